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
question's specific terms, which is what coverage catches.

That is ``support-v1`` (`support_scores_v1`). It separated question-form data worse (ROC AUC
0.649 on the question set). The answer path now gates on ``support-v2`` (`SUPPORT_V2`,
`support_scores`), fitted on the even halves of SciFact dev and of the question set
(bench/fit_support.py; held-out ROC AUC on SciFact 0.723 (v1 0.721), on the questions 0.740
(v1 0.638); docs/ANSWERS.md):

    0.7 × best-sentence cosine  +  0.3 × coverage  −  2 × dropped-word gain

* best-sentence cosine: MiniLM's cosine of the question with each sentence (and line) of the
  chunk, the best one: a chunk that answers in one sentence among unrelated ones is not diluted;
* coverage as above;
* dropped-word gain: how much closer the question comes to the chunk when one of its content
  words is left out (the most, over its words; 0 when none helps). A near-miss ("the price in
  2027", "delivery to Germany") matches the chunk better without the word the chunk lacks; a
  paraphrase loses by dropping any of its words.

It embeds the chunks, their sentences and the question less one word at a time (~55 texts per
question on the question set), shortest first in small batches: under a second per question on
a CPU from cold, milliseconds for texts seen before (a bounded per-process cache).
Recorded turns keep the confidence and threshold they were decided with; replay re-runs
synthesis on that recorded evidence and never re-derives support.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from core.models import SearchHit, SearchMode
from sinks.registry import SqlRegistry
from tasks.query.fallback import shared_fallback
from tasks.text.embed import Embedder
from tasks.text.sentences import split_sentences
from tasks.text.sparse import analyze, words
from tasks.text.values import asks_for_value, holds_value_for, is_question, value_kind

COSINE_WEIGHT = 0.5  # support-v1
_MIN_PREFIX = 4  # shorter stems are too ambiguous to match as prefixes
_MIN_UNIT_CHARS = 16  # a shorter sentence or line ("Price", "| a |") says too little alone
_EMBED_BATCH = 8  # texts embedded together (similar lengths: see `_VectorCache.get`)
MAX_DROPPED_WORDS = 16  # dropped-word variants embedded per question (`dropped_word_queries`)
_CACHED_VECTORS = 8192  # sentence / chunk / query vectors kept per process (~13 MB at 384-d)


@dataclass(frozen=True)
class SupportModel:
    """A support signal's version and weights (see the module docstring).

    Attributes:
        version: recorded with every answer and knowledge search that gated on it.
        sentence_cosine: weight ``a`` of the best-sentence cosine; coverage gets ``1 - a``.
        value_words: whether coverage counts a question's value words (`coverage`).
        dropped_word: weight ``d`` of the dropped-word gain (subtracted).
    """

    version: str
    sentence_cosine: float
    value_words: bool
    dropped_word: float


# Fitted by bench/fit_support.py on the even halves of both refusal sets: docs/ANSWERS.md.
SUPPORT_V2 = SupportModel("support-v2", sentence_cosine=0.7, value_words=True, dropped_word=2.0)
SUPPORT_VERSION = SUPPORT_V2.version


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


def support_scores_v1(
    query: str, query_vector: Sequence[float], hits: Sequence[SearchHit], embedder: Embedder,
    stats: TermStats, *, value_words: bool = True,
) -> list[float]:  # fmt: skip
    """``support-v1``: 0.5 × cosine + 0.5 × coverage of each hit, in hit order.

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


@dataclass(frozen=True)
class SupportParts:
    """What support-v2 combines for one hit (the module docstring); `bench/fit_support.py`
    fits the weights on these."""

    sentence_cosine: float
    coverage: float  # with value words
    coverage_plain: float  # without
    dropped_word_gain: float  # the most the cosine rises when a query word is left out

    def support(self, model: SupportModel = SUPPORT_V2) -> float:
        cover = self.coverage if model.value_words else self.coverage_plain
        a = model.sentence_cosine
        return (
            a * self.sentence_cosine
            + (1 - a) * cover
            - model.dropped_word * max(self.dropped_word_gain, 0.0)
        )


def support_scores(
    query: str, query_vector: Sequence[float], hits: Sequence[SearchHit], embedder: Embedder,
    stats: TermStats, *, model: SupportModel = SUPPORT_V2,
) -> list[float]:  # fmt: skip
    """The support of each hit for the query (``support-v2``, the module docstring), in hit
    order.

    Args:
        query: the question.
        query_vector: its embedding (unit length), from ``embedder``.
        hits: the gated hits.
        embedder: embeds the chunks, their sentences and the question less one word at a time
            (texts embedded before in this process are not embedded again).
        stats: term statistics of the corpus the hits come from.
        model: the weights; `SUPPORT_V2` unless comparing.

    Example:
        >>> support_scores("What is the price of Arctic Breakfast?", vector, hits,
        ...                embedder, TermStats.of_org("acme", registry))  # doctest: +SKIP
        [0.61, 0.38, ...]
    """
    parts = support_parts(query, query_vector, hits, embedder, stats)
    return [p.support(model) for p in parts]


def support_parts(
    query: str,
    query_vector: Sequence[float],
    hits: Sequence[SearchHit],
    embedder: Embedder,
    stats: TermStats,
) -> list[SupportParts]:
    """Each hit's `SupportParts`, in hit order (arguments as `support_scores`). All texts
    are embedded in one batch, less those the per-process cache holds."""
    if not hits:
        return []
    texts = [_embedded_text(h) for h in hits]
    units = [sentence_units(h.text) for h in hits]
    dropped = dropped_word_queries(query)
    vectors = _vectors(embedder, [*dropped, *texts, *(u for us in units for u in us)])
    out: list[SupportParts] = []
    for text, hit_units in zip(texts, units, strict=True):
        chunk = vectors[text]
        whole = _dot(query_vector, chunk)
        out.append(
            SupportParts(
                sentence_cosine=max(_dot(query_vector, vectors[u]) for u in hit_units),
                coverage=coverage(query, text, stats),
                coverage_plain=coverage(query, text, stats, value_words=False),
                dropped_word_gain=max((_dot(vectors[q], chunk) - whole for q in dropped),
                                      default=0.0),
            )
        )  # fmt: skip
    return out


def sentence_units(text: str) -> list[str]:
    """The sentences and lines of a chunk that say enough alone (at least 16 characters), each
    once, in order; the whole text when none does. Lines count too: a table row or a list item
    is one statement without a full stop."""
    sentences = [s for s in split_sentences(text) if len(s.strip()) >= _MIN_UNIT_CHARS]
    lines = [ln for ln in text.splitlines() if len(ln.strip()) >= _MIN_UNIT_CHARS]
    return list(dict.fromkeys([*sentences, *lines])) or [text]


def dropped_word_queries(query: str, limit: int = MAX_DROPPED_WORDS) -> list[str]:
    """The query once without each of its content words (a word the BM25 analyser keeps), in
    order: what the dropped-word gain compares the whole query with.

    At most ``limit`` variants (the first content words): each is one more text to embed, and a
    question's cost must not grow with its length (`tasks.query.bounds`). Questions have a few
    content words; the cap only bites on long ones.
    """
    said = query.split()
    kept = (i for i, word in enumerate(said) if analyze(word))
    return [" ".join(said[:i] + said[i + 1 :]) for i in itertools.islice(kept, limit)]


class _VectorCache:
    """The last few thousand vectors, by (model id, text): a chunk retrieved again, or a
    question asked again, is not embedded again."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._vectors: OrderedDict[tuple[str, str], tuple[float, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._vectors.clear()

    def get(self, embedder: Embedder, texts: Sequence[str]) -> dict[str, tuple[float, ...]]:
        model = embedder.model_id
        out: dict[str, tuple[float, ...]] = {}
        with self._lock:
            for text in texts:
                known = self._vectors.get((model, text))
                if known is not None:
                    self._vectors.move_to_end((model, text))
                    out[text] = known
        # Shortest first, a few at a time: a batch is padded to its longest text, and one
        # question's texts run from a four-word question to a 256-token chunk (one batch of
        # them all took ~3x as long on a CPU).
        missing = sorted((t for t in dict.fromkeys(texts) if t not in out), key=len)
        for start in range(0, len(missing), _EMBED_BATCH):
            batch = missing[start : start + _EMBED_BATCH]
            made = embedder.embed_documents(batch)
            with self._lock:
                for text, vector in zip(batch, made, strict=True):
                    out[text] = self._vectors[(model, text)] = tuple(vector)
        with self._lock:
            while len(self._vectors) > self.size:
                self._vectors.popitem(last=False)
        return out


_CACHE = _VectorCache(_CACHED_VECTORS)


def clear_vector_cache() -> None:
    """Forget the cached vectors (a benchmark timing support from cold)."""
    _CACHE.clear()


def _vectors(embedder: Embedder, texts: Sequence[str]) -> dict[str, tuple[float, ...]]:
    return _CACHE.get(embedder, texts)


def _embedded_text(hit: SearchHit) -> str:
    """The text a chunk's stored vector was built from (as `Chunk.embed_text`)."""
    if not hit.heading_path:
        return hit.text
    return " > ".join(hit.heading_path) + "\n" + hit.text


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return float(sum(x * y for x, y in zip(a, b, strict=True)))


QueryForm = Literal["question", "claim", "keywords"]
QUERY_FORMS: tuple[QueryForm, ...] = ("question", "claim", "keywords")
KEYWORD_MAX_WORDS = 8
"""A keyword query has at most this many words (split on whitespace: "e-bike" is one)."""
_SENTENCE_WORDS = frozenset(
    ("the", "a", "an", "is", "are", "was", "were", "be", "been", "has", "have", "had", "does",
     "do", "did", "will", "can", "could", "should", "would", "may", "might", "must")
)  # fmt: skip
"""Articles and auxiliaries: a text with one is a sentence, however short ("DUSP4
downregulation deactivates the Ras-ERK pathway"); keyword queries leave them out."""


def query_form(text: str) -> QueryForm:
    """The form of a query, which decides its refusal threshold (docs/ANSWERS.md, "Thresholds
    per query form").

    - ``question``: phrased as a question (`tasks.text.values.is_question`: it ends with "?" or
      opens with a question word): "What does the Meridian gravel bike sell for?".
    - ``keywords``: otherwise, when it reads as no sentence: no sentence-final punctuation
      (".", "!", ";"), at most `KEYWORD_MAX_WORDS` words, and no article or auxiliary
      ("Aurora e-bike price", "opening hours Rotterdam shop").
    - ``claim``: any other statement: "ALDH1 expression is associated with poorer prognosis."

    Example:
        >>> query_form("Aurora e-bike price")
        'keywords'
    """
    if is_question(text):
        return "question"
    stripped = text.strip()
    if (
        stripped.endswith((".", "!", ";"))
        or len(stripped.split()) > KEYWORD_MAX_WORDS
        or any(w in _SENTENCE_WORDS for w in words(stripped))
    ):
        return "claim"
    return "keywords"


def text_cosines(embedder: Embedder, query: str, texts: Sequence[str]) -> list[float]:
    """MiniLM cosine of ``query`` with each of ``texts`` (vectors from the per-process cache
    that support scoring fills, so a sentence scored there is not embedded again)."""
    if not texts:
        return []
    vectors = _vectors(embedder, [query, *texts])
    return [round(_dot(vectors[query], vectors[t]), 6) for t in texts]
