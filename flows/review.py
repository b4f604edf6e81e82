"""The ``review`` flow: list an org's drafts -> pause for a reviewer's form -> apply decisions.

The flow pauses with :func:`prefect.flow_runs.pause_flow_run`, so the Prefect UI renders a form
(one row per pending document) and whoever resumes the run fills it in. Nothing is held while
paused: the registry is closed and the embedded vector store is opened only after the resume.
Every decision goes through :func:`tasks.review.apply_decisions`, which authorises the reviewer
and moves each document exactly once; ``skip`` leaves a document pending.

If nobody answers within ``timeout_s``, Prefect fails the run (``FlowPauseTimeout``) and every
document stays pending_review, invisible to search.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from pydantic import BaseModel, ConfigDict, Field

from kbflow.errors import ConfigError
from kbflow.settings import Settings
from sinks.registry import DocRecord, SqlRegistry
from sinks.vectors import open_vector_store
from tasks.embed import get_embedder
from tasks.review import Decision, Outcome, held
from tasks.wrapped import apply_decisions_task, list_pending_task

# How often the paused run asks the server whether it was resumed (one cheap API read).
POLL_INTERVAL_S = 2


class DocDecision(BaseModel):
    """One row of the review form: what to do with one pending document."""

    model_config = ConfigDict(extra="forbid")

    doc_id: str = Field(description="Id of a document pending review (prefilled).")
    title: str = Field("", description="The document's title, for reference only.")
    action: Literal["approve", "edit", "reject", "skip"] = Field(
        "skip", description="approve, edit (replace the content, then approve), reject, or skip."
    )
    content: str | None = Field(
        None, description="For edit: the full corrected Markdown that replaces the draft."
    )
    note: str | None = Field(None, description="Optional note for the audit log.")


class ReviewDecision(RunInput):
    """The form a reviewer submits to resume a paused review run."""

    reviewer: str = Field(
        description="Your kbflow user id: a superadmin or the org's assigned account manager."
    )
    decisions: list[DocDecision] = Field(
        default_factory=list, description="One decision per pending document."
    )


@flow(name="review")
def review(
    org: str,
    reviewer: str | None = None,
    timeout_s: int = 3600,
    synthesis_run_id: str | None = None,
) -> dict[str, Any]:
    """Pause for a reviewer's decisions on the org's pending drafts, then apply them.

    Args:
        org: the org whose pending_review documents are reviewed.
        reviewer: user id to prefill in the form (whoever resumes may change it).
        timeout_s: how long to wait for the form; after that the run fails and every document
            stays pending_review.
        synthesis_run_id: review only the drafts of this research run.

    Returns:
        A report: org, reviewer, pending, applied, skipped, failed and one outcome per decision.
    """
    logger = get_run_logger()
    settings = Settings()
    if timeout_s <= 0:
        raise ConfigError(f"timeout_s must be greater than 0. Currently it is {timeout_s}.")
    registry = SqlRegistry.open(settings.registry_url)
    try:
        registry.get_org(org)
        pending = list_pending_task(registry, org, synthesis_run_id)
    finally:
        registry.close()  # hold nothing while paused
    if not pending:
        logger.info("org %s has no documents pending review; nothing to decide", org)
        return _report(org, reviewer, pending, outcomes=[], skipped=[])

    logger.info("org %s has %d documents pending review:", org, len(pending))
    for doc in pending:
        logger.info("  %s  %r (v%d, %s)", doc.id, doc.title, doc.version, doc.collection_path)
    logger.warning(
        "waiting up to %ds for a reviewer to resume this run with decisions; if none arrives, "
        "the run fails and all %d documents stay pending_review (hidden from search)",
        timeout_s,
        len(pending),
    )
    form = _form_for(org, pending, reviewer)
    try:
        answer = pause_flow_run(
            wait_for_input=form, timeout=timeout_s, poll_interval=POLL_INTERVAL_S
        )
    except FlowPauseTimeout:
        logger.error(
            "no decision within %ds: the %d documents of org %s stay pending_review",
            timeout_s,
            len(pending),
            org,
        )
        raise

    slots, decisions, skipped = _sort_decisions(answer.decisions, pending)
    applied: list[Outcome] = []
    if decisions:
        registry = SqlRegistry.open(settings.registry_url)
        try:
            with open_vector_store(settings) as store:
                applied = apply_decisions_task(
                    decisions,
                    answer.reviewer,
                    registry=registry,
                    open_store=held(store),
                    embedder=lambda: get_embedder(
                        settings.embedding_model, settings.embed_batch_size
                    ),
                    max_words=settings.chunk_max_words,
                    overlap_words=settings.chunk_overlap_words,
                )
        finally:
            registry.close()
    results = iter(applied)
    outcomes = [slot if slot is not None else next(results) for slot in slots]
    report = _report(org, answer.reviewer, pending, outcomes=outcomes, skipped=skipped)
    logger.info(
        "reviewer %s: %d applied, %d skipped, %d not applied (%s)",
        answer.reviewer,
        report["applied"],
        report["skipped"],
        report["failed"],
        ", ".join(f"{o.doc_id}: {o.result}" for o in outcomes if not o.applied) or "none",
    )
    return report


def _form_for(org: str, pending: Sequence[DocRecord], reviewer: str | None) -> type[ReviewDecision]:
    """The review form, prefilled with one ``skip`` row per pending document."""
    rows = "\n".join(
        f"| `{d.id}` | {d.title} | {d.collection_path} | {d.version} |" for d in pending
    )
    description = (
        f"**{len(pending)} documents of org `{org}` await review.** Set each row's action to "
        "approve, edit (paste the full corrected Markdown in *content*) or reject; rows left on "
        "skip stay pending_review. Only a superadmin or the org's assigned account manager may "
        "decide.\n\n| id | title | collection | version |\n|---|---|---|---|\n" + rows
    )
    initial: dict[str, Any] = {
        "decisions": [DocDecision(doc_id=d.id, title=d.title) for d in pending]
    }
    if reviewer:
        initial["reviewer"] = reviewer
    return ReviewDecision.with_initial_data(description=description, **initial)


def _sort_decisions(
    rows: Sequence[DocDecision], pending: Sequence[DocRecord]
) -> tuple[list[Outcome | None], list[Decision], list[str]]:
    """Split the form into decisions to apply, invalid rows and documents left pending.

    Returns one slot per non-skip row (an :class:`Outcome` for an invalid row, ``None`` where
    the next applied decision's outcome goes), the decisions to apply, and the ids of pending
    documents nobody decided on.
    """
    pending_ids = {d.id for d in pending}
    slots: list[Outcome | None] = []
    decisions: list[Decision] = []
    decided: set[str] = set()
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
            decisions.append(Decision(row.doc_id, row.action, content=row.content, note=row.note))
            slots.append(None)
    skipped = [d.id for d in pending if d.id not in decided]
    return slots, decisions, skipped


def _report(
    org: str,
    reviewer: str | None,
    pending: Sequence[DocRecord],
    *,
    outcomes: Sequence[Outcome],
    skipped: Sequence[str],
) -> dict[str, Any]:
    applied = sum(o.applied for o in outcomes)
    return {
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
