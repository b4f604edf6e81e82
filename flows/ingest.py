"""The ``ingest`` flow: discover -> plan (content hash) -> per batch: extract, chunk, embed,
check, upsert -> report.

The caller that starts it in this process may have discovered and planned already
(`kbflow.services.ingest.run_ingest` does, to decide whether a flow is needed at all): the flow
then takes that plan (`tasks.ingest.planned`) and reads and hashes nothing again. Started any
other way (a deployment, a worker, a background job) it discovers and plans on its own.

With ``KBFLOW_TASK_RUNNER=dask`` the batches are extracted and embedded on a Dask cluster
(`flows.runners`) while the flow writes each one, in batch order, exactly as the default runner
does: registry rows stay pending until their vectors are stored, whatever runs where.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import deque
from collections.abc import Iterator
from itertools import islice
from typing import Any

from prefect import flow, get_run_logger

from core import progress
from core.contracts import IngestReport, IngestRequest
from core.models import DocStatus
from core.settings import Settings
from flows.runners import ComputeRunner, compute_runner
from sinks.connect import open_registry
from tasks.ingest.drop import deployment_terms
from tasks.ingest.index import BatchReport, IngestTarget, WorkItem, ingest_report
from tasks.ingest.planned import take as take_planned
from tasks.ingest.steps import (
    Prepared,
    discover_task,
    extract_batch_task,
    extractors,
    index_batch_task,
    plan_task,
    prepare_batch_task,
    repair_task,
)


def deployment_run() -> bool:
    """Whether this run was started from a deployment (a subflow of a background job, or a
    run of `kbflow ingest` in its own process, is not)."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    return run is not None and run.deployment_id is not None


@flow(name="ingest")
def ingest(
    paths: list[str],
    org: str,
    collection: str,
    status: DocStatus | None = DocStatus.APPROVED,
    audience: str | None = None,
    effective_date: dt.date | None = None,
    source_tag: str | None = None,
    actor: str = "system",
    job_id: str | None = None,
) -> IngestReport:
    """Ingest files, directories, globs or JSONL corpora into one org's collection.

    Unchanged documents (same content hash) are skipped; a changed one becomes a new version
    and supersedes the old. Returns a report; fails when too many documents could not be read.
    ``job_id`` names the registry job this run does (see `kbflow.services.job_runner`).
    """
    # The parameters are IngestRequest's fields; checking them as one catches a bad form entry.
    IngestRequest(
        org=org,
        collection=collection,
        status=status,
        audience=audience,
        effective_date=effective_date,
        source_tag=source_tag,
    )
    logger = get_run_logger()
    settings = Settings()
    started = time.perf_counter()
    if deployment_run():  # its parameters are anyone's who reaches the Prefect API
        asked = status
        paths, status, actor = deployment_terms(settings, paths, status)
        logger.info(
            "a deployment run: reading only the drop folder; documents enter %s (asked: %s) "
            "as %s", status.value, asked.value if asked else None, actor,
        )  # fmt: skip
    with open_registry(settings) as registry:
        if job_id is not None:
            from prefect.runtime import flow_run

            if flow_run.parent_flow_run_id is None:  # as a subflow: the parent's run is the job's
                registry.jobs.update_job_runner(job_id, flow_run_id=str(flow_run.id))
        registry.people.get_org(org)  # an unknown org is refused (`kbflow orgs create` makes one)
        coll = registry.catalog.ensure_collection(org, collection)
    target = IngestTarget(
        org_id=org,
        collection_id=coll.id,
        collection_path=coll.path,
        status=status,
        audience=audience,
        effective_date=effective_date,
        source_tag=source_tag,
        actor=actor,
    )
    handed = take_planned(paths, org)
    if handed is None:
        found = discover_task(paths)
        plan = plan_task(found.sources, org, settings)
    else:  # the caller that started this run discovered, hashed and planned them
        found, plan = handed.found, handed.plan
        started -= handed.seconds
        logger.info("took the plan of the caller that started this run: nothing is read again")
    sources = found.sources
    logger.info(
        "discovered %d sources: %d new, %d changed, %d unchanged, %d resumed",
        len(sources),
        plan.new,
        plan.changed,
        plan.unchanged,
        plan.resumed,
    )
    progress.advance("index", 0, total=len(plan.work))
    # Paths discovery could not or would not take are reported like unreadable files.
    total = BatchReport(skipped=list(found.skipped), notes=list(found.notes))
    if plan.shadowed:  # left by a crash of an older release: a re-run converges
        total.superseded += repair_task(plan, settings, actor)
    size = settings.ingest.ingest_batch_docs
    batches = [plan.work[start : start + size] for start in range(0, len(plan.work), size)]
    with compute_runner(settings if batches else None) as compute:
        if compute is None:
            with extractors():
                for batch in batches:
                    extracted = extract_batch_task(batch, settings)
                    total.merge(index_batch_task(batch, target, extracted, settings))
                    progress.advance("index", len(batch))
        else:
            logger.info("extracting and embedding %d batches on Dask", len(batches))
            for batch, prepared in _prepared_in_order(compute, batches, settings):
                total.merge(index_batch_task(batch, target, {}, settings, prepared=prepared))
                progress.advance("index", len(batch))
    report = ingest_report(
        plan,
        total,
        org=org,
        collection=coll.path,
        discovered=len(sources),
        seconds=time.perf_counter() - started,
    )
    logger.info(
        "indexed %d documents (%d chunks), skipped %d, superseded %d in %.1fs",
        total.documents,
        total.chunks,
        len(total.skipped),
        total.superseded,
        report.seconds,
    )
    report.raise_if_too_many_skipped(settings.ingest.max_skip_ratio)
    return report


def _prepared_in_order(
    compute: ComputeRunner, batches: list[list[WorkItem]], settings: Settings
) -> Iterator[tuple[list[WorkItem], Prepared]]:
    """Each batch with its extraction and vectors, computed on the runner's workers and
    yielded in batch order. A few batches per worker are in flight at once: enough to keep
    every worker busy while the flow writes, few enough that a large ingest is not held in
    memory whole."""
    todo = iter(batches)
    pending: deque[tuple[list[WorkItem], Any]] = deque(
        (batch, _submit(compute, batch, settings)) for batch in islice(todo, 2 * compute.workers)
    )
    while pending:
        batch, future = pending.popleft()
        prepared = future.result()
        nxt = next(todo, None)
        if nxt is not None:
            pending.append((nxt, _submit(compute, nxt, settings)))
        yield batch, prepared


def _submit(compute: ComputeRunner, batch: list[WorkItem], settings: Settings) -> Any:
    params = {"items": batch, "settings": settings, "threads": compute.threads}
    return compute.runner.submit(prepare_batch_task, params)
