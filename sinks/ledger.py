"""The answer ledger: every agent turn, written in one SQL transaction, and read back.

Turns live in ``<home>/warehouse/kbflow_ledger.duckdb`` (dataset ``ledger``), or in schema
``ledger`` of the database at ``KBFLOW_WAREHOUSE_URL`` when that is set (written and read back
through the same destination: ``sinks.warehouse.writing`` / ``reading``). The DuckDB file is
one of their own so a nightly eval writing the eval warehouse never blocks answers. The file is
not called ``ledger.duckdb``: DuckDB names the catalog after the file, and a catalog named like
the dataset makes ``ledger.<table>`` ambiguous. One turn is spread over five tables
(`sinks.ledger_rows`: their columns and keys, and a turn as rows and back), recorded in one
transaction (`sinks.ledger_loads`): a reader sees the whole turn or nothing of it, and a record
that fails half-way leaves nothing. The tables, columns and bookkeeping are the ones a dlt load
makes, so a ledger that dlt loaded turn by turn is read and appended to as it is.

DuckDB allows ONE writer process per file, and a writer also shuts readers out. Writers take
``<ledger file>.lock`` for the transaction alone (connect, write, commit, close), so writers
queue on it instead of on DuckDB's file lock; readers retry on that file lock. Both wait up to
``lock_wait_s``, then raise :class:`LedgerError`. PostgreSQL needs no lock of ours: its
transactions isolate readers, and an advisory lock per turn id orders two records of one turn.

duckdb and SQLAlchemy are imported inside the functions, which commands that never touch the
ledger should not pay for.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core import faults
from core.errors import ConfigError, LedgerError, NotFound
from core.models import Turn
from sinks.ledger_loads import (
    checkpoint_by_wal_size,
    ensure_tables,
    finished_rows,
    is_missing_table,
    is_unfinished,
    ledger_tables,
    readable,
    unfinished_turns,
    write_turn,
)
from sinks.ledger_rows import (
    CITATIONS_TABLE,
    DATASET_NAME,
    HITS_TABLE,
    LLM_CALLS_TABLE,
    RETRIEVALS_TABLE,
    TURNS_TABLE,
    aware,
    rows_to_turn,
    turn_to_rows,
)
from sinks.warehouse import (
    Destination,
    SqlReader,
    destination,
    is_lock_error,
    reading,
    retry_while_locked,
    writing,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

log = logging.getLogger(__name__)

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
        lock_wait_s: float = 10.0,
        url: str | None = None,
    ) -> None:
        if lock_wait_s < 0:
            raise ConfigError(
                f"lock_wait_s must be 0 or more. Currently, the lock_wait_s is {lock_wait_s}"
            )
        self.path = ledger_path(home)
        self.destination = destination(self.path, url)
        self.lock_wait_s = lock_wait_s

    def record(self, turn: Turn) -> None:
        """Store one turn (idempotent per turn id: recording it again replaces its rows).

        Payloads are stored verbatim: the caller scrubs personal data (``tasks/text/pii.py``) before
        building the turn. ``output``, ``replay_input``, ``gate_filter``, ``scores`` and the
        messages must be JSON-ready; tuples inside them read back as lists.

        The turn's rows replace those of any earlier record of its id in one transaction: a
        record that fails (or a process that dies) half-way leaves nothing of the new version
        and the earlier version whole; readers see one version or the other, never a mix.

        Raises:
            ConfigError: ``created_at`` is naive, or a payload is not JSON-ready.
            LedgerError: Another process held the ledger for longer than ``lock_wait_s``, or
                the write failed (the message names the turn; the database error is chained).
        """
        rows = turn_to_rows(turn)
        deadline = time.monotonic() + self.lock_wait_s
        started = time.perf_counter()
        busy = f"record turn {turn.turn_id!r}"
        errors = self._database_errors()
        try:
            with self._one_at_a_time(), self._one_writer(deadline):
                self._write(turn.turn_id, rows, deadline)
        except BlockingIOError as exc:
            raise self._busy(busy) from exc
        except errors as exc:
            if is_lock_error(exc):
                raise self._busy(busy) from exc
            raise LedgerError(
                f"could not record turn {turn.turn_id!r} in the ledger {self.where}: "
                f"{_first_line(getattr(exc, 'orig', None) or exc)} — fix the cause and record "
                "the turn again; recording the same turn id replaces its rows"
            ) from exc
        log.info(
            "recorded turn %s in %s: %s in %.3f s",
            turn.turn_id,
            self.where,
            {table: len(table_rows) for table, table_rows in rows.items()},
            time.perf_counter() - started,
        )

    def get_turn(self, turn_id: str) -> Turn:
        """The turn exactly as it was recorded (``created_at`` in UTC).

        Raises:
            NotFound: No turn with this id, no ledger yet, or a dlt load of the turn failed
                half-way.
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
            faults.point("ledger.read_after_turn")
            # Only the rows of the turn's own load: in a ledger dlt wrote, an earlier version
            # with more calls, hits or citations than this one may have left rows behind.
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

    def _write(self, turn_id: str, rows: dict[str, list[dict[str, Any]]], deadline: float) -> None:
        """One transaction: make the tables if this process has not yet, then the turn.

        The tables are checked once per process and destination; if they vanish after that
        (a test dropped the schema, the file was deleted), the write makes them and runs again.
        """
        target = self.destination
        postgres = target.url is not None and target.url.startswith("postgresql")
        for attempt in (1, 2):
            # A DuckDB file that is not there yet is new, whatever this process made before.
            ready = target in _TABLES_MADE and (target.url is not None or target.path.exists())
            try:
                with writing(
                    target,
                    on_lock=lambda: self._busy(f"record turn {turn_id!r}"),
                    on_error=self._unreachable,
                    wait_s=max(0.0, deadline - time.monotonic()),
                ) as con:
                    if target.is_duckdb:
                        checkpoint_by_wal_size(con)
                    if not ready:
                        ensure_tables(con, self._dialect(), postgres=postgres)
                    write_turn(con, turn_id, rows, postgres=postgres)
            except Exception as exc:
                _TABLES_MADE.discard(target)
                if attempt == 1 and ready and is_missing_table(exc, duckdb_file=target.is_duckdb):
                    log.warning("the ledger tables in %s are gone: making them again", self.where)
                    continue
                raise
            _TABLES_MADE.add(target)
            return

    def _dialect(self) -> Dialect:
        """The SQL dialect to write DDL in: the database's, or PostgreSQL's for DuckDB (whose
        parser is PostgreSQL's, and which maps its types to the ones dlt gave DuckDB)."""
        if self.destination.url is None:
            from sqlalchemy.dialects import postgresql

            return postgresql.dialect()
        from sqlalchemy.engine import make_url

        return make_url(self.destination.url).get_dialect()()

    def _database_errors(self) -> tuple[type[Exception], ...]:
        """The driver's errors a write may raise (only the driver in use is imported)."""
        if self.destination.is_duckdb:
            import duckdb

            return (duckdb.Error,)
        from sqlalchemy.exc import SQLAlchemyError

        return (SQLAlchemyError,)

    @property
    def where(self) -> str:
        """The DuckDB file, or the database URL without its password."""
        return self.destination.where

    def _one_at_a_time(self) -> AbstractContextManager[None]:
        """On DuckDB, one ledger read or write at a time in this process (`_in_process`)."""
        return _in_process(self.path) if self.destination.is_duckdb else nullcontext()

    def _one_writer(self, deadline: float) -> AbstractContextManager[None]:
        """On DuckDB, the writers' lock file, waited for until ``deadline``."""
        if not self.destination.is_duckdb:
            return nullcontext()
        lock_path = self.path.with_name(self.path.name + ".lock")
        return one_writer(lock_path, max(0.0, deadline - time.monotonic()))

    @contextmanager
    def _reading(self) -> Iterator[SqlReader]:
        with (
            self._one_at_a_time(),
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
        """Another process held the DuckDB file (PostgreSQL never makes us wait for long)."""
        return LedgerError(
            f"could not {action}: another process is writing the ledger {self.where} "
            f"(DuckDB allows one writer per file; waited {self.lock_wait_s:g} s) — retry when "
            "it finishes"
        )


_TABLES_MADE: set[Destination] = set()
"""Destinations whose tables this process has made or found whole: later records skip the check."""

_THREAD_LOCKS: dict[Path, threading.RLock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextmanager
def _in_process(path: Path) -> Iterator[None]:
    """One ledger read or write at a time in this process (a server's request threads): DuckDB
    shuts readers out while one connection writes, and refuses a read-only connection to a file
    this process has open for writing. Held for the transaction alone, never around the work
    that made the turn."""
    with _THREAD_LOCKS_GUARD:
        lock = _THREAD_LOCKS.setdefault(path, threading.RLock())
    with lock:
        yield


@contextmanager
def one_writer(lock_path: Path, wait_s: float) -> Iterator[None]:
    """Hold ``lock_path`` exclusively: one ledger writer at a time, for one transaction.

    DuckDB's own lock would do for correctness, but a writer that finds the file held can
    only retry opening it (a whole database open each time); writers queue on this file
    instead, and meet DuckDB's lock only while a reader has the file open.

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
