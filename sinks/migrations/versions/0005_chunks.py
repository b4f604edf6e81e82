"""Chunk texts in the registry, for the keyword fallback when the vector engine is down.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chunks",
        sa.Column("chunk_id", sa.String(200), primary_key=True),
        sa.Column("doc_id", sa.String(64), sa.ForeignKey("documents.id"), nullable=False),
        sa.Column("org_id", sa.String(64), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("chunk_index", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("heading_path", sa.JSON(), nullable=False),
        sa.Column("location", sa.JSON(), nullable=True),
    )
    op.create_index("ix_chunks_doc", "chunks", ["doc_id", "content_hash"])
    op.create_index("ix_chunks_org", "chunks", ["org_id"])


def downgrade() -> None:
    op.drop_index("ix_chunks_org", "chunks")
    op.drop_index("ix_chunks_doc", "chunks")
    op.drop_table("chunks")
