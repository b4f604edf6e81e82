"""Map legacy document statuses forward.

active -> approved, draft -> pending_review, deprecated -> superseded, and any other value that
is not a current status -> approved. NULL stays NULL (a legacy row with no status, still served).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_CURRENT = ("pending_review", "approved", "rejected", "superseded")
_LEGACY = {"active": "approved", "draft": "pending_review", "deprecated": "superseded"}


def upgrade() -> None:
    conn = op.get_bind()
    for old, new in _LEGACY.items():
        conn.execute(
            sa.text("UPDATE documents SET status = :new WHERE status = :old"),
            {"new": new, "old": old},
        )
    placeholders = ", ".join(f":s{i}" for i in range(len(_CURRENT)))
    conn.execute(
        sa.text(
            "UPDATE documents SET status = 'approved' "
            f"WHERE status IS NOT NULL AND status NOT IN ({placeholders})"
        ),
        {f"s{i}": s for i, s in enumerate(_CURRENT)},
    )


def downgrade() -> None:
    """The old values are not recoverable; the statuses stay as they are."""
