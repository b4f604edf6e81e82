"""Citation tags in a document's text and the Citations footer that lists them.

Research drafts cite their sources inline with tags (``[doc:<id>]``, ``[url:<url>]``,
``[search:<query>]``) and end with a footer::

    ---
    ## Citations
    - [doc:3f2a…] Brand brief.pdf
    - [url:https://acme.example/] Acme homepage

The footer is metadata, not knowledge: `split_citation_footer` takes it off a document before
it is chunked (so it is never embedded, searched or served as a chunk) and returns its entries
as `SourceRef`s, which the registry keeps with the document. `cited_sources` resolves the tags
in a served text from the citing document's own entries, and nothing else: a tag never leads
to a lookup of the id it names, so it cannot reveal another document (of any status, or of
another org) beyond what the citing document itself says.

A line an account manager added in an edit without citing anything is tagged as hers
(``[am:<user>/<date>]``, see `added_by`): it has no source, and says so, wherever its
document's sources are shown.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from core.models import ExtractedDocument, SourceRef

CITE_OPEN = re.compile(r"\[(?:doc|url|search|am):")
"""The opening of a citation tag; its id runs to the closing bracket (see `cite_ids_in`)."""

FOOTER = "---\n## Citations\n"
"""How a draft's footer starts (then one ``- [<id>] <title>`` line per cited id)."""

FOOTER_HEADING = "Citations"

MAX_TITLE_CHARS = 200

AM_KIND = "am"
"""The citation kind of a line an account manager added without a source (`added_by`)."""

_FOOTER_LINE = re.compile(r"^\s*[-*+]\s+\[((?:doc|url|search|am):.+?)\](?:\s+(.*?))?\s*$")
_RULE = re.compile(r"^\s*(?:-{3,}|\*{3,}|_{3,})\s*$")
_WEB = re.compile(r"^https?://[^\s<>\"']+$")


def cite_ids_in(text: str, known: Iterable[str] = ()) -> list[str]:
    """Every cited id in ``text``, in order.

    Ids may themselves contain brackets (URLs, search queries), so at each opening the longest
    ``known`` id followed by ``]`` wins; an unknown id runs to the next ``]``.
    """
    ids = frozenset(known)
    found: list[str] = []
    for match in CITE_OPEN.finditer(text):
        rest = text[match.start() + 1 :]
        hits = [cid for cid in ids if rest.startswith(cid + "]")]
        if hits:
            found.append(max(hits, key=len))
        else:
            end = rest.find("]")
            found.append(rest if end < 0 else rest[:end])
    return found


def footer_entries(text: str) -> list[tuple[str, str]] | None:
    """The ``(id, title)`` of each ``- [<id>] <title>`` line of a footer's body, or None when
    a non-blank line is not such an entry (or there is none)."""
    entries: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _FOOTER_LINE.match(line)
        if match is None:
            return None
        entries.append((match.group(1), match.group(2) or ""))
    return entries or None


def split_citation_footer(
    document: ExtractedDocument, uris: Mapping[str, str] | None = None
) -> tuple[ExtractedDocument, tuple[SourceRef, ...]]:
    """``document`` without its Citations footer, and the footer's entries.

    The footer is the document's last section when its heading is "Citations" and every line
    of it is a ``- [<id>] <title>`` entry; the rule (``---``) that ends the section before it
    goes too. A document without one comes back as it is, with no entries.

    Args:
        uris: known URIs by cited id (the research corpus's); a ``url:`` id with an http(s)
            URL is its own URI.
    """
    if not document.sections:
        return document, ()
    last = document.sections[-1]
    if not last.heading_path or last.heading_path[-1].strip().casefold() != "citations":
        return document, ()
    entries = footer_entries(last.text)
    if entries is None:
        return document, ()
    sections = list(document.sections[:-1])
    if sections:
        lines = sections[-1].text.rstrip().splitlines()
        while lines and (_RULE.match(lines[-1]) or not lines[-1].strip()):
            lines.pop()
        if lines:
            sections[-1] = replace(sections[-1], text="\n".join(lines))
        else:
            sections.pop()
    refs = source_refs(entries, uris)
    return replace(document, sections=tuple(sections)), refs


def source_refs(
    entries: Iterable[tuple[str, str]], uris: Mapping[str, str] | None = None
) -> tuple[SourceRef, ...]:
    """One `SourceRef` per distinct id (the first entry wins), its title cleaned and bounded."""
    refs: dict[str, SourceRef] = {}
    for cite_id, title in entries:
        if cite_id in refs:
            continue
        clean = " ".join(title.split())[:MAX_TITLE_CHARS] or _plain_title(cite_id)
        refs[cite_id] = SourceRef(cite_id, clean, _uri(cite_id, uris or {}))
    return tuple(refs.values())


def cited_sources(text: str, refs: Sequence[SourceRef]) -> list[SourceRef]:
    """The sources the tags in ``text`` cite, in order of first citation, from ``refs`` (the
    citing document's own entries). A ``url:`` or ``search:`` tag the entries lack is read
    from the tag itself; a ``doc:`` tag they lack is left out: ids are never looked up (and
    so is an ``am:`` one: only an edit records who added a line)."""
    known = {r.cite_id: r for r in refs}
    found: dict[str, SourceRef] = {}
    for cite_id in cite_ids_in(text, known):
        if cite_id in found:
            continue
        ref = known.get(cite_id) or _self_evident(cite_id)
        if ref is not None:
            found[cite_id] = ref
    return list(found.values())


def with_titles(text: str, sources: Iterable[SourceRef]) -> str:
    """``text`` with each resolved tag replaced by its source's title (``[Brand brief.pdf]``),
    for people to read; agents get the tags and the sources list instead."""
    for ref in sorted(sources, key=lambda r: -len(r.cite_id)):
        text = text.replace(ref.tag, f"[{ref.title}]")
    return text


def render_footer(refs: Sequence[SourceRef]) -> str:
    """The Citations footer for ``refs`` (empty without any), as drafts end with it."""
    if not refs:
        return ""
    return FOOTER + "".join(f"- {r.tag} {r.title}\n" for r in refs)


def added_by(user_id: str, on: dt.date) -> SourceRef:
    """What a line ``user_id`` added in an edit of ``on`` without a citation cites: her, not a
    source (``[am:amy/2026-12-07]``, titled "added by amy on 2026-12-07")."""
    return SourceRef(f"{AM_KIND}:{user_id}/{on.isoformat()}", _added_title(user_id, on.isoformat()))


def added_by_title(cite_id: str) -> str | None:
    """The title of an ``am:`` citation ("added by amy on 2026-12-07"), None for another."""
    kind, _, value = cite_id.partition(":")
    user, _, day = value.rpartition("/")
    return _added_title(user, day) if kind == AM_KIND and user and day else None


def _added_title(user_id: str, day: str) -> str:
    return f"added by {user_id} on {day}"


def _plain_title(cite_id: str) -> str:
    kind, _, value = cite_id.partition(":")
    if kind == AM_KIND:
        return added_by_title(cite_id) or value
    return f"Web search: {value}" if kind == "search" else value


def _uri(cite_id: str, uris: Mapping[str, str]) -> str | None:
    known = uris.get(cite_id)
    if known:
        return known
    kind, _, value = cite_id.partition(":")
    return value if kind == "url" and _WEB.match(value) else None


def _self_evident(cite_id: str) -> SourceRef | None:
    kind, _, value = cite_id.partition(":")
    if kind == "url" and _WEB.match(value):
        return SourceRef(cite_id, value, value)
    if kind == "search" and value.strip():
        return SourceRef(cite_id, _plain_title(cite_id)[:MAX_TITLE_CHARS], None)
    return None
