# Over 500 lines: the review flow and the form it pauses on are reviewed together.
"""The ``review`` flow: list an org's drafts -> pause for a reviewer's form -> apply decisions.

The flow pauses with :func:`prefect.flow_runs.pause_flow_run`, so the Prefect UI renders a form
(one row per pending document) and whoever resumes the run fills it in. Anyone who reaches the
Prefect API can read that form and submit it, so:

- **the form holds no draft text**: each row names its draft (title, collection, version, id)
  and where to read it behind a login (the review inbox's page, or `kbflow review show`);
  an ``edit`` row carries the whole new Markdown; an ``edit`` equal to the stored draft is
  applied as an approve of it (nothing is re-chunked or re-embedded);
- **a typed name proves nothing**: the form's ``code`` field takes a proof that a one-time
  review code signed exactly these decisions for this run (:mod:`tasks.review.codes`; the inbox
  makes it, and the code itself never enters Prefect's storage). The run verifies it before it
  applies anything. A missing or bare code, a wrong, used, expired or foreign one, or decisions
  changed after they were signed (another client swapped the input while the run polled) end
  the run Failed with nothing applied; the code's user is the reviewer of every decision,
  checked like `kbflow review approve`.
- **only runs kbflow started get the inbox's decisions**: just before it pauses the run records
  itself in the registry (`review_runs`); a paused run planted through the Prefect API is not
  there, and the inbox decides directly instead.

Nothing is held while paused: the registry and the embedded vector store are opened only to
list the drafts before pausing and to apply the decisions after the resume. Just before it
pauses, the run announces its id and UI address on :func:`core.progress.waiting`. After the
resume, the run's logs and a Markdown artifact on its page say what was decided, by whom.

Every decision goes through :func:`tasks.review.machine.apply_decisions`, which authorises the
reviewer and moves each document exactly once; ``skip`` leaves a document pending. The run ends
Failed (its report in the error, see :class:`~core.errors.RunFailed`) when it did not do its
job, by the rule of :func:`tasks.review.machine.review_failure`: a refused reviewer, or only
invalid rows. Lost races and skipped rows are reported, and the run completes.

If nobody answers within ``timeout_s``, the run fails (:class:`~core.errors.ReviewTimeout`;
Prefect records "The flow was paused and never resumed.") and every document stays
pending_review, invisible to search.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from logging import Logger, LoggerAdapter
from typing import Any, Literal

import pydantic
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
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
from tasks.review.codes import DRAFT_FIELD_PREFIX
from tasks.review.decisions import Decision, Outcome, review_failure, same_content
from tasks.review.steps import (
    apply_decisions_task,
    list_pending_task,
    prove_reviewer_task,
    read_drafts_task,
    record_review_run_task,
)

UNCHANGED_EDIT = "the edit left the draft's text unchanged: the stored draft was approved as is"


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
        description="For edit only: the whole new Markdown of the draft (copy it from the "
        "inbox's editor or `kbflow review show`, change it, paste it here). Equal to the "
        "draft, it is approved as it is.",
    )
    note: str = Field("", description="Why (optional): kept with the decision in the audit log.")


def _code_required(schema: dict[str, Any]) -> None:
    """List the form's ``code`` as required in its JSON schema: the Prefect UI labels every
    property the schema does not require "(Optional)", and a decision proof is not optional."""
    required = schema.setdefault("required", [])
    if "code" in schema.get("properties", {}) and "code" not in required:
        required.insert(0, "code")


class ReviewDecision(RunInput):
    """The form a reviewer submits to resume a paused review run.

    The form built for a run (:func:`review_form`) adds one :class:`DraftDecision` field per
    pending draft, ``doc_<id>``, whose description is the draft's text: the Prefect UI shows a
    field's description inside the form, where it cannot collapse (the run input's own
    description is squeezed to nothing once the form is taller than the dialog). Programs may
    instead send ``decisions``, a list of :class:`DocDecision` rows; it is not shown in the UI.
    """

    # Unknown keys are ignored rather than refused: the stored schema leaves out `decisions`
    # (see above), and the server checks submissions against that schema. The schema lists
    # `code` as required (`_code_required`), so the Prefect UI does not label it "(Optional)";
    # the model keeps a default, so an empty or missing code still reaches the run, which then
    # fails with nothing applied.
    model_config = ConfigDict(extra="ignore", json_schema_extra=_code_required)

    code: str = Field(
        "",
        title="Your decision proof",
        description="Proof that you made exactly these decisions: the review inbox sends it for "
        "you when you decide there (the simplest way). Programs sign their decisions with a "
        "one-time review code (`kbflow review code --org ORG --as YOU`): "
        "`tasks.review.codes.sign_decisions(code, run_id, run_input)`; a bare code is refused, "
        "since anyone who reaches this API could read it here and reuse it. Without a valid "
        "proof nothing is applied and the run fails.",
    )
    # Accepted and ignored (older forms and scripts sent it): a typed name proves nothing, the
    # reviewer is the user the code was issued to.
    reviewer: SkipJsonSchema[str | None] = Field(None, exclude=True)
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
        reviewer: who is expected to decide (named in the run's logs only: the reviewer is
            whoever the form's review code proves).
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

    logger.info("org %s has %d documents pending review:", org, len(pending))
    for doc in pending:
        logger.info("  %s  %r (v%d, %s)", doc.id, doc.title, doc.version, doc.collection_path)
    form = _form_for(org, pending, settings.inbox.review_url)
    run_id = str(flow_run.id)
    record_review_run_task(run_id, org, [d.id for d in pending], settings)
    url = url_for("flow-run", obj_id=run_id)
    logger.info(
        "waiting up to %ds for a reviewer%s to resume this run with decisions and a review "
        "code (%s); if none arrives, the run fails and all %d documents stay pending_review "
        "(hidden from search)",
        timeout_s,
        f" ({reviewer} expected)" if reviewer else "",
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
                "decide in the review inbox (`kbflow serve`, /review), or open the run in the "
                "Prefect UI, press Resume, enter a review code (`kbflow review code --org "
                f"{org} --as YOU`), choose approve, edit, reject or skip for each draft and "
                f"submit; after {timeout_s}s the run fails and every draft stays pending_review."
            ),
        )
    )
    try:
        # How often it asks whether it was resumed (KBFLOW_REVIEW_POLL_S); Prefect annotates
        # an int but only sleeps it, so a fraction of a second works.
        answer: ReviewDecision = pause_flow_run(  # type: ignore[call-overload]
            wait_for_input=form, timeout=timeout_s, poll_interval=settings.inbox.review_poll_s
        )
    except FlowPauseTimeout as exc:
        raise ReviewTimeout(
            f"no decisions arrived within {timeout_s}s, so the {len(pending)} drafts of org "
            f"{org!r} stay pending_review (hidden from search). Run `kbflow review flow` again, "
            "or decide with `kbflow review approve/reject/edit`."
        ) from exc

    rows, bad = answer.rows()
    received = answer.model_dump(mode="json")  # exactly what the proof must cover
    proof = prove_reviewer_task(answer.code, org, run_id, received, settings)
    if proof.reviewer is None:
        why = f"nothing was applied: {proof.refused}"
        logger.error(
            "review refused, %s Then decide again in the review inbox, or start a new review "
            "run (`kbflow review flow --org %s`): this run has ended.", why, org,
        )  # fmt: skip
        refused = [
            Outcome(r.doc_id, r.action, "forbidden", why) for r in rows if r.action != "skip"
        ]
        report = _report(org, None, pending, outcomes=[*bad, *refused],
                         skipped=[d.id for d in pending])  # fmt: skip
        _summarize(org, None, report, why)
        return failed_run(f"review of org {org!r} refused: {why}", report)
    proven = proof.reviewer
    edited = [d for d in pending if any(r.doc_id == d.id and r.action == "edit" for r in rows)]
    texts = _read_drafts(settings, edited, logger) if edited else {}
    slots, decisions, skipped, unchanged = _sort_decisions(rows, pending, texts)
    slots = [*bad, *slots]
    applied: list[Outcome] = []
    if decisions:
        applied = apply_decisions_task(decisions, proven, settings)
    results = iter(applied)
    outcomes = [slot if slot is not None else next(results) for slot in slots]
    outcomes = [
        replace(o, message=UNCHANGED_EDIT) if o.applied and o.doc_id in unchanged else o
        for o in outcomes
    ]
    report = _report(org, proven, pending, outcomes=outcomes, skipped=skipped)
    failure = review_failure(org, proven, outcomes)
    _summarize(org, proven, report, failure)
    if failure is not None:
        logger.error("review failed: %s", failure)  # the run's logs in the UI say why, too
        return failed_run(failure, report)
    return report


def _summarize(org: str, reviewer: str | None, report: ReviewReport, failure: str | None) -> None:
    """What was decided, by whom: one log line per decision and a Markdown artifact on the
    run's page (the run page otherwise says only Completed or Failed)."""
    logger = get_run_logger()
    who = reviewer or "nobody proven"
    logger.info(
        "reviewer %s: %d applied, %d skipped, %d not applied",
        who, report.applied, report.skipped, report.failed,
    )  # fmt: skip
    for o in report.outcomes:
        logger.info("  %s %s: %s%s", o.action, o.doc_id, o.result,
                    f" ({o.message})" if o.message else "")  # fmt: skip
    lines = [
        f"# Review of org `{org}`",
        "",
        f"**Reviewer** (proven by a review code): {who}  ",
        f"**Applied** {report.applied} · **skipped** {report.skipped} · "
        f"**not applied** {report.failed}",
        "",
    ]
    if failure:
        lines += [f"**The run failed:** {_cell(failure)}", ""]
    if report.outcomes:
        lines += ["| document | action | result | message |", "|---|---|---|---|"]
        lines += [
            f"| `{o.doc_id}` | {o.action} | {o.result} | {_cell(o.message or '')} |"
            for o in report.outcomes
        ]
    try:
        create_markdown_artifact(
            markdown="\n".join(lines), key=f"review-{_artifact_key(org)}",
            description=f"Decisions on org {org}'s drafts",
        )  # fmt: skip
    except Exception as exc:
        logger.warning("could not attach the review summary to the run: %s", exc)


def _artifact_key(org: str) -> str:
    """An artifact key Prefect accepts (lowercase letters, digits and dashes)."""
    return re.sub(r"[^a-z0-9-]+", "-", org.lower()).strip("-") or "org"


def failed_run(message: str, report: Report) -> Any:
    """The Failed state a flow returns when it did not do its job: ``message`` is the state's
    message, and its data a :class:`~core.errors.RunFailed` holding ``report``.

    A plain call of the flow raises that RunFailed (so callers still get the report);
    ``return_state=True`` gets the state. Typed ``Any`` because callers never receive it as a
    value: the flows keep their report's return type. The error holds the report's JSON.
    """
    return Failed(message=message, data=RunFailed(message, report.to_dict()))


def _read_drafts(
    settings: Settings, docs: Sequence[DocRecord], logger: Logger | LoggerAdapter[Logger]
) -> dict[str, str]:
    """The stored Markdown of the drafts a form edits, to tell an unchanged edit (an approve
    of the stored draft) from a change; the store is held only while reading.

    A busy store (another process holds it) costs that comparison, not the review: every edit
    is then applied as an edit.
    """
    try:
        texts: dict[str, str] = read_drafts_task(docs, settings)
    except StoreBusy as exc:
        logger.warning("could not compare edits with the stored drafts: %s", exc)
        return {}
    return texts


def _form_for(
    org: str, pending: Sequence[DocRecord], review_url: str | None
) -> type[ReviewDecision]:
    """The review form: a review-code field, then one field per draft, titled with the
    draft's title and starting on ``skip``. No draft text is in it (the form is readable by
    anyone who reaches the Prefect API): each field says where to read its draft."""
    where = (
        f"in the review inbox ({review_url.rstrip('/')}/review)"
        if review_url
        else "in the review inbox (`kbflow serve`, /review) or with `kbflow review show`"
    )
    description = (
        f"**{len(pending)} documents of org `{org}` await review.** Read each draft {where}, "
        "then choose its action here: approve, edit (paste the whole new text), reject, or "
        "skip (it stays pending_review). Enter your one-time review code first: only a "
        "superadmin or the org's assigned account manager gets one, and without it nothing is "
        "applied."
    )
    fields: dict[str, Any] = {}
    for number, doc in enumerate(pending, start=1):
        fields[f"{DRAFT_FIELD_PREFIX}{doc.id}"] = (
            DraftDecision,
            Field(
                DraftDecision(),
                title=f"Draft {number} of {len(pending)}: {' '.join(doc.title.split())}",
                description=_draft_section(doc, review_url),
            ),
        )
    form: type[ReviewDecision] = pydantic.create_model(
        ReviewDecision.__name__, __base__=ReviewDecision, **fields
    )
    form._description = description  # what Prefect's RunInput.with_initial_data sets
    return form


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _draft_section(doc: DocRecord, review_url: str | None) -> str:
    """One draft's field description: its id, collection and version, and where to read it:
    its page in the review inbox (on ``review_url``, else the page's path on `kbflow serve`)."""
    head = f"`{doc.id}` · {_cell(doc.collection_path)} · version {doc.version}"
    show = f"`kbflow review show {doc.id} --as YOU`"
    path = draft_page_path(doc.id)
    if review_url:
        page = f"{review_url.rstrip('/')}{path}"
        return f"{head}\n\nRead it (after logging in): [{page}]({page}) — or {show}."
    return (
        f"{head}\n\nRead it in the review inbox, at `{path}` on the address of `kbflow "
        f"serve` (after logging in), or with {show}."
    )


def draft_page_path(doc_id: str) -> str:
    """Where the review inbox shows a draft (`kbflow serve`'s /review/drafts/<id>)."""
    return f"/review/drafts/{doc_id}"


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
