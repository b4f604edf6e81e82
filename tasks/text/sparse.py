"""The one BM25 analyser, and the sparse vectors built with it.

`analyze` (lowercase, split into runs of letters and digits, English stop words out, Snowball
stems) is the only way kbflow turns text into BM25 terms, for documents and queries alike, so a
query matches the same words on every keyword path:

* the sparse vectors stored in Qdrant (`document_sparse_vector`, `query_sparse_vector`; Qdrant
  applies the IDF through the ``Idf`` modifier): the ``keyword`` and ``hybrid`` modes and the
  retrieval evals;
* the keyword fallback over the registry's chunk texts (`tasks.query.fallback`, rank-bm25);
* the term coverage of the answer confidence (`tasks.answer.confidence`);
* the bm25s run the metric tests rank SciFact with (``tests/evals/test_metrics.py``).

Each path keeps its own scorer (see its module for why); only the terms are shared, and
``tests/tasks/text/test_sparse.py`` checks that every path sees the same terms on tricky text.

The terms' ids are stored in Qdrant: a change to `analyze` needs a re-index, so bump
``ANALYZER_VERSION`` with it (the eval indexes are keyed on it).
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Iterable
from functools import cache

from core.models import SparseVec

ANALYZER_VERSION = 1  # bump with any change to what `analyze` returns (see the docstring)
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


def words(text: str) -> list[str]:
    """Text -> its lower-cased words, before stop words and stemming: runs of letters and digits.

    Anything else splits words: "COVID-19" -> covid, 19; "1,450" -> 1, 450; "don't" -> don, t.
    Accents are kept ("café" is not "cafe").
    """
    return _TOKEN_RE.findall(text.lower())


def analyze(text: str) -> list[str]:
    """Text -> BM25 terms: its `words`, stop words removed, Snowball-stemmed, in text order."""
    kept = [w for w in words(text) if w not in STOPWORDS]
    return list(_stemmer().stemWords(kept))  # type: ignore[attr-defined]


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
    return terms_sparse_vector(analyze(text))


def terms_sparse_vector(terms: Iterable[str]) -> SparseVec:
    """`query_sparse_vector` of a query already analysed (`tasks.query.bounds.CheckedQuery`)."""
    return _sparse({term_id(t): 1.0 for t in terms})
