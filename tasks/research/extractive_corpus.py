"""The research corpus as the extractive synthesizer reads it: distinct, informative sentences
and table rows, each with its citation id and the headings above it."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from core.models import ResearchCorpus
from tasks.research import extractive_cues as cues
from tasks.research.steering import PROMPT_SOURCE
from tasks.text.citations import CITE_OPEN
from tasks.text.sentences import (
    HEADING,
    LIST_ITEM,
    MarkdownTable,
    split_sentences,
    split_tables,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sentence:
    """A corpus sentence, or a row of one of its tables (``header`` and ``cells`` set)."""

    text: str
    cite_id: str
    source: str
    header: tuple[str, ...] = ()
    cells: tuple[str, ...] = ()
    headings: str = ""  # the headings above it, " > "-joined (context, never quoted)
    lead: str = ""  # a list item's lead-in sentence (context, never quoted with it)

    @property
    def context(self) -> str:
        """What labels the sentence: its headings, lead-in and table header."""
        return " | ".join(p for p in (self.headings, self.lead, *self.header) if p)

    @property
    def line(self) -> str:
        return f"- {self.text} [{self.cite_id}]"

    @property
    def table(self) -> tuple[str, tuple[str, ...]] | None:
        """Which table the row belongs to (entry and header), or None for a sentence."""
        return (self.cite_id, self.header) if self.header else None


def table_lines(rows: Sequence[Sentence]) -> list[str]:
    """Rows of one table as Markdown, a line per row with its citation in a Source column;
    the header and separator rows lead the first row's line, so that dropping rows to fit a
    budget never leaves a table without rows."""
    width = max(len(rows[0].header), *(len(r.cells) for r in rows))
    header = [*rows[0].header, *[""] * (width - len(rows[0].header)), "Source"]
    head = "| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n"
    lines = []
    for row in rows:
        cells = [*row.cells, *[""] * (width - len(row.cells)), f"[{row.cite_id}]"]
        lines.append("| " + " | ".join(cells) + " |")
    lines[0] = head + lines[0]
    return lines


def clean(sentence: str) -> str:
    """One line of text; a quoted "[doc:..." in the corpus must not read as a citation."""
    text = " ".join(sentence.split())
    text = CITE_OPEN.sub(lambda m: "(" + m.group()[1:], text)
    if len(text) > cues.MAX_SENTENCE_CHARS:
        text = text[: cues.MAX_SENTENCE_CHARS].rsplit(" ", 1)[0] + "…"
    return text


def sections(text: str) -> list[tuple[str, str]]:
    """``text`` as (heading path, body) pairs: each heading starts a section, and its path is
    the headings above it by level, " > "-joined."""
    out: list[tuple[str, str]] = []
    path: list[tuple[int, str]] = []
    body: list[str] = []
    for line in text.splitlines():
        heading = HEADING.match(line)
        if heading is None:
            body.append(line)
            continue
        out.append((" > ".join(t for _, t in path), "\n".join(body)))
        level = len(heading.group(1))
        path = [(lv, t) for lv, t in path if lv < level] + [(level, heading.group(2))]
        body = []
    out.append((" > ".join(t for _, t in path), "\n".join(body)))
    return [(headings, body) for headings, body in out if body.strip()]


def corpus_sentences(corpus: ResearchCorpus, limit: int) -> list[Sentence]:
    """Distinct, informative sentences of the corpus, each with its entry's citation id and the
    headings above it; a table's rows come as sentences that keep their cells and the table's
    header. A lead-in ("How long we keep it:") says nothing without what follows: dropped.

    The AM's prompts are instructions (`tasks.research.steering`), never quoted: skipped. A
    short line of its own that reads as a title (a PDF's headings arrive as plain paragraphs)
    labels the sentences below it instead of being one; a list's lead-in sentence labels its
    items the same way ("Besides stock sales we run three service lines.").
    """
    seen: set[str] = set()
    out: list[Sentence] = []
    for entry in corpus.entries:
        if entry.source == PROMPT_SOURCE:
            continue
        for headings, section in sections(entry.text):
            found = []
            for part in split_tables(section):
                if isinstance(part, MarkdownTable):
                    header = tuple(clean(c) for c in part.header)
                    for row in part.rows:
                        cells = tuple(clean(c) for c in row)
                        text = " | ".join(c for c in cells if c)
                        found.append(
                            Sentence(text, entry.cite_id, entry.source, header, cells, headings)
                        )
                else:
                    found.extend(
                        Sentence(clean(raw), entry.cite_id, entry.source, headings=h, lead=lead)
                        for h, lead, raw in _labelled_sentences(part, headings)
                    )
            for sentence in found:
                text = sentence.text
                key = text.casefold()
                contact = cues.EMAIL.search(text) or cues.has_phone(text)
                short = len(re.findall(r"\w+", text)) < 4 or text.endswith(":")
                if key in seen or (short and not (contact or cues.MONEY.search(text))):
                    continue
                seen.add(key)
                out.append(sentence)
                if len(out) >= limit:
                    log.warning("corpus has more than %d sentences; the rest are not used", limit)
                    return drop_contained(out)
    return drop_contained(out)


_SHINGLE = 5  # words: a sentence is looked for inside others by its first five


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())


def drop_contained(sentences: Sequence[Sentence]) -> list[Sentence]:
    """One quote per fact: a sentence whose words run inside a longer one of the corpus (a
    piece cut at a chunk's edge, a fact a second seed repeats within a longer sentence) is
    dropped for the longer; table rows are facts of their own and always kept."""
    words = [_words(s.text) for s in sentences]
    order = sorted(range(len(sentences)), key=lambda i: -len(words[i]))
    index: dict[tuple[str, ...], list[int]] = {}
    dropped: set[int] = set()
    for i in order:
        own = words[i]
        if sentences[i].header or len(own) < _SHINGLE:
            continue
        joined = f" {' '.join(own)} "
        head = tuple(own[:_SHINGLE])
        if any(f" {' '.join(words[j])} ".find(joined) >= 0 for j in index.get(head, ())):
            dropped.add(i)
            continue
        for k in range(len(own) - _SHINGLE + 1):
            index.setdefault(tuple(own[k : k + _SHINGLE]), []).append(i)
    return [s for i, s in enumerate(sentences) if i not in dropped]


_TITLE_LINE = re.compile(r"^(?:\d+(?:\.\d+)*\.?\s+)?[A-Z][^.!?:;|@]*$")
_INCH = re.compile(r'(?<=\d)"(?![A-Za-z])')  # 1/2" bolts: an inch mark, not a quotation
_INCH_MASK = "\ue000"


def _is_title(paragraph: str) -> bool:
    """A one-line paragraph that labels what follows: short, no end punctuation, no figures
    that would make it a fact (a price, an address)."""
    line = paragraph.strip()
    words = re.findall(r"\w+", line)
    return (
        "\n" not in line
        and 1 <= len(words) <= 8
        and bool(_TITLE_LINE.match(line))
        and not LIST_ITEM.match(line)
        and not (cues.MONEY.search(line) or cues.EMAIL.search(line) or cues.has_phone(line))
    )


def _labelled_sentences(text: str, headings: str) -> list[tuple[str, str, str]]:
    """(headings, lead-in, sentence) of a text part: a title line joins the headings of what
    follows it, a list's lead-in sentence labels the list's items; overlong sentences are
    split again."""
    out: list[tuple[str, str, str]] = []
    title = ""
    lead = ""
    paragraphs = [p for p in re.split(r"\n[ \t]*\n", text) if p.strip()]
    for n, paragraph in enumerate(paragraphs):
        if _is_title(paragraph) or _CAPTION.match(paragraph.strip()):
            if not _is_code(paragraphs[n + 1] if n + 1 < len(paragraphs) else ""):
                title, lead = paragraph.strip(), ""
            continue  # a code line ("RETURN CASE") says nothing, and titles nothing
        context = " > ".join(h for h in (headings, title) if h)
        is_item = bool(LIST_ITEM.match(paragraph.lstrip()))
        found = _split(paragraph)
        out.extend((context, lead if is_item else "", sentence) for sentence in found)
        if not is_item and found:
            lead = found[-1]
    return out


_CAPTION = re.compile(
    r"^(?:Example|Table|Figure|Fig\.|Listing|Exhibit|Chart)\s+(?:[A-Z]-?)?\d+(?:[-.]\d+)*\s+"
    r"[^\n]{1,120}$"
)
"""A caption ("Example 3-9 Creating a mask on the TAX_ID column"): it labels what follows."""
_CODE_MARKS = re.compile(r"[=;(){}<>]|\b[A-Z]+_[A-Z_]+\b")


def _is_code(paragraph: str) -> bool:
    """A paragraph of program text as a PDF gives it (no fences): operators, brackets,
    semicolons, SNAKE_CASE identifiers, two or more of them."""
    return len(_CODE_MARKS.findall(paragraph)) >= 2


def _split(paragraph: str) -> list[str]:
    """`split_sentences`, with inch marks kept out of the quotation rule, and any sentence
    still too long to quote split at its sentence ends regardless of quotation marks (a stray
    quote in a PDF's text must not fuse a whole page into one clipped line)."""
    masked = _INCH.sub(_INCH_MASK, paragraph)
    out: list[str] = []
    for sentence in split_sentences(masked):
        if len(sentence) > cues.MAX_SENTENCE_CHARS:
            out.extend(p for p in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9])", sentence) if p)
        else:
            out.append(sentence)
    return [s.replace(_INCH_MASK, '"') for s in out]
