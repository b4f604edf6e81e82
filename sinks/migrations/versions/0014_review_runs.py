"""Paused review runs that kbflow started: the only runs the inbox hands decisions to.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "review_runs",
        sa.Column("flow_run_id", sa.String(64), primary_key=True),
        sa.Column("org_id", sa.String(64), sa.ForeignKey("orgs.id"), nullable=False),
        sa.Column("doc_ids", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_review_runs_org", "review_runs", ["org_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_review_runs_org", table_name="review_runs")
    op.drop_table("review_runs")
