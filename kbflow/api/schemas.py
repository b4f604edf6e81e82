"""What the routes take and answer, as pydantic models: the OpenAPI page's schemas.

Requests: the agent routes' bodies (the MCP server publishes ``answer``'s too); the admin
routes' bodies and forms live with their routers.

Responses: each route's ``response_model`` is the one check of what it answers, and the
route returns an instance of it, built from what the service returned. The models say what is
in it key for key, in the order the services write them, so an answer is what it was before it
had a model:

- every key a service writes is listed, with the type it has (a date the service writes as
  text stays ``str``: a ``datetime`` field would rewrite it; a float stays ``float`` and a
  count ``int``: a ``float`` field would turn ``1`` into ``1.0``);
- ``None`` is kept (no route excludes it), and no default fills a key the service left out;
- `ApiModel` forbids keys it does not name: a key nobody described never leaves the service
  (a service that starts writing one fails loudly, a 500, until its model says what it is).

The agent tool routes answer with the tools' own output models
(`kbflow.services.query.tool_models`), which are what ``kbflow tools schema`` and MCP publish.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kbflow.services.query.tool_models import (
    CitationOut,
    MissOut,
    ResearchInput,
    SearchInput,
    SourceOut,
)
from tasks.answer.confidence import QueryForm

MAX_QUESTION_CHARS = 2000


class ApiModel(BaseModel):
    """A response model: the keys it names are checked, and no other may go out."""

    model_config = ConfigDict(extra="forbid")


# --- agent requests ----------------------------------------------------------------------------


class SearchBody(SearchInput):
    """``search_knowledge_base``'s arguments, as strict as the tool's own check: ``true`` or
    ``5.0`` is not a ``top_k``."""

    model_config = ConfigDict(extra="forbid", strict=True)


class AskBody(ResearchInput):
    """``research_knowledge_search``'s arguments, as strict as the tool's own check."""

    model_config = ConfigDict(extra="forbid", strict=True)


class AnswerBody(BaseModel):
    """A question for the agent's knowledge base."""

    model_config = ConfigDict(extra="forbid", strict=True)

    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)


# --- agent answers -----------------------------------------------------------------------------


class AskResponse(ApiModel):
    """``research_knowledge_search``'s result (`kbflow.services.query.answers.ask`): the tool's
    published output (turn_id, answer_status, steering, synthesis, citations, miss) and the
    rest of the recorded turn, in the order the turn writes them."""

    turn_id: str
    kind: Literal["ask"]
    agent: str
    queries: list[str]
    answer_status: Literal["yes", "maybe", "no"]
    steering: str
    synthesis: str
    citations: list[CitationOut]
    miss: MissOut | None
    candidates: int = Field(description="Documents considered.")
    chosen: list[str] = Field(description="The ids of the documents the synthesis read.")
    triage: str | None = Field(description='"ok", or "failed open: <why>".')
    degraded: bool
    model: str | None = Field(description="The knowledge model (None: no model configured).")
    query_form: QueryForm = Field(description="The query form whose threshold was used.")


class AnswerCitationOut(CitationOut):
    """A cited chunk of an answer, with where its quote sits."""

    model_config = ConfigDict(extra="forbid")

    quote_spans: list[list[int]] | None = Field(
        default=None,
        description="Where `quote` sits in the cited chunk's text: [start, end] offsets, one "
        "pair per quoted line (a table row comes with its header line first).",
    )


class ClaimOut(ApiModel):
    text: str
    citations: list[AnswerCitationOut]


class ConsideredOut(ApiModel):
    """A retrieved chunk a refusal weighed, with its confidence."""

    chunk_id: str
    uri: str
    confidence: float


class RefusalOut(ApiModel):
    """Why an answer was refused, and the policy that refused it."""

    policy_id: str
    policy_version: str
    reason: str
    evidence: list[dict[str, Any]]
    considered: list[ConsideredOut]


class AnswerResponse(ApiModel):
    """A cited answer (each claim with its citations) or a refusal, as recorded in the
    ledger (`kbflow.services.query.answers.answer`)."""

    turn_id: str
    kind: Literal["answer"]
    agent: str
    question: str
    status: Literal["answered", "maybe", "refused"] = Field(
        description='"answered": a quote holds the answer; "maybe": the closest evidence, and '
        '`missing` says what no quote holds; "refused": no chunk reached the threshold.'
    )
    answer: str
    claims: list[ClaimOut]
    citations: list[AnswerCitationOut]
    refusal: RefusalOut | None
    missing: str | None = Field(
        default=None, description='For "maybe": what the quoted evidence lacks.'
    )
    threshold: float = Field(description="The confidence a chunk needs to be used.")
    best_confidence: float | None = Field(description="The best retrieved chunk's confidence.")
    degraded: bool
    support: str = Field(description="The signal the confidences come from.")
    model: str | None
    query_form: QueryForm = Field(description="The question's form, whose threshold was used.")


# --- documents and their review ----------------------------------------------------------------


class DocumentOut(ApiModel):
    """A document's registry record (`sinks.registry.DocRecord.to_dict`); times and dates are
    ISO 8601 text."""

    id: str
    org_id: str
    collection_path: str
    source_key: str
    title: str
    uri: str
    content_hash: str
    version: int
    status: str | None = Field(
        description="pending_review, approved, rejected, superseded or withdrawn."
    )
    source_tag: str | None
    synthesis_run_id: str | None
    audience: str | None
    effective_date: str | None
    parse_status: str
    chunk_count: int
    created_at: str
    updated_at: str
    approved_by: str | None
    approved_at: str | None
    rejected_by: str | None
    rejected_at: str | None
    edited_by: str | None
    edited_at: str | None
    citations: list[SourceOut] = Field(description="The sources its Citations footer names.")


class DraftRun(ApiModel):
    """The drafts of one research run (``synthesis_run_id`` None: documents of no run)."""

    synthesis_run_id: str | None
    documents: list[DocumentOut]


class DraftsResponse(ApiModel):
    org: str
    runs: list[DraftRun]


class DocumentView(ApiModel):
    """A document's record and its full stored text, chunk by chunk."""

    document: DocumentOut
    chunks: list[str]
    text: str


class AuditEntry(ApiModel):
    """One audit row (`sinks.registry.audit.audit_dict`)."""

    id: int
    at: str | None
    actor: str
    action: str
    org_id: str | None
    doc_id: str | None
    synthesis_run_id: str | None
    source_tag: str | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None


# --- seeds, jobs, provenance -------------------------------------------------------------------


class SeedSkipped(ApiModel):
    source: str
    reason: str


class SeedResult(ApiModel):
    """What a seed bundle stored (`kbflow.services.research.seeds.seed`)."""

    org: str
    stored: int = Field(description="New inputs stored.")
    doc_ids: list[str]
    skipped: list[SeedSkipped]


class JobAccepted(ApiModel):
    """202: the background job started (or queued), to follow at the ``Location`` given."""

    job_id: str
    kind: str
    status: str
    org: str
    queued: bool = Field(description="It waits for a slot (KBFLOW_JOBS_MAX_RUNNING...).")
    queue_position: int | None = Field(description="Its place in the queue (1: next).")


class UploadAccepted(JobAccepted):
    """202 for an upload: the job, and the file as stored."""

    file: str = Field(description="The name the file is stored under.")
    type: str = Field(description="How it is read (its kind).")


class JobOut(ApiModel):
    """A background job (`kbflow jobs status`): its files by name, no server paths."""

    id: str
    kind: str
    status: str = Field(description="PROCESSING, COMPLETE or FAILED.")
    org: str
    created_at: str
    finished_at: str | None
    error: str | None = Field(description="Why it FAILED.")
    note: str | None
    flow_run_id: str | None
    files: list[str]
    params: dict[str, Any]
    result: dict[str, Any] | None = Field(description="The ingest or research report.")
    # Research jobs only: the route leaves it out of the others (response_model_exclude_unset).
    synthesis_run_id: str | None = Field(None, description="Research jobs only.")
    progress: dict[str, Any] | None = Field(
        None,
        description="Research jobs only: the stage a running run is in ({stage: reading, "
        "fetching, synthesising or saving; done and total where it counts steps}); null once "
        "it has ended.",
    )
    queued: bool
    queue_position: int | None


class ProvenanceRow(ApiModel):
    """One citation in a recorded answer, and whether its document still stands."""

    turn_id: str
    created_at: dt.datetime
    org_id: str
    agent_id: str
    chunk_id: str
    doc_id: str
    uri: str
    title: str
    quote: str
    kind: str = Field(description="ask or answer.")
    question: str
    outcome: str
    doc_status: str | None
    stale: str | None = Field(description="Why the answer needs revisiting (None: it does not).")


# --- health ------------------------------------------------------------------------------------


class Health(ApiModel):
    status: Literal["ok"]


class Readiness(ApiModel):
    status: Literal["ready", "degraded"]
    vector_store: Literal["open", "unavailable"]
    shared: bool = Field(description="Local processes reach the embedded store through this one.")


class ReviewCodeOut(ApiModel):
    """A one-time review code (shown once): it signs the decisions a program sends to a paused
    review run (`tasks.review.codes.sign_decisions`); the code itself is never sent there."""

    code: str = Field(description="The code, e.g. ABCD-EFGH-JKMN: once, for 15 minutes.")
    user_id: str = Field(description="Who it proves: the caller.")
    org_id: str
    flow_run_id: str | None = Field(None, description="The one run it is bound to, if any.")
    expires_at: str = Field(description="When it stops working (ISO 8601, UTC).")
