"""A recorded review run can hold a research run's drafts by that run's id: the research flow
records itself before its drafts are stored, so a decision made before its review subflow has
paused waits for that pause instead of being applied beside it. NULL for a review run recorded
with its drafts' ids only.

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("review_runs", sa.Column("synthesis_run_id", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("review_runs", "synthesis_run_id")
