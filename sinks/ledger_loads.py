"""What a failed load leaves in the ledger, and how reads and the next record deal with it.

dlt loads one package per ``record`` but commits it table by table, and notes it in
``_dlt_loads`` only once every table is in. A load that fails half-way can leave some of the
turn's rows written (and, for a turn recorded before, some of its old rows replaced). Reads
therefore skip every turn that holds a row from an unfinished load, and the next ``record``
deletes such turns outright: they read as not found until recorded again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sinks.ledger_rows import ADDED_COLUMNS, DATASET_NAME, TABLES, TURNS_TABLE
from sinks.warehouse import Destination, SqlReader, writing

log = logging.getLogger(__name__)

_LOADS_TABLE = "_dlt_loads"  # dlt's record of finished loads


def ledger_tables(con: SqlReader) -> set[str]:
    """The tables of the ledger dataset (dlt creates a table only once rows arrive for it)."""
    return con.tables(DATASET_NAME)


def readable(tables: set[str]) -> bool:
    """Whether any turn can be complete yet: some turns stored, and a load that finished."""
    return TURNS_TABLE in tables and _LOADS_TABLE in tables


def unfinished_turns(tables: set[str]) -> str:
    """SQL for the ids of turns holding a row from a load dlt did not finish (see module doc).

    Only valid when some ledger table and ``_dlt_loads`` exist.
    """
    finished = f"SELECT load_id FROM {DATASET_NAME}.{_LOADS_TABLE} WHERE status = 0"
    return " UNION ".join(
        f"SELECT turn_id FROM {DATASET_NAME}.{table} WHERE _dlt_load_id NOT IN ({finished})"
        for table in TABLES
        if table in tables
    )


def is_unfinished(con: SqlReader, tables: set[str], turn_id: str) -> bool:
    """Whether ``turn_id`` holds a row from a load dlt did not finish."""
    if _LOADS_TABLE not in tables or not tables & TABLES.keys():
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
    names = [*TABLES[table], "_dlt_load_id"]
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
    found = con.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = ? AND table_name = ?",
        [DATASET_NAME, table],
    )
    return set(added) - {str(row[0]) for row in found}


def delete_unfinished_turns(
    target: Destination, on_error: Callable[[Exception], Exception]
) -> None:
    """Delete every row of the turns failed loads left half-written, in one transaction.

    Such a turn cannot be repaired (its earlier version may be partly replaced), only recorded
    again. Runs under the writer lock, so no other load is in progress.
    """
    if not target.may_hold_data():
        return
    turn_ids: list[str] = []
    with writing(target, on_error=on_error) as con:
        tables = ledger_tables(con)
        present = [table for table in TABLES if table in tables]
        if _LOADS_TABLE not in tables or not present:
            return
        # Listed first: deleting table by table would shrink the set half-way through.
        turn_ids = [turn_id for (turn_id,) in con.execute(unfinished_turns(tables))]
        if not turn_ids:
            return
        marks = ", ".join("?" * len(turn_ids))
        for table in present:
            con.execute(f"DELETE FROM {DATASET_NAME}.{table} WHERE turn_id IN ({marks})", turn_ids)
    log.warning(
        "deleted %d turn(s) a failed record left half-written in %s: %s",
        len(turn_ids),
        target.where,
        turn_ids[:10],
    )
