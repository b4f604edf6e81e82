"""Long ingests as jobs: audio, video and large files are ingested by a background process.

`submit_ingest_job` records a PROCESSING job in the registry and starts a detached
``python -m kbflow.jobs JOB_ID`` process, then returns at once. That process runs the ``ingest``
flow (a Prefect flow run, whose id it records on the job), and finishes the job COMPLETE, or
FAILED with the reason. `refresh` notices a job whose process died without finishing.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from core.contracts import IngestReport, IngestRequest
from core.models import JobStatus
from core.settings import Settings, configure_environment
from sinks.registry import JobRecord, SqlRegistry

log = logging.getLogger(__name__)

INGEST_KIND = "ingest"


def submit_ingest_job(settings: Settings, paths: list[str], request: IngestRequest) -> JobRecord:
    """Record a PROCESSING job and start its background process; returns immediately."""
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    registry = SqlRegistry.open(settings.registry_url)
    try:
        jobs = registry
        job = jobs.create_job(
            request.org, kind=INGEST_KIND, inputs=paths, params=request.job_params()
        )
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
                start_new_session=True,  # outlives the command that started it
            )
        jobs.update_job_runner(job.id, pid=proc.pid, log_path=str(log_path))
        return jobs.get_job(job.id)
    finally:
        registry.close()


def refresh(jobs: SqlRegistry, job: JobRecord) -> JobRecord:
    """A PROCESSING job whose process is gone is marked FAILED, naming its log."""
    if job.status is not JobStatus.PROCESSING or job.pid is None or _alive(job):
        return job
    jobs.finish_job(
        job.id,
        JobStatus.FAILED,
        reason=(
            f"the job's process (pid {job.pid}) exited without finishing — see its log "
            f"{job.log_path or '(none)'}; re-run the ingest (finished files are skipped)"
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


def run_job(job_id: str, settings: Settings | None = None) -> JobRecord:
    """Run a recorded ingest job to its end in this process (what the background process does)."""
    settings = settings or Settings()
    configure_environment(settings)
    registry = SqlRegistry.open(settings.registry_url)
    jobs = registry
    try:
        job = jobs.get_job(job_id)
        jobs.update_job_runner(job.id, pid=os.getpid())
        request = IngestRequest.model_validate(job.params)
        from flows.ingest import ingest

        try:
            report = ingest(paths=job.inputs, job_id=job.id, **request.flow_params())
        except Exception as exc:  # the job records any failure; nothing else would see it
            log.exception("job %s failed", job.id)
            jobs.finish_job(job.id, JobStatus.FAILED, reason=f"{type(exc).__name__}: {exc}")
            return jobs.get_job(job.id)
        final, reason = _outcome(report)
        jobs.finish_job(job.id, final, reason=reason, report=report.to_dict())
        return jobs.get_job(job.id)
    finally:
        registry.close()


def _outcome(report: IngestReport) -> tuple[JobStatus, str | None]:
    """COMPLETE when something was read; FAILED (with the reasons) when every file failed."""
    skipped = report.skipped
    reasons = "; ".join(f"{s.source}: {s.reason}" for s in skipped[:5])
    if skipped and not report.documents and not report.empty:
        return JobStatus.FAILED, reasons
    if skipped:
        return JobStatus.COMPLETE, f"{len(skipped)} file(s) failed: {reasons}"
    return JobStatus.COMPLETE, None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m kbflow.jobs JOB_ID\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from kbflow.processes import guard_process

    settings = Settings()
    guard_process(settings.home)  # its temporary Prefect server must not outlive it either
    job = run_job(args[0], settings)
    sys.stdout.write(f"job {job.id}: {job.status.value} {job.reason or ''}\n")
    return 0 if job.status is JobStatus.COMPLETE else 1


if __name__ == "__main__":
    raise SystemExit(main())
