"""The research page of the review inbox (``/review/research``): an org's research runs as its
account manager follows them, and starting one.

A run started here is a research job (`kbflow.services.jobs.submit_research_job`, as
``POST /v1/admin/orgs/{org}/research`` starts one): it returns at once and the page follows the
job: queued for a free slot, researching (gathering the seeds and public pages, drafting), drafts
ready (waiting in the inbox), done (with what it spent of its budget) or failed (with why).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.models import DocStatus, JobStatus, SourceTag
from core.settings import Settings
from kbflow.services.jobs import RESEARCH_KIND, queue, submit_research_job
from kbflow.services.orchestration import prefect_api, running_server_url
from kbflow.services.research.seeds import DEFAULT_BUDGET_TOKENS
from sinks.registry.schema import aware
from tasks.research.seed import list_seeds
from tasks.review.access import authorize_decision, may_decide, may_inspect

if TYPE_CHECKING:
    from sinks.registry import DocRecord, JobRecord, OrgRecord, SqlRegistry, UserRecord

SHOWN_RUNS = 10


@dataclass(frozen=True)
class RunView:
    """One research run (a job) as the page shows it."""

    job: JobRecord
    stage: str
    detail: str
    drafts: int
    spent_tokens: int | None
    max_tokens: int
    run_url: str | None
    notes: tuple[str, ...] = ()  # what the run noted (a source it could not fetch, a held draft)

    @property
    def active(self) -> bool:
        return self.job.status is JobStatus.PROCESSING


@dataclass(frozen=True)
class ResearchPage:
    """An org's recent research runs, newest first, and what starting one takes."""

    org: OrgRecord
    may_decide: bool
    runs: list[RunView]
    seeds: int
    budget_tokens: int

    @property
    def refresh(self) -> bool:
        """Whether a run is still going (the page reloads itself until none is)."""
        return any(run.active for run in self.runs)


def research_page(
    settings: Settings, registry: SqlRegistry, user: UserRecord, org: OrgRecord
) -> ResearchPage:
    """``org``'s research runs for someone who may read its drafts.

    Raises:
        Forbidden: the user may not read the org's drafts.
    """
    from core.errors import Forbidden

    if not may_inspect(user, org):
        raise Forbidden("no such organisation, or not one you may read.")
    jobs = [j for j in registry.jobs.list_jobs(org.id, limit=100) if j.kind == RESEARCH_KIND]
    drafts = registry.documents.list_documents(org.id, statuses=[DocStatus.PENDING_REVIEW.value])
    made = [d for d in drafts if d.source_tag == SourceTag.AGENT_SYNTHESIS.value]
    ui = _prefect_ui(settings)
    runs = []
    for job in jobs[:SHOWN_RUNS]:
        if job.status is JobStatus.PROCESSING:
            job = queue.refresh(registry, job, settings)  # a dead run is failed, a slot used
        runs.append(_view(job, made, ui))
    return ResearchPage(
        org=org,
        may_decide=may_decide(user, org),
        runs=runs,
        seeds=len(list_seeds(registry, org.id)),
        budget_tokens=DEFAULT_BUDGET_TOKENS,
    )


def start_research(
    settings: Settings, registry: SqlRegistry, user: UserRecord, org: OrgRecord
) -> JobRecord:
    """A research run for ``org`` started as ``user`` (its reviewer), returning at once.

    Raises:
        Forbidden: the user may not decide for the org (audited).
        JobQueueFull, JobRunnerUnavailable: see `kbflow.services.jobs.start_job`.
    """
    authorize_decision(registry, user.id, org.id, what="run research")
    return submit_research_job(
        settings, org.id, client_name=org.name or org.id, model=None,
        budget_tokens=DEFAULT_BUDGET_TOKENS, reviewer=user.id,
    )  # fmt: skip


def _view(job: JobRecord, pending: Sequence[DocRecord], ui: str | None) -> RunView:
    report = job.report or {}
    budget = report.get("budget") or {}
    max_tokens = int(job.params.get("budget_tokens") or budget.get("max_tokens") or 0)
    # the final report's spend, else what the run recorded as it saved its drafts
    spent = budget.get("tokens", report.get("consumed_tokens", (job.progress or {}).get("tokens")))
    url = f"{ui}/runs/flow-run/{job.flow_run_id}" if ui and job.flow_run_id else None
    since = job.created_at
    waiting = [d for d in pending if aware(d.created_at) >= since]  # SQLite's come naive
    if job.status is JobStatus.FAILED:
        return RunView(job, "failed", job.reason or "the run failed", 0, spent, max_tokens, url)
    if job.status is JobStatus.COMPLETE:
        made = len(report.get("documents") or [])
        notes = tuple(str(n) for n in report.get("notes") or [])
        detail = f"{made} draft{'s' if made != 1 else ''} made"
        return RunView(job, "done", detail, made, spent, max_tokens, url, notes)
    if queue.is_queued(job):
        return RunView(job, "queued", "waiting for a free slot: other jobs run first", 0, None,
                       max_tokens, url)  # fmt: skip
    if waiting:
        count = len(waiting)
        return RunView(job, "drafts ready",
                       f"{count} draft{'s' if count != 1 else ''} waiting for your review in the "
                       "inbox", count, spent, max_tokens, url)  # fmt: skip
    started = int((dt.datetime.now(dt.UTC) - since).total_seconds())
    stage, detail = _progress(job.progress or {})
    return RunView(job, stage, f"{detail} ({started} s so far)", 0, None, max_tokens,
                   url)  # fmt: skip


def _progress(progress: dict[str, object]) -> tuple[str, str]:
    """The stage a running research job reported (`tasks.research.progress`), in words."""
    stage, done, total = progress.get("stage"), progress.get("done"), progress.get("total")
    if stage == "reading":
        if total == 0:
            return "reading", "no seed inputs to read: public pages only"
        count = f"{total} " if isinstance(total, int) else ""
        return "reading", f"reading the {count}seed input{'s' if total != 1 else ''}"
    if stage == "fetching" and isinstance(done, int) and isinstance(total, int):
        return "fetching", f"fetching public pages: {done} of {total}"
    if stage == "synthesising":
        return "synthesising", "writing the four drafts from what was gathered"
    if stage == "saving":
        return "saving", "saving the drafts for your review"
    return "researching", "starting: reading the seed inputs and public pages, then drafting"


def _prefect_ui(settings: Settings) -> str | None:
    """Where the Prefect UI of this home's runs is, when a server is known (None: runs report
    to temporary servers that no UI reaches; the job's log has the run)."""
    api = prefect_api.configured_url() or running_server_url(settings)
    return api.removesuffix("/api") if api else None
