"""Does a quote hold the answer? The check that decides "answered" or "maybe".

An answer is "answered" only when the exact text it quotes holds what the question asks for:

- a **value question** (a price, a total, a date, a phone number, a share, a count …) needs a
  value of the asked kind in the quote (`asked_kinds`);
- a quote that is only a table's **header row** holds no value at all;
- a **superlative** ("highest", "cheapest", "most") is either stated by the quote itself
  ("the world's smallest breed") or computed over a table's rows (`table_answer`); a row picked
  by word overlap is never claimed to be the highest;
- a question that names a **row and a column** of a table is answered with that cell, its row
  and its column header (`table_answer`), and a column the question names only in part ("date
  of birth" against "Subscription Date") is missing unless its other words are in the chunk.

Otherwise the answer is "maybe": the best evidence, and `Verdict.missing` saying what the quote
lacks. Pure and deterministic: a replay re-runs it on the recorded evidence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tasks.answer.asks import (
    KIND_NAMES,
    LEAST_EXPENSIVE,
    MOST_EXPENSIVE,
    NUMBER,
    QUESTION_WORDS,
    SUPERLATIVES,
    Ask,
    ask_of,
    holds_kind,
)
from tasks.answer.contract import Claim
from tasks.answer.quotes import Table, TableRow, header_lines, is_header_only, is_heading, tables
from tasks.answer.table_answers import table_answer
from tasks.text.sparse import analyze, words

__all__ = ["Ask", "Judgement", "Verdict", "ask_of", "check", "holds_kind", "judge"]


def _name_words(text: str) -> set[str]:
    """Words and their stems ("Thursdays" names "Thursday")."""
    said = words(text)
    return set(said) | set(analyze(" ".join(said)))


def _known_terms(chunk: str, title: str) -> set[str]:
    """The analysed terms of a chunk and its document's title: what the passage mentions."""
    return set(analyze(chunk)) | set(analyze(title))


def _labels(chunk: str) -> str:
    """What labels a chunk's text: its headings, heading-like lines and table headers."""
    lines = [ln.strip().lstrip("#").strip() for ln in chunk.splitlines()]
    heads = [ln for ln in lines if ln and is_heading(ln)]
    heads += [" ".join(t.header) for t in tables(chunk)]
    heads += [m.group(1) for m in re.finditer(r"^#{1,6}\s+(.+)$", chunk, re.M)]
    return "\n".join(heads)


@dataclass(frozen=True)
class Verdict:
    """The support check's finding on one quote: ``ok``, or what is ``missing``."""

    ok: bool
    missing: str | None = None


def check(ask: Ask, quote: str, chunk: str, *, computed: bool = False, title: str = "") -> Verdict:
    """Whether ``quote`` (exact text of ``chunk``) holds the answer to ``ask``.

    Args:
        computed: the quote is a superlative computed over a table's rows (`table_answer`).
        title: the chunk's document title (a question's words may be there, not in the chunk).
    """
    if not quote.strip():
        return Verdict(False, "the answer quotes nothing")
    flat = " ".join(chunk.split())
    if any(" ".join(ln.split()) not in flat for ln in quote.splitlines() if ln.strip()):
        return Verdict(False, "the quote is not in the cited passage")
    if is_header_only(quote, chunk):
        return Verdict(False, "the quote is a table's header row, which holds no value")
    body = _rows_only(quote, chunk)
    if ask.kinds and not any(holds_kind(k, body, ask.question) for k in ask.kinds):
        wanted = " or ".join(sorted(KIND_NAMES[k] for k in ask.kinds))
        return Verdict(False, f"the quoted text states no {wanted}")
    if ask.extreme and not computed and not _states_superlative(ask, quote):
        return Verdict(
            False,
            f"the question asks for the {ask.superlative} and the quote does not compare "
            "(no table to compute it over)",
        )
    named = _name_words(f"{quote}\n{title}\n{_labels(chunk)}")
    absent = [" ".join(g) for g in ask.name_groups if not any(w in named for w in g)]
    if absent:
        return Verdict(False, f"the quote never names {', '.join(absent)!r}")
    if computed:
        return Verdict(True)
    is_row = any(ln.strip().startswith("|") for ln in quote.splitlines())
    missing = (
        _unnamed_attribute(ask, quote, chunk, title)
        or (None if is_row else _uncounted(ask, quote))
        or (_unnamed_column(ask, quote, chunk, title) if is_row else _untied(ask, chunk, title))
        or _unacted(ask, quote, title)
        or (None if is_row else _unmentioned(ask, chunk, title))
    )
    return Verdict(False, missing) if missing else Verdict(True)


_AUX = (
    "is are was were do does did can could will would should has have had may might must "
    "the a an of in on for to at by from with"
)
_ATTRIBUTE = re.compile(
    rf"^\s*(?:what|which)\s+((?:(?!(?:{'|'.join(_AUX.split())})\b)[\w-]+\s+){{1,3}})", re.I
)
_COUNTED = re.compile(
    rf"\bhow many\s+((?:(?!(?:{'|'.join(_AUX.split())})\b)[\w-]+\s*){{1,3}})", re.I
)


def _unnamed_attribute(ask: Ask, quote: str, chunk: str, title: str) -> str | None:
    """ "What colours …", "Which frame sizes …": the thing asked for is named in the chunk (or
    its title), or, for a table row, by a column header. Not for value kinds ("what time")."""
    m = _ATTRIBUTE.search(ask.question)
    if not m or ask.kinds - {"name"}:
        return None
    asked = [t for t in analyze(m.group(1)) if t not in QUESTION_WORDS and t not in ask.names]
    if not asked:
        return None
    head = asked[-1]
    headers = {t for tb in tables(chunk) for cell in tb.header for t in analyze(cell)}
    if any(ln.strip().startswith("|") for ln in quote.splitlines()):
        return (
            None
            if head in headers
            else f"no column of the table is the {m.group(1).strip()!r} asked for"
        )
    if head in _known_terms(chunk, title):
        return None
    return f"the cited passage never mentions {m.group(1).strip()!r}"


def _uncounted(ask: Ask, quote: str) -> str | None:
    """ "How many pages …": a number in the quote counts that thing ("80863 … pages")."""
    m = _COUNTED.search(ask.question)
    if not m:
        return None
    nouns = [t for t in analyze(m.group(1)) if t not in ask.names] or analyze(m.group(1))
    if not nouns:
        return None
    said = words(quote)
    stems = _stems_aligned(said)
    for i, stem in enumerate(stems):  # any of the asked words, the verb among them too
        if stem in nouns and any(NUMBER.search(w) for w in said[max(0, i - 4) : i]):
            return None
    return f"no number in the quote counts the {m.group(1).strip()!r} asked for"


def _stems_aligned(said: list[str]) -> list[str]:
    """Each word's stem, position for position (stop words kept as they are)."""
    return [(analyze(w) or [w])[0] for w in said]


def _tied_terms(question: str, *, row: bool = False) -> list[str]:
    """The words a question ties to what it asks by "of", "from" or "during" ("date of
    birth", "pages from patents") and, of a table row, by "for" ("number for weekends"; in a
    sentence "for" ties purposes too: "for work"): a qualifier the answer holds."""
    linked = r"of|for|from|during" if row else r"of|from|during"
    found = re.findall(rf"\b(?:{linked})\s+(?:the\s+|a\s+|an\s+)?(\w+)", question, re.I)
    return analyze(" ".join(found))


def _untied(ask: Ask, chunk: str, title: str) -> str | None:
    """ "How many weeks of maternity leave": a word tied by "of" to what is asked, found
    nowhere in the chunk or its title, is a fact the passage does not hold."""
    tied = [t for t in _tied_terms(ask.question) if t not in QUESTION_WORDS]
    known = _known_terms(chunk, title)
    absent = [t for t in tied if t not in known]
    return f"the cited passage never mentions {', '.join(absent)!r}" if absent else None


_WHO_DOES = re.compile(r"^\s*(?:who|whom)\s+([a-z][\w-]*)\b", re.I)


def _unacted(ask: Ask, quote: str, title: str) -> str | None:
    """ "Who manages the Utrecht store?": the role the question asks about is in the quote,
    as the verb or a word of its family ("Store Manager", "founder" for "founded"); a name
    in a sentence that never mentions managing answers some other question."""
    m = _WHO_DOES.search(ask.question)
    if not m or m.group(1).lower() in _AUX.split():
        return None
    acted = [t for t in analyze(m.group(1)) if t not in QUESTION_WORDS and t not in ask.names]
    if not acted:
        return None
    stem = acted[0][:5]
    if any(t.startswith(stem) for t in _known_terms(quote, title)):
        return None
    return f"the quote never says who {m.group(1).lower()}"


def _unmentioned(ask: Ask, chunk: str, title: str) -> str | None:
    """A question asking for no value ("Where is IBM's head office?") whose every word,
    besides its names, is absent from the chunk and its title: the passage is about the names,
    not about what is asked. (A table row has its own check, `_unnamed_column`.)"""
    if ask.kinds - {"name"}:
        return None
    asked = [t for t in dict.fromkeys(ask.terms) if t not in ask.names]
    if not asked or any(t in _known_terms(chunk, title) for t in asked):
        return None
    return f"the cited passage never mentions {' '.join(asked)!r}"


def _rows_only(quote: str, chunk: str) -> str:
    """The quote without its tables' header lines: values sit in rows, not in column names."""
    headers = header_lines(chunk)
    return "\n".join(ln for ln in quote.splitlines() if " ".join(ln.split()) not in headers)


_CAP = re.compile(
    r"\b(?:up to|at most|maximum|max\.?|no more than|not more than|limit(?:ed)? (?:of|to)"
    r"|capped at|ceiling)\b",
    re.I,
)
_FLOOR = re.compile(r"\b(?:at least|minimum|min\.|no less than|not less than|from)\b", re.I)


def _states_superlative(ask: Ask, quote: str) -> bool:
    said = set(words(quote))
    if ask.superlative in ("most", "max", "maximum") and _CAP.search(quote):
        return True  # "the most I can spend" is a cap: "up to 140 EUR"
    if ask.superlative in ("least", "min", "minimum") and _FLOOR.search(quote):
        return True
    if ask.superlative == "expensive":
        return bool(MOST_EXPENSIVE.search(quote) or LEAST_EXPENSIVE.search(quote))
    same = {w for w, d in SUPERLATIVES.items() if d == ask.extreme}
    return ask.superlative in said or bool(said & same & {ask.superlative or ""})


def _unnamed_column(ask: Ask, quote: str, chunk: str, title: str) -> str | None:
    """For a quoted table row: what the question asks of the row must be a column.

    When kbflow's own reading of the table picks this row and a column (`table_answers`), only
    a word tied to the column's name by "of" and found nowhere in the chunk is missing ("date
    of birth" of a customer list whose only date is "Subscription Date"). Otherwise (a row
    quoted for its words), every question word that names neither the row nor a column and
    appears nowhere in the chunk or its title is missing ("job title" of the same list).
    """
    quoted = [ln for ln in quote.splitlines() if ln.strip().startswith("|")]
    if not quoted:
        return None
    known = _known_terms(chunk, title)
    acting = " ".join(w for w in words(ask.question) if w.endswith(("ed", "ing")))
    loose = set(analyze(" ".join(SUPERLATIVES) + " " + acting))
    absent = [t for t in dict.fromkeys(ask.terms) if t not in known and t not in loose]
    if not absent:
        return None
    read = table_answer(ask, [("", chunk)])
    rows = {" ".join(q.split()) for q in quoted}
    if read is not None and any(" ".join(chunk[s:e].split()) in rows for s, e in read.spans[1:]):
        tied = set(_tied_terms(ask.question, row=True))
        absent = [t for t in absent if t in tied]
    if absent:
        return f"no column or row of the table matches the question's {', '.join(absent)!r}"
    return None


def _row_of(table: Table, chunk: str, quoted: Sequence[str]) -> TableRow | None:
    lines = {" ".join(q.split()) for q in quoted}
    for row in table.rows:
        if " ".join(chunk[row.span[0] : row.span[1]].split()) in lines:
            return row
    return None


@dataclass(frozen=True)
class Judgement:
    """The support check over an answer's claims: ``answered`` with the claims whose quotes
    hold the answer (in order), or not, with the claims as evidence and what is ``missing``."""

    answered: bool
    claims: tuple[Claim, ...]
    missing: str | None = None


def judge(
    question: str,
    claims: Sequence[Claim],
    texts: dict[str, str],
    titles: dict[str, str] | None = None,
) -> Judgement:
    """Check each claim's quote against the chunk it quotes (``texts``: chunk id -> the text
    the model saw; ``titles``: chunk id -> its document's title). Answered when at least one
    quote holds the answer; those claims are kept, the rest dropped. Otherwise every claim is
    kept as evidence, with the first one's gap."""
    ask = ask_of(question)
    held: list[Claim] = []
    gaps: list[str] = []
    for claim in claims:
        chunk = texts.get(claim.chunk_ids[0], "") if claim.chunk_ids else ""
        if not claim.quote:
            gaps.append(claim.unverified or "the answer quotes nothing")
            continue
        title = (titles or {}).get(claim.chunk_ids[0], "")
        verdict = check(ask, claim.quote, chunk, computed=claim.computed, title=title)
        if verdict.ok:  # it cites what it quotes: an unquoted second chunk is not checked
            held.append(replace(claim, chunk_ids=claim.chunk_ids[:1]))
        else:
            gaps.append(verdict.missing or "")
    if held:
        return Judgement(True, tuple(held))
    return Judgement(False, tuple(claims), gaps[0] if gaps else "no claim quotes the passage")
