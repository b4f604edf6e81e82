"""The ``ingest`` flow: discover -> plan (content hash) -> per batch: extract, chunk, embed,
check, upsert -> report."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from typing import Any

from prefect import flow, get_run_logger

from core import progress
from core.models import DocStatus
from core.settings import Settings
from sinks.connect import open_vector_store
from sinks.jobs import JobStore
from sinks.registry import SqlRegistry
from tasks.ingest.extract import SUPPORTED_SUFFIXES
from tasks.ingest.index import BatchReport, IngestSummary, IngestTarget, prefetched, repair_shadowed
from tasks.ingest.isolate import isolated_extractor
from tasks.text.embed import get_embedder
from tasks.wrapped import discover_task, extract_batch_task, index_batch_task, plan_task


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
) -> dict[str, Any]:
    """Ingest files, directories, globs or JSONL corpora into one org's collection.

    Unchanged documents (same content hash) are skipped; a changed one becomes a new version
    and supersedes the old. Returns a report; fails when too many documents could not be read.
    ``job_id`` names the registry job this run does (see `kbflow.jobs`).
    """
    logger = get_run_logger()
    settings = Settings()
    started = time.perf_counter()
    registry = SqlRegistry.open(settings.registry_url)
    if job_id is not None:
        from prefect.runtime import flow_run

        JobStore(registry).update_runner(job_id, flow_run_id=str(flow_run.id))
    try:
        registry.get_org(org)  # an unknown org is refused (`kbflow orgs create` makes one)
        coll = registry.ensure_collection(org, collection)
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
        found = discover_task(paths, SUPPORTED_SUFFIXES)
        sources = found.sources
        plan = plan_task(sources, registry, org)
        logger.info(
            "discovered %d sources: %d new, %d changed, %d unchanged",
            len(sources),
            plan.new,
            plan.changed,
            plan.unchanged,
        )
        progress.advance("index", 0, total=len(plan.work))
        # Paths discovery could not or would not take are reported like unreadable files.
        total = BatchReport(skipped=list(found.skipped), notes=list(found.notes))
        if plan.shadowed:  # left by a crash of an older release: a re-run converges
            with open_vector_store(settings) as store:
                total.superseded += repair_shadowed(plan, registry, store, actor=actor)
        embedder = get_embedder(settings.embedding_model, settings.embed_batch_size)

        if plan.work:
            # Files: the store is held only while writing, not while parsing or transcribing.
            # Corpus records need no extraction: one store for the whole run saves reopening.
            has_files = any(w.source.record is None for w in plan.work)
            with isolated_extractor(settings) as extract, contextlib.ExitStack() as held:
                shared = None if has_files else held.enter_context(open_vector_store(settings))
                size = settings.ingest_batch_docs
                for start in range(0, len(plan.work), size):
                    batch = plan.work[start : start + size]
                    extracted = extract_batch_task(batch, extract)
                    with contextlib.ExitStack() as per_batch:
                        store = (
                            shared
                            if shared is not None
                            else per_batch.enter_context(open_vector_store(settings))
                        )
                        total.merge(
                            index_batch_task(
                                batch,
                                target,
                                store=store,
                                registry=registry,
                                embedder=embedder,
                                extract_file=prefetched(extracted),
                                max_words=settings.chunk_max_words,
                                overlap_words=settings.chunk_overlap_words,
                            )
                        )
                    progress.advance("index", len(batch))
        summary = IngestSummary.build(
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
            summary.seconds,
        )
        summary.raise_if_too_many_skipped(settings.max_skip_ratio)
        return summary.to_dict()
    finally:
        registry.close()
