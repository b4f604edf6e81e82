"""Offline replay of hybrid retrieval over an exported eval index, for levers the query path
cannot run yet: Rocchio feedback on the dense leg (needs the hits' vectors) and a learned fusion.

`bench/retrieval_levers.py --phases simulate` uses it. Every point of the eval index is exported
once (vectors and doc ids); both legs are replayed exactly in numpy (dense: cosine, exact;
keyword: the stored BM25 weights times Qdrant's IDF), then fused as `tasks.query.retrieve` does.
The replayed default is checked against the real path's figures (printed side by side).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DEPTH = 100  # candidates per leg (RetrievalConfig.prefetch_limit)


@dataclass
class Replay:
    """An exported index: chunk vectors, BM25 postings, each chunk's corpus doc id."""

    vectors: np.ndarray  # (chunks, 384), unit length
    postings: dict[int, tuple[np.ndarray, np.ndarray]]  # term -> (chunk rows, weights * idf)
    docs: list[str]  # row -> corpus doc id

    @classmethod
    def export(cls, store: Any, corpus_ids: dict[str, str]) -> Replay:
        rows: list[list[float]] = []
        docs: list[str] = []
        terms: dict[int, tuple[list[int], list[float]]] = {}
        for point in store.export_points():
            cid = corpus_ids.get(point.payload.get("doc_id", ""))
            if cid is None:
                continue
            row = len(rows)
            rows.append(point.dense)
            docs.append(cid)
            for tid, w in zip(point.sparse.indices, point.sparse.values, strict=True):
                at = terms.setdefault(tid, ([], []))
                at[0].append(row)
                at[1].append(w)
        n = len(rows)
        postings = {}
        for tid, (r, w) in terms.items():
            idf = math.log((n - len(r) + 0.5) / (len(r) + 0.5) + 1)  # Qdrant's Idf modifier
            postings[tid] = (np.asarray(r), np.asarray(w) * idf)
        vectors = np.asarray(rows, dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return cls(vectors, postings, docs)

    def dense(self, query: np.ndarray) -> np.ndarray:
        q = query / np.linalg.norm(query)
        return self.vectors @ q

    def sparse(self, indices: Sequence[int], values: Sequence[float]) -> np.ndarray:
        scores = np.zeros(len(self.docs), dtype=np.float64)
        for tid, qv in zip(indices, values, strict=True):
            if tid in self.postings:
                r, w = self.postings[tid]
                scores[r] += qv * w
        return scores


def top(scores: np.ndarray, k: int = DEPTH) -> np.ndarray:
    """Rows of the ``k`` best scores (positive ones only for a sparse leg), best first."""
    part = np.argpartition(-scores, min(k, len(scores) - 1))[:k]
    return part[np.argsort(-scores[part], kind="stable")]


def minmax(scores: np.ndarray, rows: np.ndarray) -> dict[int, float]:
    vals = scores[rows]
    low, high = float(vals.min()), float(vals.max())
    span = high - low
    return {
        int(r): (float(s) - low) / span if span else 1.0 for r, s in zip(rows, vals, strict=True)
    }


def legs(dense: np.ndarray, sparse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = top(dense)
    s = top(sparse)
    s = s[sparse[s] > 0]
    return d, s


def weighted(dense: np.ndarray, sparse: np.ndarray, w: float = 0.5) -> list[tuple[int, float]]:
    """`tasks.query.retrieve._weighted_fusion` on replayed legs: (row, fused score), best first."""
    d, s = legs(dense, sparse)
    nd = minmax(dense, d) if len(d) else {}
    ns = minmax(sparse, s) if len(s) else {}
    mixed = {r: w * nd.get(r, 0.0) + (1 - w) * ns.get(r, 0.0) for r in {*nd, *ns}}
    return sorted(mixed.items(), key=lambda x: -x[1])


def doc_ranking(replay: Replay, ranked: Sequence[int], depth: int = 100) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for row in ranked:
        doc = replay.docs[row]
        if doc not in seen:
            seen.add(doc)
            out.append(doc)
            if len(out) == depth:
                break
    return out


FEATURES = ("dense_norm", "sparse_norm", "cosine", "sparse_share", "in_dense", "in_sparse",
            "dense_rr", "sparse_rr")  # fmt: skip


def features(dense: np.ndarray, sparse: np.ndarray) -> tuple[list[int], np.ndarray]:
    """Per-candidate features of the union of both legs' candidates."""
    d, s = legs(dense, sparse)
    nd = minmax(dense, d) if len(d) else {}
    ns = minmax(sparse, s) if len(s) else {}
    rank_d = {int(r): i for i, r in enumerate(d)}
    rank_s = {int(r): i for i, r in enumerate(s)}
    top_s = float(sparse[s[0]]) if len(s) else 1.0
    rows = sorted({*nd, *ns})
    x = np.array(
        [
            [
                nd.get(r, 0.0),
                ns.get(r, 0.0),
                float(dense[r]),
                float(sparse[r]) / top_s if top_s else 0.0,
                float(r in nd),
                float(r in ns),
                1 / (10 + rank_d[r]) if r in rank_d else 0.0,
                1 / (10 + rank_s[r]) if r in rank_s else 0.0,
            ]
            for r in rows
        ]
    )
    return rows, x
