"""Background jobs: start one, read one, notice one whose run died.

A job is a registry row (`sinks/registry/jobs.py`) and a run that does its work (`kbflow.jobs`):
an ingest of long files (``ingest``) or a research run (``research``). The row goes from
PROCESSING to COMPLETE, or FAILED with the reason. ``KBFLOW_JOB_RUNNER`` says what runs it:

- ``process`` (the default): a detached ``python -m kbflow.jobs JOB_ID`` on this machine,
  watched by its pid;
- ``prefect``: a run of the ``kbflow-job`` deployment (``KBFLOW_JOB_DEPLOYMENT``) on a work
  pool, through the Prefect server at ``PREFECT_API_URL``, watched by its flow run id.

Starting and reading jobs needs no Prefect import (`kbflow.services.prefect_api` speaks its REST
API), so `kbflow serve` does both (tests/test_layers.py); only the job's own run imports flows.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

from core.contracts import IngestRequest
from core.errors import KbflowError
from core.models import JobStatus
from core.settings import Settings
from kbflow.services import prefect_api
from sinks.connect import open_registry
from sinks.registry import JobRecord, SqlRegistry

INGEST_KIND = "ingest"
RESEARCH_KIND = "research"

log = logging.getLogger(__name__)


def submit_ingest_job(
    settings: Settings, paths: list[str], request: IngestRequest, *, actor: str | None = None
) -> JobRecord:
    """Record a PROCESSING ingest job and start its run (`_start`); returns immediately.

    ``actor`` is who the documents are recorded as ingested by (default: ``system``).
    """
    params = request.job_params() | ({"actor": actor} if actor else {})
    return _start(settings, request.org, INGEST_KIND, paths, params)


def submit_research_job(
    settings: Settings,
    org: str,
    *,
    client_name: str,
    model: str | None,
    budget_tokens: int,
    reviewer: str,
) -> JobRecord:
    """Record a PROCESSING research job and start its run (`_start`); returns at once.

    The run does `kbflow.services.research.run_research` (the ``research`` flow, which
    records its flow run id on the job and pauses for review as ``kbflow research`` does), and
    finishes the job with the run's report, whose ``synthesis_run_id`` names the drafts.
    """
    params = {
        "client_name": client_name,
        "model": model,
        "budget_tokens": budget_tokens,
        "reviewer": reviewer,
    }
    return _start(settings, org, RESEARCH_KIND, [], params)


def _start(
    settings: Settings, org: str, kind: str, inputs: list[str], params: dict[str, Any]
) -> JobRecord:
    """Record the job and start its run by ``settings.job_runner``.

    Raises:
        JobRunnerUnavailable: the ``prefect`` runner has no PREFECT_API_URL, its server has no
            such deployment or does not answer (no job is recorded), or the server refused the
            run (the job is recorded FAILED with the reason).
    """
    if settings.job_runner == "prefect":
        return _start_deployment_run(settings, org, kind, inputs, params)
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    with open_registry(settings) as registry:
        job = registry.create_job(org, kind=kind, inputs=inputs, params=params)
        log_path = (settings.jobs_dir / f"{job.id}.log").resolve()
        env = dict(os.environ, KBFLOW_HOME=str(settings.home.resolve()))
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kbflow.jobs", job.id],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=os.getcwd(),
                start_new_session=True,  # outlives the command (or service) that started it
            )
        registry.update_job_runner(job.id, pid=proc.pid, log_path=str(log_path))
        return registry.get_job(job.id)


def _start_deployment_run(
    settings: Settings, org: str, kind: str, inputs: list[str], params: dict[str, Any]
) -> JobRecord:
    # Both checks come before the row: a runner that cannot start anything records nothing.
    url = prefect_api.api_url()
    deployment = prefect_api.deployment_id(url, settings.job_deployment)
    with open_registry(settings) as registry:
        job = registry.create_job(org, kind=kind, inputs=inputs, params=params)
        try:
            run_id = prefect_api.start_run(url, deployment, {"job_id": job.id}, key=job.id)
        except Exception as exc:  # no run will ever finish this row: finish it here
            registry.finish_job(
                job.id,
                JobStatus.FAILED,
                reason=f"could not start a run of {settings.job_deployment}: {exc}",
            )
            raise
        registry.update_job_runner(job.id, flow_run_id=run_id)
        return registry.get_job(job.id)


def refresh(jobs: SqlRegistry, job: JobRecord) -> JobRecord:
    """A PROCESSING job whose run is over without finishing it is marked FAILED.

    A process job (a pid) whose process is gone is failed naming its log. A deployment-run job
    (no pid, a flow run id) whose flow run ended FAILED, CRASHED or CANCELLED is failed naming
    that state and its message (a worker that died, a cancelled run); when the Prefect server
    cannot be asked, the row is left as it is.
    """
    if job.status is not JobStatus.PROCESSING:
        return job
    if job.pid is None:
        return _refresh_from_prefect(jobs, job) if job.flow_run_id else job
    if _alive(job):
        return job
    jobs.finish_job(
        job.id,
        JobStatus.FAILED,
        reason=(
            f"the job's process (pid {job.pid}) exited without finishing — see its log "
            f"{job.log_path or '(none)'}; {_again(job)}"
        ),
    )
    return jobs.get_job(job.id)


def _again(job: JobRecord) -> str:
    if job.kind == INGEST_KIND:
        return "re-run the ingest (finished files are skipped)"
    return f"start the {job.kind} again"


def _refresh_from_prefect(jobs: SqlRegistry, job: JobRecord) -> JobRecord:
    assert job.flow_run_id is not None
    try:
        state = prefect_api.run_state(prefect_api.api_url(), job.flow_run_id)
    except KbflowError as exc:  # no server set, or it does not answer: nothing to say yet
        log.debug("job %s: flow run %s not read: %s", job.id, job.flow_run_id, exc)
        return job
    if state is None or state.type not in prefect_api.FAILED_TYPES:
        return job
    jobs.finish_job(
        job.id,
        JobStatus.FAILED,
        reason=(
            f"its Prefect flow run {job.flow_run_id} ended {state.name}: "
            f"{state.message or '(no message)'}; {_again(job)}"
        ),
    )
    return jobs.get_job(job.id)


def _alive(job: JobRecord) -> bool:
    import psutil

    try:
        proc = psutil.Process(job.pid)
        return proc.status() != psutil.STATUS_ZOMBIE and job.id in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def list_jobs(
    settings: Settings, *, org: str | None, status: JobStatus | None, limit: int
) -> list[JobRecord]:
    """Recent jobs, newest first; a job whose run ended unfinished is marked FAILED."""
    with open_registry(settings) as registry:
        return [refresh(registry, job) for job in registry.list_jobs(org, status, limit)]


def get_job(settings: Settings, job_id: str) -> JobRecord:
    """One job, refreshed like `list_jobs`; raises NotFound for an unknown id."""
    with open_registry(settings) as registry:
        return refresh(registry, registry.get_job(job_id))
