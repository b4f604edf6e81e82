"""Agent answers from approved knowledge: the tri-state knowledge search and cited answers.

Two entry points, each returning a `Turn` (the result plus everything the ledger records):

* `knowledge_search` — ``research_knowledge_search``: 1–5 queries through gated retrieval,
  deduplicated by document into at most `MAX_CANDIDATES` candidates, a relevance triage over
  their descriptions (a fault fails open to every candidate; an empty verdict is an instant
  miss), the full text of at most `MAX_DOCUMENTS` chosen documents rebuilt within
  `TEXT_BUDGET_CHARS` (truncation marked), then a synthesis with a verdict: yes / maybe / no.
  Any failure of the synthesis ends in a safe "no" with the reason.
* `answer` — "no chunk, no answer": the chunks whose support reaches the calibrated confidence
  threshold are the evidence; without any, the standard refusal with the empty evidence as its
  reason; otherwise claims that each cite a chunk id and its document's uri.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from core.errors import ConfigError, LlmError, LlmReplyInvalid
from core.models import (
    AnswerStatus,
    Citation,
    DocStatus,
    LlmCall,
    MissReason,
    RetrievalCall,
    RetrievalResult,
    RetrievedChunk,
    Scope,
    SearchHit,
    SearchMode,
    Turn,
)
from sinks.gate import build_gate
from sinks.registry import SqlRegistry
from tasks.answer.confidence import TermStats, support_scores
from tasks.answer.knowledge import (
    Candidate,
    Claim,
    Evidence,
    KnowledgeDoc,
    KnowledgeModel,
    Synthesis,
)
from tasks.query.retrieve import require_text
from tasks.text.embed import Embedder
from tasks.text.pii import scrub, scrub_payload

log = logging.getLogger(__name__)

MAX_QUERIES = 5
MAX_CANDIDATES = 24
MAX_DOCUMENTS = 10
TEXT_BUDGET_CHARS = 120_000
DESCRIPTION_CHARS = 240
REFUSAL_TEXT = "I can't answer that from the approved knowledge base."


@dataclass(frozen=True)
class Policy:
    """A refusal policy: its id and version are recorded on every refusal it causes."""

    id: str
    version: str
    explains: str


NO_EVIDENCE = Policy(
    "kbflow.refusal.no-evidence",
    "1",
    "no retrieved chunk reached the confidence threshold",
)
NO_KNOWLEDGE = Policy(
    "kbflow.refusal.no-knowledge", "1", "the agent's knowledge base could not be searched"
)
MODEL_FAILED = Policy(
    "kbflow.refusal.model-failed", "1", "the answer model failed or produced no cited claim"
)

RetrieveFn = Callable[[str, Scope, int], RetrievalResult]


@dataclass(frozen=True)
class AnswerConfig:
    """How answers and knowledge searches retrieve and judge evidence.

    Attributes:
        threshold: the support a chunk needs to count as evidence
            (``KBFLOW_ANSWER_MIN_CONFIDENCE``, calibrated on SciFact: docs/ANSWERS.md).
        top_k: chunks retrieved per query.
        max_evidence: evidence chunks an answer may use.
        mode: the retrieval mode.
    """

    threshold: float
    top_k: int = 8
    max_evidence: int = 5
    mode: SearchMode = SearchMode.HYBRID

    def __post_init__(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise ConfigError(
                f"the confidence threshold is a cosine in [-1, 1]. Currently {self.threshold}."
            )
        if self.top_k <= 0 or self.max_evidence <= 0:
            raise ConfigError(
                f"top_k and max_evidence must be greater than 0. Currently {self.top_k} and "
                f"{self.max_evidence}."
            )


@dataclass(frozen=True)
class _Retrieved:
    result: RetrievalResult
    call: RetrievalCall
    confidence: list[float]  # per hit


def new_turn_id() -> str:
    return "turn_" + uuid.uuid4().hex[:20]


def chunk_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _retrieve(
    query: str,
    scope: Scope,
    retrieve_fn: RetrieveFn,
    registry: SqlRegistry,
    embedder: Embedder,
    config: AnswerConfig,
) -> _Retrieved:
    started = time.perf_counter()
    result = retrieve_fn(query, scope, config.top_k)
    query_vector = embedder.embed_query(query)
    stats = TermStats.of_org(scope.org_id, registry)
    confidence = support_scores(query, query_vector, result.hits, embedder, stats)
    call = RetrievalCall(
        query=query,
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
    )
    return _Retrieved(result, call, confidence)


def verify_citations(
    registry: SqlRegistry, scope: Scope, chunk_ids: Sequence[str]
) -> dict[str, Citation]:
    """The cited chunks that may be served to ``scope``, as citations; others are left out.

    A chunk qualifies when the registry knows it, it belongs to its document's current content,
    and the document passes the gate (approved, this org, effective, allowed collection).
    """
    gate = build_gate(scope)
    owners = registry.chunk_owners(chunk_ids)
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


def _has_servable_documents(registry: SqlRegistry, scope: Scope) -> bool:
    gate = build_gate(scope)
    docs = registry.list_documents(scope.org_id, statuses=[DocStatus.APPROVED.value])
    return any(gate.admits(d.gate_record()) for d in docs)


def _turn(
    *,
    turn_id: str,
    kind: str,
    scope_org: str,
    agent_id: str,
    question: str,
    outcome: str,
    output: dict[str, Any],
    replay_input: dict[str, Any],
    retrievals: Sequence[RetrievalCall],
    calls: Sequence[LlmCall],
    citations: Sequence[Citation],
    policy: Policy | None = None,
) -> Turn:
    return Turn(
        turn_id=turn_id,
        kind=kind,
        org_id=scope_org,
        agent_id=agent_id,
        created_at=dt.datetime.now(dt.UTC),
        question=scrub(question),
        outcome=outcome,
        output=scrub_payload(output),
        replay_input=scrub_payload(replay_input),
        retrievals=tuple(scrub_retrieval_call(r) for r in retrievals),
        llm_calls=tuple(scrub_llm_call(c) for c in calls),
        citations=tuple(citations),
        policy_id=policy.id if policy else None,
        policy_version=policy.version if policy else None,
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


# --- knowledge search (tri-state) ------------------------------------------------------------


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
    retrievals: list[RetrievalCall] = []
    calls: list[LlmCall] = []
    state: dict[str, Any] = {"candidates": 0, "chosen": [], "triage": None, "degraded": False}

    def finish(
        status: AnswerStatus,
        synthesis: Synthesis | None = None,
        citations: Sequence[Citation] = (),
        miss: tuple[MissReason, str] | None = None,
        replay_input: dict[str, Any] | None = None,
    ) -> Turn:
        output = {
            "turn_id": turn_id,
            "kind": "ask",
            "agent": agent_id,
            "queries": queries,
            "answer_status": status.value,
            "steering": status.steering,
            "synthesis": synthesis.text if synthesis else "",
            "citations": [c.to_dict() for c in citations],
            "miss": {"reason": miss[0].value, "detail": miss[1]} if miss else None,
            **state,
            "model": model.model_id if model else None,
        }
        return _turn(turn_id=turn_id, kind="ask", scope_org=org_id, agent_id=agent_id,
                     question="\n".join(queries), outcome=status.value, output=output,
                     replay_input=replay_input or {}, retrievals=retrievals, calls=calls,
                     citations=citations)  # fmt: skip

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
        got = _retrieve(query, scope, retrieve_fn, registry, embedder, config)
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
            description=_describe(entry["hit"]),
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
        registry, [(c.doc_id, found[c.doc_id]) for c in chosen], budget=TEXT_BUDGET_CHARS
    )
    replay_input = {
        "kind": "ask",
        "queries": model_queries,
        "documents": [d.to_dict() for d in docs],
        "model": model.model_id,
        "prompt_version": model.prompt_version,
        "threshold": config.threshold,
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
    return finish(synthesis.status, synthesis, citations, said_no, replay_input)


def _describe(hit: SearchHit) -> str:
    flat = " ".join(scrub(hit.text).split())
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
    registry: SqlRegistry, chosen: Sequence[tuple[str, dict[str, Any]]], *, budget: int
) -> list[KnowledgeDoc]:
    """Each chosen document's current chunks, scrubbed, sharing ``budget`` characters.

    Shares are water-filled: a short document uses what it needs and leaves the rest to the
    longer ones; a document cut short records how many characters the budget left out.
    """
    chunks = registry.document_chunks(doc_id for doc_id, _ in chosen)
    texts = {d: [(c.chunk_id, scrub(c.text)) for c in chunks.get(d, [])] for d, _ in chosen}
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


# --- answers ---------------------------------------------------------------------------------


def answer(
    question: str,
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
    """Answer ``question`` with a citation on every claim, or refuse ("no chunk, no answer").

    Raises:
        ConfigError: the question is empty.
    """
    question = require_text(question, "The question").strip()
    if not question:
        raise ConfigError("The question is empty. Ask something.")
    turn_id = new_turn_id()
    retrievals: list[RetrievalCall] = []
    calls: list[LlmCall] = []
    facts: dict[str, Any] = {"best_confidence": None, "degraded": False}

    def refuse(
        policy: Policy,
        reason: str,
        considered: Sequence[dict[str, Any]] = (),
        replay_input: dict[str, Any] | None = None,
    ) -> Turn:
        output = {
            "turn_id": turn_id,
            "kind": "answer",
            "agent": agent_id,
            "question": question,
            "status": "refused",
            "answer": REFUSAL_TEXT,
            "claims": [],
            "citations": [],
            "refusal": {
                "policy_id": policy.id,
                "policy_version": policy.version,
                "reason": reason,
                "evidence": [],
                "considered": list(considered),
            },
            "threshold": config.threshold,
            **facts,
            "model": model.model_id if model else None,
        }
        return _turn(turn_id=turn_id, kind="answer", scope_org=org_id, agent_id=agent_id,
                     question=question, outcome="refused", output=output,
                     replay_input=replay_input or {}, retrievals=retrievals, calls=calls,
                     citations=(), policy=policy)  # fmt: skip

    if scope is None:
        return refuse(NO_KNOWLEDGE, f"the knowledge base is switched off for {agent_id}")
    got = _retrieve(question, scope, retrieve_fn, registry, embedder, config)
    retrievals.append(got.call)
    facts["degraded"] = got.result.degraded
    if got.result.paused:
        return refuse(NO_KNOWLEDGE, got.result.reason or "retrieval is paused")
    scored = sorted(
        zip(got.result.hits, got.confidence, strict=True), key=lambda hc: -hc[1]
    )  # stable: ties keep retrieval order
    facts["best_confidence"] = round(scored[0][1], 4) if scored else None
    considered = [
        {"chunk_id": h.chunk_id, "uri": h.uri, "confidence": round(c, 4)} for h, c in scored[:3]
    ]
    evidence = [
        Evidence(h.chunk_id, h.doc_id, h.uri, h.title, scrub(h.text), round(c, 6))
        for h, c in scored
        if c >= config.threshold
    ][: config.max_evidence]
    if not evidence:
        best = (
            f"the best of {len(scored)} retrieved chunks scored {scored[0][1]:.3f}"
            if scored
            else "nothing was retrieved"
        )
        why = f"no chunk reached confidence {config.threshold:.2f} ({best})"
        if got.result.degraded:
            why += f"; search was degraded: {got.result.reason}"
        return refuse(NO_EVIDENCE, why, considered)
    if model is None:
        return refuse(MODEL_FAILED, no_model_reason or "no answer model is configured")
    replay_input = {
        "kind": "answer",
        "question": scrub(question),
        "evidence": [e.to_dict() for e in evidence],
        "model": model.model_id,
        "prompt_version": model.prompt_version,
        "threshold": config.threshold,
    }
    try:
        claims = model.answer(scrub(question), evidence, calls)
    except (LlmError, LlmReplyInvalid) as exc:
        return refuse(MODEL_FAILED, f"the answer model failed: {exc}", considered, replay_input)
    valid = verify_citations(registry, scope, [c for claim in claims for c in claim.chunk_ids])
    kept = [
        Claim(claim.text, tuple(c for c in claim.chunk_ids if c in valid))
        for claim in claims
        if any(c in valid for c in claim.chunk_ids)
    ]
    if not kept:
        why = (
            "the answer model found no support in the evidence"
            if not claims
            else ("no claim cited a servable chunk")
        )
        return refuse(MODEL_FAILED, why, considered, replay_input)
    citations = list({cid: valid[cid] for claim in kept for cid in claim.chunk_ids}.values())
    output = {
        "turn_id": turn_id,
        "kind": "answer",
        "agent": agent_id,
        "question": question,
        "status": "answered",
        "answer": render_answer(kept, citations),
        "claims": [
            {"text": c.text, "citations": [valid[cid].to_dict() for cid in c.chunk_ids]}
            for c in kept
        ],
        "citations": [c.to_dict() for c in citations],
        "refusal": None,
        "threshold": config.threshold,
        **facts,
        "model": model.model_id,
    }
    return _turn(turn_id=turn_id, kind="answer", scope_org=org_id, agent_id=agent_id,
                 question=question, outcome="answered", output=output, replay_input=replay_input,
                 retrievals=retrievals, calls=calls, citations=citations)  # fmt: skip


def render_answer(claims: Sequence[Claim], citations: Sequence[Citation]) -> str:
    """The answer as text: each claim with its numbered sources, then the source list."""
    number = {c.chunk_id: n for n, c in enumerate(citations, 1)}
    lines = [
        claim.text + " " + "".join(f"[{number[cid]}]" for cid in claim.chunk_ids if cid in number)
        for claim in claims
    ]
    sources = [f"[{n}] {c.uri} (chunk {c.chunk_id})" for c, n in zip(citations, number.values(),
                                                                      strict=True)]  # fmt: skip
    return scrub("\n".join(lines) + "\n\nSources:\n" + "\n".join(sources))


# --- replay ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    """A replayed synthesis beside the recorded one."""

    turn_id: str
    recorded: str
    replayed: str
    model: str

    @property
    def identical(self) -> bool:
        return self.recorded == self.replayed

    def diff(self) -> str:
        import difflib

        return "".join(
            difflib.unified_diff(
                self.recorded.splitlines(keepends=True),
                self.replayed.splitlines(keepends=True),
                fromfile=f"{self.turn_id} (recorded)",
                tofile=f"{self.turn_id} (replayed)",
            )
        )


def recorded_text(turn: Turn) -> str:
    """The part of a turn's output that synthesis produced (what replay compares)."""
    if turn.kind == "ask":
        out = turn.output
        return f"answer_status: {out['answer_status']}\n{out['synthesis']}"
    return str(turn.output["answer"])


def replay(
    turn: Turn,
    model: KnowledgeModel,
    registry: SqlRegistry | None = None,
    *,
    system: str | None = None,
) -> Replay:
    """Re-run a turn's synthesis on its recorded input: no retrieval, no embedding.

    Citations are rendered from the recorded evidence, so a replay does not depend on the
    registry's present state (a document approved then may be superseded now).

    Raises:
        ConfigError: the turn never reached synthesis (it refused or missed before it).
    """
    check_replayable(turn)
    data = turn.replay_input
    calls: list[LlmCall] = []
    if data["kind"] == "ask":
        docs = [KnowledgeDoc.from_dict(d) for d in data["documents"]]
        synthesis = model.synthesize(data["queries"], docs, calls, system=system)
        text = f"answer_status: {synthesis.status.value}\n{synthesis.text}"
        return Replay(turn.turn_id, recorded_text(turn), scrub(text), model.model_id)
    evidence = [Evidence.from_dict(e) for e in data["evidence"]]
    by_id = {e.chunk_id: e for e in evidence}
    claims = model.answer(data["question"], evidence, calls, system=system)
    cited = {
        cid: Citation(cid, by_id[cid].doc_id, by_id[cid].uri, by_id[cid].title)
        for claim in claims
        for cid in claim.chunk_ids
        if cid in by_id
    }
    text = render_answer(claims, list(cited.values())) if claims else REFUSAL_TEXT
    return Replay(turn.turn_id, recorded_text(turn), text, model.model_id)


def check_replayable(turn: Turn) -> None:
    """Raise ConfigError when the turn never reached synthesis (nothing to replay)."""
    if not turn.replay_input:
        raise ConfigError(
            f"turn {turn.turn_id} ended before synthesis ({turn.outcome}: "
            f"{_why_not_synthesized(turn)}), so there is nothing to replay"
        )


def _why_not_synthesized(turn: Turn) -> str:
    out = turn.output
    if out.get("refusal"):
        return str(out["refusal"]["reason"])
    if out.get("miss"):
        return str(out["miss"]["detail"])
    return "no synthesis input was recorded"
