"""Page furniture in extracted text: what a PDF or slide deck repeats on every page (running
headers and footers), table-of-contents lines and bare page numbers. None of it is a fact about
anything, and quoted in a draft it reads as one.

`strip_boilerplate` works on one document's Markdown (as `chunks_to_markdown` rebuilds it) and
keeps everything else as it was, line for line: tables, lists and headings stay intact, so
citations into the text still find their words.
"""

from __future__ import annotations

import re
from collections import Counter

from tasks.text.sentences import HEADING, LIST_ITEM

# A dot leader that runs to a page number: "Notices . . . . . . . vii", "1.1 Scope ...... 12";
# a PDF's contents page may arrive as one paragraph of them run together.
_LEADER = re.compile(r"(?:\.\s?){4,}\s*\.?\s*(?:\d{1,4}|[ivxlc]{1,7})(?:\s|\||$)", re.IGNORECASE)
_DOTS = re.compile(r"(?:\.\s?){4,}")
_LEADER_CELL = re.compile(r"^\s*(?:\.\s?)*\s*(?:\d{1,4}|[ivxlc]{1,7})?\s*$", re.IGNORECASE)
# A line that is a page number and nothing else: "12", "- 12 -", "Page 3", "Page 3 of 10", "xi".
_PAGE_NUMBER = re.compile(
    r"^\s*(?:[-–—]\s*)?(?:page\s+)?(?:\d{1,4}|[ivxlc]{1,7})(?:\s*(?:of|/)\s*\d{1,4})?"
    r"(?:\s*[-–—])?\s*$",
    re.IGNORECASE,
)
_CONTENTS = re.compile(r"^(?:table\s+of\s+)?contents$|^inhalt(?:sverzeichnis)?$|^sommaire$", re.I)
_ENDS_WITH_PAGE = re.compile(r"\s(?:\d{1,4}|[ivxlc]{1,7})\s*$", re.IGNORECASE)
_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{1,}:?\s*(?:\|\s*:?-{1,}:?\s*)*\|?\s*$")
_WORD = re.compile(r"\w+")

REPEATS = 3
"""A short line met this often in one document is a running header or footer."""
MIN_FURNITURE_WORDS = 3
"""Fewer words repeated are more likely code ("ENABLE ;") or a label than a running footer."""
MAX_FURNITURE_WORDS = 16
"""Running headers and footers are short; a longer line repeated is the author's own."""


_EDGE_PAGE = re.compile(r"^(?:\d+|[ivxlc]+)\s+|\s+(?:\d+|[ivxlc]+)$")


def _key(line: str) -> str:
    """A line as running furniture compares: case, spacing and page numbers aside (a number
    anywhere, a roman numeral at either end: "All rights reserved. xi")."""
    text = " ".join(line.casefold().strip(" |*_#").split())
    text = _EDGE_PAGE.sub(" # ", text)
    return " ".join(re.sub(r"\d+", "#", text).split())


def _is_table_line(line: str) -> bool:
    return line.lstrip().startswith("|")


def is_toc_line(line: str) -> bool:
    """A contents line: a title whose dot leader runs to a page number, or several contents
    entries run together (two dot leaders or more)."""
    return bool(_LEADER.search(line)) or len(_DOTS.findall(line)) >= 2


def _is_toc_row(line: str) -> bool:
    """A table row of a contents table: a dot leader in a cell, the rest page numbers."""
    if not _is_table_line(line):
        return False
    cells = line.strip().strip("|").split("|")
    return any(_DOTS.search(c) for c in cells) and all(
        _DOTS.search(c) or _LEADER_CELL.match(c) for c in cells
    )


def _furniture(lines: list[str]) -> set[str]:
    """Keys of the short lines repeated like running headers and footers: not table rows,
    list items or headings (a heading repeated is structure), met `REPEATS` times or more, or
    twice where the line ends in a page number that changes."""
    counts: Counter[str] = Counter()
    numbers: dict[str, set[str]] = {}
    for line in lines:
        text = line.strip()
        if (
            not text
            or _is_table_line(text)
            or HEADING.match(text)
            or LIST_ITEM.match(text)
            or text.startswith(("```", "<!--", ">"))
            or not MIN_FURNITURE_WORDS <= len(_WORD.findall(text)) <= MAX_FURNITURE_WORDS
        ):
            continue
        key = _key(text)
        if not key or key == "#":
            continue
        counts[key] += 1
        end = _ENDS_WITH_PAGE.search(text)
        if end:
            numbers.setdefault(key, set()).add(end.group().strip())
    return {
        key
        for key, n in counts.items()
        if n >= REPEATS or (n >= 2 and len(numbers.get(key, ())) >= 2 and not key.endswith("."))
    }


def strip_boilerplate(text: str) -> str:
    """``text`` without its page furniture: lines repeated as running headers or footers, bare
    page numbers, table-of-contents lines (and a contents table or section whole). Blank lines
    left in a row by what was taken out are folded into one."""
    ends_with_newline = text.endswith("\n")
    lines = text.splitlines()
    furniture = _furniture(lines)
    kept: list[str] = []
    in_contents = False
    table: list[str] = []

    def flush_table() -> None:
        body = [r for r in table if not _SEPARATOR.match(r)]
        toc = sum(_is_toc_row(r) for r in body)
        if not (body and toc * 2 >= len(body)):
            kept.extend(table)
        table.clear()

    for line in lines:
        stripped = line.strip()
        if _is_table_line(stripped):
            table.append(line)
            continue
        if table:
            flush_table()
        heading = HEADING.match(stripped)
        if heading:
            in_contents = bool(_CONTENTS.match(heading.group(2).strip()))
            if in_contents:
                continue
        elif in_contents and stripped and _ENDS_WITH_PAGE.search(stripped):
            continue
        if (
            stripped
            and not heading
            and (
                is_toc_line(stripped) or _PAGE_NUMBER.match(stripped) or _key(stripped) in furniture
            )
        ):
            continue
        kept.append(line)
    if table:
        flush_table()
    out: list[str] = []
    for line in kept:
        if not line.strip() and out and not out[-1].strip():
            continue
        out.append(line)
    result = "\n".join(out)
    return result + "\n" if ends_with_newline and result else result
