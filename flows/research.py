"""The ``research`` flow: seed bundle + public context -> four drafts (pending_review, one
synthesis run) -> pause for the account manager's decisions (the ``review`` flow as a subflow).

The run ends Failed, with the reason as the state's message and its report inside a
:class:`~core.errors.RunFailed`, when it did not do its job: the budget stopped it (nothing was
persisted), or its review failed (a refused reviewer, a timeout: the drafts stay
pending_review). The report then says so in ``budget_exceeded`` or ``review_failed``.
"""

from __future__ import annotations

import uuid

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from core.contracts import ResearchReport, ReviewReport
from core.errors import KbflowError, RunFailed
from core.models import ResearchRequest
from core.settings import Settings
from flows.review import failed_run, review
from sinks.connect import open_registry
from tasks.research.budget import push_metrics
from tasks.research.extractive import ExtractiveSynthesizer
from tasks.research.progress import job_progress
from tasks.research.run import persisted_outcome, stopped_outcome
from tasks.research.steps import gather_task, persist_task, synthesize_task
from tasks.research.synthesize import resolve_model
from tasks.review.access import authorize_decision
from tasks.review.steps import record_review_run_task


@flow(name="research")
def research(
    org: str,
    client_name: str,
    model: str | None = None,
    budget_cap_tokens: int = 200_000,
    reviewer: str | None = None,
    review_timeout_s: int = 3600,
    offline: bool | None = None,
    job_id: str | None = None,
) -> ResearchReport:
    """Draft the four KB documents for ``org`` and pause for their review.

    ``reviewer`` is who runs it: the org's account manager or a superadmin (anyone else is
    refused before anything is fetched). Left out (a deployment run with its defaults, a
    schedule), the run drafts for the org and its review waits for whoever proves with a
    review code that they may decide (see :mod:`flows.review`).

    With ``review_timeout_s=0`` the flow returns after persisting the drafts (review them later
    with ``kbflow review``). A budget overrun persists nothing and skips the review.
    ``offline`` skips public context (default: the ``KBFLOW_RESEARCH_OFFLINE`` setting).
    ``job_id`` names the registry job this run does (see `kbflow.services.job_runner`).

    Returns:
        The report; but the run ends Failed (:func:`flows.review.failed_run`: a plain call
        raises :class:`~core.errors.RunFailed` with the report) when the budget stopped it
        or its review failed.
    """
    logger = get_run_logger()
    settings = Settings()
    request = ResearchRequest(
        org_id=org, client_name=client_name, model=model, budget_cap_tokens=budget_cap_tokens
    )
    with open_registry(settings) as registry:
        if job_id is not None and flow_run.parent_flow_run_id is None:  # else: the parent's
            registry.jobs.update_job_runner(job_id, flow_run_id=str(flow_run.id))
        if reviewer is not None:  # a named starter must be the org's AM or a superadmin
            authorize_decision(registry, reviewer, org, what="run research")
        else:  # a deployment run with its defaults: nothing is published without a code
            registry.people.get_org(org)  # an unknown org is a clear error, not a traceback
            logger.info(
                "research for org %s started without a named reviewer (a deployment or a "
                "schedule); its review waits for whoever proves with a review code that they "
                "may decide for the org",
                org,
            )
    public = not (settings.research.research_offline if offline is None else offline)
    gathered = gather_task(request, settings, public, job_id)
    if gathered.stopped:
        report = stopped_outcome(gathered.notes, gathered.budget, _model_id(request, settings),
                                 gathered.stopped)  # fmt: skip
    else:
        _progress(settings, job_id, "synthesising")
        drafted = synthesize_task(gathered, settings)
        if drafted.stopped:
            report = stopped_outcome(gathered.notes, drafted.budget, drafted.model_id,
                                     drafted.stopped)  # fmt: skip
        else:
            _progress(settings, job_id, "saving", tokens=drafted.budget.tokens)
            run_id = uuid.uuid4().hex
            if review_timeout_s > 0:
                # Its drafts are in the inbox before the review subflow pauses: this run holds
                # them (recorded before they are stored), so a decision made meanwhile waits
                # for that pause (`kbflow.services.review.decisions`) instead of being applied
                # beside it and leaving the run paused on a decided draft.
                record_review_run_task(str(flow_run.id), org, [], settings, run_id)
            persisted = persist_task(drafted.drafts, gathered.corpus, org, settings, run_id)
            report = persisted_outcome(gathered, drafted, run_id, persisted)
    if settings.research.metrics_pushgateway:
        push_metrics(settings.research.metrics_pushgateway, org)
    for note in report.notes:
        logger.warning("research %s: %s", org, note)
    if report.budget_exceeded:  # its note was logged above
        why = f"research budget exceeded for org {org!r}: " + (
            report.budget_stop or "nothing was persisted"
        )
        return failed_run(why, report)
    logger.info(
        "research run %s: %d drafts pending review (%s)",
        report.synthesis_run_id,
        len(report.doc_ids),
        report.synthesizer,
    )
    if review_timeout_s > 0:
        name = f"{flow_run.name or 'research'}-review"
        try:
            reviewed = review.with_options(flow_run_name=name)(
                org=org,
                reviewer=reviewer,
                timeout_s=review_timeout_s,
                synthesis_run_id=report.synthesis_run_id,
            )
            report = report.model_copy(update={"review": reviewed})
        except RunFailed as exc:  # it ran, and says why it failed
            reviewed = ReviewReport.model_validate(exc.report)
            report = report.model_copy(update={"review": reviewed, "review_failed": str(exc)})
        except KbflowError as exc:  # it did not finish (a timeout)
            report = report.model_copy(update={"review_failed": str(exc)})
        if report.review_failed is not None:
            why = (
                f"the review of research run {report.synthesis_run_id} failed, its "
                f"{len(report.doc_ids)} drafts stay pending_review: {report.review_failed}"
            )
            return failed_run(why, report)
    return report


def _progress(
    settings: Settings, job_id: str | None, stage: str, tokens: int | None = None
) -> None:
    """Record on the job (if any) that the run has entered ``stage`` (``tokens`` spent)."""
    if job_id is None:
        return
    try:
        with open_registry(settings) as registry:
            job_progress(registry, job_id)(stage, tokens=tokens)
    except Exception:  # progress is a courtesy: never the run's failure
        get_run_logger().warning("could not record progress %s on job %s", stage, job_id)


def _model_id(request: ResearchRequest, settings: Settings) -> str:
    """The synthesizer a run would have used (for a run the budget stopped before it)."""
    return (
        resolve_model(request.model)
        if settings.answers.anthropic_api_key
        else ExtractiveSynthesizer.model_id
    )
