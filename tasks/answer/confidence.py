"""How well a retrieved chunk supports a question: the signal "no chunk, no answer" gates on.

The fused retrieval score ranks chunks within one query but means nothing across queries (it is
min-max normalised per query), so refusal needs a signal on a fixed scale. Support is

    0.5 × cosine(question, chunk)  +  0.5 × IDF-weighted share of the question's terms in the chunk

* the cosine is MiniLM's (the dense leg's raw score when retrieval kept it, else computed);
* the coverage uses the BM25 analyser (lower case, stop words out, Snowball stems) and IDF
  ``log((N + 1) / (df + 0.5))`` over the org's chunks, so a question's rare, specific terms
  (an entity, a product name) weigh most. A term also counts when a chunk word extends its
  stem or the other way round ("weigh" / "weight"); the word after "how" ("how much",
  "how long") is left out, since the answer states a quantity, not that word; and in a question,
  a word that asks for a kind of value ("price", "phone", "weigh") counts when the chunk holds
  a value of that kind ("14.50 EUR", "+32 9 …", "9.4 kg"; `tasks.text.values`).

Measured on SciFact dev (bench/refusal_calibration.py, docs/ANSWERS.md): cosine alone separates
answerable from unanswerable claims with ROC AUC ≈ 0.65; coverage alone ≈ 0.70; the sum ≈ 0.71,
for about a millisecond per query. A near-topic passage scores a high cosine but lacks the
question's specific terms, which is what coverage catches. Sentence-level embeddings gained
nothing on top of this at ~0.5 s per query on a CPU.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from core.models import SearchHit, SearchMode
from sinks.registry import SqlRegistry
from tasks.query.fallback import shared_fallback
from tasks.text.embed import Embedder
from tasks.text.sparse import analyze, words
from tasks.text.values import asks_for_value, holds_value_for, is_question, value_kind

COSINE_WEIGHT = 0.5
_MIN_PREFIX = 4  # shorter stems are too ambiguous to match as prefixes


@dataclass(frozen=True)
class TermStats:
    """Document frequencies over a corpus of chunks (``n`` chunks)."""

    n: int
    df: Counter[str]

    def idf(self, term: str) -> float:
        return math.log((self.n + 1) / (self.df.get(term, 0) + 0.5))

    @classmethod
    def of_org(cls, org_id: str, registry: SqlRegistry) -> TermStats:
        """The org's term statistics, from the registry's chunk texts (cached per process and
        rebuilt when the org's chunks change, with the keyword fallback's index)."""
        n, df = shared_fallback().term_stats(org_id, registry)
        return cls(n, df)


def query_terms(query: str, *, value_words: bool = True) -> list[str]:
    """The query's distinct BM25 terms (`analyze`, the keyword legs' analyser), in order, less
    the word after "how".

    "how much / many / long / quickly …": that word asks for a quantity or manner, and the
    answer states the quantity ("9.4 kg", "48 hours"), not the word. It is found among the
    analyser's own `words`, so it is the same term the query's analysis holds. A word that
    asks for a kind of value ("how heavy") stays: `coverage` counts it when the text holds a
    mass.
    """
    said = words(query)
    values = value_words and is_question(query)
    asked = {
        term
        for before, word in itertools.pairwise(said)
        if before == "how" and word.isalpha()
        for term in analyze(word)
        if not (values and asks_for_value(term))  # "how heavy": a mass answers it
    }
    return [t for t in dict.fromkeys(analyze(query)) if t not in asked]


def coverage(query: str, text: str, stats: TermStats, *, value_words: bool = True) -> float:
    """The IDF-weighted share of the query's distinct terms that ``text`` contains (0..1).

    With ``value_words`` (the default), a question's words that ask for a kind of value count
    when ``text`` holds such a value; off, every term is matched as a word (for comparison).
    """
    terms = query_terms(query, value_words=value_words)
    if not terms:
        return 0.0
    asked = value_words and is_question(query)
    # In a question, the words that ask for one kind of value ("phone number", "cost … price")
    # are one ask: weighed once (their heaviest), covered by the word or by one such value.
    asks: dict[object, tuple[float, list[str]]] = {}
    for term in terms:
        weight = max(stats.idf(term), 0.0)
        kind = value_kind(term) if asked else None
        key: object = term if kind is None else ("value", kind)
        best, members = asks.get(key, (0.0, []))
        asks[key] = (max(best, weight), [*members, term])
    total = sum(weight for weight, _ in asks.values())
    if total <= 0:
        return 0.0
    present = set(analyze(text))
    covered = sum(
        weight
        for weight, members in asks.values()
        if any(_holds(t, present) for t in members)
        or (asked and any(holds_value_for(t, text) for t in members))
    )
    return covered / total


def _holds(term: str, present: set[str]) -> bool:
    """The term, or a word sharing its stem as a prefix ("weigh" / "weight"), is present."""
    if term in present:
        return True
    if len(term) < _MIN_PREFIX:
        return False
    return any(
        len(word) >= _MIN_PREFIX and (word.startswith(term) or term.startswith(word))
        for word in present
    )


def support_scores(
    query: str,
    query_vector: Sequence[float],
    hits: Sequence[SearchHit],
    embedder: Embedder,
    stats: TermStats,
    *,
    value_words: bool = True,
) -> list[float]:
    """The support of each hit for the query (see the module docstring), in hit order.

    Args:
        query: the question.
        query_vector: its embedding (unit length), from ``embedder``.
        hits: the gated hits; a hit's raw dense cosine is used when retrieval kept it.
        embedder: embeds the hits that carry no dense score (fallback, RRF, keyword-only).
        stats: term statistics of the corpus the hits come from.
        value_words: see `coverage`.
    """
    dense_key = SearchMode.DENSE.value
    missing = [i for i, h in enumerate(hits) if dense_key not in h.scores]
    computed = embedder.embed_documents([_embedded_text(hits[i]) for i in missing])
    cosines = {i: _dot(query_vector, v) for i, v in zip(missing, computed, strict=True)}
    out: list[float] = []
    for i, hit in enumerate(hits):
        cosine = cosines[i] if i in cosines else float(hit.scores[dense_key])
        cover = coverage(query, _embedded_text(hit), stats, value_words=value_words)
        out.append(COSINE_WEIGHT * cosine + (1 - COSINE_WEIGHT) * cover)
    return out


def _embedded_text(hit: SearchHit) -> str:
    """The text a chunk's stored vector was built from (as `Chunk.embed_text`)."""
    if not hit.heading_path:
        return hit.text
    return " > ".join(hit.heading_path) + "\n" + hit.text


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return float(sum(x * y for x, y in zip(a, b, strict=True)))
