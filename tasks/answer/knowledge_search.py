"""The tri-state knowledge search, ``research_knowledge_search``: yes / maybe / no, with the
chunks that say so.

`knowledge_search` runs 1–5 queries through gated retrieval, deduplicated by document into at
most `MAX_CANDIDATES` candidates, a relevance triage over their descriptions (a fault fails open
to every candidate; an empty verdict is an instant miss), the full text of at most
`MAX_DOCUMENTS` chosen documents rebuilt within `TEXT_BUDGET_CHARS` (truncation marked), then a
synthesis with a verdict: yes / maybe / no. Any failure of the synthesis ends in a safe "no" with
the reason. It returns a `Turn` (the result plus everything the ledger records); what every turn
shares (scrubbing, citation checks) is in `tasks.answer.turns`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.errors import ConfigError, LlmError, LlmReplyInvalid
from core.models import AnswerStatus, Citation, DocStatus, MissReason, Scope, SearchHit, Turn
from sinks.gate import build_gate
from sinks.registry import SqlRegistry
from tasks.answer.contract import Candidate, KnowledgeDoc, KnowledgeModel, Synthesis
from tasks.answer.turns import (
    AnswerConfig,
    RetrieveFn,
    TurnRecorder,
    citation_sources,
    served_citation,
    verify_citations,
)
from tasks.query.bounds import CheckedQuery, query_text, turn_query
from tasks.text.embed import Embedder
from tasks.text.pii import scrub

log = logging.getLogger(__name__)

MAX_QUERIES = 5
MAX_CANDIDATES = 24
MAX_DOCUMENTS = 10
TEXT_BUDGET_CHARS = 120_000
DESCRIPTION_CHARS = 240


@dataclass
class DocMatch:
    """A document's best match over a search's queries."""

    hit: SearchHit  # its best-supported chunk
    conf: float  # that chunk's support
    rank: int  # the best rank any of its chunks reached in a retrieval
    support: dict[str, float] = field(default_factory=dict)  # by scrubbed query: best support


def knowledge_search(
    queries: Sequence[str | CheckedQuery], scope: Scope | None, *, org_id: str, agent_id: str,
    retrieve_fn: RetrieveFn, registry: SqlRegistry, embedder: Embedder,
    model: KnowledgeModel | None, config: AnswerConfig, no_model_reason: str | None = None,
) -> Turn:  # fmt: skip
    """``research_knowledge_search``: a yes / maybe / no verdict over the agent's knowledge.

    Args:
        queries: 1 to `MAX_QUERIES` non-empty queries: `CheckedQuery`s from the service that
            checked them, stripped and retrieved as they are; or plain text (an eval, a bench,
            a test), checked here as before (`turn_query`).
        scope: the agent's scope; None when its knowledge base is switched off.
        model: the knowledge model; None when none can be used (``no_model_reason`` says why).

    Raises:
        ConfigError: no query, too many, an empty one, or one that is not UTF-8 text.
    """
    asked = [turn_query(q, f"Query {i + 1}") for i, q in enumerate(queries)]
    stripped = [query_text(q) for q in asked]  # stripped: what the turn asks, scores and records
    if not 1 <= len(stripped) <= MAX_QUERIES or not all(stripped):
        raise ConfigError(
            f"give 1 to {MAX_QUERIES} non-empty queries. Currently {len(stripped)} "
            f"({sum(not q for q in stripped)} empty)."
        )
    model_queries = [scrub(q) for q in stripped]  # models and the ledger only ever see these
    config = config.for_query(*stripped)  # its queries' forms' threshold (AnswerConfig.for_query)
    rec = TurnRecorder("ask", "\n".join(stripped), org_id, agent_id, model, retrieve_fn, registry,
                       embedder, config)  # fmt: skip
    turn = _Searching(rec, stripped)
    if scope is None:
        return turn.miss(MissReason.DISABLED, f"the knowledge base is switched off for {agent_id}")
    if model is None:
        return turn.miss(MissReason.NO_MODEL, no_model_reason or "no knowledge model is configured")

    # 1. Retrieve every query; remember each document's best chunk and support per query.
    found: dict[str, DocMatch] = {}
    for query, said in zip(asked, model_queries, strict=True):
        got = rec.retrieve(query, scope)
        if got.result.paused:
            return turn.miss(MissReason.PAUSED, got.result.reason or "retrieval is paused")
        turn.degraded = turn.degraded or got.result.degraded
        for rank, (hit, conf) in enumerate(zip(got.result.hits, got.confidence, strict=True)):
            match = found.setdefault(hit.doc_id, DocMatch(hit, conf, rank))
            match.support[said] = max(match.support.get(said, -1.0), conf)
            if conf > match.conf:
                match.hit, match.conf = hit, conf
            match.rank = min(match.rank, rank)
    if not found:
        if turn.degraded:
            reasons = {r.reason for r in rec.retrievals if r.reason}
            return turn.miss(MissReason.UNAVAILABLE, "; ".join(sorted(reasons)) or "search failed")
        if not _has_servable_documents(registry, scope):
            why = "the agent's collections hold no approved document"
            return turn.miss(MissReason.STORE_EMPTY, why)
        return turn.miss(MissReason.NO_RESULTS, "no approved chunk matched any query")

    # 2. Candidates: one per document, best supported first, at most MAX_CANDIDATES.
    ordered = sorted(found.items(), key=lambda kv: (-kv[1].conf, kv[1].rank, kv[0]))
    candidates = [
        Candidate(doc_id, m.hit.title, _describe(m.hit, rec.clean), m.conf)
        for doc_id, m in ordered[:MAX_CANDIDATES]
    ]
    turn.candidates = len(candidates)

    # 3. Triage: a fault fails open to every candidate; an empty verdict is an instant miss.
    try:
        chosen_idx = model.triage(model_queries, candidates, rec.calls)
        turn.triage = "ok"
    except LlmError as exc:
        if exc.auth:
            return turn.miss(MissReason.AUTH_FAILED, str(exc))
        log.warning("triage failed (%s); failing open to all %d candidates", exc, len(candidates))
        chosen_idx = list(range(len(candidates)))
        turn.triage = f"failed open: {exc}"
    except LlmReplyInvalid as exc:
        log.warning("triage reply invalid (%s); failing open", exc)
        chosen_idx = list(range(len(candidates)))
        turn.triage = f"failed open: {exc}"
    if not chosen_idx:
        why = "triage found no candidate relevant to the queries"
        return turn.miss(MissReason.NOT_RELEVANT, why)
    chosen = [candidates[i] for i in chosen_idx][:MAX_DOCUMENTS]
    turn.chosen = [c.doc_id for c in chosen]

    # 4. Rebuild the chosen documents within the text budget.
    docs = rebuild_documents(
        registry,
        [(c.doc_id, found[c.doc_id]) for c in chosen],
        budget=TEXT_BUDGET_CHARS,
        clean=rec.clean,
    )
    replay_input = rec.replay_input(
        model, queries=model_queries, documents=[d.to_dict() for d in docs]
    ) | {"query_form": config.form}  # added last: older keys keep their order

    # 5. Synthesis; any failure is a safe "no" that says why.
    try:
        synthesis = model.synthesize(model_queries, docs, rec.calls)
    except LlmError as exc:
        reason = MissReason.AUTH_FAILED if exc.auth else MissReason.UNAVAILABLE
        return turn.finish(AnswerStatus.NO, miss=(reason, str(exc)), replay_input=replay_input)
    except LlmReplyInvalid as exc:
        invalid = (MissReason.INVALID_REPLY, str(exc))
        return turn.finish(AnswerStatus.NO, miss=invalid, replay_input=replay_input)
    citations = _checked(registry, scope, synthesis.citations)
    if synthesis.status is not AnswerStatus.NO and not citations:
        nothing = (MissReason.INVALID_REPLY, "the synthesis cited no servable chunk")
        return turn.finish(AnswerStatus.NO, miss=nothing, replay_input=replay_input)
    said_no = None
    if synthesis.status is AnswerStatus.NO:
        said_no = (MissReason.NOT_RELEVANT, "the chosen documents do not answer the queries")
    texts = {cid: text for d in docs for cid, text in d.chunks}
    sources = citation_sources(registry, citations, texts)
    return turn.finish(synthesis.status, synthesis, citations, said_no, replay_input, sources)


@dataclass
class _Searching:
    """A knowledge search as it runs: its recorder, its queries, and how far it got (what
    every output reports)."""

    rec: TurnRecorder
    queries: list[str]
    candidates: int = 0
    chosen: list[str] = field(default_factory=list)  # doc ids given to synthesis
    triage: str | None = None  # "ok", or "failed open: <why>"
    degraded: bool = False

    def finish(
        self,
        status: AnswerStatus,
        synthesis: Synthesis | None = None,
        citations: Sequence[Citation] = (),
        miss: tuple[MissReason, str] | None = None,
        replay_input: dict[str, Any] | None = None,
        sources: Mapping[str, list[dict[str, Any]]] | None = None,
    ) -> Turn:
        """The search's verdict, recorded."""
        output = self.rec.output(
            queries=self.queries,
            answer_status=status.value,
            steering=status.steering,
            synthesis=synthesis.text if synthesis else "",
            citations=[served_citation(c, sources or {}) for c in citations],
            miss={"reason": miss[0].value, "detail": miss[1]} if miss else None,
            candidates=self.candidates,
            chosen=self.chosen,
            triage=self.triage,
            degraded=self.degraded,
        ) | {"query_form": self.rec.config.form}  # added last: older keys keep their order
        return self.rec.record(status.value, output, replay_input, citations)

    def miss(self, reason: MissReason, detail: str) -> Turn:
        """A "no" before synthesis, with why."""
        log.info("knowledge search miss: %s", reason.value)
        return self.finish(AnswerStatus.NO, miss=(reason, detail))


def _has_servable_documents(registry: SqlRegistry, scope: Scope) -> bool:
    gate = build_gate(scope)
    docs = registry.documents.list_documents(scope.org_id, statuses=[DocStatus.APPROVED.value])
    return any(gate.admits(d.gate_record()) for d in docs)


def _describe(hit: SearchHit, clean: Callable[[str], str] = scrub) -> str:
    flat = " ".join(clean(hit.text).split())
    return flat if len(flat) <= DESCRIPTION_CHARS else flat[: DESCRIPTION_CHARS - 1] + "…"


def _checked(
    registry: SqlRegistry, scope: Scope, cited: Sequence[tuple[str, str]]
) -> list[Citation]:
    valid = verify_citations(registry, scope, [cid for cid, _ in cited])
    out: list[Citation] = []
    for cid, quote in cited:
        if cid in valid and all(c.chunk_id != cid for c in out):
            base = valid[cid]
            out.append(Citation(base.chunk_id, base.doc_id, base.uri, base.title, scrub(quote)))
    return out


def rebuild_documents(
    registry: SqlRegistry,
    chosen: Sequence[tuple[str, DocMatch]],
    *,
    budget: int,
    clean: Callable[[str], str] = scrub,
) -> list[KnowledgeDoc]:
    """Each chosen document's current chunks, scrubbed, sharing ``budget`` characters.

    Shares are water-filled: a short document uses what it needs and leaves the rest to the
    longer ones; a document cut short records how many characters the budget left out.
    """
    chunks = registry.chunks.document_chunks(doc_id for doc_id, _ in chosen)
    texts = {d: [(c.chunk_id, clean(c.text)) for c in chunks.get(d, [])] for d, _ in chosen}
    sizes = {d: sum(len(t) for _, t in texts[d]) for d, _ in chosen}
    allowance: dict[str, int] = {}
    remaining, pending = budget, sorted(sizes, key=lambda d: sizes[d])
    while pending:
        share = remaining // len(pending)
        doc_id = pending.pop(0)
        allowance[doc_id] = min(sizes[doc_id], share)
        remaining -= allowance[doc_id]
    docs: list[KnowledgeDoc] = []
    for doc_id, match in chosen:
        kept: list[tuple[str, str]] = []
        left = allowance[doc_id]
        for cid, text in texts[doc_id]:
            if left <= 0:
                break
            kept.append((cid, text[:left]))
            left -= len(kept[-1][1])
        docs.append(
            KnowledgeDoc(
                doc_id=doc_id,
                title=match.hit.title,
                uri=match.hit.uri,
                chunks=tuple(kept),
                support={q: round(v, 6) for q, v in match.support.items()},
                truncated_chars=sizes[doc_id] - sum(len(t) for _, t in kept),
            )
        )
    return docs
