"""Candidate retrieval levers, run inside the real gated search by `bench/retrieval_levers.py`.

None of these is in the query path: `tasks.query.retrieve.search` is run as it is, with only its
store step (`_query_store`, the two gated legs and their weighted fusion) replaced by
`levered_query_store` for the duration of a variant (`levers_applied`). The gate, the registry
re-check and the eval's document rankings stay the real ones.

- RM3 pseudo-relevance feedback on the keyword leg (``prf_*``): the first fused search's best
  hits' analysed terms expand the BM25 query, whose leg is re-run and fused again.
- Rocchio feedback on the dense leg (``rocchio_*``): the query vector plus ``beta`` times the
  mean of the first fused search's best hits' vectors, re-run and fused again. The hits'
  vectors come from a map exported from the index before the run (the store protocol has no
  vectors-by-id read; a served version would need one).
- Document score summing (``doc_sum_weight``): a chunk ranks by its document's score, the best
  chunk's plus the weight times the document's other candidate chunks'.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np

from core.models import ChunkPayload, SearchMode, SparseVec, StoredHit
from tasks.query import retrieve
from tasks.text.sparse import analyze, term_id, terms_sparse_vector

DOC_SUM_DEPTH = 50  # fused candidates whose documents' chunk scores are summed


@dataclass(frozen=True)
class Levers:
    prf_docs: int = 0
    prf_terms: int = 10
    prf_weight: float = 0.5
    rocchio_docs: int = 0
    rocchio_beta: float = 0.0
    doc_sum_weight: float = 0.0


def rm3_sparse_query(
    query: SparseVec, texts: Sequence[str], scores: Sequence[float], *, terms: int, weight: float
) -> SparseVec:
    """``(1 - weight) * q / |q| + weight * RM1`` over the ``terms`` strongest feedback terms;
    RM1 weighs each text's term distribution by its share of the first-round scores."""
    if not texts or terms <= 0 or weight <= 0 or not query.indices:
        return query
    total = sum(max(s, 0.0) for s in scores) or float(len(texts))
    model: Counter[int] = Counter()
    for text, score in zip(texts, scores, strict=True):
        counts = Counter(term_id(t) for t in analyze(text))
        length = sum(counts.values())
        for tid, tf in counts.items():
            model[tid] += (max(score, 0.0) or 1.0) / total * tf / length
    kept = model.most_common(terms)
    kept_total = sum(w for _, w in kept) or 1.0
    mixed = {tid: (1 - weight) / len(query.indices) for tid in query.indices}
    for tid, w in kept:
        mixed[tid] = mixed.get(tid, 0.0) + weight * w / kept_total
    items = sorted(mixed.items())
    return SparseVec([i for i, _ in items], [v for _, v in items])


def sum_by_document(
    hits: list[StoredHit], payloads: dict[str, ChunkPayload], other_weight: float
) -> list[StoredHit]:
    docs: dict[str, list[StoredHit]] = {}
    for hit in hits:
        if hit.point_id in payloads:
            docs.setdefault(payloads[hit.point_id].get("doc_id", ""), []).append(hit)
    score = {d: c[0].score + other_weight * sum(h.score for h in c[1:]) for d, c in docs.items()}
    order = sorted(docs, key=lambda d: (-score[d], docs[d][0].point_id))
    return [StoredHit(h.point_id, score[d], h.payload, h.legs) for d in order for h in docs[d]]


def _indexed_text(payload: ChunkPayload) -> str:
    return " ".join([*(payload.get("heading_path") or []), payload.get("text", "")])


def levered_query_store(
    levers: Levers, vectors: dict[str, np.ndarray] | None
) -> Callable[..., Any]:
    """A drop-in for `retrieve._query_store` that applies ``levers`` to hybrid weighted search."""
    original = retrieve._query_store

    def query_store(query, gate, store, embedder, mode, limit, config):  # type: ignore[no-untyped-def]
        # ``query``: a `tasks.query.bounds.CheckedQuery`, its terms analysed once already
        sparse = terms_sparse_vector(query.terms)
        if mode is not SearchMode.HYBRID or config.fusion != "weighted" or not sparse.indices:
            return original(query, gate, store, embedder, mode, limit, config)
        dense = np.asarray(embedder.embed_query(query.text), dtype=np.float32)
        prefetch = max(config.prefetch_limit, limit)

        def leg(d: np.ndarray | None, s: SparseVec | None) -> list[StoredHit]:
            found: list[StoredHit] = store.query(
                gate, dense=None if d is None else d.tolist(), sparse=s, limit=prefetch,
                with_payload=False,
            )  # fmt: skip
            return found

        dense_hits, sparse_hits = leg(dense, None), leg(None, sparse)
        fused = retrieve._weighted_fusion(dense_hits, sparse_hits, config.dense_weight)
        first = fused
        if levers.prf_docs:
            top = first[: levers.prf_docs]
            found = store.payloads([h.point_id for h in top])
            kept = [h for h in top if h.point_id in found]
            expanded = rm3_sparse_query(
                sparse, [_indexed_text(found[h.point_id]) for h in kept], [h.score for h in kept],
                terms=levers.prf_terms, weight=levers.prf_weight,
            )  # fmt: skip
            sparse_hits = leg(None, expanded)
        if levers.rocchio_docs and vectors is not None:
            fb = [
                vectors[h.point_id] for h in first[: levers.rocchio_docs] if h.point_id in vectors
            ]
            if fb:
                moved = dense / np.linalg.norm(dense) + levers.rocchio_beta * np.mean(fb, axis=0)
                dense_hits = leg(moved / np.linalg.norm(moved), None)
        if levers.prf_docs or levers.rocchio_docs:
            fused = retrieve._weighted_fusion(dense_hits, sparse_hits, config.dense_weight)
        if levers.doc_sum_weight:
            head = fused[: max(limit, DOC_SUM_DEPTH)]
            payloads = store.payloads([h.point_id for h in head])
            fused = sum_by_document(head, payloads, levers.doc_sum_weight)[:limit]
        else:
            fused = fused[:limit]
            payloads = store.payloads([h.point_id for h in fused])
        return [
            StoredHit(h.point_id, h.score, payloads[h.point_id], legs=h.legs)
            for h in fused
            if h.point_id in payloads
        ]

    return query_store


@contextmanager
def levers_applied(levers: Levers, vectors: dict[str, np.ndarray] | None) -> Iterator[None]:
    """Run `retrieve.search` with ``levers`` (nothing is patched for the default levers)."""
    if levers == Levers():
        yield
        return
    with mock.patch.object(retrieve, "_query_store", levered_query_store(levers, vectors)):
        yield


def export_vectors(store: Any) -> dict[str, np.ndarray]:
    """Point id -> unit dense vector, for Rocchio's feedback hits."""
    out = {}
    for point in store.export_points():
        v = np.asarray(point.dense, dtype=np.float32)
        out[point.point_id] = v / np.linalg.norm(v)
    return out
