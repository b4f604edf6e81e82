"""Answers read off a Markdown table: a cell named by its row and column, or a superlative
computed over the rows.

"What was the revenue in March 2025?" names a row (the one holding "March" and "2025") and a
column ("Revenue"): the answer is that cell, quoted with its row and the header. "Which month
had the highest revenue?" is computed: the rows' Revenue values are parsed as numbers and the
largest one's row is quoted. Rows of the same table split over several evidence chunks (each
part repeats the header) are taken together. When the question's column or row cannot be told,
no table answer is given and the caller falls back to quoting sentences (whose support check
will then ask for what is missing).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tasks.answer.asks import Ask, holds_kind
from tasks.answer.quotes import Span, Table, TableRow, quote_text, tables
from tasks.text.sparse import analyze

_NUM = re.compile(r"[-−]?\d[\d.,' ]*\d|[-−]?\d")
_SCALE = {"k": 1e3, "m": 1e6, "mn": 1e6, "bn": 1e9, "b": 1e9, "thousand": 1e3, "million": 1e6,
          "billion": 1e9}  # fmt: skip
_YEAR = re.compile(r"^(?:19|20)\d\d$")


@dataclass(frozen=True)
class TableAnswer:
    """A table answer: the chunk and spans quoted, the claim's text, and whether it was
    computed over rows (a superlative)."""

    chunk_id: str
    spans: tuple[Span, ...]
    text: str
    computed: bool


def number(cell: str) -> float | None:
    """The first number of a table cell ("$1,234.50" -> 1234.5, "1.234,5 €" -> 1234.5,
    "113k" -> 113000, "12 %" -> 12); None when it holds none."""
    m = _NUM.search(cell)
    if not m:
        return None
    raw = m.group().replace(" ", "").replace("'", "").replace("−", "-")
    if "," in raw and "." in raw:
        decimal = "," if raw.rfind(",") > raw.rfind(".") else "."
        raw = raw.replace("." if decimal == "," else ",", "").replace(",", ".")
    elif "," in raw:
        head, _, tail = raw.rpartition(",")
        raw = raw.replace(",", "") if len(tail) == 3 and head else raw.replace(",", ".")
    elif raw.count(".") > 1:
        raw = raw.replace(".", "")
    try:
        value = float(raw)
    except ValueError:
        return None
    after = cell[m.end() :].strip().lower()
    scale = re.match(r"[a-z]+", after)
    if scale and scale.group() in _SCALE:
        value *= _SCALE[scale.group()]
    return value if math.isfinite(value) else None


def _terms(cells: Sequence[str]) -> list[set[str]]:
    return [set(analyze(c)) for c in cells]


def table_answer(ask: Ask, chunks: Sequence[tuple[str, str]]) -> TableAnswer | None:
    """The answer ``chunks`` ((chunk_id, text), best first) give from a table, or None."""
    found = [(cid, text, t) for cid, text in chunks for t in tables(text) if t.rows]
    for cid, text, table in found:
        if ask.extreme:
            same = [(c, x, t) for c, x, t in found if t.header == table.header]
            got = _superlative(ask, same)
        else:
            got = _cell(ask, cid, text, table)
        if got is not None:
            return got
    return None


def _column(ask: Ask, table: Table, skip: set[str]) -> int | None:
    """The column the question names (its header shares a question term), best first."""
    scores = [
        (len((terms & set(ask.terms)) - skip), -i) for i, terms in enumerate(_terms(table.header))
    ]
    best = max(scores, default=(0, 0))
    if best[0] == 0 or sum(s == best[0] for s, _ in scores) > 1:
        return None
    return -best[1]


def _row_terms(ask: Ask, table: Table, row: TableRow) -> set[str]:
    header = {t for terms in _terms(table.header) for t in terms}
    cells = {t for terms in _terms(row.cells) for t in terms}
    return (cells & set(ask.terms)) - header


def _row_score(ask: Ask, table: Table, row: TableRow) -> float:
    """How well the question names ``row``: its matched terms, each weighed by how few rows
    hold it, twice in the row's label (first) cell."""
    matched = _row_terms(ask, table, row)
    label = set(analyze(row.cells[0])) if row.cells else set()
    score = 0.0
    for term in matched:
        holding = sum(term in {t for c in r.cells for t in analyze(c)} for r in table.rows)
        score += (2.0 if term in label else 1.0) * math.log(1 + len(table.rows) / max(holding, 1))
    return score


def _cell(ask: Ask, cid: str, text: str, table: Table) -> TableAnswer | None:
    scored = [(_row_score(ask, table, r), r) for r in table.rows]
    top = max((s for s, _ in scored), default=0.0)
    rows = [r for s, r in scored if s == top]
    if top == 0 or len(rows) != 1:
        return None
    row = rows[0]
    named = _row_terms(ask, table, row)
    col = _column(ask, table, named)
    if col is None:
        kinds = [
            i for i, cell in enumerate(row.cells) if any(holds_kind(k, cell) for k in ask.kinds)
        ]
        if len(kinds) != 1 or not ask.kinds:
            return None
        col = kinds[0]
    if col >= len(row.cells) or not row.cells[col].strip():
        return None
    first = set(analyze(row.cells[0])) & named if row.cells else set()
    label = row.cells[0] if first else ", ".join(c for c in row.cells if set(analyze(c)) & named)
    spans = (table.header_span, row.span)
    quoted = quote_text(text, spans)
    return TableAnswer(cid, spans, f"{table.header[col]} ({label}): {row.cells[col]}\n“{quoted}”",
                       computed=False)  # fmt: skip


def _superlative(ask: Ask, same: Sequence[tuple[str, str, Table]]) -> TableAnswer | None:
    table = same[0][2]
    rows: list[tuple[str, str, TableRow]] = []
    seen: set[tuple[str, ...]] = set()
    for cid, text, t in same:
        for r in t.rows:
            if r.cells not in seen:
                seen.add(r.cells)
                rows.append((cid, text, r))
    numeric = [
        i
        for i in range(len(table.header))
        if sum(_value(r.cells, i) is not None for _, _, r in rows) >= max(2, len(rows) // 2)
        and not all(_YEAR.match(r.cells[i].strip()) for _, _, r in rows if i < len(r.cells))
    ]
    asked = set(ask.terms)
    named = [i for i in numeric if set(analyze(table.header[i])) & asked]
    money = [i for i in numeric if any(holds_kind("money", r.cells[i]) for _, _, r in rows
                                       if i < len(r.cells))]  # fmt: skip
    pick = named or (money if "money" in ask.kinds and money else numeric)
    if len(pick) != 1:
        return None
    col = pick[0]
    # A question that also names rows ("in 2025") compares those rows only.
    header = {t for terms in _terms(table.header) for t in terms}
    wanted = set(ask.terms) - header - {ask.superlative or ""}
    scoped = [x for x in rows if not wanted or _row_terms(ask, table, x[2])] or rows
    values = [(v, x) for x in scoped if (v := _value(x[2].cells, col)) is not None]
    if len(values) < 2:
        return None
    pick_value = max if ask.extreme == "max" else min
    best = pick_value(v for v, _ in values)
    winners = [x for v, x in values if v == best]
    if len(winners) != 1:
        return None
    cid, text, row = winners[0]
    label = ", ".join(c for i, c in enumerate(row.cells) if i not in numeric and c.strip())
    label = label or ", ".join(c for i, c in enumerate(row.cells) if i != col)
    spans = (next(t for c, _, t in same if c == cid).header_span, row.span)
    quoted = quote_text(text, spans)
    claim = (
        f"Computed over the {len(values)} rows of the table: the {ask.superlative} "
        f"{table.header[col]} is {row.cells[col]} ({label}).\n“{quoted}”"
    )
    return TableAnswer(cid, spans, claim, computed=True)


def _value(cells: tuple[str, ...], col: int) -> float | None:
    return number(cells[col]) if col < len(cells) else None
