"""The keyword fallback: BM25 over an org's gated chunks, read from the registry.

Serves only when the vector engine is unavailable. It ranks with `rank_bm25` over the same
analysed terms as the stored sparse vectors (`tasks.text.sparse.analyze`, for the chunks and the
query), builds its index from the registry's chunk texts (never from the vector store, which is
what failed), and admits a chunk only when the gate admits its document's registry record — the
same predicate as every other path. The index is built once per org and rebuilt when the org's
chunks or documents change.

Why a scorer of its own: Qdrant's IDF lives in the store that failed, so the fallback needs an
in-process BM25. It is `BM25Okapi` (k1 1.5, b 0.75, IDF floor epsilon 0.25), whose ranking
``bench/fallback_eval.py`` measured and docs/RETRIEVAL.md reports; bm25s would be faster but
matches `BM25Okapi` only with epsilon 0, so switching would move those figures.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from core.models import Chunk, SearchHit
from sinks.gate import Gate
from sinks.registry import DocRecord, SqlRegistry
from tasks.query.bounds import CheckedQuery
from tasks.text.citations import cited_sources
from tasks.text.sparse import analyze

log = logging.getLogger(__name__)

FALLBACK_SCORE = "keyword_fallback"


@dataclass
class _OrgIndex:
    generation: tuple[int, str]
    entries: list[tuple[DocRecord, Chunk]]
    terms: list[frozenset[str]]  # each chunk's analysed terms
    bm25: Any  # rank_bm25.BM25Okapi, or None when the org has no chunks
    df: Counter[str] = field(default_factory=Counter)  # chunks holding each term


class KeywordFallback:
    """Per-process BM25 indexes over registry chunks, one per org."""

    def __init__(self) -> None:
        self._indexes: dict[str, _OrgIndex] = {}
        self._lock = threading.Lock()

    def search(
        self, query: str | CheckedQuery, gate: Gate, *, registry: SqlRegistry, top_k: int
    ) -> list[SearchHit]:
        """The ``top_k`` best chunks the gate admits, by BM25 over registry chunk texts (a
        `CheckedQuery` brings its terms, analysed when it was checked)."""
        index = self._index(gate.scope.org_id, registry)
        terms = list(query.terms) if isinstance(query, CheckedQuery) else analyze(query)
        if index.bm25 is None or not terms:
            return []
        scores = index.bm25.get_scores(terms)
        wanted = set(terms)
        # A chunk matches when it shares a term with the query (BM25 scores of terms common to
        # most chunks can be zero or negative, so the score alone cannot tell).
        matching = [i for i, own in enumerate(index.terms) if own & wanted]
        order = sorted(matching, key=lambda i: (-scores[i], i))
        hits: list[SearchHit] = []
        for i in order:
            if len(hits) == top_k:
                break
            doc, chunk = index.entries[i]
            if not gate.admits(doc.gate_record()):
                continue
            hits.append(_hit(doc, chunk, float(scores[i])))
        return hits

    def term_stats(self, org_id: str, registry: SqlRegistry) -> tuple[int, Counter[str]]:
        """The org's chunk count and, per analysed term, how many chunks hold it (for IDF)."""
        index = self._index(org_id, registry)
        return len(index.entries), index.df

    def _index(self, org_id: str, registry: SqlRegistry) -> _OrgIndex:
        generation = registry.chunks.chunk_generation(org_id)
        with self._lock:
            cached = self._indexes.get(org_id)
            if cached is not None and cached.generation == generation:
                return cached
            started = time.perf_counter()
            entries = registry.chunks.current_chunks(org_id)
            tokenized = [analyze(_indexed_text(d, c)) or ["\0"] for d, c in entries]
            bm25 = None
            if entries:
                from rank_bm25 import BM25Okapi

                bm25 = BM25Okapi(tokenized)
            terms = [frozenset(t) for t in tokenized]
            df: Counter[str] = Counter()
            for own in terms:
                df.update(own)
            index = _OrgIndex(generation, entries, terms, bm25, df)
            self._indexes[org_id] = index
            log.info(
                "keyword fallback index for %s: %d chunks in %.2fs",
                org_id,
                len(entries),
                time.perf_counter() - started,
            )
            return index


def _indexed_text(doc: DocRecord, chunk: Chunk) -> str:
    """What the fallback indexes: the same text the sparse vectors were built from."""
    return chunk.embed_text


def _hit(doc: DocRecord, chunk: Chunk, score: float) -> SearchHit:
    path = doc.collection_path
    return SearchHit(
        doc_id=doc.id,
        chunk_id=chunk.chunk_id,
        title=doc.title,
        uri=doc.uri,
        heading_path=list(chunk.heading_path),
        text=chunk.text,
        score=score,
        collection=path,
        scores={FALLBACK_SCORE: score},
        location=chunk.location,
        sources=cited_sources(chunk.text, doc.citations),
    )


_shared = KeywordFallback()


def shared_fallback() -> KeywordFallback:
    """The process-wide fallback (its indexes are worth keeping between queries)."""
    return _shared
