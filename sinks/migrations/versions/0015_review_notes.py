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


# Plain ALTER TABLE, not a batch copy: SQLite adds and (since 3.35) drops a plain column in
# place, where a batch would drop and recreate `documents`, which chunks reference.


def upgrade() -> None:
    op.add_column("documents", sa.Column("review_note", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("documents", "review_note")
