"""BM25 text analysis shared by the sparse vector leg and the keyword baseline.

One tokenizer (lowercase, word characters, English stop words, Snowball stemming) feeds both the
BM25 sparse vectors stored in Qdrant (IDF is applied inside Qdrant by the ``Idf`` modifier) and
the ``bm25s`` keyword baseline used by the evals, so the two keyword engines see the same terms.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from functools import cache

from core.models import SparseVec

BM25_K1 = 1.2
BM25_B = 0.75
# Qdrant stores per-document term weights, so the length normalisation needs a fixed average
# document length; 150 analysed tokens is typical for a chunk capped at ~180 words.
BM25_AVG_LEN = 150.0

_TOKEN_RE = re.compile(r"[^\W_]+", re.UNICODE)

# A compact English stop-word list (articles, pronouns, auxiliaries, prepositions).
STOPWORDS: frozenset[str] = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself
    yourselves""".split()  # noqa: SIM905 - readable as prose
)


@cache
def _stemmer() -> object:
    import Stemmer  # PyStemmer

    return Stemmer.Stemmer("english")


def analyze(text: str) -> list[str]:
    """Text -> BM25 terms: lowercase words, stop words removed, Snowball-stemmed."""
    words = [w for w in _TOKEN_RE.findall(text.lower()) if w not in STOPWORDS]
    return list(_stemmer().stemWords(words))  # type: ignore[attr-defined]


def term_id(term: str) -> int:
    """Stable 31-bit id of a term (the sparse vector's dimension)."""
    return zlib.crc32(term.encode("utf-8")) & 0x7FFFFFFF


def _sparse(weights: dict[int, float]) -> SparseVec:
    items = sorted(weights.items())
    return SparseVec(indices=[i for i, _ in items], values=[v for _, v in items])


def document_sparse_vector(text: str) -> SparseVec:
    """BM25 term-frequency weights of a document; Qdrant multiplies in the IDF."""
    terms = analyze(text)
    if not terms:
        return SparseVec([], [])
    norm = BM25_K1 * (1 - BM25_B + BM25_B * len(terms) / BM25_AVG_LEN)
    weights: dict[int, float] = {}
    for term, tf in Counter(terms).items():
        tid = term_id(term)
        weights[tid] = weights.get(tid, 0.0) + tf * (BM25_K1 + 1) / (tf + norm)
    return _sparse(weights)


def query_sparse_vector(text: str) -> SparseVec:
    """A query's terms, each with weight 1 (repeats ignored, as in classic BM25 ranking)."""
    return _sparse({term_id(t): 1.0 for t in analyze(text)})
