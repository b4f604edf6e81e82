"""Decisions in bulk: the CLI's and the Prefect review form's rows, each applied on its own
through the state machine (:mod:`tasks.review.machine`), and the rule for when a review run
did not do its job (:func:`review_failure`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from core.errors import ConfigError, Forbidden, KbflowError, NotFound, ReviewConflict
from sinks.registry import SqlRegistry
from tasks.review.machine import StoreOpener, approve, edit_and_approve, reject
from tasks.text.embed import Embedder

DecisionAction = Literal["approve", "reject", "edit"]


@dataclass(frozen=True)
class Decision:
    doc_id: str
    action: DecisionAction
    content: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What happened to one decision: ``applied``, or why not."""

    doc_id: str
    action: str
    result: Literal["applied", "conflict", "forbidden", "invalid", "not_found"]
    message: str = ""
    status: str | None = None

    @property
    def applied(self) -> bool:
        return self.result == "applied"


def apply_decisions(
    decisions: Sequence[Decision],
    actor_id: str,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    embedder: Callable[[], Embedder],
    max_words: int = 180,
    overlap_words: int = 30,
) -> list[Outcome]:
    """Apply each decision on its own; one that fails is reported and changes nothing."""
    outcomes: list[Outcome] = []
    for d in decisions:
        try:
            if d.action == "approve":
                doc = approve(
                    d.doc_id, actor_id, registry=registry, open_store=open_store, note=d.note
                )
            elif d.action == "reject":
                doc = reject(
                    d.doc_id, actor_id, registry=registry, open_store=open_store, note=d.note
                )
            elif d.action == "edit":
                doc = edit_and_approve(
                    d.doc_id,
                    actor_id,
                    d.content or "",
                    registry=registry,
                    open_store=open_store,
                    embedder=embedder(),
                    max_words=max_words,
                    overlap_words=overlap_words,
                    note=d.note,
                )
            else:
                raise ConfigError(f"unknown action {d.action!r}; use approve, reject or edit.")
        except ReviewConflict as exc:
            outcomes.append(Outcome(d.doc_id, d.action, "conflict", str(exc)))
        except Forbidden as exc:
            outcomes.append(Outcome(d.doc_id, d.action, "forbidden", str(exc)))
        except NotFound as exc:
            outcomes.append(Outcome(d.doc_id, d.action, "not_found", str(exc)))
        except KbflowError as exc:
            outcomes.append(Outcome(d.doc_id, d.action, "invalid", str(exc)))
        else:
            outcomes.append(Outcome(d.doc_id, d.action, "applied", status=doc.status))
    return outcomes


def same_content(edited: str | None, draft: str) -> bool:
    """Whether an ``edit`` submits the draft's text unchanged (line endings and the blank
    space around it aside): such an edit is applied as an approve of the stored draft."""
    if edited is None:
        return False
    return edited.replace("\r\n", "\n").strip() == draft.replace("\r\n", "\n").strip()


def review_failure(org_id: str, reviewer: str | None, outcomes: Sequence[Outcome]) -> str | None:
    """Why a review run did not do its job, or None when it did (it then ends Completed).

    The rule: a run fails when its reviewer was refused (authorisation is per reviewer, so
    nothing was applied), or when decisions were submitted and every one was invalid (not
    pending in this run, a duplicate, an empty edit). A run with at least one applied decision,
    one where every row was left on skip, or one that lost races (someone else decided first:
    the documents are decided) completes; its report lists every row that was not applied.
    """
    refused = [o for o in outcomes if o.result == "forbidden"]
    applied = sum(o.applied for o in outcomes)
    done = f"{applied} applied" if applied else "nothing was applied"
    if refused:
        return (
            f"reviewer {reviewer!r} may not review org {org_id!r}; {done} "
            f"({len(refused)} decisions refused): {refused[0].message}"
        )
    if outcomes and all(o.result in ("invalid", "not_found") for o in outcomes):
        return (
            f"none of the {len(outcomes)} decisions by {reviewer!r} for org {org_id!r} could "
            f"be applied; {done}: {outcomes[0].message}"
        )
    return None
