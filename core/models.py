# Over 500 lines: the value types every layer shares, one vocabulary kept in one place.
"""Domain models shared by every layer: statuses, roles, documents, chunks, scopes and hits.

One module on purpose: the vocabulary every floor shares, so any domain type is in one place.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class DocStatus(StrEnum):
    """Review state of a document. Only APPROVED (or no status at all) is ever served."""

    PENDING_REVIEW = "pending_review"
    APPROVED = "approved"
    REJECTED = "rejected"
    SUPERSEDED = "superseded"
    WITHDRAWN = "withdrawn"  # taken out of service after approval (audited, with a note)


# Statuses a newer version of the same source retires (to superseded) once it is servable:
# at most one version of a source is ever servable. None is a legacy, status-less document.
RETIRABLE_STATUSES: tuple[str | None, ...] = (
    None,
    DocStatus.APPROVED.value,
    DocStatus.PENDING_REVIEW.value,
)


class ParseStatus(StrEnum):
    """How far a document got through ingestion. Only INGESTED and PARSED are served."""

    PENDING = "pending"
    PARSED = "parsed"
    INGESTED = "ingested"
    FAILED = "failed"


SERVABLE_PARSE_STATUSES: tuple[str, ...] = (ParseStatus.INGESTED.value, ParseStatus.PARSED.value)


class JobStatus(StrEnum):
    """State of a long-running ingest job."""

    PROCESSING = "PROCESSING"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


class AuditAction(StrEnum):
    """What an audit row records. Each review transition writes exactly one row."""

    CREATED = "kb.document.created"
    APPROVED = "kb.document.approved"
    REJECTED = "kb.document.rejected"
    EDITED_APPROVED = "kb.document.edited_approved"
    SUPERSEDED = "kb.document.superseded"
    WITHDRAWN = "kb.document.withdrawn"
    RESTORED = "kb.document.restored"  # a withdrawn document back in service, as a new version
    USER_SAVED = "kb.user.saved"
    AM_ASSIGNED = "kb.org.am_assigned"
    ORG_CREATED = "kb.org.created"
    AGENT_AUDIENCES = "kb.agent.audiences"
    ORG_RENAMED = "kb.org.renamed"
    COLLECTION_CREATED = "kb.collection.created"
    COLLECTION_DESCRIBED = "kb.collection.described"
    COLLECTION_MOVED = "kb.collection.moved"
    COLLECTION_DELETED = "kb.collection.deleted"
    AGENT_CREATED = "kb.agent.created"
    AGENT_COLLECTIONS = "kb.agent.collections"
    AGENT_SWITCHED = "kb.agent.knowledge_base"
    TOKEN_CREATED = "kb.token.created"
    TOKEN_REVOKED = "kb.token.revoked"
    DENIED = "kb.access.denied"
    PASSWORD_SET = "kb.user.password_set"
    LOGGED_IN = "kb.login.ok"
    LOGIN_FAILED = "kb.login.failed"
    LOGIN_LOCKED = "kb.login.locked"
    LOGGED_OUT = "kb.login.logged_out"
    REVIEW_CODE_ISSUED = "kb.review_code.issued"
    SOURCE_ADDED = "kb.source.added"
    SOURCE_UPDATED = "kb.source.updated"
    SOURCE_REMOVED = "kb.source.removed"
    SOURCE_WITHDRAW_CONFIRMED = "kb.source.withdraw_confirmed"
    REVIEW_CODE_USED = "kb.review_code.used"
    REVIEW_CODE_REFUSED = "kb.review_code.refused"


class Role(StrEnum):
    SUPERADMIN = "superadmin"
    ACCOUNT_MANAGER = "account_manager"
    EXPERT = "expert"
    ENGINEER = "engineer"


class SearchMode(StrEnum):
    """Retrieval engines. Every mode is gated; ``hybrid+rerank`` reranks the gated hybrid
    candidates (and falls back to their fused order when the reranker fails)."""

    HYBRID = "hybrid"
    DENSE = "dense"
    KEYWORD = "keyword"
    HYBRID_RERANK = "hybrid+rerank"


AUDIENCE_ALL = "all"


@dataclass(frozen=True)
class Location:
    """Where in its source a passage sits: page (PDF), slide (PPTX), sheet (XLSX) or a time
    range in seconds (audio, video). Unset fields do not apply to the format."""

    page: int | None = None
    slide: int | None = None
    sheet: str | None = None
    start_s: float | None = None
    end_s: float | None = None

    def to_payload(self) -> dict[str, Any]:
        """The set fields only, as stored in a chunk's payload."""
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Location | None:
        fields = {k: payload[k] for k in cls.__dataclass_fields__ if payload.get(k) is not None}
        return cls(**fields) if fields else None

    def describe(self) -> str:
        """A short human label: "p. 3", "slide 2", "sheet Sales", "00:01:05-00:01:12"."""
        parts: list[str] = []
        if self.page is not None:
            parts.append(f"p. {self.page}")
        if self.slide is not None:
            parts.append(f"slide {self.slide}")
        if self.sheet is not None:
            parts.append(f"sheet {self.sheet}")
        if self.start_s is not None:
            end = f"-{_clock(self.end_s)}" if self.end_s is not None else ""
            parts.append(f"{_clock(self.start_s)}{end}")
        return ", ".join(parts)


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


@dataclass(frozen=True)
class Section:
    """A run of text under one heading path, as extraction found it, and where it came from."""

    heading_path: tuple[str, ...]
    text: str
    location: Location | None = None


@dataclass(frozen=True)
class ExtractedDocument:
    """The text of one source, split into sections that keep their headings."""

    title: str
    uri: str
    sections: tuple[Section, ...]
    source_format: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "\n\n".join(s.text for s in self.sections)


@dataclass(frozen=True)
class Chunk:
    """One retrievable piece of a document."""

    chunk_id: str
    doc_id: str
    chunk_index: int
    text: str
    heading_path: tuple[str, ...] = ()
    location: Location | None = None

    @property
    def embed_text(self) -> str:
        """The text the models see: the heading path gives the chunk its context."""
        if not self.heading_path:
            return self.text
        return " > ".join(self.heading_path) + "\n" + self.text


@dataclass(frozen=True)
class SparseVec:
    indices: list[int]
    values: list[float]


class LocationPayload(TypedDict, total=False):
    """Where in its source a chunk sits, as `Location.to_payload` writes it into a
    `ChunkPayload`: each key only where the format has it."""

    page: int
    slide: int
    sheet: str
    start_s: float
    end_s: float


class ChunkPayload(LocationPayload):
    """The payload of one chunk's point in the vector store (Qdrant Edge or a Qdrant server):
    what the gate filters on and what a hit shows. One definition for every writer and reader.

    Built by `tasks.text.points.chunk_to_point` alone (ingest, an edit, a restore), its keys
    in the order listed here; the store copy (`kbflow store migrate`), backups and their
    restore copy points as they are. Afterwards only `PayloadPatch`'s keys change
    (`VectorStore.set_document_payload`, `set_vectors`, and the review machine's re-upsert
    of an edit's points with a new ``status``). Readers: search (`tasks.query.retrieve`), the
    reviewer's inspection path, research's seed corpus, the reconciler, re-embedding, the
    store copy and backups. A read through `VectorStore.iter_payloads` holds only the fields
    it named, and a ``with_payload=False`` query none: such readers use ``.get``.

    Keys every point has:
        org_id: the owning organisation's id (the tenant key of the payload indexes).
        collection_path: the document's collection and every ancestor, shortest first
            (``["a", "a/b"]``): the gate admits a collection and its descendants.
        doc_id: the registry document the chunk belongs to.
        chunk_id: the chunk's id (``<doc_id>:<index>``; an edit's ``<doc_id>@<hash12>:<index>``);
            the point id is its UUIDv5 (`sinks.vectors.point_id_for`).
        chunk_index: the chunk's position in its document, from 0.
        parse_status: the document's `ParseStatus` value (``ingested`` when written); the
            review machine and the reconciler set it to the registry's.
        title: the document's title.
        uri: where the document came from (a file URI, a URL, ``test://...``).
        content_hash: sha256 of the document content the chunk was cut from; chunks of other
            content than the registry's are stale (deleted, and never shown).
        heading_path: the headings above the chunk, outermost first (may be empty).
        text: the chunk's text, without its heading path.

    Keys a point may lack:
        embedding_model: the id of the model that made the dense vector (`Embedder.model_id`);
            points written before it was recorded lack it until `kbflow store reembed`, which
            sets it with the new vectors.
        status: the document's `DocStatus` value; absent for a document with no status (a legacy
            one), which the gate admits like ``approved``. Set by the review machine, which
            may write None for it (a status cleared in the registry).
        source_tag: where the document came from (`SourceTag`, or an ingest's free tag).
        synthesis_run_id: the research run that drafted the document.
        audience: who may read it (absent: everyone).
        effective_date: the document is hidden from searches of days before this one; an
            RFC 3339 UTC instant (`sinks.gate.format_datetime`).
        page, slide, sheet, start_s, end_s: where in its source the chunk sits
            (`LocationPayload`, declared there), each only where the format has it.
    """

    org_id: str
    collection_path: list[str]
    doc_id: str
    chunk_id: str
    chunk_index: int
    parse_status: str
    title: str
    uri: str
    content_hash: str
    heading_path: list[str]
    text: str
    embedding_model: NotRequired[str]
    status: NotRequired[str | None]
    source_tag: NotRequired[str]
    synthesis_run_id: NotRequired[str]
    audience: NotRequired[str]
    effective_date: NotRequired[str]


class PayloadPatch(TypedDict, total=False):
    """The `ChunkPayload` keys that change on stored points without rewriting them
    (`VectorStore.set_document_payload`, `VectorStore.set_vectors`); each as typed there."""

    status: str | None
    parse_status: str
    collection_path: list[str]
    embedding_model: str


if TYPE_CHECKING:

    def chunk_payload(raw: Mapping[str, Any], /) -> ChunkPayload:
        """A stored point's payload as the store hands it back, as a `ChunkPayload`."""

else:
    chunk_payload = dict
    """At run time the very ``dict`` call the stores made before (a copy, no checks): the
    search path pays nothing for the type."""


@dataclass(frozen=True)
class ChunkPoint:
    """A chunk ready for the vector store: id, both vectors and the payload the gate filters on."""

    point_id: str
    dense: list[float]
    sparse: SparseVec
    payload: ChunkPayload


@dataclass(frozen=True)
class Scope:
    """Who is asking, and so what they may see.

    Attributes:
        org_id: the caller's organisation; nothing from another org is ever returned.
        today: the effective date cut-off (documents effective later are hidden).
        audiences: audiences the caller belongs to; documents for audience "all" (or none) are
            always in scope.
        collections: collection paths the caller may read (a path admits its descendants);
            None means every collection of the org.
        all_audiences: the caller reads every audience (a superadmin); ``audiences`` is then
            ignored.
    """

    org_id: str
    today: dt.date = field(default_factory=dt.date.today)
    audiences: tuple[str, ...] = ()
    collections: tuple[str, ...] | None = None
    all_audiences: bool = False


@dataclass(frozen=True)
class StoredHit:
    """What a vector store returns for one point."""

    point_id: str
    score: float
    payload: ChunkPayload  # only the fields asked for, from `iter_payloads`; none unfetched
    legs: dict[str, float] = field(default_factory=dict)  # raw per-leg scores after fusion


@dataclass(frozen=True)
class SourceRef:
    """A source that a document cites with a tag in its text, as its Citations footer (or the
    research corpus) names it.

    Attributes:
        cite_id: the tag without its brackets: ``doc:<id>`` (an account manager's input),
            ``url:<url>`` (a fetched page) or ``search:<query>`` (a web search).
        title: the source's title, as the citing document's footer gives it.
        uri: where the source is, when known (the research corpus's URI of the input, or the
            page's URL); None otherwise.
    """

    cite_id: str
    title: str
    uri: str | None = None

    @property
    def tag(self) -> str:
        """The tag as it stands in the text: ``[doc:<id>]``."""
        return f"[{self.cite_id}]"

    def to_dict(self) -> dict[str, Any]:
        return {"tag": self.tag, "title": self.title, "uri": self.uri}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SourceRef:
        tag = str(d["tag"])
        cite_id = tag[1:-1] if tag.startswith("[") and tag.endswith("]") else tag
        uri = d.get("uri")
        return cls(cite_id=cite_id, title=str(d.get("title") or ""), uri=str(uri) if uri else None)


@dataclass
class SearchHit:
    """One search result, ready for an agent or the CLI.

    ``sources`` resolves the citation tags in ``text`` (``[doc:<id>]``, ``[url:…]``,
    ``[search:…]``) from the hit's own document's citations; a tag it cannot resolve is left
    out.
    """

    doc_id: str
    chunk_id: str
    title: str
    uri: str
    heading_path: list[str]
    text: str
    score: float
    collection: str
    scores: dict[str, float] = field(default_factory=dict)
    location: Location | None = None
    sources: list[SourceRef] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "doc_id": self.doc_id,
            "chunk_id": self.chunk_id,
            "title": self.title,
            "uri": self.uri,
            "heading_path": self.heading_path,
            "location": self.location.to_payload() if self.location else None,
            "collection": self.collection,
            "score": self.score,
            "scores": self.scores,
            "text": self.text,
            "sources": [s.to_dict() for s in self.sources],
        }


@dataclass
class RetrievalResult:
    """What retrieval returns: the hits, and whether they came from the normal path.

    Attributes:
        hits: the gated hits, best first (may be empty: a genuine "nothing matched").
        mode: the mode asked for.
        degraded: the vector engine failed and the keyword fallback served (fail open).
        paused: retrieval is switched off by configuration; ``hits`` is empty.
        reason: why it was degraded or paused, or why reranking fell back.
        reranked: the hits were reordered by a reranker.
    """

    hits: list[SearchHit]
    mode: SearchMode
    degraded: bool = False
    paused: bool = False
    reason: str | None = None
    reranked: bool = False

    @property
    def kb_context_provided(self) -> bool:
        """The hits are the knowledge base's real answer (not paused, not a fallback)."""
        return not self.paused and not self.degraded

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "degraded": self.degraded,
            "paused": self.paused,
            "kb_context_provided": self.kb_context_provided,
            "reranked": self.reranked,
            "reason": self.reason,
            "hits": [h.to_dict() for h in self.hits],
        }


# --- research & synthesis ------------------------------------------------------------------

KB_FILENAMES: tuple[str, ...] = (
    "brand-voice-playbook.md",
    "product-context.md",
    "compliance-notes.md",
    "key-contacts-extracted.md",
)


class SourceTag(StrEnum):
    """Where a registry document came from."""

    AM_FILE = "am_file"
    AM_URL = "am_url"
    AM_PROMPT = "am_prompt"
    AGENT_SYNTHESIS = "agent_synthesis"


# An account manager's seed inputs are research material: reviewers read them with
# `review show` / `seed list`; no search returns them, for anyone, whatever the audience.
NEVER_SERVED_SOURCE_TAGS: tuple[str, ...] = (
    SourceTag.AM_FILE.value,
    SourceTag.AM_URL.value,
    SourceTag.AM_PROMPT.value,
)


@dataclass(frozen=True)
class CorpusEntry:
    """One citable input to research.

    Attributes:
        cite_id: what a draft cites, without brackets: ``doc:<id>`` for AM inputs,
            ``url:<url>`` for fetched pages, ``search:<query>`` for web-search results.
        title: a short human title.
        text: the input's text (already extracted and bounded).
        source: ``am_file``, ``am_url``, ``am_prompt``, ``public_homepage``, ``public_x`` or
            ``public_search``.
        uri: where the input is (the seed document's URI, the page's URL, the search's URL);
            kept with the drafts that cite it. Empty when unknown.
    """

    cite_id: str
    title: str
    text: str
    source: str
    uri: str = ""

    @property
    def citation(self) -> str:
        return f"[{self.cite_id}]"


@dataclass(frozen=True)
class ResearchCorpus:
    """Everything a synthesizer may use, each entry citable by its id."""

    client_name: str
    entries: tuple[CorpusEntry, ...]

    def cite_ids(self) -> frozenset[str]:
        return frozenset(e.cite_id for e in self.entries)

    def render(self) -> str:
        """The corpus as one text, each entry headed by its citation id."""
        return "\n\n".join(f"{e.citation} {e.title}\n{e.text}" for e in self.entries)


@dataclass(frozen=True)
class DraftDocument:
    """One synthesized KB document (Markdown)."""

    filename: str
    title: str
    content: str


@dataclass(frozen=True)
class SynthesisResult:
    documents: tuple[DraftDocument, ...]
    consumed_tokens: int
    model: str


class AmInput(BaseModel):
    """One account-manager input as the research API receives it."""

    model_config = ConfigDict(populate_by_name=True)

    doc_id: str = Field(
        validation_alias=AliasChoices("docId", "doc_id"), serialization_alias="docId"
    )
    source: str = Field(description="am_file, am_url or am_prompt")
    title: str = ""
    snippet: str = ""


class ResearchRequest(BaseModel):
    """A research run's request; its ids read as camelCase or snake_case (``orgId`` or
    ``org_id``) and dump by alias as camelCase."""

    model_config = ConfigDict(populate_by_name=True)

    org_id: str = Field(
        validation_alias=AliasChoices("orgId", "org_id"), serialization_alias="orgId"
    )
    client_name: str = Field(
        validation_alias=AliasChoices("clientName", "client_name"), serialization_alias="clientName"
    )
    am_inputs: list[AmInput] = Field(default_factory=list)
    budget_cap_tokens: int = Field(200_000, gt=0)
    model: str | None = None


# --- answers, knowledge search and the ledger ------------------------------------------------


class AnswerStatus(StrEnum):
    """The tri-state verdict of a knowledge search, each with its steering text."""

    YES = "yes"
    MAYBE = "maybe"
    NO = "no"

    @property
    def steering(self) -> str:
        return _STEERING[self]


_STEERING: dict[AnswerStatus, str] = {
    AnswerStatus.YES: "The knowledge base answers this: answer from the synthesis and cite it.",
    AnswerStatus.MAYBE: "The knowledge base answers part of this: use the synthesis and "
    "research the gaps it names.",
    AnswerStatus.NO: "The knowledge base does not answer this: research it live.",
}


class MissReason(StrEnum):
    """Why a knowledge search came back with nothing usable."""

    STORE_EMPTY = "store_empty"  # the agent's scope holds no approved document at all
    DISABLED = "disabled"  # the agent's knowledge base is switched off
    PAUSED = "paused"  # retrieval is paused by configuration
    UNAVAILABLE = "unavailable"  # the search or the model could not be reached
    NO_RESULTS = "no_results"  # searched, nothing matched
    NOT_RELEVANT = "not_relevant"  # triage found no candidate relevant (instant miss)
    NO_MODEL = "no_model"  # the configured model cannot be used (no key)
    AUTH_FAILED = "auth_failed"  # the model's provider refused the key
    INVALID_REPLY = "invalid_reply"  # the model's reply stayed invalid after a repair


@dataclass(frozen=True)
class Citation:
    """One cited chunk: the id an answer cites, and where it came from."""

    chunk_id: str
    doc_id: str
    uri: str
    title: str = ""
    quote: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "chunk_id": self.chunk_id,
            "doc_id": self.doc_id,
            "uri": self.uri,
            "title": self.title,
            "quote": self.quote,
        }


@dataclass(frozen=True)
class LlmCall:
    """One model call as the ledger records it (offline synthesizers record theirs too).

    Attributes:
        purpose: ``triage``, ``synthesis``, ``repair`` or ``answer``.
        model: the model id (``extractive-v1`` for the offline synthesizer).
        prompt_version: the version of the prompt text the call used.
        system: the system prompt (never holds knowledge text).
        messages: the conversation sent, as ``{"role", "content"}`` dicts.
        reply: the model's text, or None when every attempt failed.
        error: the last error, when the call failed.
        attempts: requests made (1 + retries).
        input_tokens / output_tokens: from the provider's usage (0 offline).
        latency_ms: wall time of the call, retries included.
    """

    purpose: str
    model: str
    prompt_version: str
    system: str
    messages: tuple[dict[str, str], ...]
    reply: str | None
    error: str | None = None
    attempts: int = 1
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: float = 0.0


@dataclass(frozen=True)
class RetrievedChunk:
    """One gated hit as a retrieval record keeps it."""

    chunk_id: str
    doc_id: str
    uri: str
    title: str
    content_hash: str  # sha256 of the chunk text
    score: float
    scores: dict[str, float] = field(default_factory=dict)
    confidence: float | None = None


@dataclass(frozen=True)
class RetrievalCall:
    """One gated retrieval as the ledger records it."""

    query: str
    mode: str
    top_k: int
    gate_filter: dict[str, Any]  # the gate's conditions, as JSON
    query_embedding: tuple[float, ...]
    hits: tuple[RetrievedChunk, ...]
    degraded: bool = False
    paused: bool = False
    reason: str | None = None
    latency_ms: float = 0.0
    # The id of the embedding model that made ``query_embedding`` (`Embedder.model_id`); None
    # in turns recorded before the ledger kept it.
    embedding_model: str | None = None


@dataclass(frozen=True)
class Turn:
    """One ask/answer turn: everything needed to audit it and to replay its synthesis.

    Attributes:
        turn_id: unique id, returned to the caller.
        kind: ``ask`` (tri-state knowledge search) or ``answer``.
        org_id / agent_id: who asked.
        created_at: when (timezone-aware).
        question: the question, or the queries joined by newlines for ``ask``.
        outcome: ``yes`` / ``maybe`` / ``no`` for ``ask``; ``answered`` / ``refused`` for
            ``answer``.
        output: the result as returned to the caller (JSON-ready, already scrubbed).
        replay_input: what synthesis saw (the knowledge text, question, synthesizer and
            prompt version): replay re-runs synthesis on exactly this.
        retrievals / llm_calls / citations: the calls made and what was cited.
        policy_id / policy_version: the refusal policy, when the turn refused.
    """

    turn_id: str
    kind: str
    org_id: str
    agent_id: str
    created_at: dt.datetime
    question: str
    outcome: str
    output: dict[str, Any]
    replay_input: dict[str, Any]
    retrievals: tuple[RetrievalCall, ...] = ()
    llm_calls: tuple[LlmCall, ...] = ()
    citations: tuple[Citation, ...] = ()
    policy_id: str | None = None
    policy_version: str | None = None
    # The output as the asking agent receives it, when it differs from ``output`` (contact
    # data that approved documents hold, restored: `tasks.text.pii.Pseudonyms`). Never
    # recorded: the ledger keeps ``output``.
    delivered: dict[str, Any] | None = None
