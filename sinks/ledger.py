"""The answer ledger: every agent turn in DuckDB, loaded through dlt, and read back.

Turns live in ``<home>/warehouse/kbflow_ledger.duckdb`` (dataset ``ledger``), or in schema
``ledger`` of the database at ``KBFLOW_WAREHOUSE_URL`` when that is set (read back through the
same destination: ``sinks.warehouse.reading``). The DuckDB file is one of their
own so a nightly eval writing the eval warehouse never blocks answers. The file is not called
``ledger.duckdb``: DuckDB names the catalog after the file, and a catalog named like the dataset
makes ``ledger.<table>`` ambiguous (dlt's second load into it fails). One turn is spread over
five tables (`sinks.ledger_rows`: their columns and keys, and a turn as rows and back). A record
that fails half-way shows nothing of the turn, and the next record deletes what it left
(`sinks.ledger_loads`).

DuckDB allows ONE writer process per file, and a writer also shuts readers out. Writers also
take ``<ledger file>.lock``, so two kbflow processes never share dlt's pipeline folder. Writers
and readers wait up to ``lock_wait_s``, then raise :class:`LedgerError`.

dlt and duckdb are imported inside the functions: together they take about a second to import,
which commands that never touch the ledger should not pay.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.errors import ConfigError, LedgerError, NotFound
from core.models import Turn
from sinks.ledger_loads import (
    delete_unfinished_turns,
    finished_rows,
    is_unfinished,
    ledger_tables,
    readable,
    unfinished_turns,
)
from sinks.ledger_rows import (
    CITATIONS_TABLE,
    DATASET_NAME,
    HITS_TABLE,
    LLM_CALLS_TABLE,
    PRIMARY_KEYS,
    RETRIEVALS_TABLE,
    TABLES,
    TURNS_TABLE,
    aware,
    rows_to_turn,
    turn_to_rows,
)
from sinks.warehouse import (
    SqlReader,
    destination,
    dlt_pipeline,
    drop_unfinished_loads,
    is_lock_error,
    reading,
    retry_while_locked,
    without_dlt_usage_tracking,
)

log = logging.getLogger(__name__)

PIPELINE_NAME = "kbflow_ledger"

_SUMMARY_COLUMNS = ("turn_id", "created_at", "kind", "org_id", "agent_id", "question", "outcome")
_CITATION_COLUMNS = (
    "turn_id",
    "created_at",
    "org_id",
    "agent_id",
    "chunk_id",
    "doc_id",
    "uri",
    "title",
    "quote",
)


def ledger_path(home: Path) -> Path:
    """The DuckDB file the ledger lives in: ``<home>/warehouse/kbflow_ledger.duckdb``."""
    return home / "warehouse" / "kbflow_ledger.duckdb"


class Ledger:
    """The answer ledger under one kbflow home: record turns, read them back.

    Args:
        home: kbflow's data directory; the ledger is ``ledger_path(home)``.
        pipelines_dir: Where dlt keeps the pipeline's own state. Default: ``<home>/dlt``.
        lock_wait_s: How long a write or read waits for another process to release the file.
        url: A SQL database to keep the ledger in instead of the DuckDB file (SQLAlchemy URL,
            ``KBFLOW_WAREHOUSE_URL``); its tables go to schema ``ledger``.

    Raises:
        ConfigError: ``lock_wait_s`` is negative, or ``url`` is not a database URL.
    """

    def __init__(
        self,
        home: Path,
        *,
        pipelines_dir: Path | None = None,
        lock_wait_s: float = 10.0,
        url: str | None = None,
    ) -> None:
        if lock_wait_s < 0:
            raise ConfigError(
                f"lock_wait_s must be 0 or more. Currently, the lock_wait_s is {lock_wait_s}"
            )
        self.path = ledger_path(home)
        self.destination = destination(self.path, url)
        self.pipelines_dir = pipelines_dir if pipelines_dir is not None else home / "dlt"
        self.lock_wait_s = lock_wait_s

    def record(self, turn: Turn) -> None:
        """Store one turn (idempotent per turn id: recording it again replaces its rows).

        Payloads are stored verbatim: the caller scrubs personal data (``tasks/text/pii.py``) before
        building the turn. ``output``, ``replay_input``, ``gate_filter``, ``scores`` and the
        messages must be JSON-ready; tuples inside them read back as lists.

        A record that fails half-way shows nothing of the turn: neither the rows it wrote nor
        the earlier version they may have partly replaced. The next ``record`` drops the failed
        load package and deletes the half-written turn; record it again to store it. A record
        that fails before writing (the file stayed locked) leaves an earlier version as it was.

        Raises:
            ConfigError: ``created_at`` is naive, or a payload is not JSON-ready.
            LedgerError: Another process held the ledger for longer than ``lock_wait_s``, or
                the load failed (the message names the turn; the dlt or duckdb error is chained).
        """
        tables = turn_to_rows(turn)
        deadline = time.monotonic() + self.lock_wait_s
        started = time.perf_counter()
        import duckdb
        from dlt.pipeline.exceptions import PipelineStepFailed
        from sqlalchemy.exc import SQLAlchemyError

        try:
            with (
                _in_process(self.path),
                _one_writer(self.path.with_name(self.path.name + ".lock"), self.lock_wait_s),
            ):
                retry_while_locked(
                    lambda: self._load(tables), wait_s=max(0.0, deadline - time.monotonic())
                )
        except BlockingIOError as exc:
            raise self._busy(f"record turn {turn.turn_id!r}") from exc
        except (PipelineStepFailed, duckdb.Error, SQLAlchemyError) as exc:
            if is_lock_error(exc):
                raise self._busy(f"record turn {turn.turn_id!r}") from exc
            cause = (
                f"dlt step {exc.step!r} failed: {_dlt_cause(exc.exception)}"
                if isinstance(exc, PipelineStepFailed)
                else str(exc)
            )
            raise LedgerError(
                f"could not record turn {turn.turn_id!r} in the ledger {self.where}: {cause} — "
                "fix the cause and record the turn again; recording the same turn id replaces "
                "its rows"
            ) from exc
        log.info(
            "recorded turn %s in %s: %s in %.2f s",
            turn.turn_id,
            self.where,
            {table: len(rows) for table, rows in tables.items()},
            time.perf_counter() - started,
        )

    def get_turn(self, turn_id: str) -> Turn:
        """The turn exactly as it was recorded (``created_at`` in UTC).

        Raises:
            NotFound: No turn with this id, its last record failed half-way, or no ledger yet.
            LedgerError: Another process held the ledger for longer than ``lock_wait_s``.
        """
        if not self.destination.may_hold_data():
            raise NotFound(
                f"no turn {turn_id!r} in the ledger {self.where} — there is no ledger yet: "
                "nothing has been recorded under this home"
            )
        with self._reading() as con:
            tables = ledger_tables(con)
            found = finished_rows(con, tables, TURNS_TABLE, "turn_id = ?", [turn_id])
            if not found:
                raise NotFound(
                    f"no turn {turn_id!r} in the ledger {self.where} — "
                    + (
                        "its last record failed half-way: record it again"
                        if is_unfinished(con, tables, turn_id)
                        else "check the id (each answer returns its turn id); "
                        "`kbflow turns` lists recent turns"
                    )
                )
            turn = found[0]
            # Only the rows of the turn's own load: an earlier version recorded with more calls,
            # hits or citations than this one may have left its extra rows behind.
            where, params = "turn_id = ? AND _dlt_load_id = ?", [turn_id, turn["_dlt_load_id"]]
            llm_calls = finished_rows(con, tables, LLM_CALLS_TABLE, where, params, "seq")
            retrievals = finished_rows(con, tables, RETRIEVALS_TABLE, where, params, "seq")
            hits = finished_rows(con, tables, HITS_TABLE, where, params, "retrieval_seq, rank")
            citations = finished_rows(con, tables, CITATIONS_TABLE, where, params, "seq")
        return rows_to_turn(turn, llm_calls, retrievals, hits, citations)

    def citations(
        self,
        *,
        doc_ids: Iterable[str] | None = None,
        org_id: str | None = None,
        since: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """Citation rows, newest first, each with its turn's ``kind``, ``question``, ``outcome``.

        Each row: ``turn_id``, ``created_at`` (UTC), ``org_id``, ``agent_id``, ``chunk_id``,
        ``doc_id``, ``uri``, ``title``, ``quote``, ``kind``, ``question``, ``outcome``.
        ``[]`` when nothing has been recorded yet.

        Args:
            doc_ids: Only citations of these documents.
            org_id: Only citations made for this org.
            since: Only citations of turns made at or after this time (timezone-aware).

        Raises:
            ConfigError: ``since`` is naive, or ``doc_ids`` is a single string.
            LedgerError: Another process held the ledger for longer than ``lock_wait_s``.
        """
        if isinstance(doc_ids, str):
            raise ConfigError(
                f"doc_ids must be a collection of document ids. Currently, it is the string "
                f"{doc_ids!r} — pass [{doc_ids!r}]"
            )
        wanted_docs = None if doc_ids is None else list(doc_ids)
        if wanted_docs == [] or not self.destination.may_hold_data():
            return []
        where = ["c._dlt_load_id = t._dlt_load_id"]
        params: list[Any] = []
        if wanted_docs is not None:
            where.append(f"c.doc_id IN ({', '.join('?' * len(wanted_docs))})")
            params.extend(wanted_docs)
        if org_id is not None:
            where.append("c.org_id = ?")
            params.append(org_id)
        if since is not None:
            where.append("c.created_at >= ?")
            params.append(aware(since, "since"))
        columns = [f'c."{column}"' for column in _CITATION_COLUMNS]
        columns += ['t."kind"', 't."question"', 't."outcome"']
        names = (*_CITATION_COLUMNS, "kind", "question", "outcome")
        with self._reading() as con:
            tables = ledger_tables(con)
            if not readable(tables) or CITATIONS_TABLE not in tables:
                return []
            where.append(f"t.turn_id NOT IN ({unfinished_turns(tables)})")
            result = con.execute(
                f"SELECT {', '.join(columns)} FROM {DATASET_NAME}.{CITATIONS_TABLE} c"
                f" JOIN {DATASET_NAME}.{TURNS_TABLE} t ON t.turn_id = c.turn_id"
                f" WHERE {' AND '.join(where)} ORDER BY c.created_at DESC, c.turn_id, c.seq",
                params,
            )
        rows = [dict(zip(names, values, strict=True)) for values in result]
        for row in rows:
            row["created_at"] = row["created_at"].astimezone(UTC)
        return rows

    def turns(
        self, *, org_id: str | None = None, since: datetime | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        """The most recent turns, newest first, as summaries.

        Each row: ``turn_id``, ``created_at`` (UTC), ``kind``, ``org_id``, ``agent_id``,
        ``question``, ``outcome``. ``[]`` when nothing has been recorded yet.

        Args:
            org_id: Only turns of this org.
            since: Only turns made at or after this time (timezone-aware).
            limit: At most this many turns.

        Raises:
            ConfigError: ``limit`` is not positive, or ``since`` is naive.
            LedgerError: Another process held the ledger for longer than ``lock_wait_s``.
        """
        if limit <= 0:
            raise ConfigError(f"limit must be greater than 0. Currently, the limit is {limit}")
        if not self.destination.may_hold_data():
            return []
        where: list[str] = []
        params: list[Any] = []
        if org_id is not None:
            where.append("org_id = ?")
            params.append(org_id)
        if since is not None:
            where.append("created_at >= ?")
            params.append(aware(since, "since"))
        columns = ", ".join(f'"{column}"' for column in _SUMMARY_COLUMNS)
        with self._reading() as con:
            tables = ledger_tables(con)
            if not readable(tables):
                return []
            where.append(f"turn_id NOT IN ({unfinished_turns(tables)})")
            result = con.execute(
                f"SELECT {columns} FROM {DATASET_NAME}.{TURNS_TABLE}"
                f" WHERE {' AND '.join(where)} ORDER BY created_at DESC, turn_id LIMIT ?",
                [*params, limit],
            )
        rows = [dict(zip(_SUMMARY_COLUMNS, values, strict=True)) for values in result]
        for row in rows:
            row["created_at"] = row["created_at"].astimezone(UTC)
        return rows

    def _load(self, tables: dict[str, list[dict[str, Any]]]) -> None:
        """One dlt run of all five tables, after clearing what failed loads left.

        A fresh pipeline each call, so a locked file fails at dlt's first step (sync), before
        anything is extracted, and the call can simply run again.
        """
        import dlt

        pipeline = dlt_pipeline(
            PIPELINE_NAME,
            target=self.destination,
            dataset=DATASET_NAME,
            pipelines_dir=self.pipelines_dir,
        )
        resources = [
            dlt.resource(
                rows,
                name=table,
                write_disposition="merge",
                primary_key=PRIMARY_KEYS[table],
                # Every table also merges on the turn, so recording a turn again with fewer
                # calls or hits deletes the old extra rows instead of keeping them.
                merge_key="turn_id",
                columns=TABLES[table],
            )
            for table, rows in tables.items()
        ]
        with without_dlt_usage_tracking(pipeline):
            drop_unfinished_loads(pipeline, "ledger")
            delete_unfinished_turns(self.destination, self._unreachable)
            pipeline.run(resources)

    @property
    def where(self) -> str:
        """The DuckDB file, or the database URL without its password."""
        return self.destination.where

    @contextmanager
    def _reading(self) -> Iterator[SqlReader]:
        with (
            _in_process(self.path),
            reading(
                self.destination,
                on_lock=lambda: self._busy("read the ledger"),
                on_error=self._unreachable,
                wait_s=self.lock_wait_s,
            ) as con,
        ):
            yield con

    def _unreachable(self, exc: Exception) -> LedgerError:
        if self.destination.is_duckdb:
            return LedgerError(f"could not open the ledger {self.where}: {exc}")
        return LedgerError(
            f"could not reach the ledger database {self.where}: {_first_line(exc)} — check "
            "KBFLOW_WAREHOUSE_URL and that the server is up"
        )

    def _busy(self, action: str) -> LedgerError:
        why = (
            "DuckDB allows one writer per file"
            if self.destination.is_duckdb
            else "one writer per kbflow home"
        )
        return LedgerError(
            f"could not {action}: another process is writing the ledger {self.where} "
            f"({why}; waited {self.lock_wait_s:g} s) — retry when it finishes"
        )


_THREAD_LOCKS: dict[Path, threading.RLock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextmanager
def _in_process(path: Path) -> Iterator[None]:
    """One ledger read or write at a time in this process (a server's request threads): DuckDB
    shuts readers out while one connection writes, and dlt's pipeline folder takes one load.
    Held for the write alone, never around the work that made the turn."""
    with _THREAD_LOCKS_GUARD:
        lock = _THREAD_LOCKS.setdefault(path, threading.RLock())
    with lock:
        yield


@contextmanager
def _one_writer(lock_path: Path, wait_s: float) -> Iterator[None]:
    """Hold ``lock_path`` exclusively: one ledger writer at a time.

    DuckDB's own lock is not enough: dlt keeps load packages in the pipeline folder, and two
    processes sharing it would load (or drop) each other's; and dlt connects per job, so
    another writer could slip in between two tables of a load and take it for unfinished.

    Raises:
        BlockingIOError: Another writer held it for longer than ``wait_s``.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        retry_while_locked(
            lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB),
            wait_s=wait_s,
            is_locked=lambda exc: isinstance(exc, BlockingIOError),
        )
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _dlt_cause(exc: BaseException) -> str:
    """What went wrong, in one line where dlt allows: a failed load job carries the whole
    traceback of its database error (``failed_message``), whose last line is the error."""
    traceback = getattr(exc, "failed_message", None)
    if isinstance(traceback, str) and traceback.strip():
        lines = traceback.strip().splitlines()
        # A SQLAlchemy error (dlt's sqlalchemy destination) ends in its SQL (maybe several
        # lines), parameters and a link, after the server's DETAIL: the error is above them.
        sql_at = next((i for i, line in enumerate(lines) if line.startswith("[SQL:")), None)
        said = [
            line
            for line in lines[:sql_at]
            if line.strip() and not line.startswith(("(Background on this error", "DETAIL:"))
        ]
        return (said or lines)[-1]
    return str(exc)
