"""Replay: re-run a recorded turn's synthesis on its recorded input, and set the new text beside
the recorded one."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import ConfigError
from core.models import Citation, LlmCall, Turn
from sinks.registry import SqlRegistry
from tasks.answer.cited_answer import REFUSAL_TEXT, render_answer, render_maybe, settle
from tasks.answer.contract import Evidence, KnowledgeDoc, KnowledgeModel
from tasks.text.pii import scrub


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

    Args:
        system: the system prompt to replay with instead of the model's own
            (`KnowledgeModel.with_system`; the offline model has none).

    Raises:
        ConfigError: the turn never reached synthesis (it refused or missed before it).
    """
    check_replayable(turn)
    if system is not None:
        model = model.with_system(system)
    data = turn.replay_input
    calls: list[LlmCall] = []
    if data["kind"] == "ask":
        docs = [KnowledgeDoc.from_dict(d) for d in data["documents"]]
        synthesis = model.synthesize(data["queries"], docs, calls)
        text = f"answer_status: {synthesis.status.value}\n{synthesis.text}"
        return Replay(turn.turn_id, recorded_text(turn), scrub(text), model.model_id)
    evidence = [Evidence.from_dict(e) for e in data["evidence"]]
    closest = [Evidence.from_dict(e) for e in data.get("closest", ())]
    by_id = {e.chunk_id: e for e in [*evidence, *closest]}
    claims = model.answer(data["question"], evidence, calls)
    judgement = settle(model.model_id, data["question"], claims, evidence, set(by_id),
                       data.get("below_threshold"), closest=closest)  # fmt: skip
    claims, answered, missing = list(judgement.claims), judgement.answered, judgement.missing
    cited = {
        cid: Citation(cid, by_id[cid].doc_id, by_id[cid].uri, by_id[cid].title)
        for claim in claims
        for cid in claim.chunk_ids
        if cid in by_id
    }
    if not claims:
        text = REFUSAL_TEXT
    elif answered:
        text = render_answer(claims, list(cited.values()))
    else:
        text = render_maybe(missing, claims, list(cited.values()))
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
