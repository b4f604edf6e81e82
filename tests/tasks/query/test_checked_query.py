"""A query is checked once (`tasks.query.bounds.check_query`, issue 43), and what that check
learnt travels with it as a `CheckedQuery`: retrieval takes it as it is, and refuses it exactly
as it refuses the same text given as a plain string."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest

from core.errors import ConfigError
from core.models import Scope, SearchMode
from sinks.gate import build_gate
from tasks.query.bounds import (
    CheckedQuery,
    QueryTooLong,
    check_query,
    turn_query,
    unbounded_query,
)
from tasks.query.fallback import KeywordFallback
from tasks.query.retrieve import retrieve, search
from tasks.text.sparse import analyze, query_sparse_vector, terms_sparse_vector, words
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


# Every character ``str.strip()`` strips: the whitespace ones.
WHITESPACE = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())


def test_stripping_whitespace_changes_no_bm25_term() -> None:
    """What `CheckedQuery.stripped` rests on: no whitespace character is part of an analyser
    word, so whitespace around a text (or inside it) only separates words."""
    assert len(WHITESPACE) > 20 and not words(WHITESPACE)
    for text in ("How many DAYS of annual leave?", "Zephyr launch-date 2025", "café_au_lait"):
        for ws in WHITESPACE:
            padded = f"{ws}{ws}{text}{ws}"
            assert padded.strip() == text
            assert analyze(padded) == analyze(text), repr(ws)
        assert analyze(WHITESPACE + text + WHITESPACE) == analyze(text)


def test_a_stripped_checked_query_keeps_its_terms_and_refusal() -> None:
    padded = "\t How many DAYS of annual leave? \n"
    checked = check_query(padded, "question")
    stripped = checked.stripped()
    assert isinstance(stripped, CheckedQuery)
    assert stripped.text == padded.strip()
    assert stripped.terms == checked.terms == tuple(analyze(padded.strip()))
    assert stripped.refusal is None
    blank = check_query(" \n ").stripped()
    assert blank.text == "" and blank.refusal == check_query(" \n ").refusal is not None


def test_a_turn_takes_a_checked_query_as_it_is_and_checks_plain_text_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tasks.query import bounds

    checked = check_query("  How many days of leave? ")
    # a query the check passed is stripped, not checked or analysed again
    monkeypatch.setattr(bounds, "require_text", _never)
    monkeypatch.setattr(bounds, "analyze", _never)
    taken = turn_query(checked, "The question")
    assert isinstance(taken, CheckedQuery)
    assert (taken.text, taken.terms) == ("How many days of leave?", checked.terms)
    monkeypatch.undo()
    # plain text, and a query the check refused, meet the turn's own checks, in its own words
    assert turn_query("  How many days of leave? ", "The question") == "How many days of leave?"
    assert turn_query(" \t", "Query 2") == turn_query(check_query(" \t"), "Query 2") == ""
    for text in (" a\udcffb", check_query(" a\udcffb")):
        with pytest.raises(ConfigError, match=r"^Query 2 is not valid .* at position 2"):
            turn_query(text, "Query 2")
    with pytest.raises(ConfigError, match=r"^The question must be text\. Currently it is int"):
        turn_query(3, "The question")  # type: ignore[arg-type]


def _never(*args: Any) -> Any:
    raise AssertionError(f"called again with {args!r}")
