"""The JSON the query services return, as typed dicts: the agent tools' results, the turns an
agent gets (`answers.ask`, `answers.answer`), what the ledger reads back (`answers.turns`,
`answers.provenance`) and `kbflow search --json` (`search.SearchOutcome.to_dict`).

Types only, for the reader and the type checker: the values are the plain dicts every surface
serializes as they are (the HTTP routes' response models and the tools' output schemas say the
same keys in `kbflow.api.schemas` and `tool_models`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal, NotRequired, TypedDict

JsonSchema = dict[str, Any]
"""A JSON Schema document (a tool's arguments or result, `tool_models.tool_schema`): free-form
JSON by nature, so no typed dict describes it."""


class SourceJson(TypedDict):
    """What a citation tag in a text stands for (`core.models.SourceRef.to_dict`)."""

    tag: str
    title: str
    uri: str | None


# --- the tools -------------------------------------------------------------------------------


class CollectionJson(TypedDict):
    """A collection an agent may read (`tool_models.CollectionOut`)."""

    id: int
    name: str
    description: str
    parent_id: int | None


class CollectionsListed(TypedDict):
    """``list_knowledge_collections``'s result (`tool_models.ListOutput`)."""

    agent: str
    knowledge_base_enabled: bool
    collections: list[CollectionJson]


class PassageJson(TypedDict):
    """One cited passage of ``search_knowledge_base`` (`tool_models.SearchHitOut`)."""

    doc_id: str
    chunk_id: str
    title: str
    uri: str
    collection: str
    heading_path: list[str]
    location: dict[str, Any] | None  # `core.models.Location.to_payload`: its set fields
    text: str
    score: float
    sources: list[SourceJson]


class PassagesFound(TypedDict):
    """``search_knowledge_base``'s result (`tool_models.SearchOutput`)."""

    agent: str
    query: str
    collection_id: int | None
    results: list[PassageJson]
    kb_context_provided: bool
    degraded: bool
    paused: bool
    note: str | None


class ToolExport(TypedDict):
    """A tool as ``kbflow tools schema`` publishes it."""

    name: str
    description: str
    input_schema: JsonSchema
    output_schema: JsonSchema


# --- agent turns -----------------------------------------------------------------------------


class CitedChunk(TypedDict):
    """A chunk a turn cites, with what the citation tags in it stand for."""

    chunk_id: str
    doc_id: str
    uri: str
    title: str
    quote: str
    sources: list[SourceJson]


class AnswerCitation(CitedChunk):
    """A chunk an answer cites; ``quote_spans``: where the claim's quote sits in its text."""

    quote_spans: NotRequired[list[list[int]]]


class MissJson(TypedDict):
    """Why the knowledge base could not answer (``answer_status`` "no" or "maybe")."""

    reason: str
    detail: str


class AskTurn(TypedDict):
    """A knowledge search as the agent gets it (`answers.ask`, ``research_knowledge_search``)."""

    turn_id: str
    kind: Literal["ask"]
    agent: str
    queries: list[str]
    answer_status: Literal["yes", "maybe", "no"]
    steering: str
    synthesis: str
    citations: list[CitedChunk]
    miss: MissJson | None
    candidates: int
    chosen: list[str]
    triage: str | None
    degraded: bool
    model: str | None
    query_form: str | None


class ClaimJson(TypedDict):
    text: str
    citations: list[AnswerCitation]


class ConsideredJson(TypedDict):
    """A retrieved chunk a refusal weighed, with its confidence."""

    chunk_id: str
    uri: str
    confidence: float


class RefusalJson(TypedDict):
    """Why an answer was refused, and the policy that refused it."""

    policy_id: str
    policy_version: str
    reason: str
    evidence: list[Any]
    considered: list[ConsideredJson]


class AnswerTurn(TypedDict):
    """A cited answer or a refusal as the agent gets it (`answers.answer`)."""

    turn_id: str
    kind: Literal["answer"]
    agent: str
    question: str
    status: Literal["answered", "maybe", "refused"]
    answer: str
    claims: list[ClaimJson]
    citations: list[AnswerCitation]
    refusal: RefusalJson | None
    threshold: float
    best_confidence: float | None
    degraded: bool
    support: str
    model: str | None
    missing: str | None
    query_form: str | None


# --- the ledger ------------------------------------------------------------------------------


class TurnSummary(TypedDict):
    """A recorded turn, summed up (`sinks.ledger.Ledger.turns`)."""

    turn_id: str
    created_at: dt.datetime
    kind: str
    org_id: str
    agent_id: str
    question: str
    outcome: str


class CitingAnswer(TypedDict):
    """A recorded answer's citation of a document (`sinks.ledger.Ledger.citations`), and
    whether it needs revisiting: ``stale`` says why (None: it still holds)."""

    turn_id: str
    created_at: dt.datetime
    org_id: str
    agent_id: str
    chunk_id: str
    doc_id: str
    uri: str
    title: str
    quote: str
    kind: str
    question: str
    outcome: str
    doc_status: str | None
    stale: str | None


# --- kbflow search ---------------------------------------------------------------------------


class HitJson(TypedDict):
    """A search hit (`core.models.SearchHit.to_dict`)."""

    doc_id: str
    chunk_id: str
    title: str
    uri: str
    heading_path: list[str]
    location: dict[str, Any] | None
    collection: str
    score: float
    scores: dict[str, float]
    text: str
    sources: list[SourceJson]


class SearchJson(TypedDict):
    """What ``kbflow search --json`` prints: the query, the org searched, and the result
    (`core.models.RetrievalResult.to_dict`)."""

    query: str
    org: str | None
    mode: str
    degraded: bool
    paused: bool
    kb_context_provided: bool
    reranked: bool
    reason: str | None
    hits: list[HitJson]


ToolResult = CollectionsListed | PassagesFound | AskTurn
"""What one of the agent's tools returns (`tools.TOOLS`)."""
