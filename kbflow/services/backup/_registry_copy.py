"""A registry in another database than a SQLite file (PostgreSQL), for backups: dumped table by
table into JSON lines, counted from those lines, and loaded back into an empty registry.

Why JSON lines through SQLAlchemy rather than ``pg_dump``: the dump is taken in ONE
``REPEATABLE READ`` transaction (a consistent snapshot while others write), its counts come
from the very rows dumped (so ``verify`` can recount them without a server), it restores into
PostgreSQL or SQLite alike, and it does not need a ``pg_dump`` of the server's major version on
the machine. A database administrator's ``pg_dump`` stays a good second copy.

Files: ``<table>.jsonl`` per registry table, one row per line (dates and times as ISO text),
and ``alembic_version.jsonl`` with the schema revision.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

VERSION_TABLE = "alembic_version"


def _tables() -> list[Any]:
    from sinks.registry.schema import Base

    return list(Base.metadata.sorted_tables)  # parents before children


def dump_registry(url: str, folder: Path) -> list[Path]:
    """Write every table of the registry at ``url`` into ``folder`` as JSON lines, from one
    consistent snapshot; returns the files written."""
    from sqlalchemy import create_engine, select, text

    folder.mkdir(parents=True)
    engine = create_engine(url)
    files: list[Path] = []
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                for table in _tables():
                    order = list(table.primary_key.columns)
                    rows = conn.execute(select(table).order_by(*order))
                    files.append(_write(folder / f"{table.name}.jsonl", (r._mapping for r in rows)))
                version = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))
                files.append(
                    _write(folder / f"{VERSION_TABLE}.jsonl", (r._mapping for r in version))
                )
    finally:
        engine.dispose()
    return files


def _write(path: Path, rows: Iterator[Any]) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(dict(row), default=_plain, separators=(",", ":")) + "\n")
    return path


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as JSON")


def read_rows(folder: Path) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    """Each registry table of a dump with its rows, typed again (dates and times parsed),
    parents before children."""
    from sqlalchemy import Date, DateTime

    for table in _tables():
        file = folder / f"{table.name}.jsonl"
        if not file.is_file():
            continue
        timed = {c.name: c.type for c in table.columns if isinstance(c.type, DateTime | Date)}
        rows = []
        with file.open(encoding="utf-8") as lines:
            for line in lines:
                row = json.loads(line)
                for name, kind in timed.items():
                    if row.get(name) is not None:
                        parse = (
                            dt.datetime.fromisoformat
                            if isinstance(kind, DateTime)
                            else dt.date.fromisoformat
                        )
                        row[name] = parse(row[name])
                rows.append(row)
        yield table, rows


def dump_counts(folder: Path) -> dict[str, Any]:
    """`kbflow.services.backup._parts.registry_counts` of a dump, read from its files."""

    def rows(name: str) -> list[dict[str, Any]]:
        file = folder / f"{name}.jsonl"
        if not file.is_file():
            return []
        with file.open(encoding="utf-8") as lines:
            return [json.loads(line) for line in lines]

    documents = rows("documents")
    return {
        "schema_version": (rows(VERSION_TABLE) or [{"version_num": None}])[0]["version_num"],
        "documents": dict(sorted(Counter(str(d["status"] or "none") for d in documents).items())),
        "documents_per_org": dict(sorted(Counter(str(d["org_id"]) for d in documents).items())),
        "chunks": len(rows("chunks")),
        "audit_rows": len(rows("audit_log")),
        "orgs": len(rows("orgs")),
        "users": len(rows("users")),
    }


def sqlite_rows(file: Path) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    """Each registry table of a backup's SQLite copy with its rows (read-only, never written)."""
    from sqlalchemy import create_engine, select

    engine = create_engine(f"sqlite:///file:{file}?mode=ro&immutable=1&uri=true")
    try:
        with engine.connect() as conn:
            for table in _tables():
                yield table, [dict(r._mapping) for r in conn.execute(select(table))]
    finally:
        engine.dispose()


def holds_data(url: str) -> bool:
    """Whether the registry database at ``url`` holds any org, user or document (its tables
    may exist: an empty, migrated database is empty)."""
    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            have = set(inspect(conn).get_table_names())
            return any(
                conn.execute(text(f"SELECT 1 FROM {name} LIMIT 1")).first() is not None
                for name in ("orgs", "users", "documents")
                if name in have
            )
    finally:
        engine.dispose()


def load_registry(url: str, tables: Iterator[tuple[Any, list[dict[str, Any]]]]) -> None:
    """Migrate the empty registry at ``url`` and insert every table's rows in one transaction
    (on PostgreSQL, its id sequences then continue after the restored ids)."""
    from sqlalchemy import insert, text

    from sinks.registry import SqlRegistry

    registry = SqlRegistry.open(url)  # this kbflow's schema: an older backup's rows fit it
    try:
        with registry.engine.begin() as conn:
            for table, rows in tables:
                if table.name == "collections":  # parents before children, whatever the ids
                    rows.sort(key=lambda r: (str(r["path"]).count("/"), r["id"]))
                    for row in rows:
                        conn.execute(insert(table).values(row))
                    continue
                for start in range(0, len(rows), 500):
                    conn.execute(insert(table), rows[start : start + 500])
            if registry.engine.dialect.name == "postgresql":
                for table in ("collections", "audit_log"):
                    conn.execute(
                        text(
                            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                            f"coalesce((SELECT max(id) FROM {table}), 0) + 1, false)"
                        )
                    )
    finally:
        registry.close()
