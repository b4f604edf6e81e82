"""The parts of a backup (`kbflow.services.backup.backups`): how each is copied consistently, where
it goes in the backup's folder, and what is counted in it.

Each part function takes the settings, the backup's folder being written, the previous backup's
records of the part by path and that part's folder in the previous backup (for hard links), and
returns the manifest's entry for the part: ``kind``, ``root`` (its folder in the backup),
``files`` (`sinks.snapshot.FileRecord`) and ``counts`` — or None when the home has none of it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from core.errors import NotFound
from core.settings import Settings
from sinks.snapshot import (
    FileRecord,
    copy_edge_shard,
    copy_tree,
    duckdb_copy,
    held_exclusively,
    sha256_file,
    sqlite_backup,
    sqlite_read_only,
)

LEDGER_FILE = "kbflow_ledger.duckdb"
WAREHOUSE_FILE = "kbflow.duckdb"
HOME_FILES = ("uploads", "models", "jobs", "prefect-auth")
"""What of the home besides the stores is backed up: uploads waiting for their jobs, fine-tuned
models (``KBFLOW_EMBEDDING_MODEL=promoted`` names one), job logs, and the Prefect credential
`kbflow server --auth` keeps. Caches, eval indexes and Prefect's own state are not: kbflow
rebuilds them."""
TURNS_SQL = "SELECT count(*) FROM ledger.ledger_turns"
LOCK_WAIT_S = 60.0


def part_steps() -> tuple[tuple[str, Any], ...]:
    """The parts in the order they are copied: the registry before the vectors, so that an
    ingest in flight leaves at most points the registry does not know yet (never served, and
    `kbflow reconcile` drops them), never a document without its points."""
    return (
        ("registry", registry_part),
        ("vectors", vectors_part),
        ("ledger", ledger_part),
        ("warehouse", warehouse_part),
        ("files", files_part),
    )


def registry_part(
    settings: Settings, out: Path, previous: dict[str, FileRecord], base: Path | None
) -> dict[str, Any]:
    """The registry: SQLite through its online backup API; another database (PostgreSQL) as
    JSON lines from one snapshot (`kbflow.services.backup._registry_copy`)."""
    if not settings.registry_url.startswith("sqlite:///"):
        from kbflow.services.backup._registry_copy import dump_counts, dump_registry

        files = dump_registry(settings.registry_url, out / "registry")
        return {
            "kind": "sql-jsonl",
            "root": "registry",
            "files": [_record(f, out / "registry", previous, base) for f in files],
            "counts": dump_counts(out / "registry"),
        }
    src = Path(settings.registry_url.removeprefix("sqlite:///"))
    if not src.is_file():
        raise NotFound(
            f"no registry at {src}: nothing to back up — check KBFLOW_HOME ({settings.home})"
        )
    target = out / "registry" / "registry.db"
    sqlite_backup(src, target)
    with sqlite_read_only(target) as con:
        counts = registry_counts(con)
    return {
        "kind": "sqlite",
        "root": "registry",
        "files": [_record(target, out / "registry", previous, base)],
        "counts": counts,
    }


def registry_counts(con: Any) -> dict[str, Any]:
    """What a registry holds (a DB-API connection, SQLite or SQLAlchemy's raw one): documents
    per status, per org, chunks, audit rows, orgs, users, and its schema revision."""

    def rows(sql: str) -> list[tuple[Any, ...]]:
        cur = con.cursor()
        try:
            cur.execute(sql)
            return list(cur.fetchall())
        finally:
            cur.close()

    def one(sql: str) -> int:
        return int(rows(sql)[0][0])

    return {
        "schema_version": rows("SELECT version_num FROM alembic_version")[0][0],
        "documents": {
            str(s): int(n)
            for s, n in rows(
                "SELECT coalesce(status, 'none'), count(*) FROM documents GROUP BY 1 ORDER BY 1"
            )
        },
        "documents_per_org": {
            str(o): int(n)
            for o, n in rows("SELECT org_id, count(*) FROM documents GROUP BY 1 ORDER BY 1")
        },
        "chunks": one("SELECT count(*) FROM chunks"),
        "audit_rows": one("SELECT count(*) FROM audit_log"),
        "orgs": one("SELECT count(*) FROM orgs"),
        "users": one("SELECT count(*) FROM users"),
    }


def vectors_part(
    settings: Settings, out: Path, previous: dict[str, FileRecord], base: Path | None
) -> dict[str, Any] | None:
    """The vectors: the Edge shard copied by its owner, or a Qdrant server's points."""
    if settings.stores.qdrant_url:
        return _server_points(settings, out)
    shard = settings.vectors_dir
    if not (shard / "edge_config.json").is_file():
        return None  # nothing ingested yet
    snapshot = snapshot_shard(settings, out / "vectors", previous, base)
    counts = {"points": snapshot["points"], "points_per_org": snapshot["points_per_org"]}
    return {
        "kind": "qdrant-edge",
        "root": "vectors",
        "copied_by": snapshot["copied_by"],  # "owner": the kbflow serve that holds the shard
        "files": snapshot["files"],
        "counts": counts,
    }


def snapshot_shard(
    settings: Settings, dest: Path, previous: dict[str, FileRecord], base: Path | None
) -> dict[str, Any]:
    """Copy the embedded shard consistently: as its owner when no process holds it, else
    through the process that owns and serves it (``kbflow serve``), which copies it under its
    store lock. Waits up to ``KBFLOW_STORE_LOCK_TIMEOUT_S`` for either.

    Returns ``files``, ``points``, ``points_per_org`` and ``copied_by``: ``backup`` (this
    process) or ``owner`` (the serving process).

    Raises:
        StoreBusy: a process that does not serve it (another command) held it all that time.
    """
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.shared_store import SharedStoreClient

    path = settings.vectors_dir
    deadline = time.monotonic() + settings.stores.store_lock_timeout_s
    while True:
        owned = QdrantEdgeStore.try_open(path)
        if owned is None and time.monotonic() >= deadline:
            owned = QdrantEdgeStore.open(path, lock_timeout_s=0)  # raises StoreBusy
        if owned is not None:
            try:
                copied = copy_edge_shard(owned, dest, previous=previous, previous_root=base)
            finally:
                owned.close()
            return {**copied, "copied_by": "backup"}
        client = SharedStoreClient.connect(path)
        if client is not None:
            try:
                copied = client.snapshot(dest, previous=previous, previous_root=base)
            finally:
                client.close()
            return {**copied, "copied_by": "owner"}
        time.sleep(0.1)


def _server_points(settings: Settings, out: Path) -> dict[str, Any]:
    """Every point of the Qdrant server's collection (vectors and payload), as JSON lines."""
    from collections import Counter

    from sinks.connect import open_vector_store
    from sinks.shared_store import _point_to_wire

    target = out / "vectors" / "points.jsonl"
    target.parent.mkdir(parents=True)
    per_org: Counter[str] = Counter()
    with open_vector_store(settings) as store, target.open("w", encoding="utf-8") as lines:
        for point in store.export_points():  # type: ignore[attr-defined]
            per_org[str(point.payload.get("org_id"))] += 1
            lines.write(json.dumps(_point_to_wire(point), separators=(",", ":")) + "\n")
    counts = {"points": sum(per_org.values()), "points_per_org": dict(per_org)}
    record = _record(target, out / "vectors", {}, None)
    return {"kind": "qdrant-points", "root": "vectors", "files": [record], "counts": counts}


def ledger_part(
    settings: Settings, out: Path, previous: dict[str, FileRecord], base: Path | None
) -> dict[str, Any] | None:
    """The answer ledger's DuckDB file, under its writers' lock (they queue meanwhile); a
    ledger in a database (``KBFLOW_WAREHOUSE_URL``) as JSON lines."""
    from sinks.ledger import ledger_path

    if settings.stores.warehouse_url:  # a database: its ledger tables, from one snapshot
        from kbflow.services.backup._ledger_copy import dump_ledger, dump_turns

        files = dump_ledger(settings.stores.warehouse_url, out / "ledger")
        return {
            "kind": "sql-jsonl",
            "root": "ledger",
            "files": [_record(f, out / "ledger", previous, base) for f in files],
            "counts": {"turns": dump_turns(out / "ledger")},
        }
    src = ledger_path(settings.home)
    if not src.is_file():
        return None
    target = out / "warehouse" / LEDGER_FILE
    with held_exclusively(src.with_name(src.name + ".lock"), LOCK_WAIT_S):
        turns = duckdb_copy(src, target, wait_s=LOCK_WAIT_S, count_sql=TURNS_SQL)
    record = _record(target, out / "warehouse", previous, base)
    return {"kind": "duckdb", "root": "warehouse", "files": [record], "counts": {"turns": turns}}


def warehouse_part(
    settings: Settings, out: Path, previous: dict[str, FileRecord], base: Path | None
) -> dict[str, Any] | None:
    """The eval warehouse's DuckDB file."""
    from evals.warehouse import warehouse_path

    src = warehouse_path(settings.home)
    if settings.stores.warehouse_url or not src.is_file():
        return None
    target = out / "warehouse-evals" / WAREHOUSE_FILE
    duckdb_copy(src, target, wait_s=LOCK_WAIT_S)
    record = _record(target, out / "warehouse-evals", previous, base)
    return {"kind": "duckdb", "root": "warehouse-evals", "files": [record], "counts": {}}


def files_part(
    settings: Settings, out: Path, previous: dict[str, FileRecord], base: Path | None
) -> dict[str, Any]:
    """Uploads, fine-tuned models, job logs and the Prefect credential (`HOME_FILES`)."""
    home = settings.home.resolve()
    files: list[FileRecord] = []
    for name in HOME_FILES:
        if (home / name).exists():
            files += copy_tree(
                home / name, out / "files", base=home, previous=previous, previous_root=base
            )
    return {"kind": "files", "root": "files", "files": files, "counts": {"files": len(files)}}


def _record(
    target: Path, root: Path, previous: dict[str, FileRecord], base: Path | None
) -> FileRecord:
    """The record of a file just written under ``root``; one equal to the previous backup's
    (same sha256) is replaced by a hard link to it, to save the space."""
    record = record_of(target, root)
    before = previous.get(record["path"])
    old = base / record["path"] if base is not None else None
    if before and before["sha256"] == record["sha256"] and old is not None and old.is_file():
        target.unlink()
        os.link(old, target)
        record["linked"] = True
    return record


def record_of(path: Path, root: Path) -> FileRecord:
    """A file's record: its path under ``root``, bytes and sha256."""
    return {
        "path": path.relative_to(root).as_posix(),
        "bytes": path.stat().st_size,
        "sha256": sha256_file(path),
        "linked": False,
    }
