"""Cited answers: "no chunk, no answer".

`answer` takes the chunks whose support reaches the calibrated confidence threshold as the
evidence; without any, it gives the standard refusal with the empty evidence as its reason;
otherwise claims that each cite a chunk id and its document's uri. It returns a `Turn` (the
result plus everything the ledger records); what every turn shares (scrubbing, citation checks)
is in `tasks.answer.turns`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from core.errors import ConfigError, LlmError, LlmReplyInvalid
from core.models import Citation, Scope, Turn
from sinks.registry import SqlRegistry
from tasks.answer.confidence import SUPPORT_VERSION, text_cosines
from tasks.answer.contract import Claim, Evidence, KnowledgeModel
from tasks.answer.extractive import (
    EVIDENCE_QUOTES,
    FILLING_MODEL_IDS,
    PROVING_MODEL_IDS,
    UNIT_SCORING_MODEL_IDS,
    WHOLE_TABLE_MODEL_IDS,
    evidence_quotes,
)
from tasks.answer.proofs import judge_proved
from tasks.answer.quotes import quote_text, units
from tasks.answer.support import Judgement, judge
from tasks.answer.turns import (
    AnswerConfig,
    Policy,
    RetrieveFn,
    TurnRecorder,
    citation_sources,
    served_citation,
    verify_citations,
)
from tasks.query.bounds import CheckedQuery, query_text, turn_query
from tasks.text.embed import Embedder
from tasks.text.pii import scrub

REFUSAL_TEXT = "I can't answer that from the approved knowledge base."
UNQUOTED_MODELS = frozenset({"extractive-v1", "extractive-v2"})
"""Recorded offline models from before the support check: they quote no span, so their turns
replay (and a pinned model answers) as they did."""


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
    question: str | CheckedQuery, scope: Scope | None, *, org_id: str, agent_id: str,
    retrieve_fn: RetrieveFn, registry: SqlRegistry, embedder: Embedder,
    model: KnowledgeModel | None, config: AnswerConfig, no_model_reason: str | None = None,
) -> Turn:  # fmt: skip
    """Answer ``question`` with a citation on every claim, or refuse ("no chunk, no answer").

    ``question``: a `CheckedQuery` from the service that checked it, stripped and retrieved as it
    is; or plain text (an eval, a bench, a test), checked here as before (`turn_query`).

    Raises:
        ConfigError: the question is not UTF-8 text, or empty.
    """
    asked_for = turn_query(question, "The question")
    question = query_text(asked_for)  # stripped: what the turn asks, scores and records
    if not question:
        raise ConfigError("The question is empty. Ask something.")
    config = config.for_query(question)  # the threshold of the question's form (query_form)
    rec = TurnRecorder("answer", question, org_id, agent_id, model, retrieve_fn, registry,
                       embedder, config)  # fmt: skip
    turn = _Answering(rec)
    if scope is None:
        return turn.refuse(NO_KNOWLEDGE, f"the knowledge base is switched off for {agent_id}")
    got = rec.retrieve(asked_for, scope)
    turn.degraded = got.result.degraded
    if got.result.paused:
        return turn.refuse(NO_KNOWLEDGE, got.result.reason or "retrieval is paused")
    scored = sorted(
        zip(got.result.hits, got.confidence, strict=True), key=lambda hc: -hc[1]
    )  # stable: ties keep retrieval order
    turn.best_confidence = round(scored[0][1], 4) if scored else None
    considered = [
        {"chunk_id": h.chunk_id, "uri": h.uri, "confidence": round(c, 4)} for h, c in scored[:3]
    ]
    evidence = _evidence(rec, scored, config.threshold, config.max_evidence)
    weak = None  # why the evidence proves nothing whatever it says, when it is below the bar
    closest: list[Evidence] = []  # below the bar, quoted beside the evidence by a "maybe" (v6)
    if not evidence and model is not None and model.model_id in PROVING_MODEL_IDS:
        evidence, weak = _closest(rec, scored, config)
    elif evidence and model is not None and model.model_id in FILLING_MODEL_IDS:
        closest = _below(rec, scored, config, room=config.max_evidence - len(evidence))
    if not evidence:
        best = (
            f"the best of {len(scored)} retrieved chunks scored {scored[0][1]:.3f}"
            if scored
            else "nothing was retrieved"
        )
        why = f"no chunk reached confidence {config.threshold:.2f} ({best})"
        if got.result.degraded:
            why += f"; search was degraded: {got.result.reason}"
        return turn.refuse(NO_EVIDENCE, why, considered)
    if model is None:
        return turn.refuse(MODEL_FAILED, no_model_reason or "no answer model is configured")
    asked = scrub(question)
    scored_units = model.model_id in UNIT_SCORING_MODEL_IDS
    if scored_units:  # it weighs each unit's meaning, not only words
        evidence = [_with_unit_scores(e, asked, embedder) for e in evidence]
    replay_input = rec.replay_input(
        model, question=asked, evidence=[e.to_dict() for e in evidence]
    ) | {"query_form": config.form}  # added last: older keys keep their order
    if weak:
        replay_input["below_threshold"] = weak  # replay settles it the same way
    unusable = None  # why the model's reply could not be used, when it could not
    try:
        claims = model.answer(asked, evidence, rec.calls)
    except LlmError as exc:
        why = f"the answer model failed: {exc}"
        return turn.refuse(MODEL_FAILED, why, considered, replay_input)
    except LlmReplyInvalid as exc:  # read, but broke its contract twice: hand over the evidence
        unusable = f"the answer model's reply could not be used ({exc})"
        claims = evidence_quotes(asked, evidence)
    if any(c.proof for c in claims):
        closest = []  # answered: a "maybe" never happens, so nothing below the bar is quoted
    elif closest:  # scored and recorded only when a "maybe" may quote them
        if scored_units:
            closest = [_with_unit_scores(e, asked, embedder) for e in closest]
        replay_input["closest"] = [e.to_dict() for e in closest]
    # The evidence's chunks too: a "maybe" may hand over any of them (`settle`).
    handed = [*evidence, *closest]
    valid = verify_citations(registry, scope, [*(c for claim in claims for c in claim.chunk_ids),
                                               *(e.chunk_id for e in handed)])  # fmt: skip
    kept = [_servable(claim, valid) for claim in claims if any(c in valid for c in claim.chunk_ids)]
    if not kept:
        why = (
            "the answer model found no support in the evidence"
            if not claims
            else ("no claim cited a servable chunk")
        )
        return turn.refuse(MODEL_FAILED, why, considered, replay_input)
    judgement = settle(model.model_id, asked, kept, evidence, set(valid), unusable or weak,
                       closest=closest)  # fmt: skip
    kept = list(judgement.claims)
    citations = quoted_citations(kept, valid)
    sources = citation_sources(registry, citations, {h.chunk_id: h.text for h in got.result.hits})
    served = [
        {
            "text": c.text,
            "citations": [served_citation(quoted_citation(c, valid[cid]), sources)
                          | _spans(c, cid) for cid in c.chunk_ids],
        }
        for c in kept
    ]  # fmt: skip
    by_chunk = {cid: _spans(c, cid) for c in reversed(kept) for cid in c.chunk_ids[:1]}
    listed = [served_citation(c, sources) | by_chunk.get(c.chunk_id, {}) for c in citations]
    if not judgement.answered:
        text = render_maybe(judgement.missing, kept, citations)
        output = turn.output("maybe", text, claims=served, citations=listed,
                             missing=judgement.missing)  # fmt: skip
        return rec.record("maybe", output, replay_input, citations)
    output = turn.output("answered", render_answer(kept, citations), claims=served,
                         citations=listed, missing=None)  # fmt: skip
    return rec.record("answered", output, replay_input, citations)


def _evidence(
    rec: TurnRecorder, scored: Sequence[tuple[Any, float]], at_least: float, limit: int
) -> list[Evidence]:
    """The scored hits at or above ``at_least``, best first, as (cleaned) evidence."""
    return [
        Evidence(h.chunk_id, h.doc_id, h.uri, h.title, rec.clean(h.text), round(c, 6))
        for h, c in scored
        if c >= at_least
    ][:limit]


def _closest(
    rec: TurnRecorder, scored: Sequence[tuple[Any, float]], config: AnswerConfig
) -> tuple[list[Evidence], str | None]:
    """Offline, when no chunk reached the threshold: the chunks at or above ``config.floor``,
    as evidence that can prove nothing (the turn is a "maybe" whatever they say), and the
    reason the turn gives. None below the floor, or with no floor: then the turn refuses."""
    if config.floor is None or not scored or scored[0][1] < config.floor:
        return [], None
    closest = _evidence(rec, scored, config.floor, config.max_evidence)
    why = (
        f"no passage reached the confidence {config.threshold:.2f} an answer needs (the best "
        f"scored {scored[0][1]:.3f}): the closest passages are quoted, unproven; read them "
        "before relying on them"
    )
    return closest, why


def _below(
    rec: TurnRecorder, scored: Sequence[tuple[Any, float]], config: AnswerConfig, room: int
) -> list[Evidence]:
    """The closest chunks under the threshold, down to ``config.floor``, as many as ``room``
    leaves (v6 quotes them in a "maybe" beside the evidence; they never prove anything)."""
    if config.floor is None or room <= 0:
        return []
    under = [hc for hc in scored if hc[1] < config.threshold]
    return _evidence(rec, under, config.floor, room)


CLOSEST_QUOTED = "passages below the confidence an answer needs are quoted too, unproven"


def settle(
    model_id: str,
    question: str,
    claims: Sequence[Claim],
    evidence: Sequence[Evidence],
    servable: set[str],
    unusable: str | None = None,
    *,
    closest: Sequence[Evidence] = (),
) -> Judgement:
    """Answered or "maybe", and with which claims: the offline model by what a structure
    proves (`tasks.answer.proofs`), a model by the support check of its quotes
    (`tasks.answer.support`), models from before quotes as they were. A "maybe" hands the
    agent verbatim evidence: a model's unquoted (or unverifiable) claims give way to the
    passages' own best text. ``unusable``: why the model's reply could not be used (then
    ``claims`` are the passages' own and nothing is answered). ``closest`` (v6): chunks below
    the threshold and above the evidence floor; a "maybe" quotes the best units of them and
    of ``evidence`` together, and nothing is ever proved from them. The answer path and its
    replay settle the same way."""
    if model_id in PROVING_MODEL_IDS:
        judgement = judge_proved(question, claims, evidence)
    elif model_id not in UNQUOTED_MODELS:
        judgement = judge(question, claims, {e.chunk_id: e.text for e in evidence},
                          {e.chunk_id: e.title for e in evidence})  # fmt: skip
    else:
        judgement = Judgement(True, tuple(claims))
    if unusable:
        judgement = Judgement(False, judgement.claims, unusable)
    kept = list(judgement.claims)
    if not judgement.answered and any(not c.quote for c in kept):
        quoted = [c for c in kept if c.quote]
        said = {q.quote for q in quoted}
        whole = model_id in WHOLE_TABLE_MODEL_IDS  # v5 hands tables over whole
        more = [c for c in evidence_quotes(question, evidence, whole_tables=whole)
                if c.chunk_ids[0] in servable and c.quote not in said]  # fmt: skip
        kept = (quoted + more)[:EVIDENCE_QUOTES] or kept
    missing = judgement.missing
    if not judgement.answered and closest and model_id in FILLING_MODEL_IDS:
        pool = [*evidence, *closest]
        wider = [c for c in evidence_quotes(question, pool, whole_tables=True, fill=True)
                 if c.chunk_ids[0] in servable]  # fmt: skip
        below = {e.chunk_id for e in closest}
        if any(c.chunk_ids[0] in below for c in wider):
            kept, missing = wider, f"{missing or 'no quote holds the answer'}; {CLOSEST_QUOTED}"
    return Judgement(judgement.answered, tuple(kept), missing)


def _with_unit_scores(evidence: Evidence, question: str, embedder: Embedder) -> Evidence:
    said = [quote_text(evidence.text, u.spans) for u in units(evidence.text)]
    return replace(evidence, unit_scores=tuple(text_cosines(embedder, question, said)))


def _servable(claim: Claim, valid: Mapping[str, Citation]) -> Claim:
    """``claim`` citing only its servable chunks; its quote goes if its quoted chunk did."""
    ids = tuple(c for c in claim.chunk_ids if c in valid)
    if ids[:1] != claim.chunk_ids[:1]:
        return Claim(claim.text, ids)
    return replace(claim, chunk_ids=ids)


def quoted_citation(claim: Claim, citation: Citation) -> Citation:
    """``citation`` with the claim's quote when the claim quotes that chunk."""
    if claim.quote and claim.chunk_ids[:1] == (citation.chunk_id,):
        return replace(citation, quote=claim.quote)
    return citation


def quoted_citations(claims: Sequence[Claim], valid: Mapping[str, Citation]) -> list[Citation]:
    """Each cited chunk once, in order, with the quote of the first claim that quotes it."""
    out: dict[str, Citation] = {}
    for claim in claims:
        for cid in claim.chunk_ids:
            cited = quoted_citation(claim, valid[cid])
            if cid not in out or (cited.quote and not out[cid].quote):
                out[cid] = cited
    return list(out.values())


def _spans(claim: Claim, chunk_id: str) -> dict[str, Any]:
    """Where a claim's quote sits in the chunk it quotes (offsets into the chunk's text as the
    model saw it: contact data masked)."""
    if claim.quote and claim.chunk_ids[:1] == (chunk_id,):
        return {"quote_spans": [list(s) for s in claim.spans]}
    return {}


@dataclass
class _Answering:
    """A cited answer as it runs: its recorder and the facts every output reports."""

    rec: TurnRecorder
    best_confidence: float | None = None  # of the best retrieved chunk
    degraded: bool = False

    def output(
        self,
        status: str,
        text: str,
        *,
        claims: Sequence[dict[str, Any]] = (),
        citations: Sequence[dict[str, Any]] = (),
        refusal: dict[str, Any] | None = None,
        missing: str | None = None,
    ) -> dict[str, Any]:
        """The answer's output; ``support`` names the signal the confidences come from (a
        threshold means something only with it); ``missing`` says what a "maybe" lacks."""
        out = self.rec.output(question=self.rec.question, status=status, answer=text,
                              claims=list(claims), citations=list(citations), refusal=refusal,
                              threshold=self.rec.config.threshold,
                              best_confidence=self.best_confidence, degraded=self.degraded,
                              support=SUPPORT_VERSION)  # fmt: skip
        return out | {"missing": missing, "query_form": self.rec.config.form}  # added last

    def refuse(
        self,
        policy: Policy,
        reason: str,
        considered: Sequence[dict[str, Any]] = (),
        replay_input: dict[str, Any] | None = None,
    ) -> Turn:
        """The standard refusal, recorded with the policy that caused it and its reason."""
        refusal = {"policy_id": policy.id, "policy_version": policy.version, "reason": reason,
                   "evidence": [], "considered": list(considered)}  # fmt: skip
        output = self.output("refused", REFUSAL_TEXT, refusal=refusal)
        return self.rec.record("refused", output, replay_input, policy=policy)


MAYBE_TEXT = "The approved knowledge base may not answer this"


def render_maybe(
    missing: str | None, claims: Sequence[Claim], citations: Sequence[Citation]
) -> str:
    """A "maybe": what the evidence lacks, then the closest evidence with its sources."""
    head = f"{MAYBE_TEXT}: {missing or 'no quote holds the answer'}. The closest evidence:"
    return scrub(head + "\n" + render_answer(claims, citations))


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
