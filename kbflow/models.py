"""Domain models shared by every layer: statuses, roles, documents, chunks, scopes and hits."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class DocStatus(StrEnum):
    """Review state of a document. Only APPROVED (or no status at all) is ever served."""

    PENDING_REVIEW = "pending_review"
    APPROVED = "approved"
    REJECTED = "rejected"
    SUPERSEDED = "superseded"


class ParseStatus(StrEnum):
    """How far a document got through ingestion. Only INGESTED and PARSED are served."""

    PENDING = "pending"
    PARSED = "parsed"
    INGESTED = "ingested"
    FAILED = "failed"


SERVABLE_PARSE_STATUSES: tuple[str, ...] = (ParseStatus.INGESTED.value, ParseStatus.PARSED.value)

# Legacy status values found in older registries, mapped forward by migration 0002.
LEGACY_STATUS_MAP: dict[str, str] = {
    "active": DocStatus.APPROVED.value,
    "draft": DocStatus.PENDING_REVIEW.value,
    "deprecated": DocStatus.SUPERSEDED.value,
}


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
    def from_payload(cls, payload: dict[str, Any]) -> Location | None:
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


@dataclass(frozen=True)
class ChunkPoint:
    """A chunk ready for the vector store: id, both vectors and the payload the gate filters on."""

    point_id: str
    dense: list[float]
    sparse: SparseVec
    payload: dict[str, Any]


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
    """

    org_id: str
    today: dt.date = field(default_factory=dt.date.today)
    audiences: tuple[str, ...] = ()
    collections: tuple[str, ...] | None = None


@dataclass(frozen=True)
class StoredHit:
    """What a vector store returns for one point."""

    point_id: str
    score: float
    payload: dict[str, Any]


@dataclass
class SearchHit:
    """One search result, ready for an agent or the CLI."""

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
    """

    cite_id: str
    title: str
    text: str
    source: str

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
    """A research run's request, in the original API's shape (camelCase or snake_case)."""

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


class ResearchDocumentOut(BaseModel):
    filename: str
    title: str
    content: str


class ResearchResponse(BaseModel):
    """A research run's outcome, in the original API's shape."""

    synthesis_run_id: str | None
    budget_exceeded: bool
    documents: list[ResearchDocumentOut] = Field(default_factory=list)
    consumed_tokens: int = 0
