"""Documents keep a note for their reviewer (an offline draft's "Evidence pack, assembled
without a model" banner) beside their text, never in it: the inbox shows it, search never
serves it. NULL for a document without one.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("documents") as batch:
        batch.add_column(sa.Column("review_note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("documents") as batch:
        batch.drop_column("review_note")
