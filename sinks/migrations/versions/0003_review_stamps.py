"""Review stamps on documents: who approved, rejected or edited a document, and when.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_STAMPS = ("approved", "rejected", "edited")


def upgrade() -> None:
    with op.batch_alter_table("documents") as batch:
        for stamp in _STAMPS:
            batch.add_column(sa.Column(f"{stamp}_by", sa.String(120), nullable=True))
            batch.add_column(sa.Column(f"{stamp}_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_documents_org_run", "documents", ["org_id", "synthesis_run_id"])


def downgrade() -> None:
    op.drop_index("ix_documents_org_run", "documents")
    with op.batch_alter_table("documents") as batch:
        for stamp in _STAMPS:
            batch.drop_column(f"{stamp}_by")
            batch.drop_column(f"{stamp}_at")
