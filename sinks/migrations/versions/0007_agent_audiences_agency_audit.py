"""Agents carry their audiences (a property of the agent, never of a request); audit rows may be
agency-wide (a user or role change outside any org has no org id).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.add_column(
            sa.Column("audiences", sa.JSON(), nullable=False, server_default=sa.text("'[]'"))
        )
    with op.batch_alter_table("audit_log") as batch:
        batch.alter_column("org_id", existing_type=sa.String(64), nullable=True)


def downgrade() -> None:
    conn = op.get_bind()
    conn.execute(sa.text("UPDATE audit_log SET org_id = '' WHERE org_id IS NULL"))
    with op.batch_alter_table("audit_log") as batch:
        batch.alter_column("org_id", existing_type=sa.String(64), nullable=False)
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("audiences")
