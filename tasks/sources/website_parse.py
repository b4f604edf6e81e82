"""What the ``website`` kind reads out of a site's answers: URLs in one spelling, a page's
links, a sitemap's entries, and the file name an item goes by. Pure functions: no fetching.

- **URLs** (`normalise`): joined to their base by `urllib.parse` and spelled one way (RFC 3986:
  lower-case scheme and host, no default port, no fragment, dot segments resolved by yarl,
  unsafe characters percent-encoded; an escape already there is kept as it is, and so are empty
  path segments: ``/a//b`` is another page than ``/a/b``).
- **Links** (`page_links`): ``<a href>`` and ``<area href>`` in document order, the first
  ``<base href>`` and a robots ``<meta>`` saying ``nofollow``, read by lxml's HTML parser as a
  stream of tags (no tree is built, so neither a deep nor a huge page stops it early; a
  malformed page yields what its tags say).
- **Sitemaps** (`parse_sitemap`): a ``sitemap.xml`` (gzipped or not) read by `lxml.etree` with a
  parser that expands no entity, loads no DTD and reaches no file or network (every external
  reference resolves to nothing), with libxml2's size limits on (``huge_tree`` off). A sitemap
  that declares entities (a billion laughs, an external entity) is refused: a sitemap never
  needs one.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import posixpath
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import yarl
from lxml import etree

from tasks.sources.base import SourceError

_DEFAULT_PORTS = {"http": 80, "https": 443}
_ROOT = yarl.URL("http://h/")  # a base for resolving a path alone
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_MAX_VERSION = 300  # the registry's version column
_MAX_NAME = 120

# Suffixes the extractors read (tasks.ingest.extract.SUPPORTED_SUFFIXES, not imported: heavy).
_DOC_SUFFIXES = frozenset(
    {".md", ".markdown", ".html", ".htm", ".docx", ".pptx", ".xlsx", ".csv", ".pdf", ".txt"}
)
_TYPE_SUFFIXES = {
    "text/html": ".html",
    "application/xhtml+xml": ".html",
    "application/pdf": ".pdf",
    "text/markdown": ".md",
    "text/plain": ".txt",
    "text/csv": ".csv",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ".docx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": ".pptx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": ".xlsx",
}
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


# -- URLs ----------------------------------------------------------------------------------------


def normalise(href: str, *, base: str | None = None) -> str | None:
    """An absolute http(s) URL in one spelling (the item key), or None when ``href`` is not
    one (``mailto:``, ``javascript:``, a bad port) or carries credentials."""
    href = href.strip()
    if not href:
        return None
    try:
        split = urllib.parse.urlsplit(urllib.parse.urljoin(base, href) if base else href)
        port = split.port
        path = urllib.parse.quote(_without_dot_segments(split.path or "/"), safe=_PATH_SAFE)
        query = urllib.parse.quote(split.query, safe=_PATH_SAFE + "?")
    except ValueError:  # a bad port, or a character no URL holds (a lone surrogate)
        return None
    scheme = split.scheme.lower()
    host = split.hostname
    if scheme not in _DEFAULT_PORTS or not host or "@" in split.netloc:
        return None
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port in (None, _DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    return urllib.parse.urlunsplit((scheme, netloc, path, query, ""))


def _without_dot_segments(path: str) -> str:
    """``path`` with its ``.`` and ``..`` segments resolved (RFC 3986 §5.2.4) by yarl's reference
    resolution, spelled as it was (``encoded=True``). The ``/.`` in front keeps a path that starts
    with ``//`` a path (never a host). `urljoin` is not used for this: it takes a last segment's
    ``;…`` for parameters (``/a/.;x`` would lose its ``.``, ``/a;`` its ``;``)."""
    if "." not in path:
        return path
    return _ROOT.join(yarl.URL("/." + path, encoded=True)).raw_path


def origin(url: str) -> tuple[str, str]:
    """A URL's site: scheme and host[:port], the way `normalise` spells them."""
    normal = normalise(url)
    if normal is None:
        return ("", "")
    split = urllib.parse.urlsplit(normal)
    return split.scheme, split.netloc


# -- links ---------------------------------------------------------------------------------------


@dataclass
class Links:
    """What a page says about where to go next."""

    hrefs: list[str] = field(default_factory=list)
    base: str | None = None
    nofollow: bool = False


class _LinkTarget:
    """lxml parser target: collects links from the tags as the parser meets them."""

    def __init__(self) -> None:
        self.found = Links()

    def start(self, tag: str, attrib: Any) -> None:
        href = attrib.get("href")
        if tag in ("a", "area") and href:
            self.found.hrefs.append(href)
        elif tag == "base" and href and self.found.base is None:
            self.found.base = href
        elif tag == "meta" and (attrib.get("name") or "").lower() == "robots":
            self.found.nofollow |= "nofollow" in (attrib.get("content") or "").lower()

    def close(self) -> Links:
        return self.found


def page_links(html: str) -> Links:
    """The links of an HTML page (its text as decoded), in document order.

    A page that breaks the parser half-way gives the links before the break.
    """
    target = _LinkTarget()
    # huge_tree: no tree is built, and an HTML parser expands no entity, so the only limit that
    # applies is the page's own size (max_item_bytes); without it a text node over 10 MB (an
    # inline script) would end the page early.
    parser = etree.HTMLParser(target=target, encoding="utf-8", no_network=True, huge_tree=True)
    with contextlib.suppress(etree.LxmlError, ValueError):  # what came before the fault stands
        etree.fromstring(html.encode("utf-8", "replace"), parser)
    return target.found


# -- sitemaps ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sitemap:
    """A sitemap's kind (``urlset`` or ``sitemapindex``) and its entries: each ``<loc>`` (as
    written, stripped) with its ``<lastmod>``."""

    kind: str
    entries: list[tuple[str, str | None]]


class _NoExternals(etree.Resolver):
    """Every DTD, entity or file a document refers to resolves to nothing: none is read."""

    def resolve(self, system_url: str, public_id: str, context: Any) -> Any:
        return self.resolve_string("", context)


def _sitemap_parser() -> etree.XMLParser:
    parser = etree.XMLParser(
        resolve_entities=False,
        load_dtd=False,
        no_network=True,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
        collect_ids=False,
    )
    parser.resolvers.add(_NoExternals())
    return parser


def parse_sitemap(url: str, data: bytes, cap: int) -> Sitemap:
    """The sitemap in ``data`` (gzipped or not; unzipped at most ``cap`` bytes).

    Raises:
        SourceError: not gzip or XML as it claims, over ``cap`` unzipped, declares entities, or
            is not a ``<urlset>`` or ``<sitemapindex>``.
    """
    try:
        root = etree.fromstring(_gunzipped(url, data, cap), _sitemap_parser())
    except etree.XMLSyntaxError as exc:
        raise SourceError(
            f"the sitemap {url} is not well-formed XML ({exc}): point 'sitemap' at the "
            "site's sitemap.xml, or crawl from a start_url instead"
        ) from exc
    dtd = root.getroottree().docinfo.internalDTD
    if dtd is not None and any(True for _ in dtd.iterentities()):
        raise SourceError(
            f"the sitemap {url} declares XML entities, which no sitemap needs (they are how an "
            "'entity expansion' attack is built); it was not read: point 'sitemap' at the "
            "site's plain sitemap.xml, or crawl from a start_url instead"
        )
    kind = etree.QName(root).localname
    if kind not in ("urlset", "sitemapindex"):
        raise SourceError(
            f"{url} is not a sitemap (its root element is <{kind}>, not <urlset> or "
            "<sitemapindex>): point 'sitemap' at the site's sitemap.xml"
        )
    child = "url" if kind == "urlset" else "sitemap"
    entries = [
        ((entry.findtext("{*}loc") or "").strip(), (entry.findtext("{*}lastmod") or "").strip())
        for entry in root.iterfind(f"{{*}}{child}")
    ]
    return Sitemap(kind, [(loc, lastmod or None) for loc, lastmod in entries])


def _gunzipped(url: str, data: bytes, cap: int) -> bytes:
    """A ``.xml.gz`` sitemap's XML (at most ``cap`` bytes), or ``data`` when not gzipped."""
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as unzipped:
            xml = unzipped.read(cap + 1)
    except (OSError, EOFError) as exc:
        raise SourceError(
            f"the sitemap {url} is not valid gzip ({exc}): fix or re-upload it"
        ) from exc
    if len(xml) > cap:
        raise SourceError(
            f"the sitemap {url} unzips to over {cap:,} bytes: split it into a sitemap index"
        )
    return xml


# -- names and versions --------------------------------------------------------------------------


def file_name(url: str, content_type: str) -> str:
    """A safe file name whose suffix picks the extractor: the URL's own when it is a document
    kind kbflow reads (``report.pdf``), else the content type's, else ``.html``."""
    last = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    stem, suffix = posixpath.splitext(last)
    suffix = suffix.lower()
    if suffix not in _DOC_SUFFIXES:
        stem, suffix = last, _TYPE_SUFFIXES.get(content_type, ".html")
    stem = _UNSAFE_NAME_CHARS.sub("-", stem).strip("-.")[: _MAX_NAME - len(suffix)]
    return f"{stem or 'index'}{suffix}"


def version_token(token: str | None) -> str | None:
    """The version token, hashed when it would not fit the registry's column."""
    if token is None or len(token) <= _MAX_VERSION:
        return token
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()
