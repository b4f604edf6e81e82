"""BM25 analysis and sparse vectors: the one analyser every keyword path shares."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from core.models import SparseVec
from tasks.text.sparse import (
    BM25_AVG_LEN,
    BM25_B,
    BM25_K1,
    STOPWORDS,
    analyze,
    document_sparse_vector,
    query_sparse_vector,
    term_id,
    words,
)

PROPERTY = hsettings(max_examples=150, derandomize=True, database=None, deadline=None)


def filler(n: int) -> str:
    """``n`` distinct non-stop-word tokens that stem to themselves."""
    return " ".join(f"z{i}q" for i in range(n))


def weight_of(term: str, vector: SparseVec) -> float:
    return dict(zip(vector.indices, vector.values, strict=True))[term_id(term)]


# --- analysis ------------------------------------------------------------------------------


def test_analyze_lowercases_drops_stop_words_and_stems() -> None:
    assert analyze("The Policies are RUNNING quickly, and the dogs ran!") == [
        "polici",
        "run",
        "quick",
        "dog",
        "ran",
    ]


def test_analyze_splits_on_punctuation_and_underscores() -> None:
    assert analyze("e-mail re_use x.y 2024") == ["e", "mail", "re", "use", "x", "y", "2024"]


def test_analyze_keeps_non_ascii_letters() -> None:
    assert analyze("Café ÉCOLE") == ["café", "école"]


@pytest.mark.parametrize("text", ["", "   ", "the and of", "!!! ... ---", "__"])
def test_nothing_to_index(text: str) -> None:
    assert analyze(text) == []
    assert document_sparse_vector(text) == SparseVec([], [])
    assert query_sparse_vector(text) == SparseVec([], [])


def test_stop_words_are_lowercase_words() -> None:
    assert all(w == w.lower() and w.isalpha() for w in STOPWORDS)
    assert {"the", "and", "of", "is"} <= STOPWORDS


# --- term ids --------------------------------------------------------------------------------


def test_term_id_is_stable_and_31_bit() -> None:
    # A fixed value: ids are stored in the vector store, so they must not change between
    # processes, Python versions or hash seeds (crc32, not hash()).
    assert term_id("polici") == 1841960306
    assert term_id("run") == 1349952704
    assert term_id("polici") != term_id("run")


@PROPERTY
@given(term=st.text(max_size=40))
def test_term_id_range(term: str) -> None:
    assert 0 <= term_id(term) < 2**31
    assert term_id(term) == term_id(term)


# --- query vectors ---------------------------------------------------------------------------


def test_query_vector_is_unique_sorted_terms_with_weight_one() -> None:
    vec = query_sparse_vector("Policy policies POLICY leave leaving the")
    assert vec.indices == sorted({term_id("polici"), term_id("leav")})
    assert vec.values == [1.0, 1.0]


@PROPERTY
@given(text=st.text(max_size=200))
def test_query_vector_shape(text: str) -> None:
    vec = query_sparse_vector(text)
    assert vec.indices == sorted({term_id(t) for t in analyze(text)})
    assert all(v == 1.0 for v in vec.values)
    assert len(vec.values) == len(vec.indices)


# --- document vectors ------------------------------------------------------------------------


def test_document_weight_is_the_bm25_term_frequency_part() -> None:
    vec = document_sparse_vector("apple apple " + filler(8))
    norm = BM25_K1 * (1 - BM25_B + BM25_B * 10 / BM25_AVG_LEN)
    assert weight_of("appl", vec) == pytest.approx(2 * (BM25_K1 + 1) / (2 + norm))


def test_higher_term_frequency_weighs_more_but_saturates() -> None:
    length = 60  # every document has the same analysed length: only tf changes
    weights = [
        weight_of("appl", document_sparse_vector("apple " * tf + filler(length - tf)))
        for tf in range(1, length + 1)
    ]
    assert all(a < b for a, b in itertools.pairwise(weights))
    assert all(w < BM25_K1 + 1 for w in weights)
    gains = [b - a for a, b in itertools.pairwise(weights)]
    assert all(a > b for a, b in itertools.pairwise(gains)), "diminishing returns"


def test_longer_documents_weigh_the_same_tf_less() -> None:
    weights = [
        weight_of("appl", document_sparse_vector("apple apple " + filler(extra)))
        for extra in (0, 10, 100, 1000)
    ]
    assert all(a > b for a, b in itertools.pairwise(weights))


def test_word_order_and_case_do_not_matter() -> None:
    assert document_sparse_vector("Leave policy. POLICY leave!") == document_sparse_vector(
        "policy leave policy leave"
    )


@PROPERTY
@given(text=st.text(alphabet=st.sampled_from("abcde ABC.,\n"), max_size=300))
def test_document_vector_shape(text: str) -> None:
    vec = document_sparse_vector(text)
    assert vec.indices == sorted(set(vec.indices))
    assert set(vec.indices) == {term_id(t) for t in analyze(text)}
    assert all(0 < v < BM25_K1 + 1 for v in vec.values)


# --- one analyser on every keyword path ------------------------------------------------------

# Tricky text, and the terms every path must see in it: accents kept, curly and straight
# apostrophes split, hyphens and thousands separators split, numbers kept as terms.
TRICKY: dict[str, list[str]] = {
    "Café Société’s crème brûlée": ["café", "société", "s", "crème", "brûlée"],
    "COVID-19 follow-up in 2-year-olds": ["covid", "19", "follow", "2", "year", "old"],
    "1,450 patients; 3.5 mg/kg": ["1", "450", "patient", "3", "5", "mg", "kg"],
    "Alzheimer's patients don't": ["alzheim", "s", "patient", "don", "t"],
    "NAÏVE Zürich résumé": ["naïv", "zürich", "résumé"],
}


def ids(terms: Any) -> set[int]:
    return {term_id(t) for t in terms}


@pytest.mark.parametrize(("text", "terms"), TRICKY.items())
def test_the_analyser_on_tricky_text(text: str, terms: list[str]) -> None:
    assert analyze(text) == terms
    assert analyze(text.upper()) == analyze(text.lower()) == terms


@pytest.mark.parametrize("text", TRICKY)
def test_every_path_analyses_a_query_the_same_way(text: str) -> None:
    from tasks.answer.confidence import query_terms

    terms = analyze(text)
    # The Qdrant legs (keyword, hybrid, the retrieval evals), for queries and documents:
    assert set(query_sparse_vector(text).indices) == ids(terms)
    assert set(document_sparse_vector(text).indices) == ids(terms)
    assert query_terms(text) == list(dict.fromkeys(terms))  # the answer confidence


def test_the_confidence_skips_the_word_after_how_as_the_analyser_splits_it() -> None:
    from tasks.answer.confidence import query_terms

    assert analyze("How many patients? how-long visits") == ["mani", "patient", "long", "visit"]
    assert query_terms("How many patients? how-long visits") == ["patient", "visit"]
    assert words("How-long, 1,450") == ["how", "long", "1", "450"]


def test_the_stored_vectors_and_the_fallback_index_hold_the_same_terms(
    edge_store: Any, registry: Any, embedder: Any
) -> None:
    from core.models import Scope, SearchMode
    from sinks.gate import build_gate
    from tasks.answer.confidence import TermStats, coverage
    from tasks.query.fallback import KeywordFallback
    from tasks.query.retrieve import search
    from tests.conftest import index_records

    kw = {"store": edge_store, "registry": registry, "embedder": embedder}
    records = [{"key": f"r{i}", "title": "Record", "text": t} for i, t in enumerate(TRICKY)]
    doc_ids = dict(zip(TRICKY, index_records(records, **kw), strict=True))
    chunks = {c.chunk_id: c.embed_text for _, c in registry.chunks.current_chunks("acme")}
    stored = {p.payload["chunk_id"]: set(p.sparse.indices) for p in edge_store.export_points()}
    assert stored == {cid: ids(analyze(t)) for cid, t in chunks.items()}  # Qdrant's terms
    fallback = KeywordFallback()
    n, df = fallback.term_stats("acme", registry)  # the fallback's (and confidence's) terms
    assert n == len(chunks) and df == sum(
        (Counter(set(analyze(t))) for t in chunks.values()), Counter()
    )

    # The query side: both keyword engines put the record first, and its text covers every
    # term of the query.
    gate = build_gate(Scope("acme"))
    for text, wanted in doc_ids.items():
        qdrant = search(text, Scope("acme"), mode=SearchMode.KEYWORD, top_k=2, **kw)
        rank = fallback.search(text, gate, registry=registry, top_k=2)
        assert qdrant[0].doc_id == rank[0].doc_id == wanted, text
        assert coverage(text, chunks[rank[0].chunk_id], TermStats(n, df)) == 1.0
