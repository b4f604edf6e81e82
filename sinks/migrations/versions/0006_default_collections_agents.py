"""Every org gets a ``Default`` collection; documents without a (valid) collection are filed
there, then the document's collection is constrained NOT NULL (backfill, then constrain).
Agents ("specialists") with their knowledge-base switch and collection allow-list.

Revision ID: 0006
Revises: 0005
"""

import datetime as dt

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

DEFAULT_PATH = "default"
DEFAULT_NAME = "Default"
DEFAULT_DESCRIPTION = "Documents not filed in a more specific collection."
NO_DESCRIPTION = "(no description yet: set one with `kbflow collections describe`)"


def upgrade() -> None:
    conn = op.get_bind()
    now = dt.datetime.now(dt.UTC)
    orgs = [row[0] for row in conn.execute(sa.text("SELECT id FROM orgs"))]
    for org in orgs:
        exists = conn.execute(
            sa.text("SELECT id FROM collections WHERE org_id = :o AND path = :p"),
            {"o": org, "p": DEFAULT_PATH},
        ).first()
        if exists is None:
            conn.execute(
                sa.text(
                    "INSERT INTO collections (org_id, path, name, description, parent_id, "
                    "created_at) VALUES (:o, :p, :n, :d, NULL, :t)"
                ),
                {
                    "o": org,
                    "p": DEFAULT_PATH,
                    "n": DEFAULT_NAME,
                    "d": DEFAULT_DESCRIPTION,
                    "t": now,
                },
            )
    # Backfill: a document with no collection, or one that no longer exists, goes to Default.
    conn.execute(
        sa.text(
            "UPDATE documents SET collection_id = (SELECT c.id FROM collections c WHERE "
            "c.org_id = documents.org_id AND c.path = :p) WHERE collection_id IS NULL OR "
            "collection_id NOT IN (SELECT id FROM collections)"
        ),
        {"p": DEFAULT_PATH},
    )
    conn.execute(
        sa.text("UPDATE collections SET description = :d WHERE description IS NULL"),
        {"d": NO_DESCRIPTION},
    )
    # Then constrain (a registry from 0001 on already is: rebuilding the table on SQLite would
    # only trip over the foreign keys that point at it).
    column = next(
        c for c in sa.inspect(conn).get_columns("documents") if c["name"] == "collection_id"
    )
    if column["nullable"]:
        with op.batch_alter_table("documents") as batch:
            batch.alter_column("collection_id", existing_type=sa.Integer(), nullable=False)
    op.create_table(
        "agents",
        sa.Column("id", sa.String(120), primary_key=True),
        sa.Column("org_id", sa.String(64), sa.ForeignKey("orgs.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("knowledge_base_enabled", sa.Boolean(), nullable=False),
        sa.Column("allowed_collection_ids", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_agents_org", "agents", ["org_id"])


def downgrade() -> None:
    op.drop_index("ix_agents_org", "agents")
    op.drop_table("agents")
