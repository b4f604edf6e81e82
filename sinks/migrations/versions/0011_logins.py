"""People log in: password hashes and lockout state per user, server-side browser sessions, and
one-time review codes (each only as a hash).

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "user_logins",
        sa.Column("user_id", sa.String(120), sa.ForeignKey("users.id"), primary_key=True),
        sa.Column("password_hash", sa.String(200), nullable=True),
        sa.Column("must_change", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("failed_attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "web_sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.String(120), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_web_sessions_user", "web_sessions", ["user_id"])
    op.create_table(
        "review_codes",
        sa.Column("code_hash", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.String(120), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("org_id", sa.String(64), sa.ForeignKey("orgs.id"), nullable=False),
        sa.Column("flow_run_id", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("used_by_run", sa.String(64), nullable=True),
    )
    op.create_index("ix_review_codes_user", "review_codes", ["user_id"])


def downgrade() -> None:
    op.drop_index("ix_review_codes_user", table_name="review_codes")
    op.drop_table("review_codes")
    op.drop_index("ix_web_sessions_user", table_name="web_sessions")
    op.drop_table("web_sessions")
    op.drop_table("user_logins")
