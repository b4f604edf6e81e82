"""Initial registry: orgs, users, collections, documents, audit log.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    ts = sa.DateTime(timezone=True)
    op.create_table(
        "orgs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("am_user_id", sa.String(120), nullable=True),
        sa.Column("created_at", ts, nullable=False),
    )
    op.create_table(
        "users",
        sa.Column("id", sa.String(120), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("org_id", sa.String(64), sa.ForeignKey("orgs.id"), nullable=True),
        sa.Column("created_at", ts, nullable=False),
    )
    op.create_table(
        "collections",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("org_id", sa.String(64), sa.ForeignKey("orgs.id"), nullable=False),
        sa.Column("path", sa.String(500), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("description", sa.Text, nullable=True),
        sa.Column("parent_id", sa.Integer, sa.ForeignKey("collections.id"), nullable=True),
        sa.Column("created_at", ts, nullable=False),
    )
    op.create_index("ux_collections_org_path", "collections", ["org_id", "path"], unique=True)
    op.create_table(
        "documents",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("org_id", sa.String(64), sa.ForeignKey("orgs.id"), nullable=False),
        sa.Column("collection_id", sa.Integer, sa.ForeignKey("collections.id"), nullable=False),
        sa.Column("source_key", sa.String(1000), nullable=False),
        sa.Column("title", sa.String(500), nullable=False),
        sa.Column("uri", sa.String(2000), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("status", sa.String(32), nullable=True),
        sa.Column("source_tag", sa.String(64), nullable=True),
        sa.Column("synthesis_run_id", sa.String(64), nullable=True),
        sa.Column("audience", sa.String(64), nullable=True),
        sa.Column("effective_date", sa.Date, nullable=True),
        sa.Column("parse_status", sa.String(32), nullable=False),
        sa.Column("chunk_count", sa.Integer, nullable=False),
        sa.Column("created_at", ts, nullable=False),
        sa.Column("updated_at", ts, nullable=False),
    )
    op.create_index("ix_documents_org_source", "documents", ["org_id", "source_key"])
    op.create_index("ix_documents_org_status", "documents", ["org_id", "status"])
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", ts, nullable=False),
        sa.Column("actor", sa.String(120), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("doc_id", sa.String(64), nullable=True),
        sa.Column("synthesis_run_id", sa.String(64), nullable=True),
        sa.Column("source_tag", sa.String(64), nullable=True),
        sa.Column("before", sa.JSON, nullable=True),
        sa.Column("after", sa.JSON, nullable=True),
    )
    op.create_index("ix_audit_org_doc", "audit_log", ["org_id", "doc_id"])


def downgrade() -> None:
    op.drop_table("audit_log")
    op.drop_table("documents")
    op.drop_table("collections")
    op.drop_table("users")
    op.drop_table("orgs")
