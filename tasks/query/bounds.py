"""How much one agent request may ask, and the one check of a query: `check_query`.

An answer's cost grows with its question: support embeds the question once per content word it
leaves out (`tasks.answer.confidence`), so an unbounded question is unbounded work for one
caller, on the cores every other org's requests share. These bounds are checked before anything
is embedded, on every surface that takes an agent's text (the tools, ``ask``, ``answer``, their
HTTP routes and MCP tools, and the CLI commands that call them), with one message that names the
limit.

- `MAX_QUERY_CHARS`: characters in one query or question (the HTTP ``answer`` body's old cap).
  MiniLM reads 256 word pieces (~200 words), so a longer query adds cost, not meaning.
- `MAX_QUERY_TERMS`: content words (the BM25 analyser's terms) in one query.

A search's query is checked once, where it comes in (the ``search_knowledge_base`` tool for the
HTTP route, MCP and ``kbflow tools call``; `kbflow.services.query.search.search` for ``kbflow
search``), by `check_query`. What that one check learns travels with the text as a
`CheckedQuery`: its BM25 terms (analysed once: the bound counts them and the keyword legs use
them) and whether retrieval must refuse it. The layers below take the `CheckedQuery` as it is.

An ``ask``'s queries and an ``answer``'s question are checked once too, by the service every
surface calls (`kbflow.services.query.answers`: ``kbflow ask`` / ``answer``, their HTTP routes
and MCP tools); the turn (`tasks.answer`) strips it (`turn_query`: the same terms) and hands the
`CheckedQuery` to retrieval, which checks and analyses nothing again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from core.errors import ConfigError
from tasks.text.sparse import analyze

MAX_QUERY_CHARS = 2000
MAX_QUERY_TERMS = 64

EMPTY_QUERY = "The query is empty. Ask a question or give some keywords."

_MADE_HERE = object()  # only this module's makers can build a CheckedQuery


class QueryTooLong(ConfigError):
    """A query or question is over one of the bounds (HTTP 422: the request is at fault)."""


@dataclass(frozen=True)
class CheckedQuery:
    """A query as its one check left it: made by `check_query` (or `unbounded_query`), never
    by hand, so a layer that takes one knows it was checked and does not check it again.

    Attributes:
        text: the query as it was given (a search never normalised it: the dense leg embeds it
            and the output echoes it as it came).
        terms: its BM25 terms (`tasks.text.sparse.analyze`), analysed once.
        refusal: why retrieval refuses it (not UTF-8 text, or blank), or None. Decided by the
            check, raised where retrieval starts (`tasks.query.retrieve`): the errors that came
            before it there (an unknown agent, a collection it may not read) still come first,
            and a knowledge base that is off still answers with its note.
    """

    text: str
    terms: tuple[str, ...]
    refusal: str | None = None
    _made: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._made is not _MADE_HERE:
            raise TypeError("a CheckedQuery is made by tasks.query.bounds.check_query only")

    def searchable(self) -> CheckedQuery:
        """This query, if retrieval may run it; else the ConfigError the check decided on."""
        if self.refusal is not None:
            raise ConfigError(self.refusal)
        return self

    def stripped(self) -> CheckedQuery:
        """This query with the whitespace around it stripped (an answer's turn asks, records and
        retrieves its question stripped), with the same terms and refusal, not checked again.

        Stripping changes no term: the analyser's words are runs of letters and digits, which
        no whitespace character is part of, so whitespace only ever separates them; nor does it
        change whether it is refused (a blank text stays blank, and stripping removes no lone
        surrogate); the refusal is kept as the check worded it (a surrogate's position is the
        unstripped text's).
        """
        return CheckedQuery(self.text.strip(), self.terms, self.refusal, _MADE_HERE)


def check_query(text: str, what: str = "query") -> CheckedQuery:
    """The one check of an agent's query: refuse ``text`` over `MAX_QUERY_CHARS` characters or
    `MAX_QUERY_TERMS` content words; else the `CheckedQuery` every layer below takes.

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
    terms = tuple(analyze(text))
    if len(terms) > MAX_QUERY_TERMS:
        raise QueryTooLong(
            f"{what} has {len(terms)} content words; the limit is {MAX_QUERY_TERMS} — ask for "
            "one thing at a time, in a sentence or two"
        )
    return CheckedQuery(text, terms, _refusal(text), _MADE_HERE)


def check_queries(texts: Sequence[str], what: str = "queries") -> list[CheckedQuery]:
    """`check_query` on each of several queries (``research_knowledge_search``'s)."""
    return [check_query(text, f"{what}[{i}]") for i, text in enumerate(texts)]


def turn_query(query: str | CheckedQuery, what: str) -> str | CheckedQuery:
    """A question or query as an answer's turn takes it: stripped of the whitespace around it.

    A `CheckedQuery` the check found nothing against comes from the service's edge
    (`kbflow.services.query.answers`): it is stripped (`CheckedQuery.stripped`) and not checked
    again. Anything else (a plain string from an eval, a replay, a test; or a query the check
    will refuse) is checked as the turn always checked it: UTF-8 text (`require_text`, naming
    ``what``), then stripped; blank comes back as "" for the turn to refuse in its own words.

    Raises:
        ConfigError: not text, or not UTF-8 (naming ``what``).
    """
    if isinstance(query, CheckedQuery) and query.refusal is None:
        return query.stripped()
    text = query.text if isinstance(query, CheckedQuery) else query
    return require_text(text, what).strip()


def query_text(query: str | CheckedQuery) -> str:
    """The text of a query, plain or checked."""
    return query.text if isinstance(query, CheckedQuery) else query


def unbounded_query(text: object) -> CheckedQuery:
    """``text`` as a `CheckedQuery` for a caller that did not come through an agent's edge (an
    eval, a bench, the demo, a test calling `tasks.query.retrieve` with a plain string): text,
    UTF-8 and not blank, as retrieval always required, but not the agents' bounds.

    Raises:
        ConfigError: ``text`` is not text, not UTF-8, or blank.
    """
    checked = require_text(text, "The query")
    if not checked.strip():
        raise ConfigError(EMPTY_QUERY)
    return CheckedQuery(checked, tuple(analyze(checked)), None, _MADE_HERE)


def require_text(value: object, what: str) -> str:
    """``value`` if it is text that can be encoded as UTF-8, else ConfigError naming ``what``:
    a lone surrogate (bytes that were not UTF-8 on a command line, or a bad JSON escape) is the
    caller's error, not something to hand to a model or an engine."""
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be text. Currently it is {type(value).__name__}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(_not_unicode(what, exc.start)) from None
    return value


def _not_unicode(what: str, position: int) -> str:
    return (
        f"{what} is not valid Unicode text (a lone surrogate at position {position}, e.g. "
        "from bytes that are not UTF-8). Send UTF-8 text."
    )


def _refusal(text: str) -> str | None:
    """What retrieval would refuse ``text`` with (`unbounded_query`'s checks), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return _not_unicode("The query", exc.start)
    return None if text.strip() else EMPTY_QUERY
