"""Job admission: at most KBFLOW_JOBS_MAX_RUNNING job processes at once (and
KBFLOW_JOBS_MAX_RUNNING_PER_ORG of one org's), the rest queued and started as slots free; and the
upload folders, removed when their job is COMPLETE, kept a while when it FAILED.

Real job processes (``python -m kbflow.services.job_runner ID``) on a real SQLite registry in
``tmp_path``,
watched with psutil while they run. The test never asks the services for a job's status while it
waits (that would start queued jobs too): the job processes alone must move the queue.

The HTTP path (30 uploads at once against ``kbflow serve``) is
tests/kbflow/test_api_admin_jobs.py::test_uploads_past_the_limits_queue (slow).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil
import pytest

from core.contracts import IngestRequest
from core.models import JobStatus
from core.settings import Settings
from kbflow.services.jobs import queue as jobs
from kbflow.services.jobs import uploads as job_uploads
from sinks.registry import JobRecord, SqlRegistry
from tests.kbflow.support import JOB_RSS_BOUND_MB, JobSampler

pytestmark = pytest.mark.integration

JOB_TIMEOUT_S = 240
NOTE = "The parental leave policy grants sixteen weeks of paid leave to every employee."


@pytest.fixture
def jobs_registry(settings: Settings) -> Iterator[SqlRegistry]:
    registry = SqlRegistry.open(settings.registry_url)
    registry.people.ensure_org("acme")
    registry.people.ensure_org("globex")
    yield registry
    registry.close()


def _upload(settings: Settings, name: str, data: bytes) -> Path:
    """A file where the upload route puts one: ``<home>/uploads/<32 hex>/NAME``."""
    folder = settings.home.resolve() / "uploads" / uuid.uuid4().hex
    folder.mkdir(parents=True, mode=0o700)
    path = folder / name
    path.write_bytes(data)
    return path


def _note(i: int) -> bytes:
    return f"# Note {i}\n\n{NOTE} Note number {i}.\n".encode()


def _broken() -> bytes:
    return random.Random(7).randbytes(4096)


def _submit_all(settings: Settings, batch: list[tuple[str, Path]]) -> list[JobRecord]:
    """Submit every (org, file) at once, one thread each, all released together."""
    gate = threading.Barrier(len(batch))
    out: list[JobRecord | BaseException | None] = [None] * len(batch)

    def submit(i: int, org: str, path: Path) -> None:
        gate.wait()
        try:
            out[i] = jobs.submit_ingest_job(settings, [str(path)], IngestRequest(org=org))
        except BaseException as exc:
            out[i] = exc

    threads = [
        threading.Thread(target=submit, args=(i, org, path)) for i, (org, path) in enumerate(batch)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for result in out:
        if not isinstance(result, JobRecord):
            raise AssertionError(f"a submit failed: {result!r}")
    return [r for r in out if isinstance(r, JobRecord)]


def _wait_finished(registry: SqlRegistry, ids: list[str]) -> dict[str, JobRecord]:
    """The jobs once none is PROCESSING, read from the registry only (no dispatching here),
    and once none of their processes is left."""
    deadline = time.monotonic() + JOB_TIMEOUT_S * len(ids)
    while time.monotonic() < deadline:
        done = {i: registry.jobs.get_job(i) for i in ids}
        if all(j.status is not JobStatus.PROCESSING for j in done.values()):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"jobs still PROCESSING: {[j for j in done.values()]}")
    while time.monotonic() < deadline and _job_processes(ids):
        time.sleep(0.2)
    return done


def _job_processes(ids: Iterable[str]) -> list[psutil.Process]:
    wanted = set(ids)
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "kbflow.services.job_runner" in cmdline and wanted & set(cmdline):
            found.append(proc)
    return found


def _logs(done: dict[str, JobRecord]) -> str:
    return "\n".join(
        f"--- {j.id} {j.status.value} {j.reason}\n"
        + (Path(j.log_path).read_text()[-1500:] if j.log_path and Path(j.log_path).exists() else "")
        for j in done.values()
    )


def test_jobs_past_the_limits_wait_and_run_in_turn(
    settings: Settings, jobs_registry: SqlRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four uploads at once, two orgs, limits 2 and 1 per org: never more than two job
    processes, never two of one org; every job ends, the queue moved by the job processes
    themselves; a COMPLETE job's upload folder is gone, a FAILED one's kept until it expires."""
    monkeypatch.setenv("KBFLOW_JOBS_MAX_RUNNING", "2")
    monkeypatch.setenv("KBFLOW_JOBS_MAX_RUNNING_PER_ORG", "1")
    settings = Settings()  # the limits from the environment, as `kbflow serve` reads them
    batch = [
        ("acme", _upload(settings, "first.md", _note(1))),
        ("acme", _upload(settings, "broken.pdf", _broken())),
        ("globex", _upload(settings, "second.md", _note(2))),
        ("globex", _upload(settings, "third.md", _note(3))),
    ]
    started = time.monotonic()
    with JobSampler() as sampler:
        submitted = _submit_all(settings, batch)
        ids = [j.id for j in submitted]
        done = _wait_finished(jobs_registry, ids)
    took = time.monotonic() - started

    orgs = {j.id: j.org_id for j in submitted}
    assert sampler.peak_running(ids) <= 2, sampler.timeline(ids)
    assert set(sampler.peak_running_per_org(orgs).values()) == {1}, sampler.timeline(ids)
    assert sampler.peak_running(ids) == 2  # two orgs' jobs did run side by side
    # Two were admitted at once (one per org); the other two waited, PROCESSING, queued.
    queued = [j for j in submitted if jobs.is_queued(j)]
    assert len(queued) == 2 and {j.org_id for j in queued} == {"acme", "globex"}, submitted
    assert all(j.status is JobStatus.PROCESSING for j in submitted)
    assert all(j.pid is None for j in queued) and all(j.pid for j in submitted if j not in queued)

    by_name = {Path(j.inputs[0]).name: j for j in done.values()}
    failed = by_name.pop("broken.pdf")
    assert failed.status is JobStatus.FAILED and "match no format" in (failed.reason or "")
    assert all(j.status is JobStatus.COMPLETE for j in by_name.values()), _logs(done)
    for job in by_name.values():  # COMPLETE: the upload folder is gone
        assert not Path(job.inputs[0]).parent.exists(), job
    kept = Path(failed.inputs[0]).parent
    assert kept.is_dir() and (kept / "broken.pdf").is_file()  # FAILED: kept for a while
    assert job_uploads.prune_uploads(settings, jobs_registry) == []
    later = failed.updated_at + dt.timedelta(hours=23)
    assert job_uploads.prune_uploads(settings, jobs_registry, now=later) == []
    expired = failed.updated_at + dt.timedelta(hours=24, seconds=1)
    assert job_uploads.prune_uploads(settings, jobs_registry, now=expired) == [kept]
    assert not kept.exists() and list((settings.home / "uploads").iterdir()) == []

    peak_mb = sampler.peak_rss_mb(ids)
    print(
        f"\n4 jobs in {took:.0f}s; peak job process RSS {sampler.peak_job_rss_mb(ids):.0f} MB "
        f"({sampler.peak_job_rss_mb(ids, tree=True):.0f} MB with its children); peak summed "
        f"{peak_mb:.0f} MB ({sampler.peak_rss_mb(ids, tree=True):.0f} MB with children)"
    )
    assert peak_mb <= 2 * JOB_RSS_BOUND_MB


def test_a_killed_job_process_does_not_strand_the_queue(
    settings: Settings, jobs_registry: SqlRegistry
) -> None:
    """The running job's process is killed: looking at the jobs (`get_job`) fails it and starts
    the one queued behind it."""
    settings = settings.replace(jobs_max_running=1)
    first, second = _submit_all(
        settings,
        [
            ("acme", _upload(settings, "a.md", _note(1))),
            ("globex", _upload(settings, "b.md", _note(2))),
        ],
    )
    running, waiting = (first, second) if first.pid else (second, first)
    assert running.pid and jobs.is_queued(waiting)
    assert jobs.admission(jobs_registry, waiting.id) == {"queued": True, "queue_position": 1}
    psutil.Process(running.pid).kill()
    _gone(running.pid)

    after = jobs.get_job(settings, running.id)
    assert after.status is JobStatus.FAILED and "exited without finishing" in (after.reason or "")
    moved = jobs_registry.jobs.get_job(waiting.id)
    assert moved.pid and not jobs.is_queued(moved)
    assert jobs.admission(jobs_registry, waiting.id) == {"queued": False, "queue_position": None}
    done = _wait_finished(jobs_registry, [moved.id])
    assert done[moved.id].status is JobStatus.COMPLETE, _logs(done)


def _gone(pid: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)


def test_an_org_past_its_queue_cap_is_refused_and_nothing_recorded(
    settings: Settings, jobs_registry: SqlRegistry
) -> None:
    from core.errors import JobQueueFull

    # Queued by hand: rows as admission records them, no process started for any.
    for _ in range(2):
        jobs_registry.jobs.create_job(
            "acme", kind="ingest", inputs=[], params={jobs.QUEUE_MARK: jobs.PROCESS_RUNNER}
        )
    capped = settings.replace(jobs_max_queued_per_org=2)
    before = jobs_registry.jobs.list_jobs("acme")
    with pytest.raises(JobQueueFull) as refused:
        jobs.submit_ingest_job(capped, ["/data/x.md"], IngestRequest(org="acme"))
    assert "KBFLOW_JOBS_MAX_QUEUED_PER_ORG=2" in str(refused.value)
    assert refused.value.retry_after_s > 0
    assert jobs_registry.jobs.list_jobs("acme") == before


# --- uploads: what is removed, and what never is -----------------------------------------------


def _finished_job(
    registry: SqlRegistry, settings: Settings, inputs: list[str], status: JobStatus
) -> JobRecord:
    job = registry.jobs.create_job("acme", kind="ingest", inputs=inputs, params={})
    job_uploads.mark_uploads(settings, job)
    registry.jobs.finish_job(job.id, status, reason=None if status is JobStatus.COMPLETE else "x")
    return registry.jobs.get_job(job.id)


def test_uploads_are_removed_only_inside_uploads_and_never_through_a_link(
    settings: Settings, jobs_registry: SqlRegistry, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.md").write_text("mine")
    uploads = settings.home.resolve() / "uploads"
    uploads.mkdir(parents=True)

    # A COMPLETE job that read a file outside uploads/ (a CLI ingest): nothing removed.
    cli = _finished_job(jobs_registry, settings, [str(outside / "keep.md")], JobStatus.COMPLETE)
    assert job_uploads.remove_uploads(settings, cli) == []
    # A link in uploads/ that looks like an upload folder, pointing out: never followed.
    link = uploads / uuid.uuid4().hex
    link.symlink_to(outside, target_is_directory=True)
    linked = _finished_job(jobs_registry, settings, [str(link / "keep.md")], JobStatus.COMPLETE)
    assert job_uploads.upload_folder(settings, str(link / "keep.md")) is None
    assert job_uploads.remove_uploads(settings, linked) == []
    # A path that climbs out of an upload folder lexically.
    real = _upload(settings, "ok.md", b"x").parent
    climbing = str(real / ".." / ".." / ".." / "outside" / "keep.md")
    assert job_uploads.upload_folder(settings, climbing) is None
    # Nested deeper, or not named as uploads are: not an upload folder.
    deep = real / "sub"
    deep.mkdir()
    assert job_uploads.upload_folder(settings, str(deep / "x.md")) is None
    odd = uploads / "not-an-upload"
    odd.mkdir()
    assert job_uploads.upload_folder(settings, str(odd / "x.md")) is None
    # An upload folder holding a link out: the folder goes, the link's target stays.
    (real / "escape").symlink_to(outside, target_is_directory=True)
    done = _finished_job(jobs_registry, settings, [str(real / "ok.md")], JobStatus.COMPLETE)
    assert job_uploads.remove_uploads(settings, done) == [real]
    assert not real.exists()

    far = dt.datetime.now(dt.UTC) + dt.timedelta(days=365)
    job_uploads.prune_uploads(settings, jobs_registry, now=far)
    assert (outside / "keep.md").read_text() == "mine"
    assert link.is_symlink() and odd.is_dir()  # not upload folders: left alone

    # uploads/ itself a link: nothing under it is touched.
    uploads_moved = tmp_path / "elsewhere"
    uploads.rename(uploads_moved)
    uploads.symlink_to(uploads_moved, target_is_directory=True)
    target = uploads_moved / uuid.uuid4().hex
    target.mkdir()
    (target / "a.md").write_text("a")
    via_link = _finished_job(jobs_registry, settings, [str(uploads / target.name / "a.md")],
                             JobStatus.COMPLETE)  # fmt: skip
    assert job_uploads.remove_uploads(settings, via_link) == []
    assert job_uploads.prune_uploads(settings, jobs_registry, now=far) == []
    assert (target / "a.md").exists()


def test_prune_keeps_running_and_young_uploads(
    settings: Settings, jobs_registry: SqlRegistry
) -> None:
    waiting = _upload(settings, "w.md", b"w")
    job = jobs_registry.jobs.create_job("acme", kind="ingest", inputs=[str(waiting)], params={})
    job_uploads.mark_uploads(settings, job)  # PROCESSING: kept however old
    arriving = _upload(settings, "new.md", b"n").parent  # no job yet: an upload still arriving
    complete = _finished_job(
        jobs_registry, settings, [str(_upload(settings, "c.md", b"c"))], JobStatus.COMPLETE
    )
    now = dt.datetime.now(dt.UTC)
    assert job_uploads.prune_uploads(settings, jobs_registry, now=now) == [
        Path(complete.inputs[0]).parent
    ]
    assert waiting.exists() and arriving.exists()
    far = now + dt.timedelta(days=30)
    # an orphan, old
    assert job_uploads.prune_uploads(settings, jobs_registry, now=far) == [arriving]
    assert waiting.exists()
    assert os.listdir(settings.home / "uploads") == [waiting.parent.name]
