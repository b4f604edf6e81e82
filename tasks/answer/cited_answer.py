"""Cited answers: "no chunk, no answer".

`answer` takes the chunks whose support reaches the calibrated confidence threshold as the
evidence; without any, it gives the standard refusal with the empty evidence as its reason;
otherwise claims that each cite a chunk id and its document's uri. It returns a `Turn` (the
result plus everything the ledger records); what every turn shares (scrubbing, citation checks)
is in `tasks.answer.turns`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.errors import ConfigError, LlmError, LlmReplyInvalid
from core.models import Citation, LlmCall, RetrievalCall, Scope, Turn
from sinks.registry import SqlRegistry
from tasks.answer.confidence import SUPPORT_VERSION
from tasks.answer.knowledge import Claim, Evidence, KnowledgeModel
from tasks.answer.turns import (
    AnswerConfig,
    Policy,
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

REFUSAL_TEXT = "I can't answer that from the approved knowledge base."


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
    clean, pseudonyms = model_text(config)
    retrievals: list[RetrievalCall] = []
    calls: list[LlmCall] = []
    # the support signal the confidences come from (a threshold means something only with it)
    facts: dict[str, Any] = {"best_confidence": None, "degraded": False, "support": SUPPORT_VERSION}

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
        return scrubbed_turn(turn_id=turn_id, kind="answer", scope_org=org_id,
                             agent_id=agent_id, question=question, outcome="refused",
                             output=output, replay_input=replay_input or {},
                             retrievals=retrievals, calls=calls, citations=(),
                             policy=policy, pseudonyms=pseudonyms)  # fmt: skip

    if scope is None:
        return refuse(NO_KNOWLEDGE, f"the knowledge base is switched off for {agent_id}")
    got = retrieve_and_score(question, scope, retrieve_fn, registry, embedder, config)
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
        Evidence(h.chunk_id, h.doc_id, h.uri, h.title, clean(h.text), round(c, 6))
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
        "support": SUPPORT_VERSION,
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
    sources = citation_sources(registry, citations, {h.chunk_id: h.text for h in got.result.hits})
    output = {
        "turn_id": turn_id,
        "kind": "answer",
        "agent": agent_id,
        "question": question,
        "status": "answered",
        "answer": render_answer(kept, citations),
        "claims": [
            {
                "text": c.text,
                "citations": [served_citation(valid[cid], sources) for cid in c.chunk_ids],
            }
            for c in kept
        ],
        "citations": [served_citation(c, sources) for c in citations],
        "refusal": None,
        "threshold": config.threshold,
        **facts,
        "model": model.model_id,
    }
    return scrubbed_turn(turn_id=turn_id, kind="answer", scope_org=org_id, agent_id=agent_id,
                         question=question, outcome="answered", output=output,
                         replay_input=replay_input, retrievals=retrievals, calls=calls,
                         citations=citations, pseudonyms=pseudonyms)  # fmt: skip


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
