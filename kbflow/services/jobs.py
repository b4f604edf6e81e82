"""Background jobs: start one, read one, notice one whose process died.

A job is a registry row (`sinks/registry/jobs.py`) and a detached ``python -m kbflow.jobs
JOB_ID`` process that does its work (`kbflow.jobs`): an ingest of long files (``ingest``) or a
research run (``research``). The row goes from PROCESSING to COMPLETE, or FAILED with the reason.
Starting and reading jobs needs no Prefect, so `kbflow serve` does both (tests/test_layers.py);
only the job's own process imports the flows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from core.contracts import IngestRequest
from core.models import JobStatus
from core.settings import Settings
from sinks.connect import open_registry
from sinks.registry import JobRecord, SqlRegistry

INGEST_KIND = "ingest"
RESEARCH_KIND = "research"


def submit_ingest_job(
    settings: Settings, paths: list[str], request: IngestRequest, *, actor: str | None = None
) -> JobRecord:
    """Record a PROCESSING ingest job and start its background process; returns immediately.

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
    """Record a PROCESSING research job and start its background process; returns at once.

    The process runs `kbflow.services.research.run_research` (the ``research`` flow, which
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


def refresh(jobs: SqlRegistry, job: JobRecord) -> JobRecord:
    """A PROCESSING job whose process is gone is marked FAILED, naming its log."""
    if job.status is not JobStatus.PROCESSING or job.pid is None or _alive(job):
        return job
    again = (
        "re-run the ingest (finished files are skipped)"
        if job.kind == INGEST_KIND
        else f"start the {job.kind} again"
    )
    jobs.finish_job(
        job.id,
        JobStatus.FAILED,
        reason=(
            f"the job's process (pid {job.pid}) exited without finishing — see its log "
            f"{job.log_path or '(none)'}; {again}"
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
    """Recent jobs, newest first; a job whose process died unfinished is marked FAILED."""
    with open_registry(settings) as registry:
        return [refresh(registry, job) for job in registry.list_jobs(org, status, limit)]


def get_job(settings: Settings, job_id: str) -> JobRecord:
    """One job, refreshed like `list_jobs`; raises NotFound for an unknown id."""
    with open_registry(settings) as registry:
        return refresh(registry, registry.get_job(job_id))
