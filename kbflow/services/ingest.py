"""Ingest and its background jobs: what `kbflow ingest`, `kbflow jobs`, the demo and the bench call.

Heavy modules (Prefect, Docling, the embedder) load inside the functions that need them.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from core.contracts import IngestReport, IngestRequest, JobRef
from core.models import JobStatus
from core.progress import Listener
from core.settings import Settings

if TYPE_CHECKING:
    from sinks.registry import JobRecord


def run_ingest(
    settings: Settings,
    paths: list[str],
    request: IngestRequest,
    *,
    wait: bool = True,
    progress: Listener | None = None,
) -> IngestReport:
    """Discover, hash and plan once, without Prefect; start the ingest flow only when there is
    work to do, and hand it the plan (`tasks.ingest.planned`: it reads nothing again).

    Unless ``wait``, audio, video and large files go to a background job (see
    `kbflow.services.job_runner`);
    the report's ``jobs`` lists them. ``progress`` hears ``("ingest", 0, n)`` just before the
    flow starts on ``n`` documents, then the flow's own ``(stage, advanced_by, total)`` calls
    (`kbflow.render.ingest_progress` draws them).

    Returns:
        The ingest's report, ``jobs`` naming the background jobs long files went to.

    Raises:
        NotFound: the org does not exist.
        IngestFailed: more than ``max_skip_ratio`` of the documents failed.
    """
    from kbflow.services.jobs import submit_ingest_job
    from sinks.connect import open_registry, open_vector_store
    from tasks.ingest.discover import discover
    from tasks.ingest.extract import SUPPORTED_SUFFIXES, runs_long
    from tasks.ingest.index import BatchReport, ingest_report, plan_ingest, repair_shadowed
    from tasks.ingest.planned import Planned, handing

    started = time.perf_counter()
    with open_registry(settings) as registry:
        registry.people.get_org(request.org)  # refuse an unknown org before reading a single file
        found = discover(paths, SUPPORTED_SUFFIXES)
        sources = found.sources
        plan = plan_ingest(sources, registry, request.org)
        planned = Planned(found, plan, seconds=time.perf_counter() - started)
        repaired = 0
        if plan.shadowed and not plan.work:  # nothing else to do: repair here, without a flow
            with open_vector_store(settings) as store:
                repaired = repair_shadowed(plan, registry, store, actor="system")
    jobs: list[JobRef] = []
    if not wait:
        threshold = int(settings.jobs.job_threshold_mb * 1024 * 1024)
        long_files = [w for w in plan.work if runs_long(w.source.path, threshold)]
        if long_files:
            job = submit_ingest_job(
                settings, sorted({str(w.source.path) for w in long_files}), request
            )
            jobs.append(JobRef(id=job.id, status=job.status.value, files=len(job.inputs)))
            plan.work = [w for w in plan.work if w not in long_files]
            paths = sorted({str(w.source.path) for w in plan.work})
    if not plan.work:
        report = ingest_report(
            plan,
            BatchReport(skipped=list(found.skipped), notes=list(found.notes), superseded=repaired),
            org=request.org,
            collection=request.collection,
            discovered=len(sources),
            seconds=time.perf_counter() - started,
            jobs=jobs,
        )
        report.raise_if_too_many_skipped(settings.ingest.max_skip_ratio)
        return report
    from flows.ingest import ingest
    from kbflow.services.orchestration import prefect_starting, tracked
    from tasks.ingest.steps import warm_up

    with prefect_starting():
        warm_up(settings)
    with handing(paths, request.org, planned), tracked(settings.home, ingest) as ingest_flow:
        if progress is None:
            report = ingest_flow(paths=paths, **request.flow_params())
        else:
            from core import progress as channel

            progress("ingest", 0, len(plan.work))
            with channel.listening(progress):
                report = ingest_flow(paths=paths, **request.flow_params())
    return report.model_copy(update={"jobs": jobs})


def list_jobs(
    settings: Settings, *, org: str | None, status: JobStatus | None, limit: int
) -> list[JobRecord]:
    """Recent jobs, newest first; a job whose process died unfinished is marked FAILED."""
    from kbflow.services.jobs import queue as jobs

    return jobs.list_jobs(settings, org=org, status=status, limit=limit)


def get_job(settings: Settings, job_id: str) -> JobRecord:
    """One job, refreshed like `list_jobs`; raises NotFound for an unknown id."""
    from kbflow.services.jobs import queue as jobs

    return jobs.get_job(settings, job_id)
