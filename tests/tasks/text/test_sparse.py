"""BM25 analysis and sparse vectors: the terms the keyword leg and the keyword baseline share."""

from __future__ import annotations

import itertools

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
