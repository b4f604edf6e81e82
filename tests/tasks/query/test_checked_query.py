"""A query is checked once (`tasks.query.bounds.check_query`, issue 43), and what that check
learnt travels with it as a `CheckedQuery`: retrieval takes it as it is, and refuses it exactly
as it refuses the same text given as a plain string."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from core.errors import ConfigError
from core.models import Scope, SearchMode
from sinks.gate import build_gate
from tasks.query.bounds import CheckedQuery, QueryTooLong, check_query, unbounded_query
from tasks.query.fallback import KeywordFallback
from tasks.query.retrieve import retrieve, search
from tasks.text.sparse import analyze, query_sparse_vector, terms_sparse_vector
from tests.tasks.conftest import TOPIC


class NoStore:
    """A vector store that must not be reached."""

    def query(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the store was queried")


def test_a_checked_query_carries_its_text_and_terms_and_is_made_by_the_check_only() -> None:
    text = "  How many DAYS of annual leave? "
    checked = check_query(text)
    assert checked.text == text  # a search never normalised its query
    assert checked.terms == tuple(analyze(text))
    assert checked.refusal is None
    assert terms_sparse_vector(checked.terms) == query_sparse_vector(text)
    with pytest.raises(TypeError, match="check_query"):
        CheckedQuery(text, checked.terms)
    with pytest.raises(dataclasses.FrozenInstanceError):
        checked.text = "other"  # type: ignore[misc]


def test_the_bounds_are_the_checks_own() -> None:
    with pytest.raises(QueryTooLong, match="question is 2,001 characters"):
        check_query("x" * 2001, "question")
    with pytest.raises(QueryTooLong, match="query has 65 content words; the limit is 64"):
        check_query(" ".join(f"word{i}" for i in range(65)))
    # unbounded: what a caller that went round the edge gets, as retrieval always checked it
    assert unbounded_query("x" * 2001).terms == ("x" * 2001,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("   ", "The query is empty. Ask a question or give some keywords."),
        ("a\udcffb", "The query is not valid Unicode text (a lone surrogate at position 1"),
    ],
)
def test_retrieval_refuses_a_checked_query_as_it_refuses_the_plain_text(
    registry: Any, embedder: Any, text: str, message: str
) -> None:
    """The check decides; retrieval raises where it always did (after top_k, before paused)."""
    checked = check_query(text)
    assert checked.refusal is not None and checked.refusal.startswith(message)
    kw: dict[str, Any] = {"store": NoStore(), "registry": registry, "embedder": embedder}
    for query in (text, checked):
        for run in (retrieve, search):
            with pytest.raises(ConfigError) as refused:
                run(query, Scope("acme"), **kw)
            assert str(refused.value).startswith(message)
        with pytest.raises(ConfigError, match="top_k must be greater than 0"):
            retrieve(query, Scope("acme"), top_k=0, **kw)
        with pytest.raises(ConfigError, match=r"empty|Unicode"):
            retrieve(query, Scope("acme"), paused=True, **kw)


def test_a_checked_query_finds_what_its_text_finds(
    world: dict[str, str], edge_store: Any, registry: Any, embedder: Any
) -> None:
    kw = {"store": edge_store, "registry": registry, "embedder": embedder, "top_k": 50}
    checked = check_query(TOPIC)
    for mode in SearchMode:
        plain = retrieve(TOPIC, Scope("acme"), mode=mode, **kw)
        assert retrieve(checked, Scope("acme"), mode=mode, **kw) == plain, mode
    fallback = KeywordFallback()
    gate = build_gate(Scope("acme"))
    plain_hits = fallback.search(TOPIC, gate, registry=registry, top_k=50)
    assert plain_hits and fallback.search(checked, gate, registry=registry, top_k=50) == plain_hits
