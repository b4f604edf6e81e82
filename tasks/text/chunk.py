"""Structure-aware chunking: sections keep their heading path; chunks respect a word cap."""

from __future__ import annotations

import re
from collections.abc import Sequence

from core.errors import ConfigError
from core.models import Chunk, ExtractedDocument, Section

_ATX_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")

_PARA_SPLIT = re.compile(r"\n\s*\n")
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+")
_TABLE_RULE = re.compile(r"^\|(?:\s*:?-{3,}:?\s*\|)+$")


def document_to_chunks(
    doc_id: str, document: ExtractedDocument, *, max_words: int = 180, overlap_words: int = 30
) -> list[Chunk]:
    """Split a document into chunks of at most ``max_words`` words.

    Each section is chunked on its own so a chunk never straddles two headings; paragraphs are
    packed whole where they fit, long paragraphs split at sentence ends, over-long sentences at
    word boundaries. Consecutive chunks of one section share ``overlap_words`` words.
    """
    if max_words <= 0:
        raise ConfigError(f"max_words must be greater than 0. Currently it is {max_words}.")
    if not 0 <= overlap_words < max_words:
        raise ConfigError(
            f"overlap_words must be in [0, max_words). Currently it is {overlap_words} "
            f"with max_words={max_words}."
        )
    chunks: list[Chunk] = []
    for section in document.sections:
        for text in section_to_texts(section, max_words=max_words, overlap_words=overlap_words):
            index = len(chunks)
            chunks.append(
                Chunk(
                    chunk_id=f"{doc_id}:{index}",
                    doc_id=doc_id,
                    chunk_index=index,
                    text=text,
                    heading_path=section.heading_path,
                    location=section.location,
                )
            )
    return chunks


def section_to_texts(section: Section, *, max_words: int, overlap_words: int) -> list[str]:
    """The chunk texts of one section.

    A Markdown table too long for one chunk is split between rows, and every part after the
    first starts with the table's header and separator rows again (no overlap words), so a row
    never loses the names of its columns (CSV and XLSX sheets arrive as such tables).
    """
    pieces: list[tuple[list[str], bool]] = []  # (words <= max_words, starts a table part)
    for para in _PARA_SPLIT.split(section.text):
        words = para.split()
        if not words:
            continue
        if len(words) <= max_words:
            pieces.append((words, False))
            continue
        table = _table_parts(para, max_words)
        if table:
            pieces.extend((part, n > 0) for n, part in enumerate(table))
            continue
        for sentence in _SENTENCE_SPLIT.split(para.strip()):
            sw = sentence.split()
            pieces.extend((sw[i : i + max_words], False) for i in range(0, len(sw), max_words))

    texts: list[str] = []
    current: list[str] = []
    fresh = 0  # words in `current` that are not overlap carried from the previous chunk
    for piece, restarts in pieces:
        if current and (restarts or len(current) + len(piece) > max_words):
            texts.append(" ".join(current))
            carry = current[-overlap_words:] if overlap_words and not restarts else []
            if len(carry) + len(piece) > max_words:
                carry = carry[len(carry) + len(piece) - max_words :]
            current, fresh = list(carry), 0
        current.extend(piece)
        fresh += len(piece)
    if current and fresh:
        texts.append(" ".join(current))
    return texts


def _table_parts(para: str, max_words: int) -> list[list[str]] | None:
    """A Markdown table split between rows into parts of at most ``max_words`` words, each
    part after the first led by the header rows; None when ``para`` is not such a table."""
    lines = [line.strip() for line in para.strip().splitlines()]
    if (
        len(lines) < 3
        or not all(line.startswith("|") for line in lines)
        or not _TABLE_RULE.match(lines[1])
    ):
        return None
    header = lines[0].split() + lines[1].split()
    if len(header) >= max_words // 2:  # a header this wide leaves no room for rows
        return None
    parts: list[list[str]] = []
    current = list(header)
    for row in lines[2:]:
        words = row.split()
        if len(current) + len(words) > max_words and len(current) > len(header):
            parts.append(current)
            current = list(header)
        room = max_words - len(header)
        for i in range(0, len(words), room):  # a row longer than a chunk is cut, header kept
            if i and len(current) > len(header):
                parts.append(current)
                current = list(header)
            current.extend(words[i : i + room])
    parts.append(current)
    return parts


def markdown_to_sections(text: str, *, title: str) -> list[Section]:
    """Split Markdown into sections at ATX headings (``#`` .. ``######``), keeping the path.

    Text before the first heading sits under ``title``. Used for content that arrives as text
    (a reviewer's edit), not as a file.
    """
    sections: list[Section] = []
    path: list[tuple[int, str]] = []
    lines: list[str] = []

    def flush() -> None:
        body = "\n".join(lines).strip()
        if body:
            heading = tuple(h for _, h in path) or (title,)
            sections.append(Section(heading, body))
        lines.clear()

    for line in text.splitlines():
        match = _ATX_HEADING.match(line)
        if match:
            flush()
            level = len(match.group(1))
            path = [(lvl, h) for lvl, h in path if lvl < level] + [(level, match.group(2))]
        else:
            lines.append(line)
    flush()
    if not sections and path:  # headings only: keep them as text so nothing is lost
        sections.append(Section((title,), "\n".join(h for _, h in path)))
    return sections


def join_chunks(texts: Sequence[str], max_overlap_words: int = 64) -> str:
    """Rebuild a text from consecutive chunks, dropping the words each repeats from the last."""
    words: list[str] = []
    for text in texts:
        new = text.split()
        overlap = 0
        for n in range(min(max_overlap_words, len(words), len(new)), 0, -1):
            if words[-n:] == new[:n]:
                overlap = n
                break
        words.extend(new[overlap:])
    return " ".join(words)
