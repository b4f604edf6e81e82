"""Sentences and blocks of Markdown text: what the offline synthesizer quotes and the extractive
answer model cites."""

from __future__ import annotations

import re

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LIST_ITEM = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_ABBREVIATIONS = frozenset(
    "e.g i.e mr mrs ms dr prof inc ltd co corp st vs etc no approx dept jr sr".split()  # noqa: SIM905
)
_SENTENCE_END = re.compile(r"[.!?][\"')\]”’]*\s+(?=[\"'(\[“‘]?[A-Z0-9])")


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
            sentence = block[start : match.end()]
            if sentence.count('"') % 2 or sentence.count("“") > sentence.count("”"):
                continue  # inside a quotation: keep quoted copy whole
            sentences.append(sentence.strip())
            start = match.end()
        sentences.append(block[start:].strip())
    return [s for s in sentences if s]
