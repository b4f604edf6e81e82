"""The ingest flow's Prefect tasks: discover -> plan -> per batch: extract, index. Each takes
values (paths, sources, the target, ``Settings``) and opens what it needs.

- ``extract-batch`` is pure on its files' content hashes and the extraction settings: its
  result is cached on them (and on this code), so a run resumed after a crash re-extracts
  nothing. The isolated worker processes are shared by the batches of a run
  (:func:`extractors`), not restarted per batch.
- ``index-batch`` opens the registry and the vector store itself; a busy store (another
  process holds it) is retried (:mod:`tasks.retries`). A batch never half-writes before the
  store is open, and :func:`tasks.ingest.index.plan_ingest` resumes what a crash left.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE, TASK_SOURCE, CacheKeyFnPolicy

from core.errors import ConfigError
from core.models import ExtractedDocument
from core.settings import Settings
from sinks.connect import open_registry, open_vector_store
from tasks.ingest.discover import Discovery, Source, discover
from tasks.ingest.extract import SUPPORTED_SUFFIXES
from tasks.ingest.extract_options import ExtractOptions
from tasks.ingest.index import (
    BatchReport,
    Extracted,
    IngestPlan,
    IngestTarget,
    WorkItem,
    batch_texts,
    extract_batch,
    index_batch,
    plan_ingest,
    prefetched,
    repair_shadowed,
)
from tasks.ingest.isolate import isolated_extractor
from tasks.retries import TASK_RETRIES
from tasks.text.embed import Embedder, PrecomputedEmbedder, embedder_for

_open: dict[str, Callable[[Source], ExtractedDocument]] = {}
_worker_lock = threading.Lock()
_stack = ExitStack()


def warm_up(settings: Settings) -> None:
    """Load what an ingest run's first batch would otherwise wait for: the data-check suite
    (Great Expectations' import is seconds) and, when batches embed in this process, the
    embedding model. A caller runs it while something else waits (the temporary Prefect
    server starting: `kbflow.services.orchestration.server.prefect_starting`)."""
    from tasks.ingest.validate import warm_up as warm_checks

    warm_checks()
    if settings.ingest.task_runner == "default":
        embedder_for(settings).load()


@contextmanager
def extractors() -> Iterator[None]:
    """The extraction workers of one run: started by the first batch that needs them, stopped
    when the block ends."""
    try:
        yield
    finally:
        _open.clear()
        _stack.close()


def _extractor(settings: Settings) -> Callable[[Source], ExtractedDocument]:
    key = _extraction_fingerprint(settings)
    if key not in _open:
        _open[key] = _stack.enter_context(isolated_extractor(settings))
    return _open[key]


def _extraction_fingerprint(settings: Settings) -> str:
    """What an extraction's result depends on besides the file: its options and limits."""
    options = ExtractOptions.from_settings(settings)
    data = {
        **{k: str(v) for k, v in vars(options).items()},
        **settings.extraction.model_dump(
            include={"extract_timeout_s", "media_timeout_s", "extract_memory_mb"}
        ),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _extraction_key(_context: Any, parameters: dict[str, Any]) -> str:
    files = sorted(
        (item.source.source_key, item.source.content_hash)
        for item in parameters["items"]
        if item.source.record is None
    )
    settings: Settings = parameters["settings"]
    digest = hashlib.sha256(json.dumps(files).encode())
    digest.update(_extraction_fingerprint(settings).encode())
    return f"extract-{digest.hexdigest()}"


@task(name="discover-sources", cache_policy=NO_CACHE, persist_result=False)
def discover_task(paths: list[str]) -> Discovery:
    """Files, folders, globs and corpora as sources, with what was skipped and why."""
    return discover(paths, SUPPORTED_SUFFIXES)


@task(name="plan-ingest", cache_policy=NO_CACHE, persist_result=False)
def plan_task(sources: list[Source], org: str, settings: Settings) -> IngestPlan:
    """New, changed, unfinished and unchanged sources, by content hash."""
    with open_registry(settings) as registry:
        return plan_ingest(sources, registry, org)


@task(name="repair-shadowed-versions", cache_policy=NO_CACHE, persist_result=False, **TASK_RETRIES)
def repair_task(plan: IngestPlan, settings: Settings, actor: str) -> int:
    """Retire the versions a crash of an older release left servable beside a newer one."""
    with open_registry(settings) as registry, open_vector_store(settings) as store:
        return repair_shadowed(plan, registry, store, actor=actor)


@task(
    name="extract-batch",
    cache_policy=TASK_SOURCE + CacheKeyFnPolicy(cache_key_fn=_extraction_key),
    cache_expiration=dt.timedelta(days=7),
    persist_result=True,
)
def extract_batch_task(items: list[WorkItem], settings: Settings) -> Extracted:
    """The batch's files as text, each in an isolated worker with the settings' caps."""
    return extract_batch(items, _extractor(settings))


@dataclass(frozen=True)
class Prepared:
    """One batch extracted and embedded away from the flow (`prepare_batch_task`)."""

    extracted: Extracted
    vectors: dict[str, list[float]]  # by chunk text
    model_id: str
    embed_seconds: float


@task(name="prepare-batch", cache_policy=NO_CACHE, persist_result=False, **TASK_RETRIES)
def prepare_batch_task(items: list[WorkItem], settings: Settings, threads: int = 0) -> Prepared:
    """Extract and embed one batch wherever the task runner puts it (a Dask worker).

    It opens neither the registry nor the vector store: the flow writes the batch afterwards
    (`index_batch_task` with the vectors), in batch order. See `prepare_batch`.
    """
    return prepare_batch(items, settings, threads)


def prepare_batch(items: list[WorkItem], settings: Settings, threads: int = 0) -> Prepared:
    """The batch's files as text and its chunks' vectors, by chunk text.

    Files are extracted in the process's isolated extraction worker, started by its first
    batch and kept for the next ones (a daemonic child: it ends with the Dask worker).
    ``threads`` caps the embedder's CPU threads (0: every core).

    A plain function, so a task runner that pickles the task (Dask) sends a reference to it
    rather than its globals.
    """
    extracted: Extracted = {}
    if any(item.source.record is None for item in items):
        _may_start_extractors()
        with _worker_lock:  # one extraction worker per process, used by one batch at a time
            extracted = extract_batch(items, _extractor(settings))
    texts = batch_texts(
        items,
        prefetched(extracted),
        max_words=settings.ingest.chunk_max_words,
        overlap_words=settings.ingest.chunk_overlap_words,
    )
    embedder = embedder_for(settings)
    if threads:
        embedder.limit_threads(threads)
    started = time.perf_counter()
    unique = list(dict.fromkeys(texts))
    vectors = dict(zip(unique, embedder.embed_documents(unique), strict=True))
    return Prepared(extracted, vectors, embedder.model_id, time.perf_counter() - started)


def _may_start_extractors() -> None:
    import multiprocessing

    if multiprocessing.current_process().daemon:
        raise ConfigError(
            "this Dask worker is a daemonic process, so it cannot start the isolated processes "
            "that extract files: start the workers with DASK_DISTRIBUTED__WORKER__DAEMON=False "
            "in their environment (kbflow's local cluster does this itself)"
        )


@task(name="index-batch", cache_policy=NO_CACHE, timeout_seconds=3600, **TASK_RETRIES)
def index_batch_task(
    items: list[WorkItem],
    target: IngestTarget,
    extracted: Extracted,
    settings: Settings,
    prepared: Prepared | None = None,
) -> BatchReport:
    """Chunk, embed, check and store one batch; make it servable in one registry commit.

    With ``prepared`` (the batch as a worker extracted and embedded it), nothing is embedded
    here unless a text is missing from it.
    """
    embedder: Embedder = embedder_for(settings)
    if prepared is not None:
        extracted = prepared.extracted
        embedder = PrecomputedEmbedder(embedder, prepared.vectors, prepared.model_id)
    with open_registry(settings) as registry, open_vector_store(settings) as store:
        report = index_batch(
            items,
            target,
            store=store,
            registry=registry,
            embedder=embedder,
            extract_file=prefetched(extracted),
            max_words=settings.ingest.chunk_max_words,
            overlap_words=settings.ingest.chunk_overlap_words,
        )
    if prepared is not None:
        report.embed_seconds += prepared.embed_seconds
    return report
