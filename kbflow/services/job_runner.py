"""The background job's run: ``python -m kbflow.services.job_runner JOB_ID``, or the ``kbflow-job``
flow.

`kbflow.services.jobs.queue` records a PROCESSING job and starts this process detached (the
``process`` job runner), or a run of the ``kbflow-job`` deployment on a work pool
(``prefect``: `kbflow.job_flow`, which calls `run_job` here), then returns at once. The run does
the job by its kind, and finishes it COMPLETE, or FAILED with the reason:

- ``ingest``: the ``ingest`` flow over the job's files (long media, large files, uploads);
- ``research``: `kbflow.services.research.runs.run_research` (the ``research`` flow, with its review
  pause as ``kbflow research`` has it); the report names the drafts' synthesis run.

Either flow records its Prefect flow run id on the job when it starts, unless it runs as a
subflow of ``kbflow-job``, whose run is the job's. A job whose process or flow run died without
finishing is noticed by `kbflow.services.jobs.queue.refresh`.

As it starts and as it ends, a run prunes the upload folders done with (a COMPLETE job's, its
own included; a FAILED job's past KBFLOW_JOBS_FAILED_UPLOAD_RETENTION_H): see
`kbflow.services.jobs.uploads.prune_uploads`. The job process (``main``), as it ends, leaves a
helper that starts the queued jobs once it has exited
(`kbflow.services.jobs.queue.start_dispatcher`); a
worker's flow run does not (the ``prefect`` runner is not admitted through the queue).
"""

from __future__ import annotations

import logging
import os
import re
import sys

from core.contracts import IngestReport, IngestRequest, ResearchReport
from core.models import JobStatus
from core.settings import Settings, configure_environment
from kbflow.services.jobs import (
    INGEST_KIND,
    QUEUE_MARK,
    RESEARCH_KIND,
    prune_uploads,
    refresh,
    remove_uploads,
    start_dispatcher,
    submit_ingest_job,
    submit_research_job,
)
from kbflow.services.sources import SOURCE_SYNC_KIND
from sinks.registry import JobRecord, SqlRegistry

__all__ = [
    "INGEST_KIND",
    "RESEARCH_KIND",
    "main",
    "refresh",
    "run_job",
    "submit_ingest_job",
    "submit_research_job",
]

log = logging.getLogger(__name__)


def run_job(job_id: str, settings: Settings | None = None, *, record_pid: bool = True) -> JobRecord:
    """Run a recorded job to its end in this process (what the background process does).

    A job that is no longer PROCESSING is returned as it is, not run again. ``record_pid``
    False leaves the row without this process's pid (a worker's flow run: the job is watched
    by its flow run, and this pid means nothing on the machine that reads the job).
    """
    settings = settings or Settings()
    configure_environment(settings)
    registry = SqlRegistry.open(settings.registry_url)
    try:
        job = registry.jobs.get_job(job_id)
        if job.status is not JobStatus.PROCESSING:
            log.warning("job %s is already %s: not run again", job.id, job.status.value)
            return job
        if record_pid:
            registry.jobs.update_job_runner(job.id, pid=os.getpid())
        _tidy_uploads(settings, registry)
        try:
            if job.kind == RESEARCH_KIND:
                final, reason, report = _research(settings, job)
            elif job.kind == SOURCE_SYNC_KIND:
                final, reason, report = _source_sync(settings, job)
            else:
                final, reason, report = _ingest(job)
        except Exception as exc:  # the job records any failure; nothing else would see it
            log.exception("job %s failed", job.id)
            registry.jobs.finish_job(
                job.id, JobStatus.FAILED, reason=f"{type(exc).__name__}: {exc}"
            )
        else:
            registry.jobs.finish_job(job.id, final, reason=reason, report=report)
        done = registry.jobs.get_job(job.id)
        _tidy_uploads(settings, registry, done)
        return done
    finally:
        registry.close()


def _tidy_uploads(settings: Settings, registry: SqlRegistry, done: JobRecord | None = None) -> None:
    """Remove ``done``'s upload folder if it is COMPLETE, and prune the others done with; a
    failure to is logged, never the job's."""
    try:
        if done is not None:
            for folder in remove_uploads(settings, done):
                log.info("job %s: removed its upload %s", done.id, folder)
        for folder in prune_uploads(settings, registry):
            log.info("pruned upload %s", folder)
    except Exception:
        log.warning("could not prune uploads", exc_info=True)


def _ingest(job: JobRecord) -> tuple[JobStatus, str | None, dict[str, object]]:
    params = dict(job.params)
    params.pop(QUEUE_MARK, None)
    actor = str(params.pop("actor", None) or "system")
    request = IngestRequest.model_validate(params)
    from flows.ingest import ingest
    from kbflow.services.orchestration import tracked

    with tracked(Settings().home, ingest) as run:
        report = run(paths=job.inputs, job_id=job.id, actor=actor, **request.flow_params())
    final, reason = _outcome(report)
    return final, reason, report.to_dict()


def _research(
    settings: Settings, job: JobRecord
) -> tuple[JobStatus, str | None, dict[str, object]]:
    from kbflow.services.research import run_research

    params = job.params
    report = run_research(
        settings,
        job.org_id,
        client_name=params["client_name"],
        model=params.get("model"),
        budget_tokens=int(params["budget_tokens"]),
        reviewer=params.get("reviewer"),
        review_timeout_s=None,  # as `kbflow research`: the review form with a Prefect server
        job_id=job.id,
    )
    return *_research_outcome(report), report.to_dict()


def _source_sync(
    settings: Settings, job: JobRecord
) -> tuple[JobStatus, str | None, dict[str, object]]:
    """The sync a source-sync job asks for: COMPLETE with its summary (failed items counted and
    listed in it), FAILED when the source could not be listed."""
    from core.errors import RunFailed
    from kbflow.services.sources import sync_source as sync

    try:
        summary = sync(settings, job.inputs[0], job.org_id, actor=job.params.get("actor"))
    except RunFailed as exc:
        return JobStatus.FAILED, str(exc), dict(exc.report)
    failed = summary["counts"]["failed"]
    reason = f"{failed} item(s) failed; the rest synced (see errors)" if failed else None
    return JobStatus.COMPLETE, reason, summary.to_dict()


def _outcome(report: IngestReport) -> tuple[JobStatus, str | None]:
    """COMPLETE when something was read; FAILED (with the reasons) when every file failed."""
    skipped = report.skipped
    reasons = "; ".join(f"{s.source}: {s.reason}" for s in skipped[:5])
    if skipped and not report.documents and not report.empty:
        return JobStatus.FAILED, reasons
    if skipped:
        return JobStatus.COMPLETE, f"{len(skipped)} file(s) failed: {reasons}"
    return JobStatus.COMPLETE, None


def _research_outcome(report: ResearchReport) -> tuple[JobStatus, str | None]:
    """COMPLETE when the drafts were persisted (and reviewed, if the run paused for it);
    FAILED when the budget stopped the run or its review failed (the drafts stay pending)."""
    if report.budget_exceeded:
        return JobStatus.FAILED, f"research budget exceeded: {report.budget_stop or 'stopped'}"
    if report.review_failed:
        return JobStatus.FAILED, f"review failed: {report.review_failed}"
    return JobStatus.COMPLETE, None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m kbflow.services.job_runner JOB_ID\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from kbflow.services.orchestration import adopt_running_server, guard_process

    settings = Settings()
    configure_environment(settings)
    # A job started by a process that had no server (`kbflow serve` started before `kbflow
    # server`) runs on this home's server if one runs now: its review pauses where the inbox
    # and the Prefect UI reach it, instead of on a temporary server of its own.
    adopt_running_server(settings)
    guard_process(settings.home)  # its temporary Prefect server must not outlive it either
    try:
        job = run_job(args[0], settings)
    finally:  # its slot frees when this process has gone: the helper starts the next jobs then
        named = re.fullmatch(r"[0-9a-f]{12}", args[0])
        start_dispatcher(settings, settings.jobs_dir / f"{args[0]}.log" if named else None)
    sys.stdout.write(f"job {job.id}: {job.status.value} {job.reason or ''}\n")
    return 0 if job.status is JobStatus.COMPLETE else 1


if __name__ == "__main__":
    raise SystemExit(main())
