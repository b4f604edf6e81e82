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
from typing import Any

from core.errors import ConfigError, LlmError, LlmReplyInvalid
from core.models import (
    AnswerStatus,
    Citation,
    DocStatus,
    LlmCall,
    MissReason,
    RetrievalCall,
    Scope,
    SearchHit,
    Turn,
)
from sinks.gate import build_gate
from sinks.registry import SqlRegistry
from tasks.answer.confidence import SUPPORT_VERSION
from tasks.answer.knowledge import Candidate, KnowledgeDoc, KnowledgeModel, Synthesis
from tasks.answer.turns import (
    AnswerConfig,
    RetrieveFn,
    citation_sources,
    model_text,
    new_turn_id,
    retrieve_and_score,
    scrubbed_turn,
    served_citation,
    verify_citations,
)
from tasks.query.retrieve import require_text
from tasks.text.embed import Embedder
from tasks.text.pii import scrub

log = logging.getLogger(__name__)

MAX_QUERIES = 5
MAX_CANDIDATES = 24
MAX_DOCUMENTS = 10
TEXT_BUDGET_CHARS = 120_000
DESCRIPTION_CHARS = 240


def knowledge_search(
    queries: Sequence[str],
    scope: Scope | None,
    *,
    org_id: str,
    agent_id: str,
    retrieve_fn: RetrieveFn,
    registry: SqlRegistry,
    embedder: Embedder,
    model: KnowledgeModel | None,
    config: AnswerConfig,
    no_model_reason: str | None = None,
) -> Turn:
    """``research_knowledge_search``: a yes / maybe / no verdict over the agent's knowledge.

    Args:
        queries: 1 to `MAX_QUERIES` non-empty queries.
        scope: the agent's scope; None when its knowledge base is switched off.
        model: the knowledge model; None when none can be used (``no_model_reason`` says why).

    Raises:
        ConfigError: no query, too many, or an empty one.
    """
    queries = [require_text(q, f"Query {i + 1}").strip() for i, q in enumerate(queries)]
    if not 1 <= len(queries) <= MAX_QUERIES or not all(queries):
        raise ConfigError(
            f"give 1 to {MAX_QUERIES} non-empty queries. Currently {len(queries)} "
            f"({sum(not q for q in queries)} empty)."
        )
    model_queries = [scrub(q) for q in queries]
    turn_id = new_turn_id()
    clean, pseudonyms = model_text(config)
    retrievals: list[RetrievalCall] = []
    calls: list[LlmCall] = []
    state: dict[str, Any] = {"candidates": 0, "chosen": [], "triage": None, "degraded": False}

    def finish(
        status: AnswerStatus,
        synthesis: Synthesis | None = None,
        citations: Sequence[Citation] = (),
        miss: tuple[MissReason, str] | None = None,
        replay_input: dict[str, Any] | None = None,
        sources: Mapping[str, list[dict[str, Any]]] | None = None,
    ) -> Turn:
        output = {
            "turn_id": turn_id,
            "kind": "ask",
            "agent": agent_id,
            "queries": queries,
            "answer_status": status.value,
            "steering": status.steering,
            "synthesis": synthesis.text if synthesis else "",
            "citations": [served_citation(c, sources or {}) for c in citations],
            "miss": {"reason": miss[0].value, "detail": miss[1]} if miss else None,
            **state,
            "model": model.model_id if model else None,
        }
        return scrubbed_turn(turn_id=turn_id, kind="ask", scope_org=org_id, agent_id=agent_id,
                             question="\n".join(queries), outcome=status.value, output=output,
                             replay_input=replay_input or {}, retrievals=retrievals,
                             calls=calls, citations=citations,
                             pseudonyms=pseudonyms)  # fmt: skip

    def miss(reason: MissReason, detail: str) -> Turn:
        log.info("knowledge search miss: %s", reason.value)
        return finish(AnswerStatus.NO, miss=(reason, detail))

    if scope is None:
        return miss(MissReason.DISABLED, f"the knowledge base is switched off for {agent_id}")
    if model is None:
        return miss(MissReason.NO_MODEL, no_model_reason or "no knowledge model is configured")

    # 1. Retrieve every query; remember each document's best chunk and support per query.
    found: dict[str, dict[str, Any]] = {}
    for query in queries:
        got = retrieve_and_score(query, scope, retrieve_fn, registry, embedder, config)
        retrievals.append(got.call)
        if got.result.paused:
            return miss(MissReason.PAUSED, got.result.reason or "retrieval is paused")
        state["degraded"] = state["degraded"] or got.result.degraded
        for rank, (hit, conf) in enumerate(zip(got.result.hits, got.confidence, strict=True)):
            entry = found.setdefault(
                hit.doc_id, {"hit": hit, "conf": conf, "rank": rank, "support": {}}
            )
            said = scrub(query)  # models and the ledger only ever see scrubbed queries
            entry["support"][said] = max(entry["support"].get(said, -1.0), conf)
            if conf > entry["conf"]:
                entry.update(hit=hit, conf=conf)
            entry["rank"] = min(entry["rank"], rank)
    if not found:
        if state["degraded"]:
            reasons = {r.reason for r in retrievals if r.reason}
            return miss(MissReason.UNAVAILABLE, "; ".join(sorted(reasons)) or "search failed")
        if not _has_servable_documents(registry, scope):
            return miss(MissReason.STORE_EMPTY, "the agent's collections hold no approved document")
        return miss(MissReason.NO_RESULTS, "no approved chunk matched any query")

    # 2. Candidates: one per document, best supported first, at most MAX_CANDIDATES.
    ordered = sorted(found.items(), key=lambda kv: (-kv[1]["conf"], kv[1]["rank"], kv[0]))
    ordered = ordered[:MAX_CANDIDATES]
    candidates = [
        Candidate(
            doc_id=doc_id,
            title=entry["hit"].title,
            description=_describe(entry["hit"], clean),
            support=entry["conf"],
        )
        for doc_id, entry in ordered
    ]
    state["candidates"] = len(candidates)

    # 3. Triage: a fault fails open to every candidate; an empty verdict is an instant miss.
    try:
        chosen_idx = model.triage(model_queries, candidates, calls)
        state["triage"] = "ok"
    except LlmError as exc:
        if exc.auth:
            return miss(MissReason.AUTH_FAILED, str(exc))
        log.warning("triage failed (%s); failing open to all %d candidates", exc, len(candidates))
        chosen_idx = list(range(len(candidates)))
        state["triage"] = f"failed open: {exc}"
    except LlmReplyInvalid as exc:
        log.warning("triage reply invalid (%s); failing open", exc)
        chosen_idx = list(range(len(candidates)))
        state["triage"] = f"failed open: {exc}"
    if not chosen_idx:
        return miss(MissReason.NOT_RELEVANT, "triage found no candidate relevant to the queries")
    chosen = [candidates[i] for i in chosen_idx][:MAX_DOCUMENTS]
    state["chosen"] = [c.doc_id for c in chosen]

    # 4. Rebuild the chosen documents within the text budget.
    docs = rebuild_documents(
        registry,
        [(c.doc_id, found[c.doc_id]) for c in chosen],
        budget=TEXT_BUDGET_CHARS,
        clean=clean,
    )
    replay_input = {
        "kind": "ask",
        "queries": model_queries,
        "documents": [d.to_dict() for d in docs],
        "model": model.model_id,
        "prompt_version": model.prompt_version,
        "threshold": config.threshold,
        "support": SUPPORT_VERSION,
    }

    # 5. Synthesis; any failure is a safe "no" that says why.
    try:
        synthesis = model.synthesize(model_queries, docs, calls)
    except LlmError as exc:
        reason = MissReason.AUTH_FAILED if exc.auth else MissReason.UNAVAILABLE
        return finish(AnswerStatus.NO, miss=(reason, str(exc)), replay_input=replay_input)
    except LlmReplyInvalid as exc:
        return finish(AnswerStatus.NO, miss=(MissReason.INVALID_REPLY, str(exc)),
                      replay_input=replay_input)  # fmt: skip
    citations = _checked(registry, scope, synthesis.citations)
    if synthesis.status is not AnswerStatus.NO and not citations:
        nothing = (MissReason.INVALID_REPLY, "the synthesis cited no servable chunk")
        return finish(AnswerStatus.NO, miss=nothing, replay_input=replay_input)
    said_no = None
    if synthesis.status is AnswerStatus.NO:
        said_no = (MissReason.NOT_RELEVANT, "the chosen documents do not answer the queries")
    texts = {cid: text for d in docs for cid, text in d.chunks}
    sources = citation_sources(registry, citations, texts)
    return finish(synthesis.status, synthesis, citations, said_no, replay_input, sources)


def _has_servable_documents(registry: SqlRegistry, scope: Scope) -> bool:
    gate = build_gate(scope)
    docs = registry.list_documents(scope.org_id, statuses=[DocStatus.APPROVED.value])
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
    chosen: Sequence[tuple[str, dict[str, Any]]],
    *,
    budget: int,
    clean: Callable[[str], str] = scrub,
) -> list[KnowledgeDoc]:
    """Each chosen document's current chunks, scrubbed, sharing ``budget`` characters.

    Shares are water-filled: a short document uses what it needs and leaves the rest to the
    longer ones; a document cut short records how many characters the budget left out.
    """
    chunks = registry.document_chunks(doc_id for doc_id, _ in chosen)
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
    for doc_id, entry in chosen:
        kept: list[tuple[str, str]] = []
        left = allowance[doc_id]
        for cid, text in texts[doc_id]:
            if left <= 0:
                break
            kept.append((cid, text[:left]))
            left -= len(kept[-1][1])
        hit: SearchHit = entry["hit"]
        docs.append(
            KnowledgeDoc(
                doc_id=doc_id,
                title=hit.title,
                uri=hit.uri,
                chunks=tuple(kept),
                support={q: round(v, 6) for q, v in entry["support"].items()},
                truncated_chars=sizes[doc_id] - sum(len(t) for _, t in kept),
            )
        )
    return docs
