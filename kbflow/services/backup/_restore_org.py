"""``kbflow restore DIR --org ORG``: one org of a backup, added to a home that is in use.

Who: a superadmin of the home (``--as``), checked before anything is read or written, and
audited (``kb.org.restored``; a refusal ``kb.access.denied``).

The rule: the org must not exist in the home (an org is restored whole or not at all, never
merged into a live one — to replace an org, restore it into a fresh home and compare first).
What comes back, and only the org's own rows: the org, its collections (given new ids, the
agents' allow-lists and the documents following them), its documents with their versions and
statuses, the chunks of those documents, its agents and their agent tokens, its audit rows (new
row ids, same contents), its points, and its ledger turns. People: the users of the org (its
experts, engineers and account managers) and its account manager when an account manager with
no other org — never a superadmin, never a user the home has already (the home's user stands),
and never a password, session or user token (each sets a password in this home). The org's
account-manager assignment is kept when that user is an account manager here. Background jobs
and one-time review codes are not restored: they belong to the home that ran them.

Order, so that a failure half-way can simply be run again: the points first (an upsert by
id; no search can reach them until the registry knows the org), then the ledger turns (their
rows replaced by turn id), then the registry in ONE transaction — the step that makes the org
exist, and the one the refusal checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.models import Role
from core.settings import Settings
from kbflow.services.backup.backups import scratch
from kbflow.services.backup.types import BackupManifest
from sinks.snapshot import copy_tree

_BATCH = 256


def authorize_restore(settings: Settings, org: str, actor: str | None) -> str:
    """The actor's id if they may add ``org`` from a backup to this home: a superadmin here.

    Raises:
        Forbidden: no ``actor``, an unknown user, or not a superadmin (audited); nothing read.
    """
    from sinks.connect import open_registry
    from tasks.review.access import authorize_org_admin

    what = f"restore org {org!r} from a backup"
    with open_registry(settings) as registry:
        return authorize_org_admin(registry, actor, what, org, superadmin_only=True)


def restore_org(
    settings: Settings, path: Path, org: str, *, actor: str, manifest: BackupManifest
) -> dict[str, Any]:
    """Add ``org`` from the verified backup at ``path`` (its ``manifest``, signature checked)
    to ``settings.home``, for ``actor`` (a superadmin, `authorize_restore`).

    Returns:
        What was restored: ``documents``, ``chunks``, ``audit_rows``, ``sources``, ``users``,
        ``points``, ``turns``.

    Raises:
        ConfigError: the home has the org (or one of its agents) already, or the backup has
            no such org or no SQLite registry.
    """
    from sqlalchemy import select

    from sinks.connect import open_registry
    from sinks.registry.schema import AgentRow, OrgRow

    parts = manifest["parts"]
    if "registry" not in parts:
        raise ConfigError(f"the backup at {path} has no registry to take {org} from")
    kind = parts["registry"]["kind"]
    with _backup_registry(path, kind) as source, open_registry(settings) as registry:
        with source.connect() as src:
            if src.execute(select(OrgRow).where(OrgRow.id == org)).first() is None:
                raise ConfigError(
                    f"the backup at {path} has no org {org!r} — `kbflow backup verify {path} "
                    "--json` lists its counts per org"
                )
            agents = [r.id for r in src.execute(select(AgentRow.id).where(AgentRow.org_id == org))]
        with registry.engine.connect() as dst:
            if dst.execute(select(OrgRow.id).where(OrgRow.id == org)).first() is not None:
                raise ConfigError(
                    f"the home {settings.home} has an org {org!r} already: --org restores an org "
                    "the home does not have (nothing was changed) — restore the backup into an "
                    "empty KBFLOW_HOME to compare, or pick another home"
                )
            taken = [a for a in agents if dst.execute(
                select(AgentRow.id).where(AgentRow.id == a)).first()]  # fmt: skip
            if taken:
                raise ConfigError(
                    f"the home has agents named like {org}'s: {', '.join(taken)} (agent ids are "
                    "unique across orgs); nothing was changed"
                )
        points = _restore_points(settings, path, parts, org)
        turns = _restore_turns(settings, path, parts, org)
        counts = _restore_rows(source, registry.engine, org, actor=actor, backup=path.name)
    return {**counts, "points": points, "turns": turns}


@contextmanager
def _backup_registry(path: Path, kind: str) -> Iterator[Any]:
    """A read-only SQLAlchemy engine on the backup's registry (never writes a byte of it); a
    dump in JSON lines is loaded into a scratch SQLite registry first."""
    from sqlalchemy import create_engine

    with scratch("kbflow-restore-registry-") as tmp:
        file = path / "registry" / "registry.db"
        if kind != "sqlite":
            from kbflow.services.backup._registry_copy import load_registry, read_rows

            file = tmp / "registry.db"
            load_registry(f"sqlite:///{file}", read_rows(path / "registry"))
        engine = create_engine(f"sqlite:///file:{file}?mode=ro&immutable=1&uri=true")
        try:
            yield engine
        finally:
            engine.dispose()


def _restore_points(settings: Settings, path: Path, parts: dict[str, Any], org: str) -> int:
    """Upsert the org's points from the backup into the configured store (through its owner
    when ``kbflow serve`` holds it)."""
    import json

    from sinks.connect import open_vector_store
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.shared_store import _point_from_wire

    kind = parts.get("vectors", {}).get("kind")
    if kind is None:
        return 0
    count = 0
    with open_vector_store(settings) as target, scratch("kbflow-restore-") as tmp:
        if kind == "qdrant-edge":
            copy_tree(path / "vectors", tmp / "vectors")  # opening a shard writes to it
            source = QdrantEdgeStore.open(tmp / "vectors", lock_timeout_s=0)
            try:
                batch = []
                for point in source.export_points(org):
                    batch.append(point)
                    if len(batch) >= _BATCH:
                        target.upsert(batch)
                        count, batch = count + len(batch), []
                target.upsert(batch)
                count += len(batch)
            finally:
                source.close()
        else:
            with (path / "vectors" / "points.jsonl").open(encoding="utf-8") as lines:
                points = [_point_from_wire(json.loads(line)) for line in lines]
            mine = [p for p in points if p.payload.get("org_id") == org]
            for start in range(0, len(mine), _BATCH):
                target.upsert(mine[start : start + _BATCH])
            count = len(mine)
    return count


def _restore_turns(settings: Settings, path: Path, parts: dict[str, Any], org: str) -> int:
    """Copy the org's ledger turns (all five tables and their loads) into the configured
    ledger, under its writers' rules; a turn already there is replaced."""
    if "ledger" not in parts:
        return 0
    from kbflow.services.backup import _ledger_copy as ledger_copy

    rows = ledger_copy.of_org(ledger_copy.backup_rows(path, parts["ledger"]), org)
    return ledger_copy.load(settings, rows)


def _restore_rows(source: Any, engine: Any, org: str, *, actor: str, backup: str) -> dict[str, int]:
    """The org's own registry rows, copied in one transaction (collections get new ids), and
    the audit row that says who restored it."""
    from sqlalchemy import insert, select

    from sinks.registry.schema import (
        AgentRow,
        ApiTokenRow,
        AuditRow,
        Base,
        ChunkRow,
        CollectionRow,
        DocumentRow,
        OrgRow,
        SourceItemRow,
        SourceRow,
        UserRow,
    )

    tables = Base.metadata.tables

    def rows(src: Any, table: Any, *where: Any) -> list[dict[str, Any]]:
        return [dict(r._mapping) for r in src.execute(select(table).where(*where))]

    with source.connect() as src, engine.begin() as dst:
        org_row = rows(src, tables["orgs"], OrgRow.id == org)[0]
        # The org's own people, never a superadmin (their rights would reach every org).
        people = rows(src, tables["users"], UserRow.org_id == org, UserRow.role != Role.SUPERADMIN)
        am = org_row["am_user_id"]
        if am:
            people += rows(src, tables["users"], UserRow.id == am,
                           UserRow.role == Role.ACCOUNT_MANAGER,
                           UserRow.org_id.is_(None))  # fmt: skip
        have = {r[0]: r[1] for r in dst.execute(select(UserRow.id, UserRow.role))}
        new_people = {u["id"]: u for u in people if u["id"] not in have}
        if am and not (am in new_people or have.get(am) == Role.ACCOUNT_MANAGER):
            org_row["am_user_id"] = None  # no such account manager here: a superadmin assigns
        am_later = {u["id"]: u for u in new_people.values() if u["org_id"] == org}
        for user in new_people.values():  # the org's own users after the org (foreign key)
            if user["id"] not in am_later:
                dst.execute(insert(tables["users"]).values(user))
        dst.execute(insert(tables["orgs"]).values(org_row))
        for user in am_later.values():
            dst.execute(insert(tables["users"]).values(user))
        new_ids: dict[int, int] = {}
        collections = rows(src, tables["collections"], CollectionRow.org_id == org)
        for coll in sorted(collections, key=lambda c: (c["path"].count("/"), c["id"])):
            old = coll.pop("id")
            if coll["parent_id"] is not None:
                coll["parent_id"] = new_ids[coll["parent_id"]]
            made = dst.execute(insert(tables["collections"]).values(coll))
            new_ids[old] = int(made.inserted_primary_key[0])
        documents = rows(src, tables["documents"], DocumentRow.org_id == org)
        for doc in documents:
            doc["collection_id"] = new_ids[doc["collection_id"]]
        doc_ids = [d["id"] for d in documents]
        chunks = rows(src, tables["chunks"], ChunkRow.org_id == org, ChunkRow.doc_id.in_(doc_ids))
        agents = rows(src, tables["agents"], AgentRow.org_id == org)
        for agent in agents:
            agent["allowed_collection_ids"] = [
                new_ids[i] for i in agent["allowed_collection_ids"] or [] if i in new_ids
            ]
        agent_ids = [a["id"] for a in agents]
        tokens = rows(src, tables["api_tokens"], ApiTokenRow.agent_id.in_(agent_ids),
                      ApiTokenRow.user_id.is_(None))  # fmt: skip
        audit = rows(src, tables["audit_log"], AuditRow.org_id == org)
        # Its synced sources and what their last syncs saw: the next sync goes on from there.
        synced = rows(src, tables["sources"], SourceRow.org_id == org)
        items = rows(src, tables["source_items"],
                     SourceItemRow.source_id.in_([r["id"] for r in synced]))  # fmt: skip
        audit.sort(key=lambda r: r["id"])  # new ids, in the same order
        for row in audit:
            row.pop("id")
        for table, batch in (
            (tables["documents"], documents),
            (tables["chunks"], chunks),
            (tables["agents"], agents),
            (tables["api_tokens"], tokens),
            (tables["audit_log"], audit),
            (tables["sources"], synced),
            (tables["source_items"], items),
        ):
            for start in range(0, len(batch), _BATCH):
                dst.execute(insert(table), batch[start : start + _BATCH])
        counts = {"documents": len(documents), "chunks": len(chunks), "audit_rows": len(audit),
                  "sources": len(synced), "users": len(new_people)}  # fmt: skip
        dst.execute(insert(tables["audit_log"]).values(
            actor=actor, action="kb.org.restored", org_id=org,
            after={"backup": backup, **counts, "am_user_id": org_row["am_user_id"]},
        ))  # fmt: skip
    return counts
