"""What a knowledge model is: the `KnowledgeModel` Protocol (STYLE habit 4) and the values it
takes and gives (evidence, rebuilt documents, triage candidates, claims, syntheses).

Its two implementations: `tasks.answer.extractive` (offline, deterministic) and
`tasks.answer.claude`. Both see only what the caller gives them: chunks that passed the gate,
already PII-scrubbed. Each appends every call it makes to the turn's ``calls``, which the ledger
records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.models import AnswerStatus, LlmCall


@dataclass(frozen=True)
class Evidence:
    """One gated chunk a model may use, with its support for the question."""

    chunk_id: str
    doc_id: str
    uri: str
    title: str
    text: str
    confidence: float
    unit_scores: tuple[float, ...] = ()
    """MiniLM cosine of the question with each quotable unit of ``text``
    (`tasks.answer.quotes.units`), for the offline model's choice; recorded, so a replay needs
    no embedding. Empty for models that do not use it and turns recorded before it."""

    def to_dict(self) -> dict[str, Any]:
        out = {"chunk_id": self.chunk_id, "doc_id": self.doc_id, "uri": self.uri,
               "title": self.title, "text": self.text, "confidence": self.confidence}  # fmt: skip
        return out | ({"unit_scores": list(self.unit_scores)} if self.unit_scores else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Evidence:
        return cls(str(d["chunk_id"]), str(d["doc_id"]), str(d["uri"]), str(d["title"]),
                   str(d["text"]), float(d["confidence"]),
                   tuple(float(x) for x in d.get("unit_scores", ())))  # fmt: skip


@dataclass(frozen=True)
class KnowledgeDoc:
    """A rebuilt document for synthesis: its chunks in order, within the text budget.

    ``support`` maps each query to the best confidence of this document's chunks for it.
    ``truncated_chars`` counts what the budget cut (0 = complete).
    """

    doc_id: str
    title: str
    uri: str
    chunks: tuple[tuple[str, str], ...]  # (chunk_id, text)
    support: dict[str, float] = field(default_factory=dict)
    truncated_chars: int = 0

    def render(self) -> str:
        body = "\n".join(f"[chunk:{cid}] {text}" for cid, text in self.chunks)
        if self.truncated_chars:
            body += f"\n[… truncated: {self.truncated_chars} more characters not shown]"
        head = f'<document id="{self.doc_id}" title="{self.title}" uri="{self.uri}">'
        return f"{head}\n{body}\n</document>"

    def to_dict(self) -> dict[str, Any]:
        return {"doc_id": self.doc_id, "title": self.title, "uri": self.uri,
                "chunks": [list(c) for c in self.chunks], "support": dict(self.support),
                "truncated_chars": self.truncated_chars}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KnowledgeDoc:
        return cls(
            doc_id=str(d["doc_id"]),
            title=str(d["title"]),
            uri=str(d["uri"]),
            chunks=tuple((str(c[0]), str(c[1])) for c in d["chunks"]),
            support={str(k): float(v) for k, v in d["support"].items()},
            truncated_chars=int(d["truncated_chars"]),
        )


@dataclass(frozen=True)
class Candidate:
    """A candidate document for triage: what the triage sees of it."""

    doc_id: str
    title: str
    description: str
    support: float  # best confidence over its chunks and the queries


@dataclass(frozen=True)
class Claim:
    """One sentence of an answer and the chunk ids that support it.

    ``quote`` is the exact text of the first cited chunk the claim relies on, at ``spans``
    (offsets into that chunk's text as the model saw it; `tasks.answer.quotes`); ``computed``
    marks a superlative computed over a table's rows. Models before ``extractive-v3`` and
    ``knowledge-v2`` gave no quote.
    """

    text: str
    chunk_ids: tuple[str, ...]
    quote: str = ""
    spans: tuple[tuple[int, int], ...] = ()
    computed: bool = False
    unverified: str = ""
    """Why a model's claim carries no quote although the model gave one: the quote it gave is
    not text of the passage it cites (the claim then proves nothing: "maybe")."""
    proof: str = ""
    """The structure that proves the claim offline (`tasks.answer.proofs`: a table cell, a value
    in a sentence); empty for a claim that only quotes evidence, and for a model's claims."""


@dataclass(frozen=True)
class Synthesis:
    """A knowledge search's synthesis: the verdict, the text, the cited chunks with quotes."""

    status: AnswerStatus
    text: str
    citations: tuple[tuple[str, str], ...]  # (chunk_id, quote)


class KnowledgeModel(Protocol):
    """Triage, synthesis and cited answers over gated, scrubbed knowledge; every call a method
    makes is appended to ``calls``."""

    model_id: str
    prompt_version: str

    def triage(
        self, queries: Sequence[str], candidates: Sequence[Candidate], calls: list[LlmCall]
    ) -> list[int]:
        """Indices of the relevant candidates ([] = none is relevant)."""
        ...

    def synthesize(
        self, queries: Sequence[str], docs: Sequence[KnowledgeDoc], calls: list[LlmCall]
    ) -> Synthesis:
        """The verdict over ``docs`` for the queries, citing their chunks."""
        ...

    def answer(
        self, question: str, evidence: Sequence[Evidence], calls: list[LlmCall]
    ) -> list[Claim]:
        """Claims that each cite evidence; [] when the evidence does not answer."""
        ...

    def with_system(self, system: str | None) -> KnowledgeModel:
        """This model with ``system`` as the system prompt of its syntheses and answers (a
        replay's ``--prompt``; None or "" keeps its own). A model with no prompt returns
        itself."""
        ...
