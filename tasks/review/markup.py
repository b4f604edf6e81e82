"""A draft as a reviewer reads it in a browser: its Markdown rendered (headings, lists, tables,
links) and sanitised, its citation tags as titled links, and a line diff against the version it
would replace.

Draft text comes from fetched public pages, so it is treated as hostile: markdown-it renders it
with raw HTML off (a ``<script>`` in the text comes out as text), images become their alt text
(no remote image is ever fetched), and nh3 (Ammonia) then keeps only an allow-list of tags and
attributes and only ``http``, ``https`` and ``mailto`` links (``javascript:`` and ``data:`` go),
every link marked ``rel="noopener noreferrer nofollow"``. The inbox's pages add a Content
Security Policy that forbids scripts and remote loads on top (defence in depth).
"""

from __future__ import annotations

import difflib
import html
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import nh3
from markdown_it import MarkdownIt

from core.models import SourceRef
from tasks.text.citations import AM_KIND, added_by_title

_TAG = re.compile(r"\[((?:doc|url|search|am):[^\]\s]+)\]")
_ALLOWED_TAGS = {
    "h1", "h2", "h3", "h4", "h5", "h6", "p", "br", "hr", "blockquote", "pre", "code",
    "em", "strong", "del", "s", "ul", "ol", "li", "table", "thead", "tbody", "tr", "th", "td",
    "a", "span",
}  # fmt: skip
_ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "th": {"style"},
    "td": {"style"},
    "ol": {"start"},
    "span": {"class"},
}
_SAFE_STYLE = {"text-align"}
DIFF_CONTEXT_LINES = 3


def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])

    def image(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        # An image is never loaded: its alt text stands in, marked as an image.
        alt = "".join(child.content for child in tokens[idx].children or [])
        return f'<span class="image">[image: {html.escape(alt or "no description")}]</span>'

    md.add_render_rule("image", image)
    return md


_MD = _markdown()


def sanitize(fragment: str) -> str:
    """``fragment`` with only the allowed tags, attributes and link schemes left."""
    return nh3.clean(
        fragment,
        tags=_ALLOWED_TAGS,
        attributes=_ALLOWED_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
        filter_style_properties=_SAFE_STYLE,
        strip_comments=True,
    )


def render_markdown(text: str) -> str:
    """Markdown as sanitised HTML (headings, lists, tables, links; no raw HTML, no images)."""
    return sanitize(_MD.render(text))


@dataclass(frozen=True)
class Citation:
    """A source a draft cites, as the reviewer sees it: a title and where it leads."""

    tag: str
    title: str
    href: str | None


def _md_text(text: str) -> str:
    """Text safe inside a Markdown link's label."""
    return re.sub(r"([\\\[\]*_`<>])", r"\\\1", " ".join(text.split()))


def _href(uri: str | None) -> str | None:
    if not uri:
        return None
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https") and parts.netloc:
        return quote(uri, safe=":/?#&=%.-_~+@!$,;")
    return None


def cited_doc_ids(text: str) -> list[str]:
    """The kbflow document ids ``text`` cites with ``[doc:<id>]`` tags, in order."""
    found: dict[str, None] = {}
    for match in _TAG.finditer(text):
        kind, _, value = match.group(1).partition(":")
        if kind == "doc":
            found[value] = None
    return list(found)


def citations_of(
    text: str,
    refs: tuple[SourceRef, ...],
    local_href: Callable[[str], str | None],
    titles: Mapping[str, str] | None = None,
) -> list[Citation]:
    """The sources ``text`` cites, in order of first mention: each titled (its footer's
    title, else ``titles`` for kbflow documents, else the tag) and linked to its public URL or,
    for an account manager's input, to ``local_href(doc_id)``. A line an editor added without
    a source cites her (``[am:amy/2026-12-07]``): "added by amy on 2026-12-07", unlinked."""
    known = {ref.cite_id: ref for ref in refs}
    seen: dict[str, Citation] = {}
    for match in _TAG.finditer(text):
        tag = match.group(1)
        if tag in seen:
            continue
        kind, _, value = tag.partition(":")
        ref = known.get(tag)
        title = ref.title if ref and ref.title else (titles or {}).get(value, "")
        href = _href(ref.uri if ref else None)
        if kind == "url":
            href = href or _href(value)
            title = title or (urlsplit(value).netloc or value)
        elif kind == "doc" and href is None:
            href = local_href(value)
        elif kind == "search":
            title = title or f"web search: {value}"
        elif kind == AM_KIND:  # a line the editor added without a source: hers, no link
            href = None
            title = added_by_title(tag) or title
        seen[tag] = Citation(tag, title or tag, href)
    return list(seen.values())


def with_citation_links(text: str, citations: list[Citation]) -> str:
    """``text`` with each ``[doc:…]``/``[url:…]`` tag replaced by a Markdown link to its source
    titled with the source's title (a tag without a link becomes its title in brackets)."""
    by_tag = {c.tag: c for c in citations}

    def link(match: re.Match[str]) -> str:
        found = by_tag.get(match.group(1))
        if found is None:
            return match.group(0)
        label = _md_text(found.title)
        return f"[{label}]({found.href})" if found.href else f"[{label}]"

    return _TAG.sub(link, text)


def render_draft(text: str, citations: list[Citation]) -> str:
    """A draft's Markdown as the page shows it: citations as titled links, sanitised HTML."""
    return render_markdown(with_citation_links(text, citations))


@dataclass(frozen=True)
class DiffLine:
    """One line of a diff: ``kind`` is ``add``, ``del``, ``same`` or ``gap`` (lines left out)."""

    kind: str
    text: str


def line_diff(before: str, after: str, context: int = DIFF_CONTEXT_LINES) -> list[DiffLine]:
    """The lines that change from ``before`` to ``after``, with ``context`` lines around each
    change (a template escapes the text; nothing here is HTML)."""
    old, new = before.splitlines(), after.splitlines()
    lines: list[DiffLine] = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        if lines:
            lines.append(DiffLine("gap", "…"))
        for op, a0, a1, b0, b1 in group:
            if op == "equal":
                lines += [DiffLine("same", line) for line in old[a0:a1]]
                continue
            lines += [DiffLine("del", line) for line in old[a0:a1]]
            lines += [DiffLine("add", line) for line in new[b0:b1]]
    return lines
