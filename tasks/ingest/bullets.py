"""Bullet glyphs at the start of a list item, as Markdown's "- ".

Word and PowerPoint draw bullets with symbol fonts, and a PDF's text layer often says so
badly: a Symbol-font bullet comes out as a private-use code point (U+F0B7; Wingdings' square,
arrow and tick as U+F0A7, U+F0D8, U+F0FC), as a middle dot (Symbol's 0xB7 read as Latin-1), or
as "∞" (macOS Word writes its bullet as SymbolMT code 0xA5 under a MacRoman encoding, where
0xA5 is "•"; Docling's parser reads the code in Symbol's own encoding, where 0xA5 is "∞").
A glyph is only rewritten at the start of a line: the same character inside a sentence stays.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence

from core.models import Section

# Glyphs that are bullets whenever they open a line: nobody starts a sentence with them.
_BULLETS = "•◦▪▫●○■‣⁃∙➢➤►▸▹❖" + "\uf021-\uf0ff"
# Glyphs that open a line for other reasons too ("∞ as n grows", "· 3"): bullets only in a
# run of items, each opening a line and followed by a word that is not lower-case.
_AMBIGUOUS = "∞·"

_BULLET_START = re.compile(rf"^(\s*)[{_BULLETS}][ \t\u00a0]*(?=\S)")
_AMBIGUOUS_START = re.compile(rf"^(\s*)([{_AMBIGUOUS}])[ \t\u00a0]+(?=\S)")

BULLET_GLYPHS: str = _BULLETS + _AMBIGUOUS
"""A regex character class body (ranges included) of every glyph rewritten here."""


def strip_bullet(item: str) -> str:
    """A list item's text without a bullet glyph its source left in front of it (the item is
    already a list item, so the glyph, ambiguous or not, only duplicates the marker)."""
    return re.sub(rf"^\s*[{BULLET_GLYPHS}][ \t\u00a0]*(?=\S)", "", item)


def bullets_to_markdown(lines: Sequence[str]) -> list[str]:
    """``lines`` (lines or paragraphs, in reading order) with a bullet glyph opening a line
    rewritten as "- ", keeping the line's indentation.

    "•", "▪", "●", "◦", private-use symbol-font glyphs and the like are always bullets there.
    "∞" and "·" are only when at least two lines open with the same one, each followed by a
    word that does not start lower-case: a list, not a formula wrapped onto a new line.
    """
    starts = Counter(glyph for line in lines if (glyph := _ambiguous_bullet(line)))
    listed = {glyph for glyph, count in starts.items() if count >= 2}
    out: list[str] = []
    for line in lines:
        line = _BULLET_START.sub(r"\1- ", line, count=1)
        glyph = _ambiguous_bullet(line)
        if glyph is not None and glyph in listed:
            line = _AMBIGUOUS_START.sub(r"\1- ", line, count=1)
        out.append(line)
    return out


def _ambiguous_bullet(line: str) -> str | None:
    """The ambiguous glyph opening ``line`` as a bullet would, if any."""
    m = _AMBIGUOUS_START.match(line)
    return m.group(2) if m is not None and not line[m.end()].islower() else None


def sections_bullets_to_markdown(sections: Sequence[Section]) -> list[Section]:
    """`bullets_to_markdown` over every line of a document's sections at once, so a list of
    "∞" items counts as one even when it runs over pages or Docling gave each item alone."""
    lines = [section.text.split("\n") for section in sections]
    fixed = iter(bullets_to_markdown([line for own in lines for line in own]))
    return [
        dataclasses.replace(section, text="\n".join(next(fixed) for _ in own))
        for section, own in zip(sections, lines, strict=True)
    ]
