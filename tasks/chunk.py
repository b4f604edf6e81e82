"""Structure-aware chunking: sections keep their heading path; chunks respect a word cap."""

from __future__ import annotations

import re

from kbflow.errors import ConfigError
from kbflow.models import Chunk, ExtractedDocument, Section

_ATX_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")

_PARA_SPLIT = re.compile(r"\n\s*\n")
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+")


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
    """The chunk texts of one section."""
    pieces: list[list[str]] = []  # word lists, each at most max_words long
    for para in _PARA_SPLIT.split(section.text):
        words = para.split()
        if not words:
            continue
        if len(words) <= max_words:
            pieces.append(words)
            continue
        for sentence in _SENTENCE_SPLIT.split(para.strip()):
            sw = sentence.split()
            pieces.extend(sw[i : i + max_words] for i in range(0, len(sw), max_words))

    texts: list[str] = []
    current: list[str] = []
    fresh = 0  # words in `current` that are not overlap carried from the previous chunk
    for piece in pieces:
        if current and len(current) + len(piece) > max_words:
            texts.append(" ".join(current))
            carry = current[-overlap_words:] if overlap_words else []
            if len(carry) + len(piece) > max_words:
                carry = carry[len(carry) + len(piece) - max_words :]
            current, fresh = list(carry), 0
        current.extend(piece)
        fresh += len(piece)
    if current and fresh:
        texts.append(" ".join(current))
    return texts


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
