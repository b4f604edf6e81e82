"""Who said a line that cites nothing: an edit's new uncited lines are the editor's.

A draft that cites its sources is read line by line as "this, from there". When an account
manager edits it and adds a line without a citation tag, that line has no source; served as it
is, it would read as if it had one. So the edit tags each such line as hers
(``[am:amy/2026-12-07]``, `tasks.text.citations.added_by`) and the document cites her among its
sources: the inbox lists "added by amy on 2026-12-07", and a search hit's sources name her.

Only lines the edit added count (a line the document already had, cited or not, is left as
it is), only lines that say something (headings, rules, table separator rows, blank lines and
code fences do not), and only in a document that cited sources before the edit: where no line
claims a source, none can be mistaken for sourced.
"""

from __future__ import annotations

import datetime as dt
import re

from core.models import SourceRef
from tasks.text.citations import CITE_OPEN, added_by

_HEADING = re.compile(r"^#{1,6}(?:\s|$)")
_RULE = re.compile(r"^(?:-{3,}|\*{3,}|_{3,})$")
_TABLE_RULE = re.compile(r"^\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?$")
_FENCE = re.compile(r"^(?:```|~~~)")
_MARKUP_ONLY = re.compile(r"^(?:(?:[>*+|-]|\d+[.)])\s*)*$")
_ITEM = re.compile(r"^(?:>\s*)*(?:[-*+]|\d+[.)])\s")


def _key(line: str) -> str:
    return " ".join(line.split())


def attribute_added_lines(
    before: str, after: str, *, user_id: str, on: dt.date
) -> tuple[str, SourceRef | None]:
    """``after`` (an edit of ``before``) with each line it added without a citation tagged as
    ``user_id``'s of ``on``, and the citation those tags name (None when no line was tagged).

    A paragraph or list item that runs over several lines is one line here (a tag on any of
    them cites it all; the tag goes at its end); a table row gets the tag in its last cell.
    """
    if not CITE_OPEN.search(before):
        return after, None
    had = {_key(line) for line in before.splitlines()}
    ref = added_by(user_id, on)
    lines = after.splitlines(keepends=True)
    tagged = False
    for block in _blocks(lines):
        texts = [lines[i].strip() for i in block]
        if any(CITE_OPEN.search(t) for t in texts) or all(_key(t) in had for t in texts):
            continue
        last = block[-1]
        body = lines[last].rstrip("\r\n")
        lines[last] = _tagged(body.rstrip(), ref.tag) + lines[last][len(body) :]
        tagged = True
    return "".join(lines), ref if tagged else None


def _blocks(lines: list[str]) -> list[list[int]]:
    """The indexes of the lines that say something, grouped into what one tag would cite: a
    paragraph or a list item with its continuation lines, or one table row. Headings, rules,
    table headers and separators, blank lines and fenced code say nothing here."""
    blocks: list[list[int]] = []
    fenced = False
    open_block = False  # the last line began or continued a paragraph or list item
    for i, line in enumerate(lines):
        text = line.strip()
        if _FENCE.match(text):
            fenced, open_block = not fenced, False
            continue
        if fenced or not _says_something(text):
            open_block = False
            continue
        if text.startswith("|"):
            following = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if not _TABLE_RULE.match(following):  # a header row names columns, says nothing
                blocks.append([i])
            open_block = False
        elif open_block and not _ITEM.match(text):
            blocks[-1].append(i)
        else:
            blocks.append([i])
            open_block = True
    return blocks


def _says_something(text: str) -> bool:
    return not (
        not text
        or _HEADING.match(text)
        or _RULE.match(text)
        or _TABLE_RULE.match(text)
        or _MARKUP_ONLY.match(text)
    )


def _tagged(line: str, tag: str) -> str:
    if line.lstrip().startswith("|") and line.endswith("|") and len(line.strip()) > 1:
        return f"{line[:-1].rstrip()} {tag} |"
    return f"{line} {tag}"
