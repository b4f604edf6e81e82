"""A turn's load: the ledger's tables in SQL, one transaction per turn, and what reads may show.

The tables are the ones a dlt load makes (ledgers were once loaded that way): the five of
`sinks.ledger_rows`, each with dlt's ``_dlt_load_id`` and ``_dlt_id`` columns, and dlt's
``_dlt_loads``, where a load counts once it is noted with status 0. A ledger written by dlt is
read and appended to as it is, and a new one gets the same names, types and nullability.

``write_turn`` records a turn in the caller's transaction: it deletes every row of the turn id,
inserts the new rows under a fresh load id and notes that load in ``_dlt_loads``. Committed,
the turn is whole; rolled back, nothing of it was written. Reads still skip turns holding a row
of a load that never finished: only dlt left such turns (it committed a load table by table),
and they read as not found until recorded again.
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from core import faults
from sinks.ledger_rows import ADDED_COLUMNS, DATASET_NAME, TABLES, TURNS_TABLE
from sinks.warehouse import SqlReader

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.engine import Dialect

LOADS_TABLE = "_dlt_loads"  # dlt's record of finished loads
LOAD_ID = "_dlt_load_id"
ROW_ID = "_dlt_id"
SCHEMA_NAME = "kbflow_ledger"  # what dlt wrote in _dlt_loads.schema_name for the ledger


# --- writing ---------------------------------------------------------------------------------


@cache
def sql_tables() -> dict[str, Table]:
    """The ledger's tables as SQLAlchemy tables, with dlt's types: its ``sqlalchemy``
    destination's on a server (``text``, ``bigint``, ``double precision``, ``boolean``,
    ``timestamp with time zone``), which DuckDB reads as the types dlt gave it there."""
    import sqlalchemy as sa

    types: dict[str, Any] = {
        "text": sa.Text(),
        "bigint": sa.BigInteger(),
        "double": sa.Double(),
        "bool": sa.Boolean(),
        "timestamp": sa.DateTime(timezone=True),
    }
    metadata = sa.MetaData(schema=DATASET_NAME)
    tables = {
        name: sa.Table(
            name,
            metadata,
            *(
                sa.Column(column, types[hint["data_type"]], nullable=hint["nullable"], quote=True)
                for column, hint in columns.items()
            ),
            sa.Column(LOAD_ID, sa.Text(), nullable=False, quote=True),
            sa.Column(ROW_ID, sa.String(128), nullable=False, quote=True),
        )
        for name, columns in TABLES.items()
    }
    tables[LOADS_TABLE] = sa.Table(
        LOADS_TABLE,
        metadata,
        sa.Column("load_id", sa.String(64), nullable=False, quote=True),
        sa.Column("schema_name", sa.Text(), quote=True),
        sa.Column("status", sa.BigInteger(), nullable=False, quote=True),
        sa.Column("inserted_at", sa.DateTime(timezone=True), nullable=False, quote=True),
        sa.Column("schema_version_hash", sa.Text(), quote=True),
    )
    return tables


def ensure_tables(con: SqlReader, dialect: Dialect, *, postgres: bool) -> None:
    """Create the schema and the tables the ledger lacks, and the columns added since an older
    ledger was made (`ADDED_COLUMNS`), in the caller's transaction.

    Args:
        con: A connection inside the transaction that will write the turn.
        dialect: The SQL dialect to write the DDL in (PostgreSQL's for DuckDB, which reads it).
        postgres: The database is PostgreSQL: the first records of two processes would race
            to create the tables (a duplicate-type error), so they take turns.
    """
    from sqlalchemy.schema import CreateSchema, CreateTable

    if postgres:
        _postgres_lock(con, SCHEMA_NAME)
    present = con.tables(DATASET_NAME)
    if not present:
        con.execute(str(CreateSchema(DATASET_NAME, if_not_exists=True).compile(dialect=dialect)))
    for name, table in sql_tables().items():
        if name not in present:
            con.execute(str(CreateTable(table, if_not_exists=True).compile(dialect=dialect)))
            continue
        added = ADDED_COLUMNS.get(name, ())
        have = con.columns(DATASET_NAME, name) if added else set()
        for column in (c for c in added if c not in have):
            con.execute(
                f'ALTER TABLE {DATASET_NAME}.{name} ADD COLUMN "{column}" '
                f"{table.c[column].type.compile(dialect=dialect)}"
            )


def checkpoint_by_wal_size(con: SqlReader) -> None:
    """On a DuckDB file: checkpoint once the write-ahead log passes 512 KB, not on every close.

    DuckDB checkpoints when the last connection to a file closes, and a checkpoint rewrites a
    table's last row group whole when rows were appended to it (up to 2,048 rows; each
    retrieval row holds a ~8 KB query embedding). Closing after every turn made a record grow
    from ~40 ms to over 120 ms within 1,000 turns; leaving the turns in the log kept it flat at
    35-40 ms (2,000 turns), for ~10 ms more per read (an open replays the log, at most 512 KB).
    Committed turns are in the log, which the next open replays: none is lost.
    """
    con.execute("PRAGMA disable_checkpoint_on_shutdown")
    con.execute("SET wal_autocheckpoint = '512KB'")


def write_turn(
    con: SqlReader, turn_id: str, rows: dict[str, list[dict[str, Any]]], *, postgres: bool
) -> str:
    """Replace every row of ``turn_id`` by ``rows`` (`turn_to_rows`) in the caller's transaction.

    Fault points ``ledger.after_delete`` and ``ledger.after_<table>`` (``turns``,
    ``llm_calls``, ``retrievals``, ``retrieval_hits``, ``citations``) lie between the steps.

    Args:
        con: A connection inside a transaction on a ledger with all its tables.
        turn_id: The turn the rows belong to.
        rows: Its rows, by table.
        postgres: Take the turn's advisory lock first, so two processes recording the same turn
            id at once replace one another instead of both inserting.

    Returns:
        The load id the rows carry (``_dlt_load_id``), noted as finished in ``_dlt_loads``.
    """
    if postgres:
        _postgres_lock(con, f"{SCHEMA_NAME}.turn:{turn_id}")
    for table in TABLES:
        con.execute(f"DELETE FROM {DATASET_NAME}.{table} WHERE turn_id = ?", [turn_id])
    faults.point("ledger.after_delete")
    # dlt's own load ids are the load's Unix time; the turn's rows share one.
    load_id = str(time.time())
    for table, table_rows in rows.items():
        if table_rows:
            columns = [*TABLES[table], LOAD_ID, ROW_ID]
            values = [
                value
                for row in table_rows
                for value in (*(row[c] for c in TABLES[table]), load_id, _row_id())
            ]
            _insert(con, table, columns, len(table_rows), values)
        faults.point(f"ledger.after_{table.removeprefix('ledger_')}")
    _insert(
        con,
        LOADS_TABLE,
        ["load_id", "schema_name", "status", "inserted_at", "schema_version_hash"],
        1,
        [load_id, SCHEMA_NAME, 0, datetime.now(UTC), None],
    )
    return load_id


def is_missing_table(exc: BaseException, *, duckdb_file: bool) -> bool:
    """Whether ``exc`` says a ledger table, column or the schema is not there (dropped since
    this process made them): the write can make them again and retry."""
    if duckdb_file:
        import duckdb

        return isinstance(exc, duckdb.CatalogException | duckdb.BinderException)
    # undefined_table, undefined_column, invalid_schema_name
    return getattr(getattr(exc, "orig", None), "sqlstate", None) in {"42P01", "42703", "3F000"}


def _insert(con: SqlReader, table: str, columns: list[str], count: int, values: list[Any]) -> None:
    """One multi-row INSERT: a round trip per table, not per row."""
    names = ", ".join(f'"{column}"' for column in columns)
    marks = f"({', '.join('?' * len(columns))})"
    con.execute(
        f"INSERT INTO {DATASET_NAME}.{table} ({names}) VALUES {', '.join([marks] * count)}",
        values,
    )


def _row_id() -> str:
    """A row id like dlt's: 14 random base64 characters."""
    return secrets.token_urlsafe(10)


def _postgres_lock(con: SqlReader, key: str) -> None:
    """PostgreSQL's advisory lock on ``key``, held until the transaction ends."""
    con.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", [key])


# --- reading ---------------------------------------------------------------------------------


def ledger_tables(con: SqlReader) -> set[str]:
    """The tables of the ledger dataset (a ledger dlt made has a table only once rows came)."""
    return con.tables(DATASET_NAME)


def readable(tables: set[str]) -> bool:
    """Whether any turn can be complete yet: some turns stored, and a load that finished."""
    return TURNS_TABLE in tables and LOADS_TABLE in tables


def unfinished_turns(tables: set[str]) -> str:
    """SQL for the ids of turns holding a row from a load that never finished (see module doc).

    Only valid when some ledger table and ``_dlt_loads`` exist.
    """
    finished = f"SELECT load_id FROM {DATASET_NAME}.{LOADS_TABLE} WHERE status = 0"
    return " UNION ".join(
        f"SELECT turn_id FROM {DATASET_NAME}.{table} WHERE {LOAD_ID} NOT IN ({finished})"
        for table in TABLES
        if table in tables
    )


def is_unfinished(con: SqlReader, tables: set[str], turn_id: str) -> bool:
    """Whether ``turn_id`` holds a row from a load that never finished."""
    if LOADS_TABLE not in tables or not tables & TABLES.keys():
        return False
    found = con.execute(
        f"SELECT count(*) FROM ({unfinished_turns(tables)}) AS unfinished WHERE turn_id = ?",
        [turn_id],
    )
    return bool(found and found[0][0])


def finished_rows(
    con: SqlReader,
    tables: set[str],
    table: str,
    where: str,
    params: list[Any],
    order: str = "turn_id",
) -> list[dict[str, Any]]:
    """Rows of ``table`` that belong to finished turns, as dicts with ``_dlt_load_id``."""
    if not readable(tables) or table not in tables:
        return []
    names = [*TABLES[table], LOAD_ID]
    missing = _missing_columns(con, table)
    columns = ", ".join(f'NULL AS "{name}"' if name in missing else f'"{name}"' for name in names)
    result = con.execute(
        f"SELECT {columns} FROM {DATASET_NAME}.{table} WHERE {where}"
        f" AND turn_id NOT IN ({unfinished_turns(tables)}) ORDER BY {order}",
        params,
    )
    return [dict(zip(names, values, strict=True)) for values in result]


def _missing_columns(con: SqlReader, table: str) -> set[str]:
    """The columns of ``ADDED_COLUMNS`` that ``table`` lacks (a ledger written before them)."""
    added = ADDED_COLUMNS.get(table, ())
    if not added:
        return set()
    return set(added) - con.columns(DATASET_NAME, table)
