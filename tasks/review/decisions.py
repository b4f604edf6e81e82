"""Review decisions at the bottom of their one path: the verbs (`Verb`), the note rules
(`checked_note`), and `apply_decision`, the one function that turns a decision into a state
machine transition (:mod:`tasks.review.machine`: rights, compare-and-set, audit). Every surface
reaches it: the CLI, HTTP and the inbox through `kbflow.services.review.decisions.decide`, the
Prefect review form through `apply_decisions` in the paused run. Also the rule for when a
review run did not do its job (:func:`review_failure`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from core.errors import ConfigError, Forbidden, KbflowError, NotFound, ReviewConflict
from sinks.registry import SqlRegistry
from tasks.review.machine import StoreOpener, approve, edit_and_approve, reject, restore, withdraw
from tasks.text.embed import Embedder

if TYPE_CHECKING:
    from sinks.registry import DocRecord

DecisionAction = Literal["approve", "reject", "edit"]


class Verb(StrEnum):
    """What a decision does to a document."""

    APPROVE = "approve"
    REJECT = "reject"
    EDIT = "edit"
    WITHDRAW = "withdraw"
    RESTORE = "restore"


FORM_VERBS = frozenset({Verb.APPROVE, Verb.REJECT, Verb.EDIT})
"""The decisions a paused review run's form takes (on a draft pending review)."""
NOTE_REQUIRED = frozenset({Verb.WITHDRAW, Verb.RESTORE})
"""Decisions that need a note saying why, whoever decides and from wherever."""
NOTE_REQUIRED_AT_A_FORM = frozenset({Verb.REJECT})
"""Decisions a person at a form (the inbox) must also say why for; a script (CLI, HTTP) may
reject without a note, as documented."""
_GERUND = {Verb.APPROVE: "approving", Verb.REJECT: "rejecting", Verb.EDIT: "editing",
           Verb.WITHDRAW: "withdrawing", Verb.RESTORE: "restoring"}  # fmt: skip


def checked_note(
    verb: Verb, note: str | None, content: str | None = None, *, at_form: bool = False
) -> str | None:
    """The decision's note (blank is none), once the note rules hold: `NOTE_REQUIRED` always,
    `NOTE_REQUIRED_AT_A_FORM` too for a person at a form; an edit needs the new text.

    Raises:
        ConfigError: a note or the text is missing (nothing was changed).
    """
    note = (note or "").strip() or None
    required = NOTE_REQUIRED | (NOTE_REQUIRED_AT_A_FORM if at_form else frozenset())
    if verb in required and not note:
        raise ConfigError(f"{_GERUND[verb]} needs a note saying why (it is audited)")
    if verb is Verb.EDIT and not (content or "").strip():
        raise ConfigError("an edit needs the document's new text.")
    return note


def apply_decision(
    verb: Verb,
    doc_id: str,
    actor_id: str,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    embedder: Callable[[], Embedder],
    note: str | None = None,
    content: str | None = None,
    max_words: int = 180,
    overlap_words: int = 30,
) -> DocRecord:
    """Apply one decision as ``actor_id`` through the state machine (rights, compare-and-set,
    audit): the one place a verb becomes a transition.

    Raises:
        Forbidden: the actor may not decide for the document's org.
        ReviewConflict: the document is no longer in the state the decision needs.
        NotFound: no such document.
        ConfigError: a note the transition needs is missing.
    """
    r, o = registry, open_store
    if verb is Verb.APPROVE:
        return approve(doc_id, actor_id, registry=r, open_store=o, note=note)
    if verb is Verb.REJECT:
        return reject(doc_id, actor_id, registry=r, open_store=o, note=note)
    if verb is Verb.WITHDRAW:
        return withdraw(doc_id, actor_id, registry=r, open_store=o, note=note or "")
    if verb is Verb.RESTORE:
        return restore(doc_id, actor_id, registry=r, open_store=o, note=note or "",
                       embedder=embedder())  # fmt: skip
    return edit_and_approve(doc_id, actor_id, content or "", registry=r, open_store=o,
                            embedder=embedder(), max_words=max_words,
                            overlap_words=overlap_words, note=note)  # fmt: skip


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
            if d.action not in FORM_VERBS:
                raise ConfigError(f"unknown action {d.action!r}; use approve, reject or edit.")
            doc = apply_decision(Verb(d.action), d.doc_id, actor_id, registry=registry,
                                 open_store=open_store, embedder=embedder, note=d.note,
                                 content=d.content, max_words=max_words,
                                 overlap_words=overlap_words)  # fmt: skip
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
