"""Chunks record the id of the embedding model that made their vectors, so a search or an
ingest with another model is refused instead of mixing two models' vectors. NULL for a chunk
written before model ids were recorded (read as "unknown": compatible with any model).

Indexed with the org first: "does this org hold a chunk of another model?" is two index
seeks (its smallest and its largest model id), however many chunks the org has.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("chunks") as batch:
        batch.add_column(sa.Column("embedding_model", sa.String(500), nullable=True))
    op.create_index("ix_chunks_org_model", "chunks", ["org_id", "embedding_model"])


def downgrade() -> None:
    op.drop_index("ix_chunks_org_model", "chunks")
    with op.batch_alter_table("chunks") as batch:
        batch.drop_column("embedding_model")
