"""Bearer tokens for the HTTP API: each stands for one user or one agent (a CHECK constraint),
and only the sha256 of its secret is stored.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# The same text as sinks.registry.schema.TOKEN_ONE_SUBJECT, written out: a migration keeps the
# schema it made even if the models change later.
ONE_SUBJECT = (
    "(user_id IS NOT NULL AND agent_id IS NULL) OR (user_id IS NULL AND agent_id IS NOT NULL)"
)


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(120), sa.ForeignKey("users.id"), nullable=True),
        sa.Column("agent_id", sa.String(120), sa.ForeignKey("agents.id"), nullable=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("created_by", sa.String(120), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(ONE_SUBJECT, name="ck_api_tokens_one_subject"),
    )
    op.create_index("ux_api_tokens_secret_hash", "api_tokens", ["secret_hash"], unique=True)
    op.create_index("ix_api_tokens_user", "api_tokens", ["user_id"])
    op.create_index("ix_api_tokens_agent", "api_tokens", ["agent_id"])


def downgrade() -> None:
    op.drop_index("ix_api_tokens_agent", table_name="api_tokens")
    op.drop_index("ix_api_tokens_user", table_name="api_tokens")
    op.drop_index("ux_api_tokens_secret_hash", table_name="api_tokens")
    op.drop_table("api_tokens")
