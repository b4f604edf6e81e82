"""Retrieval evals: index a BEIR dataset the way kbflow indexes anything, query it in every mode
through the same gated retrieval agents use, and score the document rankings.

The index lives in its own data directory (``<KBFLOW_HOME>/evals/<dataset>``: registry and
embedded Qdrant), so evals never touch a client's knowledge base. Corpus records go through the
normal ingest path (content-hash planning, chunking, BM25 sparse vectors, the data checks) with
embeddings cached by content hash and model id (``<KBFLOW_HOME>/cache/embeddings.sqlite``): a
re-run re-embeds nothing, and neither does rebuilding an index after a BM25 change.

Rankings are per document: a document's rank is that of its best chunk. Each mode retrieves
enough chunks to fill 100 distinct documents (Recall@100). For fused modes the top of the
ranking comes from a query made exactly as agents make it (top 10, the configured candidate
depth per leg), and the rest from the deep query, so MRR@10 and nDCG@10 measure what is served.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from core.errors import ConfigError, ExtractionError
from core.models import ExtractedDocument, Scope, SearchMode
from core.settings import Settings
from evals.beir import BeirDataset
from evals.metrics import Run, Scores, evaluate
from evals.refusal import (
    RefusalSupports,
    Situation,
    refusal_supports,
    relevant_documents,
    situations,
)
from evals.warehouse import EvalRecord
from sinks.connect import open_vector_store
from sinks.registry import SqlRegistry
from sinks.vectors import VectorStore
from tasks.ingest.discover import Source, jsonl_sources
from tasks.ingest.index import IngestTarget, index_batch, plan_ingest
from tasks.query.rerank import Reranker, rerank_hits, reranker_from_settings
from tasks.query.retrieve import RetrievalConfig, search
from tasks.text.embed import CachedEmbedder, Embedder, embedder_for

if TYPE_CHECKING:
    from tasks.answer.confidence import TermStats

log = logging.getLogger(__name__)

DEFAULT_MODES: tuple[SearchMode, ...] = (SearchMode.KEYWORD, SearchMode.DENSE, SearchMode.HYBRID)
EVAL_ORG = "eval"
DOC_DEPTH = 100  # documents ranked per query (Recall@100)
CHUNK_DEPTH = 250  # chunks fetched to fill DOC_DEPTH documents (SciFact: ~1.7 chunks a doc)
SERVED_K = 10  # what an agent asks for: the fused top is measured at this depth
INDEX_BATCH = 256

Progress = Callable[[str, int, int], None]  # (stage, done, total)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "dataset"


def index_fingerprint(settings: Settings) -> str:
    """What the stored index depends on: a change to any of these needs a fresh index.

    The embedding part is the embedder's model id, so an int8 index never serves an fp32
    eval (or the reverse); for fp32 it is the model setting itself, as before.
    """
    from tasks.text.chunk import CHUNKER_VERSION
    from tasks.text.sparse import ANALYZER_VERSION, BM25_AVG_LEN, BM25_B, BM25_K1

    parts = (
        embedder_for(settings).model_id,
        settings.ingest.chunk_max_words,
        settings.ingest.chunk_overlap_words,
        CHUNKER_VERSION,
        BM25_K1,
        BM25_B,
        BM25_AVG_LEN,
        ANALYZER_VERSION,
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:10]


def eval_settings(settings: Settings, dataset: BeirDataset) -> Settings:
    """The settings of the dataset's own index: the same models, its own data directory
    (one per index fingerprint, so changing chunking, BM25 or its analyser never reuses a stale
    index)."""
    home = settings.home / "evals" / _slug(dataset.name) / index_fingerprint(settings)
    return settings.replace(home=home, database_url=None, qdrant_url=None)


def cached_embedder(settings: Settings) -> CachedEmbedder:
    inner = embedder_for(settings)
    return CachedEmbedder(inner, settings.home / "cache" / "embeddings.sqlite")


def build_index(
    dataset: BeirDataset,
    settings: Settings,
    *,
    embedder: Embedder,
    progress: Progress | None = None,
) -> dict[str, int]:
    """Index the dataset's corpus into its eval home; unchanged records cost nothing."""
    home = eval_settings(settings, dataset)
    sources = list(jsonl_sources(dataset.corpus_path))
    registry = SqlRegistry.open(home.registry_url)
    try:
        registry.people.ensure_org(EVAL_ORG)
        coll = registry.catalog.ensure_collection(EVAL_ORG, "corpus")
        target = IngestTarget(EVAL_ORG, coll.id, coll.path, actor="eval")
        plan = plan_ingest(sources, registry, EVAL_ORG)
        done = 0
        if plan.work:
            with open_vector_store(home) as store:
                for start in range(0, len(plan.work), INDEX_BATCH):
                    batch = plan.work[start : start + INDEX_BATCH]
                    report = index_batch(
                        batch,
                        target,
                        store=store,
                        registry=registry,
                        embedder=embedder,
                        extract_file=_no_files,
                        max_words=home.ingest.chunk_max_words,
                        overlap_words=home.ingest.chunk_overlap_words,
                    )
                    if report.skipped:
                        log.warning("eval index: %d records skipped", len(report.skipped))
                    done += len(batch)
                    if progress:
                        progress("index", done, len(plan.work))
        return {"documents": len(sources), "indexed": len(plan.work), "unchanged": plan.unchanged}
    finally:
        registry.close()


def _no_files(source: Source) -> ExtractedDocument:
    raise ExtractionError(f"{source.name}: an eval corpus holds records, not files")


@dataclass
class ModeRun:
    run: Run
    seconds: float
    notes: list[str]


def run_queries(
    dataset: BeirDataset,
    settings: Settings,
    modes: Sequence[SearchMode],
    *,
    embedder: Embedder,
    config: RetrievalConfig,
    reranker: Reranker | None = None,
    progress: Progress | None = None,
) -> dict[SearchMode, ModeRun]:
    """Rank documents for every query in every mode, through the gated search."""
    home = eval_settings(settings, dataset)
    scope = Scope(org_id=EVAL_ORG)
    registry = SqlRegistry.open(home.registry_url)
    try:
        ids = corpus_ids(registry)
        out: dict[SearchMode, ModeRun] = {}
        with open_vector_store(home) as store:
            for mode in modes:
                out[mode] = _run_mode(
                    dataset, mode, scope, store, registry, embedder, config, reranker,
                    ids, progress,
                )  # fmt: skip
        return out
    finally:
        registry.close()


def corpus_ids(registry: SqlRegistry) -> dict[str, str]:
    """Document id -> the corpus record id it was indexed from (the source key's fragment)."""
    return {
        doc.id: doc.source_key.rsplit("#", 1)[-1]
        for doc in registry.documents.current_documents(EVAL_ORG).values()
    }


def _run_mode(
    dataset: BeirDataset,
    mode: SearchMode,
    scope: Scope,
    store: VectorStore,
    registry: SqlRegistry,
    embedder: Embedder,
    config: RetrievalConfig,
    reranker: Reranker | None,
    corpus_ids: dict[str, str],
    progress: Progress | None,
) -> ModeRun:
    started = time.perf_counter()
    run: Run = {}
    failures: list[str] = []
    engine_mode = SearchMode.HYBRID if mode is SearchMode.HYBRID_RERANK else mode
    fused = engine_mode is SearchMode.HYBRID
    for done, (qid, text) in enumerate(dataset.queries.items(), start=1):
        deep = search(
            text, scope, store=store, registry=registry, embedder=embedder, mode=engine_mode,
            top_k=CHUNK_DEPTH, config=config,
        )  # fmt: skip
        hits = deep
        if fused:
            # A deep query widens each leg's candidates, which changes the fused order: the top
            # is taken from a query made exactly as agents make it, the tail from the deep one.
            head = config.rerank_candidates if mode is SearchMode.HYBRID_RERANK else SERVED_K
            hits = search(
                text, scope, store=store, registry=registry, embedder=embedder,
                mode=engine_mode, top_k=head, config=config,
            )  # fmt: skip
            if mode is SearchMode.HYBRID_RERANK and reranker is not None:
                hits, failure = rerank_hits(text, hits, reranker, top_k=head)
                if failure:
                    failures.append(failure)
            hits = hits + deep
        ranking: list[str] = []
        for hit in hits:
            cid = corpus_ids.get(hit.doc_id)
            if cid is not None and cid not in ranking:
                ranking.append(cid)
                if len(ranking) == DOC_DEPTH:
                    break
        run[qid] = ranking
        if progress and (done % 50 == 0 or done == len(dataset.queries)):
            progress(mode.value, done, len(dataset.queries))
    notes = [f"reranker failed on {len(failures)} queries: {failures[0]}"] if failures else []
    return ModeRun(run, time.perf_counter() - started, notes)


@dataclass
class EvalResult:
    record: EvalRecord
    scores: dict[str, Scores]
    index: dict[str, int]
    notes: list[str]
    refusal: dict[str, float] = field(default_factory=dict)
    """`evals.refusal.REFUSAL_METRICS` at the configured threshold; empty without hybrid."""

    def summary(self) -> dict[str, Any]:
        """The command's JSON: ``{"dataset", "modes": {mode: {metric: value}}, "refusal":
        {metric: value}, ...}`` (``refusal`` is empty when hybrid did not run)."""
        return {
            "dataset": self.record.dataset,
            "run_id": self.record.run_id,
            "queries": next(iter(self.scores.values())).queries if self.scores else 0,
            "modes": {
                m: {k: round(v, 4) for k, v in s.mean.items()} for m, s in self.scores.items()
            },
            "refusal": {k: round(v, 4) for k, v in self.refusal.items()},
            "seconds": round(self.record.seconds, 1),
            "index": self.index,
            "settings": self.record.settings,
            "notes": self.notes,
        }


def run_eval(
    dataset: BeirDataset,
    settings: Settings,
    modes: Sequence[SearchMode] | None = None,
    *,
    progress: Progress | None = None,
) -> EvalResult:
    """Index (cached), query every mode, and score: one eval run, not yet recorded."""
    started_at = dt.datetime.now(dt.UTC)
    started = time.perf_counter()
    # The default modes add hybrid+rerank when a reranker is configured; it is built once.
    wants_rerank = not modes or SearchMode.HYBRID_RERANK in modes
    reranker = reranker_from_settings(settings) if wants_rerank else None
    if not modes:
        modes = (*DEFAULT_MODES, SearchMode.HYBRID_RERANK) if reranker else DEFAULT_MODES
    modes = tuple(modes)
    notes: list[str] = []
    if SearchMode.HYBRID_RERANK in modes and reranker is None:
        notes.append("hybrid+rerank: no reranker configured, so it equals hybrid")
    embedder = cached_embedder(settings)
    try:
        index = build_index(dataset, settings, embedder=embedder, progress=progress)
        config = RetrievalConfig.from_settings(settings)
        runs = run_queries(
            dataset, settings, modes, embedder=embedder, config=config, reranker=reranker,
            progress=progress,
        )  # fmt: skip
        refusal = (
            refusal_of(dataset, settings, embedder=embedder, config=config)
            if SearchMode.HYBRID in modes
            else None
        )
        index["embeddings_computed"] = embedder.misses
        index["embeddings_cached"] = embedder.hits
    finally:
        embedder.close()
    scores = {mode.value: evaluate(r.run, dataset.qrels) for mode, r in runs.items()}
    for r in runs.values():
        notes.extend(r.notes)
    means: dict[str, dict[str, float]] = {m: dict(s.mean) for m, s in scores.items()}
    per_query: dict[str, dict[str, dict[str, float]]] = {m: s.per_query for m, s in scores.items()}
    refusal_metrics: dict[str, float] = {}
    if refusal is not None:
        # stored beside hybrid's retrieval metrics: the answer path retrieves in hybrid mode
        refusal_metrics = refusal.metrics(settings.answers.answer_min_confidence)
        hybrid = SearchMode.HYBRID.value
        means[hybrid] = {**means[hybrid], **refusal_metrics}
        for qid, supports in refusal.per_query().items():
            if qid in per_query[hybrid]:  # judged queries; near-misses have no retrieval row
                per_query[hybrid][qid] = {**per_query[hybrid][qid], **supports}
    record = EvalRecord(
        run_id=uuid.uuid4().hex[:12],
        dataset=dataset.name,
        started_at=started_at,
        commit=_git_commit(),
        settings=_eval_settings_record(settings, reranker),
        modes=means,
        per_query=per_query,
        seconds=time.perf_counter() - started,
    )
    return EvalResult(record, scores, index, notes, refusal_metrics)


def refusal_of(
    dataset: BeirDataset, settings: Settings, *, embedder: Embedder, config: RetrievalConfig
) -> RefusalSupports:
    """The answer path's support over the eval index, answerable and not (`evals.refusal`)."""
    with eval_situations(dataset, settings, embedder=embedder, config=config) as index:
        return refusal_supports(index.cases, embedder, index.stats)


class EvalSituations(NamedTuple):
    """What `eval_situations` yields."""

    cases: Iterator[Situation]
    """Each situation, searched as it is iterated."""
    stats: TermStats
    """The corpus's term statistics (what support weighs terms by)."""
    corpus_ids: dict[str, str]
    """Document id -> corpus id (`corpus_ids`)."""


@contextmanager
def eval_situations(
    dataset: BeirDataset,
    settings: Settings,
    *,
    embedder: Embedder,
    config: RetrievalConfig | None = None,
    queries: int | None = None,
    top_k: int | None = None,
) -> Iterator[EvalSituations]:
    """The refusal situations (`evals.refusal.situations`) over the eval index of ``dataset``
    that `run_eval` built under ``settings``, with the corpus's term statistics and ids; the
    index is open for the block.

    Args:
        dataset: the BEIR split; its judged queries, qrels and unanswerable questions.
        settings: the home the eval index is in (`eval_settings` finds it).
        embedder: what the index was built with (`cached_embedder`).
        config: retrieval settings; the index home's by default.
        queries: only the first ``queries`` judged queries (all by default).
        top_k: hits per situation; ``KBFLOW_ANSWER_TOP_K`` by default.

    Raises:
        ConfigError: there is no eval index of ``dataset`` in this home yet.
    """
    from tasks.answer.confidence import TermStats

    home = eval_settings(settings, dataset)
    registry = SqlRegistry.open(home.registry_url)
    try:
        ids = corpus_ids(registry)
        if not ids:
            raise ConfigError(
                f"no eval index of {dataset.name} under {settings.home}: "
                "run `kbflow eval run` on it first"
            )
        stats = TermStats.of_org(EVAL_ORG, registry)
        judged = dict(list(dataset.queries.items())[:queries])
        with open_vector_store(home) as store:
            cases = situations(
                judged, relevant_documents(dataset.qrels), dataset.unanswerable, org_id=EVAL_ORG,
                store=store, registry=registry, embedder=embedder,
                config=config or RetrievalConfig.from_settings(home), corpus_ids=ids,
                top_k=settings.answers.answer_top_k if top_k is None else top_k,
            )  # fmt: skip
            yield EvalSituations(cases, stats, ids)
    finally:
        registry.close()


def _eval_settings_record(settings: Settings, reranker: Reranker | None) -> dict[str, Any]:
    from tasks.text.sparse import ANALYZER_VERSION, BM25_AVG_LEN, BM25_B, BM25_K1

    return {
        "embedding_model": settings.ingest.embedding_model,
        "embedding_id": embedder_for(settings).model_id,  # the int8 form's id when it ran
        "chunk_max_words": settings.ingest.chunk_max_words,
        "chunk_overlap_words": settings.ingest.chunk_overlap_words,
        "fusion": settings.retrieval.fusion,
        "rrf_k": settings.retrieval.rrf_k,
        "dense_weight": settings.retrieval.dense_weight,
        "prefetch_limit": settings.retrieval.prefetch_limit,
        "bm25": {
            "k1": BM25_K1,
            "b": BM25_B,
            "avg_len": BM25_AVG_LEN,
            "analyzer": ANALYZER_VERSION,
        },
        "reranker": reranker.name if reranker else None,
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parents[1],
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def parse_modes(text: str | None) -> tuple[SearchMode, ...] | None:
    """``"keyword,dense,hybrid"`` -> modes; None for the default set."""
    if not text:
        return None
    modes: list[SearchMode] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            modes.append(SearchMode(part))
        except ValueError:
            raise ConfigError(
                f"unknown mode {part!r} — choose from {', '.join(m.value for m in SearchMode)}"
            ) from None
    return tuple(dict.fromkeys(modes))
