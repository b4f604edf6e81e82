"""Login attempts by the name as typed: reserved before a password is verified (at most
``login_max_failures`` checks per lock window, however many arrive at once), and kept for
unknown user ids too, so they are locked like known ones.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "login_attempts",
        sa.Column("login", sa.String(120), primary_key=True),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_login_attempts_last_at", "login_attempts", ["last_at"])


def downgrade() -> None:
    op.drop_index("ix_login_attempts_last_at", table_name="login_attempts")
    op.drop_table("login_attempts")
