"""Synced sources and what each sync saw of their items.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sources",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("org_id", sa.String(64), sa.ForeignKey("orgs.id"), nullable=False),
        sa.Column("name", sa.String(120), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("collection", sa.String(300), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("audience", sa.String(200), nullable=True),
        sa.Column("include", sa.JSON, nullable=False),
        sa.Column("exclude", sa.JSON, nullable=False),
        sa.Column("max_items", sa.Integer, nullable=False),
        sa.Column("max_item_bytes", sa.Integer, nullable=False),
        sa.Column("schedule", sa.String(120), nullable=True),
        sa.Column("timezone", sa.String(64), nullable=True),
        sa.Column("created_by", sa.String(120), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_sync", sa.JSON, nullable=True),
    )
    op.create_index("ux_sources_org_name", "sources", ["org_id", "name"], unique=True)
    op.create_table(
        "source_items",
        sa.Column(
            "source_id",
            sa.String(32),
            sa.ForeignKey("sources.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("item_id", sa.String(64), primary_key=True),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("uri", sa.Text, nullable=False),
        sa.Column("version", sa.String(300), nullable=True),
        sa.Column("content_hash", sa.String(64), nullable=True),
        sa.Column("meta", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("source_items")
    op.drop_index("ux_sources_org_name", table_name="sources")
    op.drop_table("sources")
