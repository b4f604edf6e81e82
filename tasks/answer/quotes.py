"""Quotable units of a chunk, with their offsets: what an answer may quote, exactly.

A quote is one or more exact spans of the chunk's text: ``quote == "\\n".join(text[s:e] for s,
e in spans)``. A sentence or a list item is one span. A table row is quoted with its table's
header row first (two spans), so a row never reaches an agent without its column names. A unit
longer than `MAX_UNIT_CHARS` is cut at word boundaries into windows, so a quote is never a
"cut-off fragment" that stops before the part that answers.

Pure functions over text: the offline answer model quotes with them, and the support check
(`tasks.answer.support`) reads tables through them.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from tasks.text.sentences import table_cells

MAX_UNIT_CHARS = 400
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]”’]*\s+(?=[\"'(\[“‘]?[A-Z0-9])")
_TABLE_RULE = re.compile(r"^\|(?:\s*:?-{3,}:?\s*\|)+\s*$")
_HEADING = re.compile(r"^#{1,6}\s")
_ABBREVIATION = re.compile(
    r"\b(?:e\.g|i\.e|mr|mrs|ms|dr|prof|inc|ltd|co|st|vs|etc|no|approx)\.$", re.I
)

Span = tuple[int, int]


@dataclass(frozen=True)
class Table:
    """A Markdown table of a chunk: its header line's span, header cells, and rows."""

    header_span: Span
    header: tuple[str, ...]
    rows: tuple[TableRow, ...]


@dataclass(frozen=True)
class TableRow:
    span: Span
    cells: tuple[str, ...]


@dataclass(frozen=True)
class Unit:
    """One quotable unit: its own span and, for a table row, its table."""

    span: Span
    table: Table | None = None
    row: TableRow | None = None

    @property
    def spans(self) -> tuple[Span, ...]:
        """The spans a quote of this unit gives: a table row's header first."""
        return (self.table.header_span, self.span) if self.table else (self.span,)


def quote_text(text: str, spans: tuple[Span, ...]) -> str:
    """The exact text of ``spans`` of ``text``, one line per span."""
    return "\n".join(text[s:e] for s, e in spans)


def _lines(text: str) -> list[Span]:
    out, start = [], 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        out.append((start, start + len(body)))
        start += len(line)
    return out


def tables(text: str) -> list[Table]:
    """The Markdown tables of ``text`` (a header row, a separator row, then rows)."""
    return [u for u in _blocks(text) if isinstance(u, Table)]


def _blocks(text: str) -> list[Table | list[Span]]:
    """``text`` as tables and runs of other lines (paragraphs split at blank lines)."""
    lines = _lines(text)
    out: list[Table | list[Span]] = []
    para: list[Span] = []
    i = 0
    while i < len(lines):
        s, e = lines[i]
        line = text[s:e].strip()
        if (
            line.startswith("|")
            and i + 1 < len(lines)
            and _TABLE_RULE.match(text[lines[i + 1][0] : lines[i + 1][1]].strip())
        ):
            if para:
                out.append(para)
                para = []
            end = i + 2
            rows: list[TableRow] = []
            while end < len(lines) and text[lines[end][0] : lines[end][1]].strip().startswith("|"):
                rs, re_ = lines[end]
                rows.append(TableRow((rs, re_), table_cells(text[rs:re_])))
                end += 1
            out.append(Table((s, e), table_cells(line), tuple(rows)))
            i = end
            continue
        if not line or _HEADING.match(line) or re.fullmatch(r"[|:\-\s=*_#]+", line):
            if para:
                out.append(para)
                para = []
        elif line.startswith(("-", "*", "+", "•", "|")) or re.match(r"\d+[.)]\s", line):
            if para:
                out.append(para)
            out.append([(s, e)])  # a list item or a lone row: a unit of its own
            para = []
        else:
            para.append((s, e))
        i += 1
    if para:
        out.append(para)
    return out


def units(text: str) -> list[Unit]:
    """Every quotable unit of ``text`` in order: sentences, list items and table rows."""
    out: list[Unit] = []
    for block in _blocks(text):
        if isinstance(block, Table):
            out.extend(Unit(r.span, block, r) for r in block.rows if any(r.cells))
            continue
        for run in _record_runs(text, block):
            spans = _sentence_spans(text, run[0][0], run[-1][1])
            out.extend(Unit(span) for span in spans if not is_heading(text[span[0] : span[1]]))
    return out


_SMALL = frozenset("a an and as at by for from in of on or the to with via vs de la le".split())  # noqa: SIM905


_VALUE = re.compile(r"\d[\d.,']*\d|[$€£¥%]")


def is_heading(line: str) -> bool:
    """A title-like line (a PDF's heading as plain text): at most ten words, no sentence end,
    most words capitalised. It labels what follows and states nothing, so it is never quoted."""
    said = line.split()
    if not said or len(said) > 10 or line.rstrip()[-1:] in ".!?" or _VALUE.search(line):
        return False
    big = [w for w in said if w.lower() not in _SMALL]
    return bool(big) and sum(w[:1].isupper() or w[:1].isdigit() for w in big) >= 0.6 * len(big)


def _record_runs(text: str, para: list[Span]) -> list[list[Span]]:
    """A paragraph's lines in runs that read on: a line that ends without punctuation and is
    followed by one that starts with a capital or a digit is a record of its own (an OCR'd
    bill's "Total CHF 2,930.05", an address line); a line followed by a lowercase one is a
    hard wrap of the same sentence."""
    runs: list[list[Span]] = [[para[0]]]
    for (s0, e0), (s1, e1) in itertools.pairwise(para):
        line, after = text[s0:e0].rstrip(), text[s1:e1].lstrip()
        ends = line[-1:] in (".", "!", "?", ":", ";", ",", "-", "(") if line else True
        if not ends and (after[:1].isupper() or after[:1].isdigit()):
            runs.append([(s1, e1)])
        else:
            runs[-1].append((s1, e1))
    return runs


def _sentence_spans(text: str, start: int, end: int) -> list[Span]:
    spans: list[Span] = []
    cursor = start
    for m in _SENTENCE_END.finditer(text, start, end):
        if _ABBREVIATION.search(text[cursor : m.start()]):
            continue
        spans.append((cursor, m.start()))
        cursor = m.end()
    spans.append((cursor, end))
    out: list[Span] = []
    for s, e in spans:
        s, e = _strip(text, s, e)
        if e - s > MAX_UNIT_CHARS:
            out.extend(_windows(text, s, e))
        elif e > s:
            out.append((s, e))
    return out


def _strip(text: str, s: int, e: int) -> Span:
    while s < e and text[s] in " \t\r\n-*+•>":
        s += 1
    while e > s and text[e - 1] in " \t\r\n":
        e -= 1
    return s, e


def _windows(text: str, s: int, e: int) -> list[Span]:
    """A long unit as windows of at most `MAX_UNIT_CHARS`, cut at spaces, overlapping a
    little, so whichever part holds the answer is quoted whole."""
    out: list[Span] = []
    cursor = s
    while cursor < e:
        stop = min(cursor + MAX_UNIT_CHARS, e)
        if stop < e:
            space = text.rfind(" ", cursor + MAX_UNIT_CHARS // 2, stop)
            stop = space if space > cursor else stop
        out.append(_strip(text, cursor, stop))
        if stop >= e:
            break
        back = text.rfind(" ", cursor, stop - MAX_UNIT_CHARS // 4)
        cursor = back + 1 if back > cursor else stop
    return [w for w in out if w[1] > w[0]]


def header_lines(chunk: str) -> set[str]:
    """The header rows of ``chunk``'s tables, blank space normalised."""
    return {" ".join(chunk[t.header_span[0] : t.header_span[1]].split()) for t in tables(chunk)}


def is_header_only(quote: str, chunk: str) -> bool:
    """Every line of ``quote`` is a header or separator row of one of ``chunk``'s tables: the
    column names, no row, so no value."""
    headers = header_lines(chunk)
    lines = [" ".join(ln.split()) for ln in quote.splitlines() if ln.strip()]
    body = [ln for ln in lines if not _TABLE_RULE.match(ln)]
    return bool(lines) and all(ln in headers for ln in body)


def locate(quote: str, text: str) -> tuple[Span, ...] | None:
    """The spans of ``text`` that ``quote`` (a model's copy) is, or None when it is not there.

    Exact text first; then line by line, each line found on its own (a table's header and one
    of its rows); blank space may differ. A quoted table row gets its table's header first.
    """
    if not quote.strip():
        return None
    spans: list[Span] = []
    for line in [ln.strip() for ln in quote.splitlines() if ln.strip()] or [quote.strip()]:
        span = _find(line, text)
        if span is None:
            return None
        spans.append(span)
    rows = {r.span: t for t in tables(text) for r in t.rows}
    if len(spans) == 1 and spans[0] in rows:
        spans.insert(0, rows[spans[0]].header_span)
    return tuple(spans)


def _find(line: str, text: str) -> Span | None:
    at = text.find(line)
    if at >= 0:
        return at, at + len(line)
    pattern = r"\s+".join(re.escape(w) for w in line.split())
    m = re.search(pattern, text)
    if m is None:
        return None
    start, end = m.span()
    for s, e in _lines(text):  # a whole table row when the line is one, pipes and all
        if s <= start and end <= e and text[s:e].strip().startswith("|"):
            return _strip(text, s, e)
    return start, end
