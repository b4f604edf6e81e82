"""What every agent turn shares: the answer settings, the refusal policy record, retrieval with
support scores, the citation check, and the scrubbed `Turn` that the ledger records.

The turns themselves: `tasks.answer.knowledge_search` (``research_knowledge_search``, the
tri-state verdict) and `tasks.answer.cited_answer` ("no chunk, no answer"); `tasks.answer.replay`
re-runs either one's synthesis from the ledger.

`TurnRecorder` is one turn as it runs: the setup both turns share and what the ledger records.

Every chunk text, question and query is PII-scrubbed before a model sees it (retrieval, which
stays in the process, uses the raw text), so the recorded replay input is exactly what
synthesis saw and no personal data reaches a model provider; outputs are scrubbed again. Every
citation is checked against the registry before it is returned: the chunk exists, belongs to
its document's current content, and the document passes the gate for this scope (approved,
effective, in an allowed collection).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from core.errors import ConfigError
from core.models import (
    Citation,
    LlmCall,
    RetrievalCall,
    RetrievalResult,
    RetrievedChunk,
    Scope,
    SearchMode,
    Turn,
)
from sinks.gate import build_gate
from sinks.registry import SqlRegistry
from tasks.answer.confidence import (
    QUERY_FORMS,
    SUPPORT_VERSION,
    QueryForm,
    TermStats,
    query_form,
    support_scores,
)
from tasks.answer.contract import KnowledgeModel
from tasks.query.bounds import CheckedQuery, query_text
from tasks.text.citations import cited_sources
from tasks.text.embed import Embedder
from tasks.text.pii import Pseudonyms, map_strings, scrub, scrub_payload

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Policy:
    """A refusal policy: its id and version are recorded on every refusal it causes."""

    id: str
    version: str
    explains: str


RetrieveFn = Callable[[str | CheckedQuery, Scope, int], RetrievalResult]
"""Retrieval for a turn: the query (a `CheckedQuery` when the turn was handed one by the
service that checked it, to be taken as it is; else the plain text), the scope, top_k."""


@dataclass(frozen=True)
class AnswerConfig:
    """How answers and knowledge searches retrieve and judge evidence.

    Attributes:
        threshold: the support (support-v2) a chunk needs to count as evidence
            (``KBFLOW_ANSWER_MIN_CONFIDENCE``, calibrated on SciFact and the question set:
            docs/ANSWERS.md); the default for a query form without an entry in
            ``thresholds``. A turn's config has its query's (`for_query`), which it records.
        top_k: chunks retrieved per query.
        max_evidence: evidence chunks an answer may use.
        mode: the retrieval mode.
        reveal_contacts: give the asking agent the e-mail addresses and phone numbers that its
            evidence holds (``KBFLOW_AGENT_CONTACT_DATA=reveal``); models, the ledger and
            logs see placeholders either way.
        thresholds: the threshold of each query form (`tasks.answer.confidence.query_form`:
            ``question``, ``claim``, ``keywords``; ``KBFLOW_ANSWER_MIN_CONFIDENCE_<FORM>``);
            a form without an entry gets ``threshold``.
        form: the query form ``threshold`` was chosen for (`for_query`); None until then.
        floor: below ``threshold``, the support down to which the offline model still hands
            the closest passages over as unproven evidence (a "maybe" that says so) instead of
            refusing (``KBFLOW_ANSWER_EVIDENCE_FLOOR``); None: refuse below ``threshold``.
    """

    threshold: float
    top_k: int = 8
    max_evidence: int = 5
    mode: SearchMode = SearchMode.HYBRID
    reveal_contacts: bool = False
    thresholds: Mapping[str, float] = field(default_factory=dict, hash=False)
    form: QueryForm | None = None
    floor: float | None = None

    def __post_init__(self) -> None:
        for name, value in {"": self.threshold, **self.thresholds}.items():
            if not -1.0 <= value <= 1.0:
                raise ConfigError(
                    f"the confidence threshold{' for ' + name if name else ''} is a cosine in "
                    f"[-1, 1]. Currently {value}."
                )
        unknown = sorted(set(self.thresholds) - set(QUERY_FORMS))
        if unknown:
            raise ConfigError(
                f"thresholds are per query form ({', '.join(QUERY_FORMS)}). Currently also "
                f"{', '.join(unknown)}."
            )
        if self.top_k <= 0 or self.max_evidence <= 0:
            raise ConfigError(
                f"top_k and max_evidence must be greater than 0. Currently {self.top_k} and "
                f"{self.max_evidence}."
            )

    def threshold_for(self, query: str) -> float:
        """The support a chunk needs to be evidence for ``query``: its form's threshold."""
        return self.thresholds.get(query_form(query), self.threshold)

    def for_query(self, *queries: str) -> AnswerConfig:
        """This config with ``threshold`` (and ``form``) chosen for a turn over ``queries``.

        One query: its form's threshold. Several (a knowledge search): the lowest of their
        forms' thresholds, the first query's form on a tie, so a candidate that one query's
        form would keep is kept. A turn records ``threshold`` and ``form``; replay uses the
        recorded threshold.
        """
        if not queries:
            raise ConfigError("for_query needs at least one query. Currently none.")
        form = min(
            (query_form(q) for q in queries), key=lambda f: self.thresholds.get(f, self.threshold)
        )
        return replace(self, threshold=self.thresholds.get(form, self.threshold), form=form)


@dataclass(frozen=True)
class Retrieved:
    """One retrieval of a turn: its result, its ledger record, and each hit's support."""

    result: RetrievalResult
    call: RetrievalCall
    confidence: list[float]  # per hit


def new_turn_id() -> str:
    return "turn_" + uuid.uuid4().hex[:20]


def chunk_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def retrieve_and_score(
    query: str | CheckedQuery,
    scope: Scope,
    retrieve_fn: RetrieveFn,
    registry: SqlRegistry,
    embedder: Embedder,
    config: AnswerConfig,
) -> Retrieved:
    """Retrieve ``query`` for ``scope`` and score each hit's support (`support_scores`).

    ``retrieve_fn`` gets ``query`` as it came (a `CheckedQuery` goes to retrieval as it is);
    the support scores and the ledger's record take its text."""
    started = time.perf_counter()
    result = retrieve_fn(query, scope, config.top_k)
    text = query_text(query)
    query_vector = embedder.embed_query(text)
    stats = TermStats.of_org(scope.org_id, registry)
    confidence = support_scores(text, query_vector, result.hits, embedder, stats)
    call = RetrievalCall(
        query=text,
        mode=result.mode.value,
        top_k=config.top_k,
        gate_filter=build_gate(scope).describe(),
        query_embedding=tuple(float(x) for x in query_vector),
        hits=tuple(
            RetrievedChunk(
                chunk_id=h.chunk_id,
                doc_id=h.doc_id,
                uri=h.uri,
                title=h.title,
                content_hash=chunk_hash(h.text),
                score=float(h.score),
                scores={k: float(v) for k, v in h.scores.items()},
                confidence=round(c, 6),
            )
            for h, c in zip(result.hits, confidence, strict=True)
        ),
        degraded=result.degraded,
        paused=result.paused,
        reason=result.reason,
        latency_ms=round((time.perf_counter() - started) * 1000, 1),
        embedding_model=embedder.model_id,
    )
    return Retrieved(result, call, confidence)


def verify_citations(
    registry: SqlRegistry, scope: Scope, chunk_ids: Sequence[str]
) -> dict[str, Citation]:
    """The cited chunks that may be served to ``scope``, as citations; others are left out.

    A chunk qualifies when the registry knows it, it belongs to its document's current content,
    and the document passes the gate (approved, this org, effective, allowed collection).
    """
    gate = build_gate(scope)
    owners = registry.chunks.chunk_owners(chunk_ids)
    out: dict[str, Citation] = {}
    for cid in chunk_ids:
        found = owners.get(cid)
        if found is None:
            log.warning("citation of unknown chunk %s dropped", cid)
            continue
        doc, current = found
        if not current or not gate.admits(doc.gate_record()):
            log.warning("citation of chunk %s dropped: its document %s is not served", cid, doc.id)
            continue
        out[cid] = Citation(chunk_id=cid, doc_id=doc.id, uri=doc.uri, title=doc.title)
    return out


def citation_sources(
    registry: SqlRegistry, citations: Iterable[Citation], texts: Mapping[str, str]
) -> dict[str, list[dict[str, Any]]]:
    """For each (already verified) citation, by chunk id: the sources that the citation tags
    in its chunk's text (``texts``) stand for, from its document's own Citations footer
    (`tasks.text.citations.cited_sources`: a tag's id is never looked up)."""
    cited = list(citations)
    docs = registry.documents.get_documents(c.doc_id for c in cited)
    return {
        c.chunk_id: [
            s.to_dict() for s in cited_sources(texts.get(c.chunk_id, ""), docs[c.doc_id].citations)
        ]
        if c.doc_id in docs
        else []
        for c in cited
    }


def served_citation(
    citation: Citation, sources: Mapping[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """A citation as a turn's output gives it: its fields and the sources its chunk cites."""
    return citation.to_dict() | {"sources": sources.get(citation.chunk_id, [])}


def model_text(config: AnswerConfig) -> tuple[Callable[[str], str], Pseudonyms | None]:
    """How knowledge text is cleaned before a model sees it, and the pseudonyms to restore.

    Always scrubbed (`scrub`); with ``reveal_contacts``, contact data gets numbered
    placeholders that `TurnRecorder.record` restores in what the agent receives.
    """
    if not config.reveal_contacts:
        return scrub, None
    pseudonyms = Pseudonyms()
    return pseudonyms.mask, pseudonyms


@dataclass
class TurnRecorder:
    """One agent turn as it runs: the setup every turn shares, and what the ledger records.

    Made as a turn starts (`tasks.answer.knowledge_search`, `tasks.answer.cited_answer`): a new
    turn id, and how knowledge text is cleaned before a model sees it (`model_text`). While the
    turn runs it keeps each retrieval (`retrieve`: the query, its embedding, the gate filter,
    the hits with their support) and each model call (models append to ``calls``); `record`
    makes the scrubbed `Turn` the ledger records.
    """

    kind: str  # "ask" (knowledge search) or "answer" (cited answer)
    question: str  # as the ledger records it (a knowledge search: its queries, one a line)
    org_id: str
    agent_id: str
    model: KnowledgeModel | None
    retrieve_fn: RetrieveFn
    registry: SqlRegistry
    embedder: Embedder
    config: AnswerConfig
    turn_id: str = field(default_factory=new_turn_id)
    retrievals: list[RetrievalCall] = field(default_factory=list)
    calls: list[LlmCall] = field(default_factory=list)
    clean: Callable[[str], str] = field(init=False, repr=False)
    pseudonyms: Pseudonyms | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.clean, self.pseudonyms = model_text(self.config)

    def retrieve(self, query: str | CheckedQuery, scope: Scope) -> Retrieved:
        """Retrieve and score ``query`` (`retrieve_and_score`), recording the retrieval."""
        got = retrieve_and_score(
            query, scope, self.retrieve_fn, self.registry, self.embedder, self.config
        )
        self.retrievals.append(got.call)
        return got

    def output(self, **fields: Any) -> dict[str, Any]:
        """The turn's output: which turn and agent, then ``fields``, then the model."""
        return {"turn_id": self.turn_id, "kind": self.kind, "agent": self.agent_id, **fields,
                "model": self.model.model_id if self.model else None}  # fmt: skip

    def replay_input(self, model: KnowledgeModel, **inputs: Any) -> dict[str, Any]:
        """What a replay needs to re-run the synthesis: ``inputs`` (exactly what ``model`` was
        given), the model, its prompt version and the support signal it was judged by."""
        return {"kind": self.kind, **inputs, "model": model.model_id,
                "prompt_version": model.prompt_version, "threshold": self.config.threshold,
                "support": SUPPORT_VERSION}  # fmt: skip

    def record(
        self,
        outcome: str,
        output: dict[str, Any],
        replay_input: dict[str, Any] | None = None,
        citations: Sequence[Citation] = (),
        policy: Policy | None = None,
    ) -> Turn:
        """The `Turn` the ledger records, question, output, replay input and calls scrubbed.

        With pseudonyms (``reveal_contacts``), ``delivered`` holds the output with the contact
        data they masked restored, for the asking agent only (the ledger keeps the numbered
        placeholders, which is what the model saw, so a replay sends the same text).
        """
        recorded = scrub_payload(output)
        pseudonyms = self.pseudonyms
        return Turn(
            turn_id=self.turn_id,
            kind=self.kind,
            org_id=self.org_id,
            agent_id=self.agent_id,
            created_at=dt.datetime.now(dt.UTC),
            question=scrub(self.question),
            outcome=outcome,
            output=recorded,
            replay_input=scrub_payload(replay_input or {}),
            retrievals=tuple(scrub_retrieval_call(r) for r in self.retrievals),
            llm_calls=tuple(scrub_llm_call(c) for c in self.calls),
            citations=tuple(citations),
            policy_id=policy.id if policy else None,
            policy_version=policy.version if policy else None,
            delivered=map_strings(recorded, pseudonyms.restore) if pseudonyms else None,
        )


def scrub_retrieval_call(call: RetrievalCall) -> RetrievalCall:
    return replace(
        call, query=scrub(call.query), reason=scrub(call.reason) if call.reason else None
    )


def scrub_llm_call(call: LlmCall) -> LlmCall:
    return replace(
        call,
        system=scrub(call.system),
        messages=tuple(scrub_payload(dict(m)) for m in call.messages),
        reply=scrub(call.reply) if call.reply is not None else None,
        error=scrub(call.error) if call.error is not None else None,
    )
