"""The answer ledger in a database (``KBFLOW_WAREHOUSE_URL``, PostgreSQL), for backups: its
tables dumped as JSON lines from one snapshot, and any backup's turns loaded into the configured
ledger — a DuckDB file or a database — under its writers' rules.

A DuckDB ledger is backed up as its file (`kbflow.services.backup._parts`); this module covers
the other cases: a ledger in a database, a whole restore into a database, and the turns of one
org (``kbflow restore --org``). The rows are the ones `sinks.ledger_loads` writes: the five
tables of a turn and dlt's ``_dlt_loads``, whose finished loads make a turn readable.
"""

from __future__ import annotations

import datetime as dt
import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from core.errors import LedgerError
from core.settings import Settings

Rows = dict[str, list[dict[str, Any]]]
"""Table name -> rows, for the ledger's tables and ``_dlt_loads``."""


def _tables() -> dict[str, Any]:
    from sinks.ledger_loads import sql_tables

    return sql_tables()


def dump_ledger(url: str, folder: Path) -> list[Path]:
    """Write the ledger tables of the database at ``url`` into ``folder`` as JSON lines, from
    one consistent snapshot (a table not made yet is an empty file); returns the files."""
    from sqlalchemy import create_engine, inspect, select

    from sinks.ledger_rows import DATASET_NAME

    folder.mkdir(parents=True)
    engine = create_engine(url)
    files = []
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                have = set(inspect(conn).get_table_names(schema=DATASET_NAME))
                for name, table in _tables().items():
                    file = folder / f"{name}.jsonl"
                    rows: Any = conn.execute(select(table)) if name in have else []
                    with file.open("w", encoding="utf-8") as out:
                        for row in rows:
                            line = json.dumps(dict(row._mapping), default=_plain)
                            out.write(line + "\n")
                    files.append(file)
    finally:
        engine.dispose()
    return files


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as JSON")


def dump_turns(folder: Path) -> int:
    """How many turns a dump holds."""
    from sinks.ledger_rows import TURNS_TABLE

    with (folder / f"{TURNS_TABLE}.jsonl").open(encoding="utf-8") as lines:
        return sum(1 for _ in lines)


def backup_rows(path: Path, part: dict[str, Any]) -> Rows:
    """Every ledger row of a backup's ledger part (a DuckDB copy or a dump), typed."""
    from sqlalchemy import DateTime

    root = path / part["root"]
    rows: Rows = {}
    if part["kind"] == "duckdb":
        import duckdb

        from sinks.ledger_rows import DATASET_NAME

        con = duckdb.connect(str(root / "kbflow_ledger.duckdb"), read_only=True)
        try:
            for name in _tables():
                try:
                    result = con.execute(f"SELECT * FROM {DATASET_NAME}.{name}")
                except duckdb.CatalogException:
                    rows[name] = []
                    continue
                columns = [d[0] for d in result.description]
                rows[name] = [dict(zip(columns, r, strict=True)) for r in result.fetchall()]
        finally:
            con.close()
        return rows
    for name, table in _tables().items():
        timed = [c.name for c in table.columns if isinstance(c.type, DateTime)]
        with (root / f"{name}.jsonl").open(encoding="utf-8") as lines:
            rows[name] = [json.loads(line) for line in lines]
        for row in rows[name]:
            for column in timed:
                if row.get(column) is not None:
                    row[column] = dt.datetime.fromisoformat(row[column])
    return rows


def of_org(rows: Rows, org: str) -> Rows:
    """The rows of ``org``'s turns, and the loads they were written in."""
    from sinks.ledger_loads import LOAD_ID, LOADS_TABLE
    from sinks.ledger_rows import TURNS_TABLE

    turns = {r["turn_id"] for r in rows.get(TURNS_TABLE, []) if r.get("org_id") == org}
    kept = {
        name: [r for r in table if r.get("turn_id") in turns]
        for name, table in rows.items()
        if name != LOADS_TABLE
    }
    loads = {r[LOAD_ID] for table in kept.values() for r in table}
    kept[LOADS_TABLE] = [r for r in rows.get(LOADS_TABLE, []) if r["load_id"] in loads]
    return kept


def holds_turns(settings: Settings) -> bool:
    """Whether the configured ledger has recorded any turn."""
    from sinks.ledger import Ledger

    return bool(Ledger(settings.home, url=settings.stores.warehouse_url).turns(limit=1))


def load(settings: Settings, rows: Rows) -> int:
    """Write ``rows`` into the configured ledger in one transaction, replacing any rows of the
    same turns (so a load that failed half-way can run again); returns the turns loaded.

    Raises:
        LedgerError: the ledger stayed busy, or could not be opened.
    """
    from sqlalchemy.dialects import postgresql

    from sinks.ledger import Ledger
    from sinks.ledger_loads import LOADS_TABLE, ensure_tables
    from sinks.ledger_rows import DATASET_NAME, TURNS_TABLE
    from sinks.snapshot import held_exclusively
    from sinks.warehouse import writing

    ledger = Ledger(settings.home, url=settings.stores.warehouse_url)
    target = ledger.destination
    turns = [r["turn_id"] for r in rows.get(TURNS_TABLE, [])]
    loads = [r["load_id"] for r in rows.get(LOADS_TABLE, [])]
    postgres = bool(target.url and target.url.startswith("postgresql"))
    lock = ledger.path.with_name(ledger.path.name + ".lock")
    with (
        held_exclusively(lock, 60.0) if target.is_duckdb else nullcontext(),
        writing(
            target,
            on_lock=lambda: LedgerError(f"the ledger {ledger.where} stayed busy — retry"),
            on_error=lambda exc: LedgerError(f"could not open the ledger {ledger.where}: {exc}"),
            wait_s=60.0,
        ) as con,
    ):
        dialect = postgresql.dialect() if target.url is None else None
        ensure_tables(con, dialect or _dialect(target.url), postgres=postgres)
        for name, table in rows.items():
            key, ids = ("load_id", loads) if name == LOADS_TABLE else ("turn_id", turns)
            for start in range(0, len(ids), 500):
                batch = ids[start : start + 500]
                con.execute(
                    f'DELETE FROM {DATASET_NAME}.{name} WHERE "{key}" IN '
                    f"({', '.join('?' * len(batch))})",
                    batch,
                )
            for row in table:
                columns = ", ".join(f'"{c}"' for c in row)
                con.execute(
                    f"INSERT INTO {DATASET_NAME}.{name} ({columns}) "
                    f"VALUES ({', '.join('?' * len(row))})",
                    list(row.values()),
                )
    return len(turns)


def _dialect(url: str | None) -> Any:
    from sqlalchemy.engine import make_url

    assert url is not None
    return make_url(url).get_dialect()()
