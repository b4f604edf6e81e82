"""``/metrics``' research spend reads only the jobs that ended since its last read (an
unauthenticated scrape once read up to 100,000 job rows), and counts each job once."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import generate_latest
from sqlalchemy import update

from core.models import JobStatus
from kbflow.api import metrics as served_metrics
from kbflow.api.metrics import Metrics
from sinks.registry import SqlRegistry
from sinks.registry.schema import JobRow, utcnow


def _scrape(metrics: Metrics) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("kbflow_research_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _finish(registry: SqlRegistry, status: JobStatus, tokens: int, kind: str = "research") -> str:
    job = registry.jobs.create_job("acme", kind=kind, inputs=[], params={})
    registry.jobs.finish_job(job.id, status, report={"consumed_tokens": tokens})
    return job.id


def test_each_scrape_reads_only_the_jobs_that_ended_since_the_last(
    registry: SqlRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(served_metrics, "RESEARCH_READ_EVERY_S", 0.0)
    registry.people.ensure_org("acme")
    reads: list[tuple[Any, int]] = []

    def finished(after: Any) -> list[Any]:
        jobs = registry.jobs.finished_jobs("research", after=after)
        reads.append((after, len(jobs)))
        return jobs

    metrics = Metrics()
    metrics.watch_research(finished)
    assert _scrape(metrics)["kbflow_research_tokens_total"] == 0
    _finish(registry, JobStatus.COMPLETE, 1200)
    _finish(registry, JobStatus.FAILED, 300)
    _finish(registry, JobStatus.COMPLETE, 999, kind="ingest")  # not research: not counted
    registry.jobs.create_job("acme", kind="research", inputs=[], params={})  # still running
    first = _scrape(metrics)
    assert first["kbflow_research_tokens_total"] == 1500
    assert first['kbflow_research_runs_total{status="COMPLETE"}'] == 1
    assert first['kbflow_research_runs_total{status="FAILED"}'] == 1
    reads.clear()
    assert _scrape(metrics) == first  # nothing new: nothing counted twice
    # The scrape asked only after the last job it had read, and got nothing back.
    assert reads == [(reads[0][0], 0)] and reads[0][0] is not None, reads
    _finish(registry, JobStatus.COMPLETE, 50)
    later = _scrape(metrics)
    assert later["kbflow_research_tokens_total"] == 1550
    assert later['kbflow_research_runs_total{status="COMPLETE"}'] == 2


def test_many_jobs_ending_at_once_are_each_counted_once(
    registry: SqlRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More jobs than one read returns, all ending at the same instant: read on from the last
    one (by end time, then id), none counted twice or skipped."""
    monkeypatch.setattr(served_metrics, "RESEARCH_READ_EVERY_S", 0.0)
    registry.people.ensure_org("acme")
    ids = [_finish(registry, JobStatus.COMPLETE, 10) for _ in range(7)]
    with registry.session() as s, s.begin():
        s.execute(update(JobRow).where(JobRow.id.in_(ids)).values(updated_at=utcnow()))
    metrics = Metrics()
    metrics.watch_research(
        lambda after: registry.jobs.finished_jobs("research", after=after, limit=3)
    )
    assert _scrape(metrics)["kbflow_research_tokens_total"] == 70
    assert _scrape(metrics)["kbflow_research_tokens_total"] == 70
