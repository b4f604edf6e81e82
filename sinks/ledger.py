"""The answer ledger: every agent turn in DuckDB, loaded through dlt, and read back.

Turns live in ``<home>/warehouse/kbflow_ledger.duckdb`` (dataset ``ledger``), a file of their
own so a nightly eval writing the eval warehouse never blocks answers. The file is not called
``ledger.duckdb``: DuckDB names the catalog after the file, and a catalog named like the dataset
makes ``ledger.<table>`` ambiguous (dlt's second load into it fails). One turn is spread over
five tables, each merged on its primary key:

- ``ledger_turns`` (``turn_id``): who asked what, the outcome, the output and replay input;
- ``ledger_llm_calls`` (``turn_id``, ``seq``): the model calls, ``seq`` = position in the turn;
- ``ledger_retrievals`` (``turn_id``, ``seq``): the gated retrievals, embedding included;
- ``ledger_retrieval_hits`` (``turn_id``, ``retrieval_seq``, ``rank``): each retrieval's hits,
  ``rank`` counting from 1;
- ``ledger_citations`` (``turn_id``, ``seq``): what the answer cited, with the turn's org, agent
  and time copied in so "who cited this document" is one table scan.

Nested values (output, messages, filters, scores, the embedding) are JSON text columns, so dlt
keeps them in the row instead of exploding them into child tables; Python's JSON writes floats
with ``repr``, so they read back bit for bit.

What a failed load leaves: dlt loads one package per ``record`` but commits it table by table,
and notes it in ``_dlt_loads`` only once every table is in. A load that fails half-way can leave
some of the turn's rows written (and, for a turn recorded before, some of its old rows
replaced). Reads therefore skip every turn that holds a row from an unfinished load, and the
next ``record`` deletes such turns outright: they read as not found until recorded again.

DuckDB allows ONE writer process per file, and a writer also shuts readers out. Writers also
take ``<ledger file>.lock``, so two kbflow processes never share dlt's pipeline folder. Writers
and readers wait up to ``lock_wait_s``, then raise :class:`LedgerError`.

dlt and duckdb are imported inside the functions: together they take about a second to import,
which commands that never touch the ledger should not pay.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, LedgerError, NotFound
from core.models import Citation, LlmCall, RetrievalCall, RetrievedChunk, Turn
from sinks.warehouse import (
    drop_unfinished_loads,
    duckdb_pipeline,
    is_lock_error,
    read_only_connection,
    retry_while_locked,
    without_dlt_usage_tracking,
)

if TYPE_CHECKING:
    import duckdb

log = logging.getLogger(__name__)

PIPELINE_NAME = "kbflow_ledger"
DATASET_NAME = "ledger"
TURNS_TABLE = "ledger_turns"
LLM_CALLS_TABLE = "ledger_llm_calls"
RETRIEVALS_TABLE = "ledger_retrievals"
HITS_TABLE = "ledger_retrieval_hits"
CITATIONS_TABLE = "ledger_citations"


def _column(data_type: str, *, nullable: bool = False) -> dict[str, Any]:
    hint: dict[str, Any] = {"data_type": data_type, "nullable": nullable}
    if data_type == "timestamp":
        hint["timezone"] = True
    return hint


# Declared up front so every table has the same columns and types whatever the first turn
# holds (a turn without a policy would otherwise create no ``policy_id`` column at all).
_TABLES: dict[str, dict[str, Any]] = {
    TURNS_TABLE: {
        "turn_id": _column("text"),
        "kind": _column("text"),
        "org_id": _column("text"),
        "agent_id": _column("text"),
        "created_at": _column("timestamp"),
        "question": _column("text"),
        "outcome": _column("text"),
        "policy_id": _column("text", nullable=True),
        "policy_version": _column("text", nullable=True),
        "output": _column("text"),  # JSON
        "replay_input": _column("text"),  # JSON
    },
    LLM_CALLS_TABLE: {
        "turn_id": _column("text"),
        "seq": _column("bigint"),
        "purpose": _column("text"),
        "model": _column("text"),
        "prompt_version": _column("text"),
        "system": _column("text"),
        "messages": _column("text"),  # JSON
        "reply": _column("text", nullable=True),
        "error": _column("text", nullable=True),
        "attempts": _column("bigint"),
        "input_tokens": _column("bigint"),
        "output_tokens": _column("bigint"),
        "latency_ms": _column("double"),
    },
    RETRIEVALS_TABLE: {
        "turn_id": _column("text"),
        "seq": _column("bigint"),
        "query": _column("text"),
        "mode": _column("text"),
        "top_k": _column("bigint"),
        "gate_filter": _column("text"),  # JSON
        "query_embedding": _column("text"),  # JSON
        "degraded": _column("bool"),
        "paused": _column("bool"),
        "reason": _column("text", nullable=True),
        "latency_ms": _column("double"),
    },
    HITS_TABLE: {
        "turn_id": _column("text"),
        "retrieval_seq": _column("bigint"),
        "rank": _column("bigint"),
        "chunk_id": _column("text"),
        "doc_id": _column("text"),
        "uri": _column("text"),
        "title": _column("text"),
        "content_hash": _column("text"),
        "score": _column("double"),
        "scores": _column("text"),  # JSON
        "confidence": _column("double", nullable=True),
    },
    CITATIONS_TABLE: {
        "turn_id": _column("text"),
        "seq": _column("bigint"),
        "org_id": _column("text"),
        "agent_id": _column("text"),
        "created_at": _column("timestamp"),
        "chunk_id": _column("text"),
        "doc_id": _column("text"),
        "uri": _column("text"),
        "title": _column("text"),
        "quote": _column("text"),
    },
}
_PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    TURNS_TABLE: ("turn_id",),
    LLM_CALLS_TABLE: ("turn_id", "seq"),
    RETRIEVALS_TABLE: ("turn_id", "seq"),
    HITS_TABLE: ("turn_id", "retrieval_seq", "rank"),
    CITATIONS_TABLE: ("turn_id", "seq"),
}

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
_LOADS_TABLE = "_dlt_loads"  # dlt's record of finished loads


def ledger_path(home: Path) -> Path:
    """The DuckDB file the ledger lives in: ``<home>/warehouse/kbflow_ledger.duckdb``."""
    return home / "warehouse" / "kbflow_ledger.duckdb"


class Ledger:
    """The answer ledger under one kbflow home: record turns, read them back.

    Args:
        home: kbflow's data directory; the ledger is ``ledger_path(home)``.
        pipelines_dir: Where dlt keeps the pipeline's own state. Default: ``<home>/dlt``.
        lock_wait_s: How long a write or read waits for another process to release the file.

    Raises:
        ConfigError: ``lock_wait_s`` is negative.
    """

    def __init__(
        self, home: Path, *, pipelines_dir: Path | None = None, lock_wait_s: float = 10.0
    ) -> None:
        if lock_wait_s < 0:
            raise ConfigError(
                f"lock_wait_s must be 0 or more. Currently, the lock_wait_s is {lock_wait_s}"
            )
        self.path = ledger_path(home)
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
        tables = _turn_to_rows(turn)
        deadline = time.monotonic() + self.lock_wait_s
        started = time.perf_counter()
        import duckdb
        from dlt.pipeline.exceptions import PipelineStepFailed

        try:
            with _one_writer(self.path.with_name(self.path.name + ".lock"), self.lock_wait_s):
                retry_while_locked(
                    lambda: self._load(tables), wait_s=max(0.0, deadline - time.monotonic())
                )
        except BlockingIOError as exc:
            raise self._busy(f"record turn {turn.turn_id!r}") from exc
        except (PipelineStepFailed, duckdb.Error) as exc:
            if is_lock_error(exc):
                raise self._busy(f"record turn {turn.turn_id!r}") from exc
            cause = (
                f"dlt step {exc.step!r} failed: {_dlt_cause(exc.exception)}"
                if isinstance(exc, PipelineStepFailed)
                else str(exc)
            )
            raise LedgerError(
                f"could not record turn {turn.turn_id!r} in the ledger {self.path}: {cause} — "
                "fix the cause and record the turn again; recording the same turn id replaces "
                "its rows"
            ) from exc
        log.info(
            "recorded turn %s in %s: %s in %.2f s",
            turn.turn_id,
            self.path,
            {table: len(rows) for table, rows in tables.items()},
            time.perf_counter() - started,
        )

    def get_turn(self, turn_id: str) -> Turn:
        """The turn exactly as it was recorded (``created_at`` in UTC).

        Raises:
            NotFound: No turn with this id, its last record failed half-way, or no ledger yet.
            LedgerError: Another process held the ledger for longer than ``lock_wait_s``.
        """
        if not self.path.exists():
            raise NotFound(
                f"no turn {turn_id!r} in the ledger {self.path} — there is no ledger yet: "
                "nothing has been recorded under this home"
            )
        with self._reading() as con:
            tables = _ledger_tables(con)
            found = _rows(con, tables, TURNS_TABLE, "turn_id = ?", [turn_id])
            if not found:
                raise NotFound(
                    f"no turn {turn_id!r} in the ledger {self.path} — "
                    + (
                        "its last record failed half-way: record it again"
                        if _is_unfinished(con, tables, turn_id)
                        else "check the id (each answer returns its turn id); "
                        "`kbflow turns` lists recent turns"
                    )
                )
            turn = found[0]
            # Only the rows of the turn's own load: an earlier version recorded with more calls,
            # hits or citations than this one may have left its extra rows behind.
            where, params = "turn_id = ? AND _dlt_load_id = ?", [turn_id, turn["_dlt_load_id"]]
            llm_calls = _rows(con, tables, LLM_CALLS_TABLE, where, params, "seq")
            retrievals = _rows(con, tables, RETRIEVALS_TABLE, where, params, "seq")
            hits = _rows(con, tables, HITS_TABLE, where, params, "retrieval_seq, rank")
            citations = _rows(con, tables, CITATIONS_TABLE, where, params, "seq")
        return _rows_to_turn(turn, llm_calls, retrievals, hits, citations)

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
        if wanted_docs == [] or not self.path.exists():
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
            params.append(_aware(since, "since"))
        columns = [f'c."{column}"' for column in _CITATION_COLUMNS]
        columns += ['t."kind"', 't."question"', 't."outcome"']
        names = (*_CITATION_COLUMNS, "kind", "question", "outcome")
        with self._reading() as con:
            tables = _ledger_tables(con)
            if not _readable(tables) or CITATIONS_TABLE not in tables:
                return []
            where.append(f"t.turn_id NOT IN ({_unfinished_turns(tables)})")
            result = con.execute(
                f"SELECT {', '.join(columns)} FROM {DATASET_NAME}.{CITATIONS_TABLE} c"
                f" JOIN {DATASET_NAME}.{TURNS_TABLE} t ON t.turn_id = c.turn_id"
                f" WHERE {' AND '.join(where)} ORDER BY c.created_at DESC, c.turn_id, c.seq",
                params,
            ).fetchall()
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
        if not self.path.exists():
            return []
        where: list[str] = []
        params: list[Any] = []
        if org_id is not None:
            where.append("org_id = ?")
            params.append(org_id)
        if since is not None:
            where.append("created_at >= ?")
            params.append(_aware(since, "since"))
        columns = ", ".join(f'"{column}"' for column in _SUMMARY_COLUMNS)
        with self._reading() as con:
            tables = _ledger_tables(con)
            if not _readable(tables):
                return []
            where.append(f"turn_id NOT IN ({_unfinished_turns(tables)})")
            result = con.execute(
                f"SELECT {columns} FROM {DATASET_NAME}.{TURNS_TABLE}"
                f" WHERE {' AND '.join(where)} ORDER BY created_at DESC, turn_id LIMIT ?",
                [*params, limit],
            ).fetchall()
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

        pipeline = duckdb_pipeline(
            PIPELINE_NAME,
            database=self.path,
            dataset=DATASET_NAME,
            pipelines_dir=self.pipelines_dir,
        )
        resources = [
            dlt.resource(
                rows,
                name=table,
                write_disposition="merge",
                primary_key=_PRIMARY_KEYS[table],
                # Every table also merges on the turn, so recording a turn again with fewer
                # calls or hits deletes the old extra rows instead of keeping them.
                merge_key="turn_id",
                columns=_TABLES[table],
            )
            for table, rows in tables.items()
        ]
        with without_dlt_usage_tracking(pipeline):
            drop_unfinished_loads(pipeline, "ledger")
            _delete_unfinished_turns(self.path)
            pipeline.run(resources)

    @contextmanager
    def _reading(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with read_only_connection(
            self.path,
            on_lock=lambda: self._busy("read the ledger"),
            on_error=lambda exc: LedgerError(f"could not open the ledger {self.path}: {exc}"),
            wait_s=self.lock_wait_s,
        ) as con:
            yield con

    def _busy(self, action: str) -> LedgerError:
        return LedgerError(
            f"could not {action}: another process is writing the ledger {self.path} "
            f"(DuckDB allows one writer per file; waited {self.lock_wait_s:g} s) — retry when "
            "it finishes"
        )


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


def _turn_to_rows(turn: Turn) -> dict[str, list[dict[str, Any]]]:
    created_at = _aware(turn.created_at, f"created_at of turn {turn.turn_id!r}").astimezone(UTC)

    def to_json(value: Any, field: str) -> str:
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{field} of turn {turn.turn_id!r} is not JSON-ready: {exc} — convert it to "
                "dicts, lists, strings, numbers, booleans and None before recording"
            ) from exc

    key = {"turn_id": turn.turn_id}
    return {
        TURNS_TABLE: [
            {
                **key,
                "kind": turn.kind,
                "org_id": turn.org_id,
                "agent_id": turn.agent_id,
                "created_at": created_at,
                "question": turn.question,
                "outcome": turn.outcome,
                "policy_id": turn.policy_id,
                "policy_version": turn.policy_version,
                "output": to_json(turn.output, "output"),
                "replay_input": to_json(turn.replay_input, "replay_input"),
            }
        ],
        LLM_CALLS_TABLE: [
            {
                **key,
                "seq": seq,
                "purpose": call.purpose,
                "model": call.model,
                "prompt_version": call.prompt_version,
                "system": call.system,
                "messages": to_json(list(call.messages), f"messages of llm call {seq}"),
                "reply": call.reply,
                "error": call.error,
                "attempts": call.attempts,
                "input_tokens": call.input_tokens,
                "output_tokens": call.output_tokens,
                "latency_ms": call.latency_ms,
            }
            for seq, call in enumerate(turn.llm_calls)
        ],
        RETRIEVALS_TABLE: [
            {
                **key,
                "seq": seq,
                "query": call.query,
                "mode": call.mode,
                "top_k": call.top_k,
                "gate_filter": to_json(call.gate_filter, f"gate_filter of retrieval {seq}"),
                "query_embedding": to_json(
                    list(call.query_embedding), f"query_embedding of retrieval {seq}"
                ),
                "degraded": call.degraded,
                "paused": call.paused,
                "reason": call.reason,
                "latency_ms": call.latency_ms,
            }
            for seq, call in enumerate(turn.retrievals)
        ],
        HITS_TABLE: [
            {
                **key,
                "retrieval_seq": seq,
                "rank": rank,
                "chunk_id": hit.chunk_id,
                "doc_id": hit.doc_id,
                "uri": hit.uri,
                "title": hit.title,
                "content_hash": hit.content_hash,
                "score": hit.score,
                "scores": to_json(hit.scores, f"scores of hit {rank} of retrieval {seq}"),
                "confidence": hit.confidence,
            }
            for seq, call in enumerate(turn.retrievals)
            for rank, hit in enumerate(call.hits, start=1)
        ],
        CITATIONS_TABLE: [
            {
                **key,
                "seq": seq,
                "org_id": turn.org_id,
                "agent_id": turn.agent_id,
                "created_at": created_at,
                **citation.to_dict(),
            }
            for seq, citation in enumerate(turn.citations)
        ],
    }


def _rows_to_turn(
    turn: dict[str, Any],
    llm_calls: list[dict[str, Any]],
    retrievals: list[dict[str, Any]],
    hits: list[dict[str, Any]],
    citations: list[dict[str, Any]],
) -> Turn:
    hits_of: dict[int, list[RetrievedChunk]] = {}
    for hit in hits:
        hits_of.setdefault(hit["retrieval_seq"], []).append(
            RetrievedChunk(
                chunk_id=hit["chunk_id"],
                doc_id=hit["doc_id"],
                uri=hit["uri"],
                title=hit["title"],
                content_hash=hit["content_hash"],
                score=hit["score"],
                scores=json.loads(hit["scores"]),
                confidence=hit["confidence"],
            )
        )
    return Turn(
        turn_id=turn["turn_id"],
        kind=turn["kind"],
        org_id=turn["org_id"],
        agent_id=turn["agent_id"],
        created_at=turn["created_at"].astimezone(UTC),
        question=turn["question"],
        outcome=turn["outcome"],
        output=json.loads(turn["output"]),
        replay_input=json.loads(turn["replay_input"]),
        retrievals=tuple(
            RetrievalCall(
                query=row["query"],
                mode=row["mode"],
                top_k=row["top_k"],
                gate_filter=json.loads(row["gate_filter"]),
                query_embedding=tuple(json.loads(row["query_embedding"])),
                hits=tuple(hits_of.get(row["seq"], ())),
                degraded=row["degraded"],
                paused=row["paused"],
                reason=row["reason"],
                latency_ms=row["latency_ms"],
            )
            for row in retrievals
        ),
        llm_calls=tuple(
            LlmCall(
                purpose=row["purpose"],
                model=row["model"],
                prompt_version=row["prompt_version"],
                system=row["system"],
                messages=tuple(json.loads(row["messages"])),
                reply=row["reply"],
                error=row["error"],
                attempts=row["attempts"],
                input_tokens=row["input_tokens"],
                output_tokens=row["output_tokens"],
                latency_ms=row["latency_ms"],
            )
            for row in llm_calls
        ),
        citations=tuple(
            Citation(
                chunk_id=row["chunk_id"],
                doc_id=row["doc_id"],
                uri=row["uri"],
                title=row["title"],
                quote=row["quote"],
            )
            for row in citations
        ),
        policy_id=turn["policy_id"],
        policy_version=turn["policy_version"],
    )


def _ledger_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The tables of the ledger dataset (dlt creates a table only once rows arrive for it)."""
    found = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
        [DATASET_NAME],
    ).fetchall()
    return {name for (name,) in found}


def _readable(tables: set[str]) -> bool:
    """Whether any turn can be complete yet: some turns stored, and a load that finished."""
    return TURNS_TABLE in tables and _LOADS_TABLE in tables


def _unfinished_turns(tables: set[str]) -> str:
    """SQL for the ids of turns holding a row from a load dlt did not finish (see module doc).

    Only valid when some ledger table and ``_dlt_loads`` exist.
    """
    finished = f"SELECT load_id FROM {DATASET_NAME}.{_LOADS_TABLE} WHERE status = 0"
    return " UNION ".join(
        f"SELECT turn_id FROM {DATASET_NAME}.{table} WHERE _dlt_load_id NOT IN ({finished})"
        for table in _TABLES
        if table in tables
    )


def _is_unfinished(con: duckdb.DuckDBPyConnection, tables: set[str], turn_id: str) -> bool:
    if _LOADS_TABLE not in tables or not tables & _TABLES.keys():
        return False
    found = con.execute(
        f"SELECT count(*) FROM ({_unfinished_turns(tables)}) WHERE turn_id = ?", [turn_id]
    ).fetchone()
    return bool(found and found[0])


def _rows(
    con: duckdb.DuckDBPyConnection,
    tables: set[str],
    table: str,
    where: str,
    params: list[Any],
    order: str = "turn_id",
) -> list[dict[str, Any]]:
    """Rows of ``table`` that belong to finished turns, as dicts with ``_dlt_load_id``."""
    if not _readable(tables) or table not in tables:
        return []
    names = [*_TABLES[table], "_dlt_load_id"]
    columns = ", ".join(f'"{name}"' for name in names)
    result = con.execute(
        f"SELECT {columns} FROM {DATASET_NAME}.{table} WHERE {where}"
        f" AND turn_id NOT IN ({_unfinished_turns(tables)}) ORDER BY {order}",
        params,
    ).fetchall()
    return [dict(zip(names, values, strict=True)) for values in result]


def _delete_unfinished_turns(path: Path) -> None:
    """Delete every row of the turns failed loads left half-written.

    Such a turn cannot be repaired (its earlier version may be partly replaced), only recorded
    again. Runs under the writer lock, so no other load is in progress.
    """
    if not path.exists():
        return
    import duckdb

    with duckdb.connect(str(path)) as con:
        tables = _ledger_tables(con)
        present = [table for table in _TABLES if table in tables]
        if _LOADS_TABLE not in tables or not present:
            return
        # Listed first: deleting table by table would shrink the set half-way through.
        turn_ids = [turn_id for (turn_id,) in con.execute(_unfinished_turns(tables)).fetchall()]
        if not turn_ids:
            return
        con.execute("BEGIN TRANSACTION")
        for table in present:
            con.execute(
                f"DELETE FROM {DATASET_NAME}.{table} WHERE list_contains(?, turn_id)", [turn_ids]
            )
        con.execute("COMMIT")
    log.warning(
        "deleted %d turn(s) a failed record left half-written in %s: %s",
        len(turn_ids),
        path,
        turn_ids[:10],
    )


def _aware(value: datetime, what: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ConfigError(
            f"{what} must be timezone-aware. Currently {value.isoformat()} — pass "
            "datetime.now(UTC) or attach a tzinfo"
        )
    return value


def _dlt_cause(exc: BaseException) -> str:
    """What went wrong, in one line where dlt allows: a failed load job carries the whole
    traceback of its database error (``failed_message``), whose last line is the error."""
    traceback = getattr(exc, "failed_message", None)
    if isinstance(traceback, str) and traceback.strip():
        return traceback.strip().splitlines()[-1]
    return str(exc)
