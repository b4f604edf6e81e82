"""Background jobs: start one, read one, notice one whose run died.

A job is a registry row (`sinks/registry/jobs.py`) and a run that does its work
(`kbflow.services.job_runner`): an ingest of long files (``ingest``) or a research run
(``research``). The row goes from PROCESSING to COMPLETE, or FAILED with the reason.
``KBFLOW_JOB_RUNNER`` says what runs it: ``process`` (the default), a detached ``python -m
kbflow.services.job_runner JOB_ID`` on this machine, watched by its pid; or ``prefect``, a run
of the ``kbflow-job`` deployment (``KBFLOW_JOB_DEPLOYMENT``) on a work pool, through the
Prefect server at ``PREFECT_API_URL``, watched by its flow run id.

Starting and reading jobs needs no Prefect import (`orchestration.prefect_api` speaks its REST
API), so `kbflow serve` does both (tests/test_layers.py); only the job's own run imports flows.

**Admission** (the ``process`` runner only). At most ``KBFLOW_JOBS_MAX_RUNNING`` job processes
run on this machine at once, and at most ``KBFLOW_JOBS_MAX_RUNNING_PER_ORG`` of one org's. A job
over either limit is recorded and waits in a queue: its row is PROCESSING with no pid (and no
flow run), its params marked ``_runner: process`` (`QUEUE_MARK`; no new state, no new column);
`is_queued` says so, `admission` gives its place. Queued jobs start oldest first, each as soon
as a slot of its own org and a global one are free: `dispatch` starts them, called

- by each submit (after recording the new job);
- by a helper the job process leaves behind when it ends (`dispatch_after_exit`), which waits
  for that process to be gone, so that a finishing job and its successor never overlap;
- by `refresh` (given settings), `list_jobs` and `get_job`, so a job process that was killed
  does not strand the queue: its row is failed and its slot given to the next job.

A slot is held by a PROCESSING row whose process lives, and by any live job runner process of
this registry (a finished job's until it has exited). Counting and starting happen under an OS
lock (`admission_lock`, ``flock`` on ``<jobs_dir>/.admission.lock``), so threads and processes
never admit more than the limits between them. Past
``KBFLOW_JOBS_MAX_QUEUED_PER_ORG`` waiting jobs of one org a submit is refused
(:class:`~core.errors.JobQueueFull`, HTTP 429 with Retry-After) and nothing is recorded.

The ``prefect`` runner is outside these limits: its work pool (and the pool's concurrency limit)
decides when its runs start. Uploads end with their job (`kbflow.services.jobs.uploads`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.contracts import IngestRequest
from core.errors import JobQueueFull, JobRunnerUnavailable, KbflowError, NotFound
from core.models import JobStatus
from core.settings import Settings
from kbflow.services.jobs import uploads
from kbflow.services.jobs.types import Admission
from kbflow.services.orchestration import prefect_api
from sinks.connect import open_registry
from sinks.registry import JobRecord, SqlRegistry

INGEST_KIND = "ingest"
RESEARCH_KIND = "research"

QUEUE_MARK = "_runner"
"""The params key that marks a job of the ``process`` runner, admitted through the queue: with
no pid yet (and no flow run) the job is waiting for a slot. `kbflow.services.job_runner` drops it
before it reads the params; the API does not show it."""
PROCESS_RUNNER = "process"

ADMISSION_LOCK = ".admission.lock"
"""The lock file under ``jobs_dir`` that admission holds while it counts and starts jobs."""
ADMISSION_LOCK_TIMEOUT_S = 60.0
QUEUE_FULL_RETRY_S = 60
"""What a refused submit's Retry-After says: about one job's run."""

_JOB_ID = re.compile(r"[0-9a-f]{12}")
_SCAN = 100_000  # rows: every PROCESSING job, in practice
_EXIT_WAIT_S = 900.0
_WAITER = (
    "import sys; from kbflow.services.jobs.queue import dispatch_after_exit; "
    "raise SystemExit(dispatch_after_exit(int(sys.argv[1])))"
)

log = logging.getLogger(__name__)


def submit_ingest_job(
    settings: Settings, paths: list[str], request: IngestRequest, *, actor: str | None = None
) -> JobRecord:
    """Record a PROCESSING ingest job and start its run (`start_job`); returns immediately.

    ``actor`` is who the documents are recorded as ingested by (default: ``system``).
    """
    params = request.job_params() | ({"actor": actor} if actor else {})
    return start_job(settings, request.org, INGEST_KIND, paths, params)


def submit_research_job(
    settings: Settings,
    org: str,
    *,
    client_name: str,
    model: str | None,
    budget_tokens: int,
    reviewer: str,
) -> JobRecord:
    """Record a PROCESSING research job and start its run (`start_job`); returns at once.

    The run does `kbflow.services.research.runs.run_research` (the ``research`` flow, which
    records its flow run id on the job and pauses for review as ``kbflow research`` does), and
    finishes the job with the run's report, whose ``synthesis_run_id`` names the drafts.
    """
    params = {
        "client_name": client_name,
        "model": model,
        "budget_tokens": budget_tokens,
        "reviewer": reviewer,
    }
    return start_job(settings, org, RESEARCH_KIND, [], params)


def start_job(
    settings: Settings, org: str, kind: str, inputs: list[str], params: dict[str, Any]
) -> JobRecord:
    """Record the job and start its run by ``settings.jobs.job_runner``.

    With the ``process`` runner the job is admitted under `admission_lock`: recorded, then
    started at once if a slot is free (`dispatch`), else left queued (`is_queued`) for the next
    free slot. The ``prefect`` runner is not limited here (its work pool is).

    Raises:
        JobQueueFull: the org already has ``jobs_max_queued_per_org`` jobs waiting (no job is
            recorded).
        JobRunnerUnavailable: the ``prefect`` runner has no PREFECT_API_URL, its server has no
            such deployment or does not answer (no job is recorded), or the server refused the
            run (the job is recorded FAILED with the reason); or the admission lock stayed
            held past ``ADMISSION_LOCK_TIMEOUT_S``.
    """
    if settings.jobs.job_runner == "prefect":
        return _start_deployment_run(settings, org, kind, inputs, params)
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    with open_registry(settings) as registry:
        with admission_lock(settings):
            waiting = sum(1 for j in _queue(registry) if j.org_id == org)
            if waiting >= settings.jobs.jobs_max_queued_per_org:
                raise JobQueueFull(
                    f"org {org!r} already has {waiting} background jobs waiting to start "
                    f"(KBFLOW_JOBS_MAX_QUEUED_PER_ORG={settings.jobs.jobs_max_queued_per_org}; at "
                    f"most {settings.jobs.jobs_max_running_per_org} of an org's jobs run at once, "
                    f"KBFLOW_JOBS_MAX_RUNNING_PER_ORG) — try again once some have finished",
                    retry_after_s=QUEUE_FULL_RETRY_S,
                )
            job = registry.jobs.create_job(
                org, kind=kind, inputs=inputs, params=params | {QUEUE_MARK: PROCESS_RUNNER}
            )
            log_path = (settings.jobs_dir / f"{job.id}.log").resolve()
            registry.jobs.update_job_runner(job.id, log_path=str(log_path))
            uploads.mark_uploads(settings, job)
            try:
                _dispatch_locked(settings, registry)
            except Exception:  # recorded and queued: the next dispatch starts it
                log.exception("job %s: recorded, not started yet", job.id)
        return registry.jobs.get_job(job.id)


def _child_env(settings: Settings) -> dict[str, str]:
    """The environment of a job process or dispatcher: this one's, with the home and the
    admission limits of ``settings`` (so the whole queue keeps the limits it was started with,
    whichever process dispatches it)."""
    return dict(
        os.environ,
        KBFLOW_HOME=str(settings.home.resolve()),
        KBFLOW_JOBS_MAX_RUNNING=str(settings.jobs.jobs_max_running),
        KBFLOW_JOBS_MAX_RUNNING_PER_ORG=str(settings.jobs.jobs_max_running_per_org),
        KBFLOW_JOBS_MAX_QUEUED_PER_ORG=str(settings.jobs.jobs_max_queued_per_org),
        KBFLOW_JOBS_FAILED_UPLOAD_RETENTION_H=str(settings.jobs.jobs_failed_upload_retention_h),
    )


def _spawn(settings: Settings, registry: SqlRegistry, job: JobRecord) -> bool:
    """Start ``python -m kbflow.services.job_runner JOB_ID`` for a queued job (under the admission
    lock) and
    record its pid; a process that cannot be started fails the job. True when started."""
    log_path = Path(job.log_path or settings.jobs_dir / f"{job.id}.log").resolve()
    env = _child_env(settings)
    try:
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kbflow.services.job_runner", job.id],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=os.getcwd(),
                start_new_session=True,  # outlives the command (or service) that started it
            )
    except OSError as exc:
        registry.jobs.finish_job(
            job.id, JobStatus.FAILED, reason=f"could not start the job's process: {exc}"
        )
        return False
    registry.jobs.update_job_runner(job.id, pid=proc.pid, log_path=str(log_path))
    return True


def _start_deployment_run(
    settings: Settings, org: str, kind: str, inputs: list[str], params: dict[str, Any]
) -> JobRecord:
    # Both checks come before the row: a runner that cannot start anything records nothing.
    url = prefect_api.api_url()
    deployment = prefect_api.deployment_id(url, settings.jobs.job_deployment)
    with open_registry(settings) as registry:
        job = registry.jobs.create_job(org, kind=kind, inputs=inputs, params=params)
        uploads.mark_uploads(settings, job)
        try:
            run_id = prefect_api.start_run(url, deployment, {"job_id": job.id}, key=job.id)
        except Exception as exc:  # no run will ever finish this row: finish it here
            registry.jobs.finish_job(
                job.id,
                JobStatus.FAILED,
                reason=f"could not start a run of {settings.jobs.job_deployment}: {exc}",
            )
            raise
        registry.jobs.update_job_runner(job.id, flow_run_id=run_id)
        return registry.jobs.get_job(job.id)


def refresh(registry: SqlRegistry, job: JobRecord, settings: Settings | None = None) -> JobRecord:
    """A PROCESSING job whose run is over without finishing it is marked FAILED.

    A process job (a pid) whose process is gone is failed naming its log. A deployment-run job
    (no pid, a flow run id) whose flow run ended FAILED, CRASHED or CANCELLED is failed naming
    that state and its message (a worker that died, a cancelled run); when the Prefect server
    cannot be asked, the row is left as it is. A queued job (`is_queued`) is left as it is.

    Given ``settings``, queued jobs whose slot is free are started too (`dispatch`), and the
    job is returned as it is after that (started, if it was one of them).
    """
    job = _refreshed(registry, job)
    if settings is None:
        return job
    if dispatch(settings, registry):
        return registry.jobs.get_job(job.id)
    return job


def _refreshed(registry: SqlRegistry, job: JobRecord) -> JobRecord:
    if job.status is not JobStatus.PROCESSING:
        return job
    if job.pid is None:
        return _refresh_from_prefect(registry, job) if job.flow_run_id else job
    if _alive(job):
        return job
    registry.jobs.finish_job(
        job.id,
        JobStatus.FAILED,
        reason=(
            f"the job's process (pid {job.pid}) exited without finishing — see its log "
            f"{job.log_path or '(none)'}; {_again(job)}"
        ),
    )
    return registry.jobs.get_job(job.id)


def _again(job: JobRecord) -> str:
    if job.kind == INGEST_KIND:
        return "re-run the ingest (finished files are skipped)"
    return f"start the {job.kind} again"


def _refresh_from_prefect(registry: SqlRegistry, job: JobRecord) -> JobRecord:
    assert job.flow_run_id is not None
    try:
        state = prefect_api.run_state(prefect_api.api_url(), job.flow_run_id)
    except KbflowError as exc:  # no server set, or it does not answer: nothing to say yet
        log.debug("job %s: flow run %s not read: %s", job.id, job.flow_run_id, exc)
        return job
    if state is None or state.type not in prefect_api.FAILED_TYPES:
        return job
    registry.jobs.finish_job(
        job.id,
        JobStatus.FAILED,
        reason=(
            f"its Prefect flow run {job.flow_run_id} ended {state.name}: "
            f"{state.message or '(no message)'}; {_again(job)}"
        ),
    )
    return registry.jobs.get_job(job.id)


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
    """Recent jobs, newest first; a job whose run ended unfinished is marked FAILED, and queued
    jobs whose slot is free are started first (`dispatch`)."""
    with open_registry(settings) as registry:
        dispatch(settings, registry)
        return [refresh(registry, job) for job in registry.jobs.list_jobs(org, status, limit)]


def get_job(settings: Settings, job_id: str) -> JobRecord:
    """One job, refreshed like `list_jobs`; raises NotFound for an unknown id."""
    with open_registry(settings) as registry:
        job = registry.jobs.get_job(job_id)
        return refresh(registry, job, settings)


# --- admission ---------------------------------------------------------------------------------


def is_queued(job: JobRecord) -> bool:
    """Whether the job waits for a slot: a ``process``-runner job, PROCESSING, not started."""
    return (
        job.status is JobStatus.PROCESSING
        and job.pid is None
        and job.flow_run_id is None
        and job.params.get(QUEUE_MARK) == PROCESS_RUNNER
    )


def _queue(registry: SqlRegistry) -> list[JobRecord]:
    """The queued jobs, oldest first."""
    processing = registry.jobs.list_jobs(None, JobStatus.PROCESSING, _SCAN)
    return sorted((j for j in processing if is_queued(j)), key=lambda j: (j.created_at, j.id))


def admission(registry: SqlRegistry, job_id: str) -> Admission:
    """Whether the job waits for a slot, and its place among all waiting jobs (1: next), oldest
    first. A job of an org at its own limit may be passed by later jobs of other orgs."""
    for place, job in enumerate(_queue(registry), start=1):
        if job.id == job_id:
            return {"queued": True, "queue_position": place}
    return {"queued": False, "queue_position": None}


@contextmanager
def admission_lock(
    settings: Settings, timeout_s: float = ADMISSION_LOCK_TIMEOUT_S
) -> Iterator[None]:
    """Hold ``<jobs_dir>/.admission.lock`` (an exclusive ``flock``) for the block.

    Each call opens the file itself, so threads of one process exclude each other as processes
    do; the lock goes with the descriptor, so a holder that dies releases it.

    Raises:
        JobRunnerUnavailable: another holder kept it for ``timeout_s``.
    """
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    path = settings.jobs_dir / ADMISSION_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise JobRunnerUnavailable(
                        f"background jobs cannot be admitted: {path} stayed locked for "
                        f"{timeout_s:.0f}s (another kbflow process is starting jobs) — try again"
                    ) from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock


def dispatch(settings: Settings, registry: SqlRegistry | None = None) -> list[JobRecord]:
    """Start queued jobs, oldest first, while the limits leave slots; returns those started.

    Nothing queued: one query, no lock. A lock held past its timeout: nothing started now (the
    next call tries again)."""
    if registry is None:
        with open_registry(settings) as opened:
            return dispatch(settings, opened)
    if not _queue(registry):
        return []
    try:
        with admission_lock(settings):
            return _dispatch_locked(settings, registry)
    except JobRunnerUnavailable as exc:
        log.warning("queued jobs not started now: %s", exc)
        return []


def _dispatch_locked(settings: Settings, registry: SqlRegistry) -> list[JobRecord]:
    """`dispatch` under the admission lock."""
    processing = registry.jobs.list_jobs(None, JobStatus.PROCESSING, _SCAN)
    queued = sorted((j for j in processing if is_queued(j)), key=lambda j: (j.created_at, j.id))
    if not queued:
        return []
    busy = _occupied(registry, processing)
    per_org = Counter(busy.values())
    started: list[JobRecord] = []
    for job in queued:
        if len(busy) >= settings.jobs.jobs_max_running:
            break
        if per_org[job.org_id] >= settings.jobs.jobs_max_running_per_org:
            continue
        if _spawn(settings, registry, job):
            busy[job.id] = job.org_id
            per_org[job.org_id] += 1
            started.append(registry.jobs.get_job(job.id))
    return started


def _occupied(registry: SqlRegistry, processing: list[JobRecord]) -> dict[str, str]:
    """The jobs holding a slot, id -> org: PROCESSING rows whose process lives (a row whose
    process died is failed here), and every live job process of this registry, finished row
    or not (a job's process holds its slot until it has exited)."""
    busy: dict[str, str] = {}
    for job in processing:
        if job.pid is None:  # queued, or a work pool's run: no process of ours
            continue
        if _refreshed(registry, job).status is JobStatus.PROCESSING:
            busy[job.id] = job.org_id
    for job_id in _live_job_ids():
        if job_id in busy:
            continue
        try:
            busy[job_id] = registry.jobs.get_job(job_id).org_id
        except NotFound:  # another registry's job (another KBFLOW_HOME on this machine)
            continue
    return busy


def _live_job_ids() -> set[str]:
    """The job ids of the ``python -m kbflow.services.job_runner JOB_ID`` processes alive on this
    machine."""
    import psutil

    found: set[str] = set()
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        for i in range(len(cmdline) - 2):
            if cmdline[i] == "-m" and cmdline[i + 1] == "kbflow.services.job_runner":
                if _JOB_ID.fullmatch(cmdline[i + 2]):
                    found.add(cmdline[i + 2])
                break
    return found


def start_dispatcher(settings: Settings, log_path: Path | None = None) -> None:
    """Leave behind a small process that waits for this one to exit, then starts the queued
    jobs whose slot is free (`dispatch_after_exit`). A job process calls it as it ends: its
    successor starts only once it has gone, so the two never hold memory at the same time.
    The helper runs ``python -c`` (no ``kbflow.services.job_runner`` in its command line): it holds
    no slot."""
    out = log_path.open("ab") if log_path else open(os.devnull, "wb")  # noqa: SIM115
    try:
        subprocess.Popen(
            [sys.executable, "-c", _WAITER, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_child_env(settings),
            cwd=os.getcwd(),
            start_new_session=True,
        )
    except OSError as exc:  # the next submit, or a look at the jobs, starts them instead
        log.warning("could not start the queue's dispatcher: %s", exc)
    finally:
        out.close()


def dispatch_after_exit(pid: int) -> int:
    """Wait (at most 15 minutes) until process ``pid`` has exited, then `dispatch`."""
    import psutil

    deadline = time.monotonic() + _EXIT_WAIT_S
    try:
        proc = psutil.Process(pid)
        while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    except psutil.Error:  # gone already
        pass
    started = dispatch(Settings())
    for job in started:
        sys.stdout.write(f"started queued job {job.id} (pid {job.pid})\n")
    return 0
