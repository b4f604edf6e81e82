"""Ingest and its background jobs: what `kbflow ingest`, `kbflow jobs`, the demo and the bench call.

Heavy modules (Prefect, Docling, the embedder) load inside the functions that need them.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Any

from core.models import DocStatus, JobStatus
from core.progress import Listener
from core.settings import Settings

if TYPE_CHECKING:
    from sinks.jobs import JobRecord


def run_ingest(
    settings: Settings,
    paths: list[str],
    *,
    org: str,
    collection: str,
    status: DocStatus | None = DocStatus.APPROVED,
    audience: str | None = None,
    effective_date: dt.date | None = None,
    source_tag: str | None = None,
    wait: bool = True,
    progress: Listener | None = None,
) -> dict[str, Any]:
    """Plan without Prefect; start the ingest flow only when there is work to do.

    Unless ``wait``, audio, video and large files go to a background job (see `kbflow.jobs`);
    the report's ``jobs`` lists them. ``progress`` hears ``("ingest", 0, n)`` just before the
    flow starts on ``n`` documents, then the flow's own ``(stage, advanced_by, total)`` calls
    (`kbflow.render.ingest_progress` draws them).

    Returns:
        The ingest summary (`tasks.ingest.index.IngestSummary.to_dict`) plus ``jobs``.

    Raises:
        NotFound: the org does not exist.
        IngestFailed: more than ``max_skip_ratio`` of the documents failed.
    """
    from kbflow.jobs import ingest_params, submit_ingest_job
    from sinks.connect import open_registry, open_vector_store
    from tasks.ingest.discover import discover
    from tasks.ingest.extract import SUPPORTED_SUFFIXES, runs_long
    from tasks.ingest.index import BatchReport, IngestSummary, plan_ingest, repair_shadowed

    started = time.perf_counter()
    with open_registry(settings) as registry:
        registry.get_org(org)  # refuse an unknown org before reading a single file
        found = discover(paths, SUPPORTED_SUFFIXES)
        sources = found.sources
        plan = plan_ingest(sources, registry, org)
        repaired = 0
        if plan.shadowed and not plan.work:  # nothing else to do: repair here, without a flow
            with open_vector_store(settings) as store:
                repaired = repair_shadowed(plan, registry, store, actor="system")
    jobs: list[dict[str, Any]] = []
    if not wait:
        threshold = int(settings.job_threshold_mb * 1024 * 1024)
        long_files = [w for w in plan.work if runs_long(w.source.path, threshold)]
        if long_files:
            job = submit_ingest_job(
                settings,
                sorted({str(w.source.path) for w in long_files}),
                ingest_params(
                    org=org,
                    collection=collection,
                    status=status,
                    audience=audience,
                    effective_date=effective_date,
                    source_tag=source_tag,
                ),
            )
            jobs.append({"id": job.id, "status": job.status.value, "files": len(job.inputs)})
            plan.work = [w for w in plan.work if w not in long_files]
            paths = sorted({str(w.source.path) for w in plan.work})
    if not plan.work:
        summary = IngestSummary.build(
            plan,
            BatchReport(skipped=list(found.skipped), notes=list(found.notes), superseded=repaired),
            org=org,
            collection=collection,
            discovered=len(sources),
            seconds=time.perf_counter() - started,
        )
        summary.raise_if_too_many_skipped(settings.max_skip_ratio)
        return summary.to_dict() | {"jobs": jobs}
    from flows.ingest import ingest as ingest_flow

    kwargs: dict[str, Any] = dict(
        paths=paths,
        org=org,
        collection=collection,
        status=status,
        audience=audience,
        effective_date=effective_date,
        source_tag=source_tag,
    )
    if progress is None:
        return ingest_flow(**kwargs) | {"jobs": jobs}
    from core import progress as channel

    progress("ingest", 0, len(plan.work))
    with channel.listening(progress):
        return ingest_flow(**kwargs) | {"jobs": jobs}


def list_jobs(
    settings: Settings, *, org: str | None, status: JobStatus | None, limit: int
) -> list[JobRecord]:
    """Recent jobs, newest first; a job whose process died unfinished is marked FAILED."""
    from kbflow.jobs import refresh
    from sinks.connect import open_registry
    from sinks.jobs import JobStore

    with open_registry(settings) as registry:
        store = JobStore(registry)
        return [refresh(store, job) for job in store.list(org, status, limit)]


def get_job(settings: Settings, job_id: str) -> JobRecord:
    """One job, refreshed like `list_jobs`; raises NotFound for an unknown id."""
    from kbflow.jobs import refresh
    from sinks.connect import open_registry
    from sinks.jobs import JobStore

    with open_registry(settings) as registry:
        store = JobStore(registry)
        return refresh(store, store.get(job_id))
