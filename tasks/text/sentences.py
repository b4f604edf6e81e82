"""Sentences and blocks of Markdown text: what the offline synthesizer quotes and the extractive
answer model cites."""

from __future__ import annotations

import re
from dataclasses import dataclass

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LIST_ITEM = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_ABBREVIATIONS = frozenset(
    "e.g i.e mr mrs ms dr prof inc ltd co corp st vs etc no approx dept jr sr".split()  # noqa: SIM905
)
_NUMBERED = frozenset("art arts sec para fig vol nr ch pp".split())  # noqa: SIM905
"""Abbreviations that lead a number: "Art. 9 GDPR", "Sec. 4" (not "art. The ...")."""
_SENTENCE_END = re.compile(r"[.!?][\"')\]”’]*\s+(?=[\"'(\[“‘]?[A-Z0-9])")
_TABLE_RULE = re.compile(r"^\|(?:\s*:?-{3,}:?\s*\|)+$")


@dataclass(frozen=True)
class MarkdownTable:
    """A Markdown table: its header cells and its rows' cells (separator row left out)."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def table_cells(line: str) -> tuple[str, ...]:
    """The cells of a table row (``| a | b |`` -> ``("a", "b")``), blank space trimmed."""
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") else inner
    return tuple(" ".join(cell.split()) for cell in inner.split("|"))


def split_tables(text: str) -> list[str | MarkdownTable]:
    """``text`` as its Markdown tables and the text between them, in order.

    A table is a run of lines that start with ``|`` whose second line is a separator row
    (``|---|---|``); other runs of ``|`` lines stay text.
    """
    out: list[str | MarkdownTable] = []
    lines = text.splitlines()
    plain: list[str] = []
    i = 0
    while i < len(lines):
        end = i
        while end < len(lines) and lines[end].strip().startswith("|"):
            end += 1
        if end - i >= 2 and _TABLE_RULE.match(" ".join(lines[i + 1].split())):
            if plain:
                out.append("\n".join(plain))
                plain = []
            rows = tuple(table_cells(line) for line in lines[i + 2 : end])
            out.append(MarkdownTable(table_cells(lines[i]), rows))
            i = end
            continue
        plain.extend(lines[i : max(end, i + 1)])
        i = max(end, i + 1)
    if plain:
        out.append("\n".join(plain))
    return out


def markdown_blocks(text: str) -> list[str]:
    """Paragraphs, list items and table rows of ``text``, without Markdown markers.

    A line that starts lowercase (or with a digit) after one that does not end a sentence is a
    hard wrap (PDF text) and is joined back; headings are dropped (they label, they do not state).
    """
    blocks: list[str] = []
    joinable = False
    text = re.sub(r"<[^>\n]{1,200}>", " ", text)  # raw HTML left in Markdown
    text = re.sub(r"\[\d{1,3}\]", "", text)  # footnote markers: "research.[13] IBM"
    for raw in text.splitlines():
        line = raw.strip()
        if not line or re.fullmatch(r"[|:\-\s=*_#]+", line) or HEADING.match(line):
            joinable = False
            continue
        is_item = bool(LIST_ITEM.match(line)) or line.startswith("|")
        line = LIST_ITEM.sub("", line).lstrip("> ").strip(" |")
        line = re.sub(r"\s*\|\s*", " | ", line)  # table rows: keep the cells readable
        if joinable and not is_item and (line[:1].islower() or line[:1].isdigit()):
            blocks[-1] = f"{blocks[-1]} {line}"
        else:
            blocks.append(line)
        joinable = not is_item and not re.search(r"[.!?:;]$", line)
    return blocks


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``; paragraphs, list items and table rows never run together."""
    sentences: list[str] = []
    for block in markdown_blocks(text):
        start = 0
        for match in _SENTENCE_END.finditer(block):
            before = block[start : match.start()].split()
            word = before[-1].lower().strip("(\"'“‘") if before else ""
            if word in _ABBREVIATIONS or re.fullmatch(r"[a-z]", word):  # "e.g.", "J. Smith"
                continue
            if word in _NUMBERED and block[match.end() : match.end() + 1].isdigit():
                continue
            sentence = block[start : match.end()]
            if sentence.count('"') % 2 or sentence.count("“") > sentence.count("”"):
                continue  # inside a quotation: keep quoted copy whole
            sentences.append(sentence.strip())
            start = match.end()
        sentences.append(block[start:].strip())
    return [s for s in sentences if s]
