"""How much one agent request may ask: the bounds every search, ask and answer is held to.

An answer's cost grows with its question: support embeds the question once per content word it
leaves out (`tasks.answer.confidence`), so an unbounded question is unbounded work for one
caller, on the cores every other org's requests share. These bounds are checked before anything
is embedded, on every surface that takes an agent's text (the tools, ``ask``, ``answer``, their
HTTP routes and MCP tools, and the CLI commands that call them), with one message that names the
limit.

- `MAX_QUERY_CHARS`: characters in one query or question (the HTTP ``answer`` body's old cap).
  MiniLM reads 256 word pieces (~200 words), so a longer query adds cost, not meaning.
- `MAX_QUERY_TERMS`: content words (the BM25 analyser's terms) in one query.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.errors import ConfigError
from tasks.text.sparse import analyze

MAX_QUERY_CHARS = 2000
MAX_QUERY_TERMS = 64


class QueryTooLong(ConfigError):
    """A query or question is over one of the bounds (HTTP 422: the request is at fault)."""


def check_query(text: str, what: str = "query") -> None:
    """Refuse ``text`` over `MAX_QUERY_CHARS` characters or `MAX_QUERY_TERMS` content words.

    Args:
        text: the query or question.
        what: how the message names it ("query", "question", "queries[2]").

    Raises:
        QueryTooLong: naming the limit, the value and what to do.
    """
    if len(text) > MAX_QUERY_CHARS:
        raise QueryTooLong(
            f"{what} is {len(text):,} characters; the limit is {MAX_QUERY_CHARS:,} — ask for "
            "one thing at a time, in a sentence or two"
        )
    terms = len(analyze(text))
    if terms > MAX_QUERY_TERMS:
        raise QueryTooLong(
            f"{what} has {terms} content words; the limit is {MAX_QUERY_TERMS} — ask for one "
            "thing at a time, in a sentence or two"
        )


def check_queries(texts: Sequence[str], what: str = "queries") -> None:
    """`check_query` on each of several queries (``research_knowledge_search``'s)."""
    for i, text in enumerate(texts):
        check_query(text, f"{what}[{i}]")
