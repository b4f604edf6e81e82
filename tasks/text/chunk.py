"""Structure-aware chunking: sections keep their heading path; chunks respect a word cap and keep
the text's Markdown shape (list items, table rows and quote lines on their own lines, blank
lines between paragraphs)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from core.errors import ConfigError
from core.models import Chunk, ExtractedDocument, Section

CHUNKER_VERSION = 2
"""Bump with any change to the texts `document_to_chunks` makes of a document: the eval indexes
are keyed on it (`evals.retrieval.index_fingerprint`). 2: line breaks and blank lines kept."""

_ATX_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")

_WORD = re.compile(r"\S+")
# The first word of a line that is a list item, a table row or a block quote.
_STRUCTURED_LINE = re.compile(r"(?:[-*+•]|\d+[.)])$|[|>]")
_TABLE_RULE = re.compile(r"^\|(?:\s*:?-{3,}:?\s*\|)+$")

Token = tuple[str, str]
"""A word and the blank space before it, normalised: ``" "`` within a line, ``"\\n"`` plus the
next line's indentation at a line break, ``"\\n\\n"`` plus indentation between paragraphs."""


def document_to_chunks(
    doc_id: str, document: ExtractedDocument, *, max_words: int = 180, overlap_words: int = 30
) -> list[Chunk]:
    """Split a document into chunks of at most ``max_words`` words.

    Each section is chunked on its own so a chunk never straddles two headings; paragraphs are
    packed whole where they fit, long paragraphs split at sentence ends (a list, quote or
    table-like paragraph first at its lines), over-long sentences at word boundaries.
    Consecutive chunks of one section share ``overlap_words`` words. A chunk keeps the line
    breaks and blank lines between its words (`section_to_texts`).
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

    The words are those of ``section.text`` in order; between two words of a chunk stands a
    space, a line break (with the next line's indentation) or a blank line, as in the text, so
    lists, tables and quotes keep their Markdown. Runs of spaces inside a line become one.

    A Markdown table too long for one chunk is split between rows, and every part after the
    first starts with the table's header and separator rows again (no overlap words), so a row
    never loses the names of its columns (CSV and XLSX sheets arrive as such tables).
    """
    pieces: list[tuple[list[Token], bool]] = []  # (tokens <= max_words, starts a table part)
    for para in _paragraphs(_tokens(section.text)):
        if len(para) <= max_words:
            pieces.append((para, False))
            continue
        table = _table_parts(para, max_words)
        if table:
            pieces.extend((part, n > 0) for n, part in enumerate(table))
            continue
        for unit in _units(para):
            pieces.extend((unit[i : i + max_words], False) for i in range(0, len(unit), max_words))

    texts: list[str] = []
    current: list[Token] = []
    fresh = 0  # words in `current` that are not overlap carried from the previous chunk
    for piece, restarts in pieces:
        if current and (restarts or len(current) + len(piece) > max_words):
            texts.append(_render(current))
            carry = current[-overlap_words:] if overlap_words and not restarts else []
            if len(carry) + len(piece) > max_words:
                carry = carry[len(carry) + len(piece) - max_words :]
            current, fresh = list(carry), 0
        current.extend(piece)
        fresh += len(piece)
    if current and fresh:
        texts.append(_render(current))
    return texts


def _tokens(text: str) -> list[Token]:
    """``text``'s words, each with the (normalised) blank space before it."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    tokens: list[Token] = []
    end = 0
    for match in _WORD.finditer(text):
        tokens.append((_gap(text[end : match.start()]), match.group()))
        end = match.end()
    return tokens


def _gap(space: str) -> str:
    breaks = space.count("\n")
    if not breaks:
        return " "
    indent = "".join(c for c in space[space.rfind("\n") + 1 :] if c in " \t")
    return ("\n\n" if breaks > 1 else "\n") + indent


def _render(tokens: Sequence[Token]) -> str:
    """The text of a run of tokens (the blank space before the first is dropped)."""
    if not tokens:
        return ""
    return tokens[0][1] + "".join(gap + word for gap, word in tokens[1:])


def _split_before(tokens: list[Token], starts: str) -> list[list[Token]]:
    """``tokens`` cut before every word whose gap starts with ``starts``."""
    runs: list[list[Token]] = []
    for token in tokens:
        if not runs or token[0].startswith(starts):
            runs.append([])
        runs[-1].append(token)
    return runs


def _paragraphs(tokens: list[Token]) -> list[list[Token]]:
    return _split_before(tokens, "\n\n")


def _lines(para: list[Token]) -> list[list[Token]]:
    return _split_before(para, "\n")


def _sentences(run: list[Token]) -> list[list[Token]]:
    """``run`` cut after every word that ends a sentence (``.``, ``!`` or ``?``)."""
    out: list[list[Token]] = [[]]
    for token in run:
        out[-1].append(token)
        if token[1][-1] in ".!?":
            out.append([])
    return [s for s in out if s]


def _units(para: list[Token]) -> list[list[Token]]:
    """The smallest pieces a paragraph too long for one chunk is packed from: its sentences;
    for a list, quote or table-like paragraph, its lines first (then each line's sentences), so
    a cut falls between items."""
    lines = _lines(para)
    if len(lines) > 1 and any(_STRUCTURED_LINE.match(line[0][1]) for line in lines):
        return [s for line in lines for s in _sentences(line)]
    return _sentences(para)


def _table_parts(para: list[Token], max_words: int) -> list[list[Token]] | None:
    """A Markdown table split between rows into parts of at most ``max_words`` words, each
    part after the first led by the header rows; None when ``para`` is not such a table."""
    lines = _lines(para)
    if (
        len(lines) < 3
        or not all(line[0][1].startswith("|") for line in lines)
        or not _TABLE_RULE.match(" ".join(word for _, word in lines[1]))
    ):
        return None
    header = lines[0] + lines[1]
    if len(header) >= max_words // 2:  # a header this wide leaves no room for rows
        return None
    parts: list[list[Token]] = []
    current = list(header)
    room = max_words - len(header)
    for row in lines[2:]:
        if len(current) + len(row) > max_words and len(current) > len(header):
            parts.append(current)
            current = list(header)
        for i in range(0, len(row), room):  # a row longer than a chunk is cut, header kept
            if i and len(current) > len(header):
                parts.append(current)
                current = list(header)
            cut = row[i : i + room]
            if len(current) == len(header):  # a part's first row starts on its own line
                cut = [("\n", cut[0][1]), *cut[1:]]
            current.extend(cut)
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
    """Rebuild a text from consecutive chunks, dropping the words each repeats from the last.

    The chunks' line breaks and blank lines are kept. A table part that starts with the header
    rows of the table the text so far ends with continues that table (the repeated header is
    dropped). Chunks that share no words are joined by a blank line, or by a space where the
    first stops mid-sentence and the second goes on in lower case (a sentence cut at the cap).
    """
    out = ""
    words: list[str] = []
    for raw in texts:
        text = raw.strip()
        matches = list(_WORD.finditer(text))
        if not matches:
            continue
        new = [m.group() for m in matches]
        if not words:
            out, words = text, new
            continue
        head = _table_head(text)
        if head is not None and _ends_with_table(out, text[:head]):
            rest = text[head:]
            out += "\n" + rest
            words.extend(rest.split())
            continue
        overlap = 0
        for n in range(min(max_overlap_words, len(words), len(new)), 0, -1):
            if words[-n:] == new[:n]:
                overlap = n
                break
        if overlap:
            out += text[matches[overlap - 1].end() :]
        elif out[-1] not in ".!?:;|)" and text[0].islower():
            out += " " + text
        else:
            out += "\n\n" + text
        words.extend(new[overlap:])
    return out


def _table_head(text: str) -> int | None:
    """Where the rows start when ``text`` opens with a table's header and separator rows."""
    first = text.find("\n")
    second = text.find("\n", first + 1)
    if first < 0 or second < 0 or not text.startswith("|"):
        return None
    return second + 1 if _TABLE_RULE.match(text[first + 1 : second].strip()) else None


def _ends_with_table(text: str, head: str) -> bool:
    """Whether ``text`` ends with a table (lines starting with ``|``) headed by ``head``."""
    rows: list[str] = []
    end = len(text)
    while end > 0:  # walk back over the trailing table's rows
        start = text.rfind("\n", 0, end) + 1
        line = text[start:end].strip()
        if not line.startswith("|"):
            break
        rows.append(" ".join(line.split()))
        end = start - 1
    want = [" ".join(line.split()) for line in head.strip().split("\n")]
    return rows[::-1][: len(want)] == want


def chunks_to_markdown(
    chunks: Sequence[tuple[Sequence[str], str]], max_overlap_words: int = 64
) -> str:
    """Markdown from ``(heading_path, text)`` chunks in order: a heading line for each level
    that changes (level = depth in the path), then the section's chunks joined without the
    words each repeats from the last.

    Chunks keep their line breaks and blank lines, so lists, tables and quotes come back as
    Markdown (`join_chunks`); what the chunker dropped stays lost: heading levels skipped in the
    source, runs of spaces inside a line.
    """
    blocks: list[str] = []
    previous: tuple[str, ...] = ()
    group: list[str] = []

    def flush() -> None:
        text = join_chunks(group, max_overlap_words=max_overlap_words)
        if text:
            blocks.append(text)
        group.clear()

    for path, text in chunks:
        heading = tuple(path)
        if heading != previous or not group:
            flush()
            same = 0
            while same < min(len(heading), len(previous)) and heading[same] == previous[same]:
                same += 1
            if heading != previous:
                blocks.extend(
                    f"{'#' * min(level + 1, 6)} {heading[level]}"
                    for level in range(same, len(heading))
                )
            previous = heading
        group.append(text)
    flush()
    return "\n\n".join(blocks) + "\n" if blocks else ""
