"""Gated retrieval: hybrid (dense + BM25, RRF-fused), dense-only or keyword-only.

A plain function on the query path: no Prefect, no Great Expectations. Every leg carries the
gate's payload filter, and every hit is re-checked against the registry before it is returned.
"""

from __future__ import annotations

import logging
import time

from kbflow.errors import ConfigError
from kbflow.models import Location, Scope, SearchHit, SearchMode, StoredHit
from sinks.gate import build_gate
from sinks.registry import SqlRegistry
from sinks.vectors import VectorStore
from tasks.embed import Embedder
from tasks.sparse import query_sparse_vector

log = logging.getLogger(__name__)


def search(
    query: str,
    scope: Scope,
    *,
    store: VectorStore,
    registry: SqlRegistry,
    embedder: Embedder,
    mode: SearchMode = SearchMode.HYBRID,
    top_k: int = 10,
    prefetch_limit: int = 100,
    rrf_k: int = 60,
) -> list[SearchHit]:
    """Return the ``top_k`` best chunks that ``scope`` may see.

    Raises:
        ConfigError: ``top_k`` is not positive or the query is empty.
    """
    if top_k <= 0:
        raise ConfigError(f"top_k must be greater than 0. Currently it is {top_k}.")
    if not query.strip():
        raise ConfigError("The query is empty. Ask a question or give some keywords.")
    started = time.perf_counter()
    gate = build_gate(scope)
    dense = embedder.embed_query(query) if mode != SearchMode.KEYWORD else None
    sparse = query_sparse_vector(query) if mode != SearchMode.DENSE else None
    # Over-fetch a little so hits dropped by the registry re-check can be replaced.
    limit = top_k + max(5, top_k // 2)
    stored = store.query(
        gate,
        dense=dense,
        sparse=sparse,
        limit=limit,
        prefetch_limit=max(prefetch_limit, limit),
        rrf_k=rrf_k,
    )
    docs = registry.get_documents(h.payload.get("doc_id", "") for h in stored)
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
        hits.append(_to_search_hit(hit, mode))
        if len(hits) == top_k:
            break
    log.debug("search mode=%s hits=%d in %.1f ms", mode, len(hits), _ms(started))
    return hits


def _to_search_hit(hit: StoredHit, mode: SearchMode) -> SearchHit:
    p = hit.payload
    path = p.get("collection_path") or []
    return SearchHit(
        doc_id=p.get("doc_id", ""),
        chunk_id=p.get("chunk_id", ""),
        title=p.get("title", ""),
        uri=p.get("uri", ""),
        heading_path=list(p.get("heading_path") or []),
        text=p.get("text", ""),
        score=hit.score,
        collection=path[-1] if path else "",
        scores={mode.value: hit.score},
        location=Location.from_payload(p),
    )


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000
