"""Gated retrieval: hybrid (dense + BM25, fused), dense-only, keyword-only, or hybrid reranked.

Plain functions on the query path: no Prefect, no Great Expectations. Every leg carries the
gate's payload filter, and every hit is re-checked against the registry before it is returned.

Both take the query as a `tasks.query.bounds.CheckedQuery` (checked once, where it came in: its
BM25 terms analysed there) or as a plain string from a caller that went round the edge (the
evals, benches, demo and tests call them directly), which is checked here as retrieval always
checked it.

`search` is the engine: it raises when the vector store fails. `retrieve` is what callers use:
it honours the pause switch, reranks ``hybrid+rerank`` candidates (falling back to the fused
order when the reranker fails), and when the vector engine fails it serves the keyword fallback
over the registry's chunk texts — gated the same way — and says so (``degraded``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from core.errors import ConfigError
from core.models import Location, RetrievalResult, Scope, SearchHit, SearchMode, StoredHit
from sinks.gate import Gate, build_gate
from sinks.registry import SqlRegistry
from sinks.vectors import VectorStore
from tasks.query.bounds import CheckedQuery, unbounded_query
from tasks.query.fallback import KeywordFallback, shared_fallback
from tasks.query.rerank import Reranker, rerank_hits
from tasks.text.citations import cited_sources
from tasks.text.embed import Embedder
from tasks.text.model_check import require_org_model
from tasks.text.sparse import terms_sparse_vector

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)

FUSIONS = ("rrf", "weighted")


@dataclass(frozen=True)
class RetrievalConfig:
    """How the legs are run and fused (tuned on SciFact dev: docs/RETRIEVAL.md).

    Attributes:
        prefetch_limit: candidates per leg before fusion.
        fusion: ``rrf`` (reciprocal-rank fusion inside Qdrant) or ``weighted`` (each leg's
            scores min-max normalised, then ``dense_weight`` * dense + (1 - it) * keyword).
        rrf_k: the RRF constant.
        dense_weight: the dense leg's weight in weighted fusion.
        rerank_candidates: how many gated hybrid hits a reranker sees.
    """

    prefetch_limit: int = 100
    fusion: str = "weighted"
    rrf_k: int = 60
    dense_weight: float = 0.5
    rerank_candidates: int = 50

    @classmethod
    def from_settings(cls, settings: Settings) -> RetrievalConfig:
        """The retrieval group's values for the fields this config has (same names)."""
        return cls(**settings.retrieval.model_dump(include={f.name for f in fields(cls)}))

    def __post_init__(self) -> None:
        if self.fusion not in FUSIONS:
            raise ConfigError(
                f"fusion must be one of {', '.join(FUSIONS)}. Currently it is {self.fusion!r}."
            )
        if not 0 <= self.dense_weight <= 1:
            raise ConfigError(
                f"dense_weight must be between 0 and 1. Currently it is {self.dense_weight}."
            )


def search(
    query: str | CheckedQuery,
    scope: Scope,
    *,
    store: VectorStore,
    registry: SqlRegistry,
    embedder: Embedder,
    mode: SearchMode = SearchMode.HYBRID,
    top_k: int = 10,
    config: RetrievalConfig | None = None,
) -> list[SearchHit]:
    """Return the ``top_k`` best chunks that ``scope`` may see (``hybrid+rerank`` returns the
    hybrid order here: reranking happens in `retrieve`).

    Raises:
        ConfigError: ``top_k`` is not positive or the query is empty.
        EmbeddingModelMismatch: a dense leg would compare the query's vector with chunks of
            the org that another embedding model made.
        Exception: whatever the vector store raises when it fails.
    """
    config = config or RetrievalConfig()
    checked = _checked(query, top_k)
    started = time.perf_counter()
    if mode is not SearchMode.KEYWORD:  # the keyword leg alone compares no vectors
        require_org_model(registry, scope.org_id, embedder.model_id)
    gate = build_gate(scope)
    # Over-fetch a little so hits dropped by the registry re-check can be replaced.
    limit = top_k + max(5, top_k // 2)
    stored = _query_store(checked, gate, store, embedder, mode, limit, config)
    docs = registry.documents.get_documents(h.payload.get("doc_id", "") for h in stored)
    hits: list[SearchHit] = []
    for hit in stored:
        doc = docs.get(hit.payload.get("doc_id", ""))
        if doc is None or not gate.admits(hit.payload) or not gate.admits(doc.gate_record()):
            log.warning(
                "dropped point %s of doc %s: the registry does not admit it (store drift; run "
                "the reconciler)",
                hit.point_id,
                hit.payload.get("doc_id"),
            )
            continue
        found = _to_search_hit(hit, mode)
        # Citation tags resolve from the hit's own (admitted) document, never by their ids.
        found.sources = cited_sources(found.text, doc.citations)
        hits.append(found)
        if len(hits) == top_k:
            break
    log.debug("search mode=%s hits=%d in %.1f ms", mode, len(hits), _ms(started))
    return hits


def retrieve(
    query: str | CheckedQuery,
    scope: Scope,
    *,
    store: VectorStore | None,
    registry: SqlRegistry,
    embedder: Embedder,
    mode: SearchMode = SearchMode.HYBRID,
    top_k: int = 10,
    config: RetrievalConfig | None = None,
    reranker: Reranker | None = None,
    paused: bool = False,
    fallback: KeywordFallback | None = None,
    store_error: str | None = None,
) -> RetrievalResult:
    """Gated retrieval with its contract: a genuine empty result is ``hits == []`` with
    ``degraded`` and ``paused`` both False.

    Args:
        store: the vector store, or None when it could not be opened (``store_error`` says why).
        reranker: used for ``hybrid+rerank``; without one that mode returns the fused order and
            says so in ``reason``.
        paused: retrieval is switched off (``KBFLOW_RETRIEVAL_PAUSED``): nothing is searched.
        fallback: the keyword fallback (default: the process-wide one).

    Raises:
        ConfigError: ``top_k`` is not positive or the query is empty.
    """
    config = config or RetrievalConfig()
    checked = _checked(query, top_k)
    if paused:
        return RetrievalResult(
            [], mode, paused=True, reason="retrieval is paused (KBFLOW_RETRIEVAL_PAUSED)"
        )
    wanted = max(top_k, config.rerank_candidates) if mode is SearchMode.HYBRID_RERANK else top_k
    if store is None:
        # ``store_error`` already describes the failure ("StoreBusy: ..."); it is quoted as-is,
        # not wrapped in another exception whose name would be prefixed to it a second time.
        why = store_error or "no vector store was opened"
        return _degraded(
            f"vector store could not be opened ({why}); keyword fallback",
            checked,
            scope,
            mode,
            registry=registry,
            fallback=fallback,
            top_k=top_k,
        )
    try:
        hits = search(
            checked,
            scope,
            store=store,
            registry=registry,
            embedder=embedder,
            mode=mode,
            top_k=wanted,
            config=config,
        )
    except ConfigError:
        raise
    except Exception as exc:  # any engine failure: fail open to the gated keyword fallback
        return _degraded(
            f"vector engine unavailable ({type(exc).__name__}: {exc}); keyword fallback",
            checked,
            scope,
            mode,
            registry=registry,
            fallback=fallback,
            top_k=top_k,
        )
    if mode is not SearchMode.HYBRID_RERANK:
        return RetrievalResult(hits[:top_k], mode)
    if reranker is None:
        return RetrievalResult(
            hits[:top_k], mode, reason="no reranker configured: hybrid order returned"
        )
    ranked, failure = rerank_hits(checked.text, hits, reranker, top_k=top_k)
    if failure:
        return RetrievalResult(ranked, mode, reason=f"{failure}; hybrid order returned")
    return RetrievalResult(ranked, mode, reranked=True)


def _degraded(
    reason: str,
    query: CheckedQuery,
    scope: Scope,
    mode: SearchMode,
    *,
    registry: SqlRegistry,
    fallback: KeywordFallback | None,
    top_k: int,
) -> RetrievalResult:
    """The gated keyword fallback's answer, marked degraded with ``reason``."""
    log.warning("retrieval degraded: %s", reason)
    gate = build_gate(scope)
    found = (fallback or shared_fallback()).search(query, gate, registry=registry, top_k=top_k)
    return RetrievalResult(found, mode, degraded=True, reason=reason)


def _checked(query: str | CheckedQuery, top_k: int) -> CheckedQuery:
    """Argument errors are the caller's, never an engine outage: raise before any engine runs.

    A `CheckedQuery` was checked where it came in: only the refusal that check decided on (a
    blank query, text that is not UTF-8) is raised here, where retrieval always raised it. A
    plain string comes from a caller that went round the edge: it is checked now."""
    if not isinstance(top_k, int) or isinstance(top_k, bool):
        raise ConfigError(f"top_k must be a whole number. Currently it is {top_k!r}.")
    if top_k <= 0:
        raise ConfigError(f"top_k must be greater than 0. Currently it is {top_k}.")
    if isinstance(query, CheckedQuery):
        return query.searchable()
    return unbounded_query(query)


def _query_store(
    query: CheckedQuery,
    gate: Gate,
    store: VectorStore,
    embedder: Embedder,
    mode: SearchMode,
    limit: int,
    config: RetrievalConfig,
) -> list[StoredHit]:
    dense = embedder.embed_query(query.text) if mode is not SearchMode.KEYWORD else None
    sparse = terms_sparse_vector(query.terms) if mode is not SearchMode.DENSE else None
    prefetch = max(config.prefetch_limit, limit)
    if dense is None or sparse is None or config.fusion == "rrf" or not sparse.indices:
        return store.query(
            gate,
            dense=dense,
            sparse=sparse,
            limit=limit,
            prefetch_limit=prefetch,
            rrf_k=config.rrf_k,
        )
    # Weighted fusion: each leg gated on its own, scores min-max normalised, then mixed. The
    # legs return ids and scores only; the payloads of the few winners are fetched after
    # (turning 2 x 100 payloads into Python objects cost more than both searches).
    dense_hits = store.query(gate, dense=dense, sparse=None, limit=prefetch, with_payload=False)
    sparse_hits = store.query(gate, dense=None, sparse=sparse, limit=prefetch, with_payload=False)
    fused = _weighted_fusion(dense_hits, sparse_hits, config.dense_weight)[:limit]
    found = store.payloads([h.point_id for h in fused])
    return [
        StoredHit(h.point_id, h.score, found[h.point_id], legs=h.legs)
        for h in fused
        if h.point_id in found  # deleted between the search and the fetch: not served
    ]


def _weighted_fusion(
    dense: list[StoredHit], sparse: list[StoredHit], dense_weight: float
) -> list[StoredHit]:
    """Min-max normalise each leg's scores and mix them; a point missing from a leg gets 0."""

    def normalised(hits: list[StoredHit]) -> dict[str, float]:
        if not hits:
            return {}
        high, low = max(h.score for h in hits), min(h.score for h in hits)
        span = high - low
        return {h.point_id: (h.score - low) / span if span else 1.0 for h in hits}

    nd, ns = normalised(dense), normalised(sparse)
    by_id = {h.point_id: h for h in [*sparse, *dense]}
    mixed = {
        pid: dense_weight * nd.get(pid, 0.0) + (1 - dense_weight) * ns.get(pid, 0.0)
        for pid in by_id
    }
    raw_dense = {h.point_id: h.score for h in dense}
    raw_sparse = {h.point_id: h.score for h in sparse}
    order = sorted(mixed, key=lambda pid: (-mixed[pid], pid))
    return [
        StoredHit(pid, mixed[pid], by_id[pid].payload, legs=_legs(pid, raw_dense, raw_sparse))
        for pid in order
    ]


def _legs(pid: str, dense: dict[str, float], sparse: dict[str, float]) -> dict[str, float]:
    """A fused point's raw leg scores (the dense one is a cosine: answers gate on it)."""
    legs = {}
    if pid in dense:
        legs[SearchMode.DENSE.value] = dense[pid]
    if pid in sparse:
        legs[SearchMode.KEYWORD.value] = sparse[pid]
    return legs


def _to_search_hit(hit: StoredHit, mode: SearchMode) -> SearchHit:
    payload = hit.payload
    path = payload.get("collection_path") or []
    return SearchHit(
        doc_id=payload.get("doc_id", ""),
        chunk_id=payload.get("chunk_id", ""),
        title=payload.get("title", ""),
        uri=payload.get("uri", ""),
        heading_path=list(payload.get("heading_path") or []),
        text=payload.get("text", ""),
        score=hit.score,
        collection=path[-1] if path else "",
        # hybrid+rerank hits carry the fused score as "hybrid"; the reranker adds "rerank".
        scores={
            (SearchMode.HYBRID if mode is SearchMode.HYBRID_RERANK else mode).value: hit.score,
            **hit.legs,
        },
        location=Location.from_payload(payload),
    )


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000
