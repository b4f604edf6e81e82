"""The ledger's tables, and a turn as rows of them and back.

One turn is spread over five tables (in the dataset ``ledger``), each keyed by its primary key
(a key of the data: no constraint enforces it, as none did when dlt made the tables):

- ``ledger_turns`` (``turn_id``): who asked what, the outcome, the output and replay input;
- ``ledger_llm_calls`` (``turn_id``, ``seq``): the model calls, ``seq`` = position in the turn;
- ``ledger_retrievals`` (``turn_id``, ``seq``): the gated retrievals, embedding included;
- ``ledger_retrieval_hits`` (``turn_id``, ``retrieval_seq``, ``rank``): each retrieval's hits,
  ``rank`` counting from 1;
- ``ledger_citations`` (``turn_id``, ``seq``): what the answer cited, with the turn's org, agent
  and time copied in so "who cited this document" is one table scan.

Nested values (output, messages, filters, scores, the embedding) are JSON text columns (as a
dlt load keeps them, in the row instead of in child tables); Python's JSON writes floats with
``repr``, so they read back bit for bit.
The column hints below are dlt's (``data_type``, ``nullable``): `sinks.ledger_loads` makes the
tables from them with the types dlt gave them.
"""

from __future__ import annotations

import json
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any, TypeVar

from core.errors import ConfigError
from core.models import Citation, LlmCall, RetrievalCall, RetrievedChunk, Turn

_Record = TypeVar("_Record", RetrievedChunk, RetrievalCall, LlmCall, Citation, Turn)

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
TABLES: dict[str, dict[str, Any]] = {
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
        "embedding_model": _column("text", nullable=True),
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


ADDED_COLUMNS: dict[str, tuple[str, ...]] = {
    RETRIEVALS_TABLE: ("embedding_model",),
}
"""Columns added after a table was first made: a ledger written before has none of them
(the next record adds them), and reads take NULL for them till then."""


PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    TURNS_TABLE: ("turn_id",),
    LLM_CALLS_TABLE: ("turn_id", "seq"),
    RETRIEVALS_TABLE: ("turn_id", "seq"),
    HITS_TABLE: ("turn_id", "retrieval_seq", "rank"),
    CITATIONS_TABLE: ("turn_id", "seq"),
}


def turn_to_rows(turn: Turn) -> dict[str, list[dict[str, Any]]]:
    """The rows ``turn`` takes in each table, by table name."""
    created_at = aware(turn.created_at, f"created_at of turn {turn.turn_id!r}").astimezone(UTC)

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
                "embedding_model": call.embedding_model,
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


def rows_to_turn(
    turn: dict[str, Any],
    llm_calls: list[dict[str, Any]],
    retrievals: list[dict[str, Any]],
    hits: list[dict[str, Any]],
    citations: list[dict[str, Any]],
) -> Turn:
    """The `Turn` its rows describe: the inverse of `turn_to_rows`."""
    hits_of: dict[int, list[RetrievedChunk]] = {}
    for hit in hits:
        hits_of.setdefault(hit["retrieval_seq"], []).append(
            _record(RetrievedChunk, hit, scores=json.loads(hit["scores"]))
        )
    return _record(
        Turn,
        turn,
        created_at=turn["created_at"].astimezone(UTC),
        output=json.loads(turn["output"]),
        replay_input=json.loads(turn["replay_input"]),
        retrievals=tuple(
            _record(
                RetrievalCall,
                row,
                gate_filter=json.loads(row["gate_filter"]),
                query_embedding=tuple(json.loads(row["query_embedding"])),
                hits=tuple(hits_of.get(row["seq"], ())),
            )
            for row in retrievals
        ),
        llm_calls=tuple(
            _record(LlmCall, row, messages=tuple(json.loads(row["messages"]))) for row in llm_calls
        ),
        citations=tuple(_record(Citation, row) for row in citations),
        delivered=None,  # what the agent received is never recorded
    )


def _record(cls: type[_Record], row: dict[str, Any], **decoded: Any) -> _Record:
    """A ledger dataclass from its row: each field read by name (a missing column is a bug and
    raises), ``decoded`` for the fields stored as JSON or built from other rows."""
    return cls(
        **{f.name: decoded[f.name] if f.name in decoded else row[f.name] for f in fields(cls)}
    )


def aware(value: datetime, what: str) -> datetime:
    """``value`` if it is timezone-aware; a ConfigError naming ``what`` if it is not."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ConfigError(
            f"{what} must be timezone-aware. Currently {value.isoformat()} — pass "
            "datetime.now(UTC) or attach a tzinfo"
        )
    return value
