"""The ``review`` flow: list an org's drafts -> pause for a reviewer's form -> apply decisions.

The flow pauses with :func:`prefect.flow_runs.pause_flow_run`, so the Prefect UI renders a form
(one row per pending document) and whoever resumes the run fills it in. The form's description
shows each draft's text (rebuilt from its stored chunks, cut to a share of
``DESCRIPTION_TEXT_CHARS`` and saying so), and each row's ``content`` is prefilled with the whole
draft, so an ``edit`` is a change to it; an ``edit`` that leaves it unchanged is applied as an
approve of the stored draft (nothing is re-chunked or re-embedded). Nothing is held while paused:
the embedded vector store is opened only briefly to read the drafts before pausing and again to
apply the decisions after the resume, and the registry is closed in between. Just before it
pauses, the run announces its id and UI address on :func:`core.progress.waiting`.

Every decision goes through :func:`tasks.review.machine.apply_decisions`, which authorises the
reviewer
and moves each document exactly once; ``skip`` leaves a document pending. The run ends Failed
(its report in the error, see :class:`~core.errors.RunFailed`) when it did not do its job, by
the rule of :func:`tasks.review.machine.review_failure`: a refused reviewer, or only invalid rows.
Lost
races and skipped rows are reported, and the run completes.

If nobody answers within ``timeout_s``, the run fails (:class:`~core.errors.ReviewTimeout`;
Prefect records "The flow was paused and never resumed.") and every document stays
pending_review, invisible to search.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from logging import Logger, LoggerAdapter
from typing import Any, Literal, TypeVar

import pydantic
from prefect import flow, get_run_logger
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run
from prefect.states import Failed
from prefect.utilities.urls import url_for
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from core import progress
from core.contracts import Report, ReviewReport
from core.errors import ConfigError, ReviewTimeout, RunFailed, StoreBusy
from core.settings import Settings
from sinks.registry import DocRecord
from tasks.review.decisions import Decision, Outcome, review_failure, same_content
from tasks.review.steps import apply_decisions_task, list_pending_task, read_drafts_task

# How often the paused run asks the server whether it was resumed (one cheap API read).
POLL_INTERVAL_S = 2
# Draft text shown in the form's description, all drafts together: each draft gets an equal
# share (at least MIN_TEXT_CHARS_PER_DRAFT) and a longer text is cut there, saying so. The
# description is one Markdown block in the resume dialog; past this it is a wall to scroll.
DESCRIPTION_TEXT_CHARS = 40_000
MIN_TEXT_CHARS_PER_DRAFT = 1_500
# A row's content is prefilled with the whole draft up to this size, never with a cut one (an
# unchanged edit of a cut text would replace the draft with its beginning). Longer drafts are
# edited with `kbflow review edit --file`.
PREFILL_MAX_CHARS = 200_000
UNCHANGED_EDIT = "the edit left the draft's text unchanged: the stored draft was approved as is"

Form = TypeVar("Form", bound=RunInput)


class DocDecision(BaseModel):
    """One row of the review form: what to do with one pending document."""

    model_config = ConfigDict(extra="forbid")

    doc_id: str = Field(description="Id of a document pending review (prefilled).")
    title: str = Field("", description="The document's title, for reference only.")
    action: Literal["approve", "edit", "reject", "skip"] = Field(
        "skip", description="approve, edit (replace the content, then approve), reject, or skip."
    )
    content: str | None = Field(
        None,
        description=(
            "For edit: the draft's Markdown (prefilled); your changed text replaces the draft. "
            "Left unchanged, the draft is approved as is."
        ),
    )
    note: str | None = Field(None, description="Optional note for the audit log.")


class DraftDecision(BaseModel):
    """What the form asks about one draft. In the form it sits under a field that names the
    draft (``doc_<id>``, titled with the draft's title) and whose description is its text."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["approve", "edit", "reject", "skip"] = Field(
        "skip",
        description="approve: publish it as it is; edit: publish the content below with your "
        "changes; reject: never publish it; skip: decide later (it stays pending_review).",
    )
    content: str = Field(
        "",
        description="The draft's Markdown, prefilled: for edit, change it here (left "
        "unchanged, the draft is approved as it is).",
    )
    note: str = Field("", description="Why (optional): kept with the decision in the audit log.")


DRAFT_FIELD_PREFIX = "doc_"


class ReviewDecision(RunInput):
    """The form a reviewer submits to resume a paused review run.

    The form built for a run (:func:`review_form`) adds one :class:`DraftDecision` field per
    pending draft, ``doc_<id>``, whose description is the draft's text: the Prefect UI shows a
    field's description inside the form, where it cannot collapse (the run input's own
    description is squeezed to nothing once the form is taller than the dialog). Programs may
    instead send ``decisions``, a list of :class:`DocDecision` rows; it is not shown in the UI.
    """

    # Unknown keys are ignored rather than refused: the stored schema leaves out `decisions`
    # (see above), and the server checks submissions against that schema.
    model_config = ConfigDict(extra="ignore")

    reviewer: str = Field(
        description="Your kbflow user id: a superadmin or the org's assigned account manager."
    )
    # Rows as sent: each is checked here (a bad one is reported, not a crash of the run), as
    # the server does not see them in the schema.
    decisions: SkipJsonSchema[list[Any]] = Field(
        default_factory=list, description="One decision per pending document (for programs)."
    )

    def rows(self) -> tuple[list[DocDecision], list[Outcome]]:
        """Every decision the reviewer made (the per-draft fields, then ``decisions``), and an
        ``invalid`` outcome for each row of ``decisions`` that is not a decision."""
        rows = [
            DocDecision(
                doc_id=name.removeprefix(DRAFT_FIELD_PREFIX),
                action=value.action,
                content=value.content or None,
                note=value.note.strip() or None,
            )
            for name, value in self
            if name.startswith(DRAFT_FIELD_PREFIX) and isinstance(value, DraftDecision)
        ]
        bad: list[Outcome] = []
        for raw in self.decisions:
            try:
                rows.append(DocDecision.model_validate(raw))
            except pydantic.ValidationError as exc:
                got = raw if isinstance(raw, dict) else {}
                problem = "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'row'}: {e['msg']}" for e in exc.errors()
                )
                bad.append(
                    Outcome(str(got.get("doc_id", "?")), str(got.get("action", "?")), "invalid",
                            f"decision {raw!r} is not valid ({problem}); nothing was done.")
                )  # fmt: skip
        return rows, bad


@flow(name="review")
def review(
    org: str,
    reviewer: str | None = None,
    timeout_s: int = 3600,
    synthesis_run_id: str | None = None,
) -> ReviewReport:
    """Pause for a reviewer's decisions on the org's pending drafts, then apply them.

    Args:
        org: the org whose pending_review documents are reviewed.
        reviewer: user id to prefill in the form (whoever resumes may change it).
        timeout_s: how long to wait for the form; after that the run fails and every document
            stays pending_review.
        synthesis_run_id: review only the drafts of this research run.

    Returns:
        A report: org, reviewer, pending, applied, skipped, failed and one outcome per decision;
        but when the run did not do its job (see
        :func:`tasks.review.machine.review_failure`) it ends
        Failed (:func:`failed_run`).

    Raises:
        RunFailed: the run ended Failed; the error carries the report.
        ReviewTimeout: nobody submitted the form within ``timeout_s``.
    """
    logger = get_run_logger()
    settings = Settings()
    if timeout_s <= 0:
        raise ConfigError(f"timeout_s must be greater than 0. Currently it is {timeout_s}.")
    pending = list_pending_task(org, synthesis_run_id, settings)  # closed while paused
    if not pending:
        logger.info("org %s has no documents pending review; nothing to decide", org)
        return _report(org, reviewer, pending, outcomes=[], skipped=[])

    texts = _read_drafts(settings, pending, logger)
    logger.info("org %s has %d documents pending review:", org, len(pending))
    for doc in pending:
        logger.info("  %s  %r (v%d, %s)", doc.id, doc.title, doc.version, doc.collection_path)
    form = _form_for(org, pending, reviewer, texts)
    run_id = str(flow_run.id)
    url = url_for("flow-run", obj_id=run_id)
    logger.info(
        "waiting up to %ds for a reviewer to resume this run with decisions (%s); if none "
        "arrives, the run fails and all %d documents stay pending_review (hidden from search)",
        timeout_s,
        url or "no UI URL known",
        len(pending),
    )
    progress.waiting(
        progress.Waiting(
            flow_run_id=run_id,
            flow_run_name=str(flow_run.name),
            url=url,
            what=f"decisions on {len(pending)} drafts of org {org}",
            todo=(
                "open it in the Prefect UI, press Resume, choose approve, edit (change the "
                "prefilled content), reject or skip for each draft and submit; after "
                f"{timeout_s}s the run fails and every draft stays pending_review."
            ),
        )
    )
    try:
        answer = pause_flow_run(
            wait_for_input=form, timeout=timeout_s, poll_interval=POLL_INTERVAL_S
        )
    except FlowPauseTimeout as exc:
        raise ReviewTimeout(
            f"no decisions arrived within {timeout_s}s, so the {len(pending)} drafts of org "
            f"{org!r} stay pending_review (hidden from search). Run `kbflow review flow` again, "
            "or decide with `kbflow review approve/reject/edit`."
        ) from exc

    rows, bad = answer.rows()
    slots, decisions, skipped, unchanged = _sort_decisions(rows, pending, texts)
    slots = [*bad, *slots]
    applied: list[Outcome] = []
    if decisions:
        applied = apply_decisions_task(decisions, answer.reviewer, settings)
    results = iter(applied)
    outcomes = [slot if slot is not None else next(results) for slot in slots]
    outcomes = [
        replace(o, message=UNCHANGED_EDIT) if o.applied and o.doc_id in unchanged else o
        for o in outcomes
    ]
    report = _report(org, answer.reviewer, pending, outcomes=outcomes, skipped=skipped)
    logger.info(
        "reviewer %s: %d applied, %d skipped, %d not applied (%s)",
        answer.reviewer,
        report.applied,
        report.skipped,
        report.failed,
        ", ".join(f"{o.doc_id}: {o.result}" for o in outcomes if not o.applied) or "none",
    )
    failure = review_failure(org, answer.reviewer, outcomes)
    if failure is not None:
        logger.error("review failed: %s", failure)  # the run's logs in the UI say why, too
        return failed_run(failure, report)
    return report


def failed_run(message: str, report: Report) -> Any:
    """The Failed state a flow returns when it did not do its job: ``message`` is the state's
    message, and its data a :class:`~core.errors.RunFailed` holding ``report``.

    A plain call of the flow raises that RunFailed (so callers still get the report);
    ``return_state=True`` gets the state. Typed ``Any`` because callers never receive it as a
    value: the flows keep their report's return type. The error holds the report's JSON.
    """
    return Failed(message=message, data=RunFailed(message, report.to_dict()))


def _read_drafts(
    settings: Settings, pending: Sequence[DocRecord], logger: Logger | LoggerAdapter[Logger]
) -> dict[str, str]:
    """The drafts' Markdown for the form, the store held only while reading (never paused).

    A busy store (another process holds it) costs the form its texts, not the review.
    """
    try:
        texts: dict[str, str] = read_drafts_task(pending, settings)
    except StoreBusy as exc:
        logger.warning("the form shows no draft text: %s", exc)
        return {}
    return texts


def _form_for(
    org: str, pending: Sequence[DocRecord], reviewer: str | None, texts: dict[str, str]
) -> type[ReviewDecision]:
    """The review form: one field per draft, titled with the draft's title, its description
    the draft's text (cut to a share of ``DESCRIPTION_TEXT_CHARS``, saying so), starting on
    ``skip`` with ``content`` prefilled with the whole draft (when it is not too long)."""
    share = max(MIN_TEXT_CHARS_PER_DRAFT, DESCRIPTION_TEXT_CHARS // len(pending))
    description = (
        f"**{len(pending)} documents of org `{org}` await review.** Read each draft below, then "
        "choose its action: approve, edit (change the prefilled content; left unchanged it is "
        "an approve), reject, or skip (it stays pending_review). Only a superadmin or the "
        "org's assigned account manager may decide."
    )
    fields: dict[str, Any] = {}
    for number, doc in enumerate(pending, start=1):
        text = texts.get(doc.id)
        fields[f"{DRAFT_FIELD_PREFIX}{doc.id}"] = (
            DraftDecision,
            Field(
                DraftDecision(content=_prefill(text) or ""),
                title=f"Draft {number} of {len(pending)}: {' '.join(doc.title.split())}",
                description=_draft_section(doc, text, share),
            ),
        )
    form: type[ReviewDecision] = pydantic.create_model(
        ReviewDecision.__name__, __base__=ReviewDecision, **fields
    )
    return with_initial_data(form, description, **({"reviewer": reviewer} if reviewer else {}))


def with_initial_data(model: type[Form], description: str, **defaults: Any) -> type[Form]:
    """``model`` with new defaults for some fields and a description, like Prefect's
    ``RunInput.with_initial_data``, but keeping each field's title and description.

    Prefect's version re-declares a prefilled field as ``(annotation, value)``, which drops its
    ``Field(description=...)``: the schema stored for the pause, which the UI renders as the
    form, then lacks the help text of exactly the fields that were prefilled.
    """
    fields: dict[str, Any] = {}
    for name, value in defaults.items():
        info = model.model_fields[name]
        fields[name] = (
            info.annotation,
            Field(value, title=info.title, description=info.description),
        )
    form: type[Form] = pydantic.create_model(model.__name__, __base__=model, **fields)
    form._description = description  # what Prefect's version sets: the form's description
    return form


def _prefill(text: str | None) -> str | None:
    return text if text and len(text) <= PREFILL_MAX_CHARS else None


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _draft_section(doc: DocRecord, text: str | None, share: int) -> str:
    """One draft in the description: a heading, its id, then its text (cut to ``share``)."""
    head = f"`{doc.id}` · {_cell(doc.collection_path)} · version {doc.version}"
    show = f"`kbflow review show {doc.id} --as USER`"
    if text is None:
        return f"{head}\n\n*The text could not be read for this form; {show} prints it.*"
    if not text.strip():
        return f"{head}\n\n*No text is stored for this draft.*"
    notes = []
    shown = text
    if len(text) > share:
        cut = text[:share]
        space = cut.rfind(" ")
        shown = (cut[:space] if space > share * 0.8 else cut) + " …"
        where = "its row's content field" if _prefill(text) else show
        notes.append(
            f"*Cut here: {len(shown) - 2:,} of {len(text):,} characters shown; the whole text is "
            f"in {where}.*"
        )
    if _prefill(text) is None:
        notes.append(
            f"*Too long ({len(text):,} characters) to prefill its content field: to edit it, "
            f"use `kbflow review edit {doc.id} --file FILE --as USER`.*"
        )
    return "\n\n".join([head, _inert_markdown(shown), *notes])


_HEADING = re.compile(r"^(#{1,6})(?=\s)", re.MULTILINE)


def _inert_markdown(text: str) -> str:
    """A draft's Markdown as it sits in the description: its headings below the draft's own
    (``###``), raw HTML shown as text, images as text (a draft may quote public web pages,
    and the form must not fetch anything)."""
    text = _HEADING.sub(lambda m: "#" * min(len(m.group(1)) + 3, 6), text)
    return text.replace("<", "&lt;").replace("![", "!\\[")


def _sort_decisions(
    rows: Sequence[DocDecision], pending: Sequence[DocRecord], texts: dict[str, str]
) -> tuple[list[Outcome | None], list[Decision], list[str], set[str]]:
    """Split the form into decisions to apply, invalid rows and documents left pending.

    Returns one slot per non-skip row (an :class:`Outcome` for an invalid row, ``None`` where
    the next applied decision's outcome goes), the decisions to apply, the ids of pending
    documents nobody decided on, and the ids whose ``edit`` left the draft's text unchanged
    (applied as an approve of the stored draft: same text, no re-chunking, no re-embedding).
    """
    pending_ids = {d.id for d in pending}
    slots: list[Outcome | None] = []
    decisions: list[Decision] = []
    decided: set[str] = set()
    unchanged: set[str] = set()
    for row in rows:
        if row.action == "skip":
            continue
        if row.doc_id not in pending_ids:
            slots.append(
                Outcome(
                    row.doc_id,
                    row.action,
                    "invalid",
                    f"document {row.doc_id!r} was not pending review when this run paused; "
                    "decide on it in a new review run.",
                )
            )
        elif row.doc_id in decided:
            slots.append(
                Outcome(
                    row.doc_id,
                    row.action,
                    "invalid",
                    f"document {row.doc_id!r} has more than one decision in this form; "
                    "only the first was applied.",
                )
            )
        else:
            decided.add(row.doc_id)
            draft = texts.get(row.doc_id)
            if row.action == "edit" and draft and same_content(row.content, draft):
                unchanged.add(row.doc_id)
                decisions.append(Decision(row.doc_id, "approve", note=row.note))
            else:
                decisions.append(
                    Decision(row.doc_id, row.action, content=row.content, note=row.note)
                )
            slots.append(None)
    skipped = [d.id for d in pending if d.id not in decided]
    return slots, decisions, skipped, unchanged


def _report(
    org: str,
    reviewer: str | None,
    pending: Sequence[DocRecord],
    *,
    outcomes: Sequence[Outcome],
    skipped: Sequence[str],
) -> ReviewReport:
    applied = sum(o.applied for o in outcomes)
    return ReviewReport.model_validate(
        {
            "org": org,
            "reviewer": reviewer,
            "pending": len(pending),
            "applied": applied,
            "skipped": len(skipped),
            "failed": len(outcomes) - applied,
            "skipped_ids": list(skipped),
            "outcomes": [
                {
                    "doc_id": o.doc_id,
                    "action": o.action,
                    "result": o.result,
                    "message": o.message,
                    "status": o.status,
                }
                for o in outcomes
            ],
        }
    )
