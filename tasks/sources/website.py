# Over 500 lines: the sitemap walk, the crawl, robots.txt, conditional fetches and caps: one walk.
"""The ``website`` kind: the pages of one site, listed by its sitemap or found by crawling.

Config (`tasks.sources.configs.website.WebsiteConfig`): exactly one of ``sitemap`` (the URL
of a ``sitemap.xml``, or of a sitemap index whose sitemaps are read one level deep) or
``start_url`` (a page to crawl from, breadth first, along ``<a href>`` links); optional
``max_pages`` (pages fetched per sync, default 500), ``max_bytes`` (bytes read per sync,
robots.txt and sitemaps included, default 200 MB), ``max_depth`` (links followed from the start
URL, default 5), ``user_agent`` and ``trust_lastmod`` (default true).

Every request goes through the research SSRF guard (`tasks.research.fetch.safe_get`): public
addresses only, pinned, bounded in bytes and time (``sources_fetch_timeout_s``). Only pages on the
sitemap's or start URL's own site (scheme, host and port) are taken, and a redirect to another
site is not followed (``safe_get``'s ``follow``: nothing is sent there); robots.txt is honoured,
and a page it disallows is neither fetched nor listed, so the sync withdraws it.

A page the sitemap dates (``<lastmod>``) as it was when last synced is unchanged without a
request (``trust_lastmod: false`` asks the site anyway). Other unchanged pages cost one
conditional request each: the ETag and Last-Modified of the last sync are sent back
(``If-None-Match``, ``If-Modified-Since``) and a 304 is an unchanged item. A crawled
page's links are kept in its ``meta`` so the crawl goes on past a 304, which has no body.

An item's key is its URL, normalised (`tasks.sources.website_parse`: lower-case scheme and
host, no default port, no fragment, dot segments resolved). Pages' links and sitemaps are read
there too (lxml; a sitemap's entities are refused). One page that fails is a failed item and the
walk goes on; a sitemap, start URL or robots.txt that cannot be read stops the sync
(`SourceError`), and a cap that stops the walk early leaves it incomplete, so nothing is
withdrawn.
"""

from __future__ import annotations

import logging
import urllib.parse
import urllib.robotparser
from collections import deque
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from core.errors import UnsafeUrl
from core.settings import Settings
from tasks.research.fetch import (
    FetchError,
    FetchResult,
    RedirectRefused,
    check_url_shape,
    safe_get,
)
from tasks.sources.base import Item, Limits, Prior, SourceError, too_big
from tasks.sources.configs.website import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_PAGES,
    WebsiteConfig,
)
from tasks.sources.website_parse import (
    file_name,
    normalise,
    origin,
    page_links,
    parse_sitemap,
    version_token,
)

logger = logging.getLogger(__name__)

DEFAULT_USER_AGENT = "kbflow-sources/0.1 (+website source; honours robots.txt)"

_ROBOTS_MAX_BYTES = 512_000  # RFC 9309 §2.5: parse at least 500 KiB
_SITEMAP_MAX_BYTES = 50_000_000  # sitemaps.org: at most 50 MB uncompressed
_MAX_LINKS = 5_000  # links kept per page in meta (a 304 page's links come from there)
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})


def check_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config, checked and normalised (`WebsiteConfig`): the URL normalised, the caps filled
    in.

    Raises:
        ConfigError: an unknown key, neither or both of ``sitemap`` / ``start_url``, a URL that
            is not a public http(s) URL, or a cap that is not a positive whole number.
    """
    return WebsiteConfig.check(config).stored()


def connector(
    config: Mapping[str, Any],
    limits: Limits,
    *,
    settings: Settings,
    transport: httpx.BaseTransport | None = None,
) -> WebsiteConnector:
    """A connector for one website source.

    Args:
        config: The source's settings (checked again by `check_config`).
        limits: The source's caps and include/exclude patterns (matched against page URLs).
        settings: ``sources_fetch_timeout_s`` bounds each fetch; ``sources_test_allow_loopback``
            lets tests serve the site from 127.0.0.1.
        transport: The httpx transport every fetch goes through (tests); a fresh one per hop by
            default.
    """
    return WebsiteConnector(check_config(config), limits, settings=settings, transport=transport)


class _Stop(Exception):
    """A cap (``max_bytes``) stopped the walk."""


_GONE = frozenset({404, 410})
"""Answers that say a page is not on the site (any more): it is not listed."""


@dataclass
class _Page:
    """What fetching one page gave: the item to list (None: not listed) and links to follow."""

    item: Item | None
    links: list[str] = field(default_factory=list)
    failed: bool = False
    final_url: str = ""


@dataclass
class _Tally:
    items: int = 0
    pages: int = 0
    unchanged: int = 0
    failed: int = 0
    off_site: int = 0
    disallowed: int = 0


class WebsiteConnector:
    """Walks one website: its sitemap's pages, or the pages a crawl from the start URL reaches.

    ``complete`` is True after a walk that listed everything: no cap hit, no sitemap of an index
    unreadable. It is False until the walk has run to its end.
    """

    complete: bool

    def __init__(
        self,
        config: Mapping[str, Any],
        limits: Limits,
        *,
        settings: Settings,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.complete = False
        self._sitemap: str | None = config.get("sitemap")
        self._start: str = config.get("start_url") or config["sitemap"]
        self._max_pages: int = config.get("max_pages", DEFAULT_MAX_PAGES)
        self._max_bytes: int = config.get("max_bytes", DEFAULT_MAX_BYTES)
        self._max_depth: int = config.get("max_depth", DEFAULT_MAX_DEPTH)
        self._agent: str = config.get("user_agent") or DEFAULT_USER_AGENT
        self._trust_lastmod: bool = bool(config.get("trust_lastmod", True))
        self._limits = limits
        self._timeout_s = settings.sources.sources_fetch_timeout_s
        self._allow_loopback = settings.sources.sources_test_allow_loopback
        self._transport = transport
        self._origin = origin(self._start)
        self._robots: urllib.robotparser.RobotFileParser | None = None
        self._used = 0
        self._tally = _Tally()

    def items(self, prior: Mapping[str, Prior]) -> Iterator[Item]:
        """Each page of the site once, in walk order; ``complete`` is set when the walk ends.

        Raises:
            SourceError: robots.txt, the sitemap or the start URL could not be read, or the URL
                is refused by the SSRF guard (the guard's message says why).
        """
        self.complete = False
        self._used = 0
        self._tally = _Tally()
        try:
            # The configured URL named in the refusal (the address checks follow, per fetch).
            check_url_shape(self._start, allow_loopback=self._allow_loopback)
        except UnsafeUrl as exc:
            raise SourceError(str(exc)) from exc
        self._robots = self._read_robots()
        walk = self._sitemap_walk if self._sitemap else self._crawl
        listed = False
        try:
            listed = yield from walk(prior)
        except _Stop:
            logger.info(
                "website %s: max_bytes (%d) reached; the walk stops", self._start, self._max_bytes
            )
        self.complete = listed
        t = self._tally
        logger.info(
            "website %s: %d item(s) (%d unchanged, %d failed) from %d page fetch(es), %d bytes; "
            "skipped %d off-site link(s) and %d page(s) robots.txt disallows; complete=%s",
            self._start,
            t.items,
            t.unchanged,
            t.failed,
            t.pages,
            self._used,
            t.off_site,
            t.disallowed,
            self.complete,
        )

    # -- the two walks -------------------------------------------------------------------------

    def _sitemap_walk(self, prior: Mapping[str, Prior]) -> Generator[Item, None, bool]:
        """The pages a sitemap (or a sitemap index, one level deep) lists. Returns whether the
        listing was whole and no cap cut the walk short."""
        assert self._sitemap is not None
        whole = True
        kind, entries = self._read_sitemap(self._sitemap)
        if kind == "sitemapindex":
            pages: list[tuple[str, str | None]] = []
            for child, _ in entries:
                try:
                    child_kind, child_entries = self._read_sitemap(child)
                except SourceError as exc:
                    logger.warning("website %s: %s; the walk is incomplete", self._start, exc)
                    whole = False
                    continue
                if child_kind == "sitemapindex":
                    logger.warning(
                        "website %s: sitemap %s is itself an index; only one level of index is "
                        "read, so the walk is incomplete — point 'sitemap' at it directly",
                        self._start,
                        child,
                    )
                    whole = False
                    continue
                pages.extend(child_entries)
        else:
            pages = entries
        listed: set[str] = set()
        for url, lastmod in pages:
            if url in listed or not self._limits.wanted(url):
                continue
            listed.add(url)
            if not self._allowed(url):
                continue
            if self._capped():
                return False
            before = prior.get(url)
            if (
                self._trust_lastmod
                and lastmod
                and before is not None
                and before.content_hash is not None
                and before.meta.get("lastmod") == lastmod
            ):
                # The sitemap says when the page last changed, and that is when it was synced:
                # unchanged, without a request (``trust_lastmod: false`` asks the site anyway).
                name = str(before.meta.get("name") or file_name(url, ""))
                yield self._count(Item(key=url, uri=url, name=name, version=before.version,
                                       unchanged=True, meta=before.meta))  # fmt: skip
                continue
            page = self._fetch_page(url, before, lastmod=lastmod, keep_links=False)
            if page.item is not None:
                yield self._count(page.item)
        return whole

    def _crawl(self, prior: Mapping[str, Prior]) -> Generator[Item, None, bool]:
        """Breadth first from the start URL along same-site links, ``max_depth`` links deep.
        Returns whether the crawl ran out of links before a cap stopped it.

        A page outside ``include`` is still fetched to follow its links (an include pattern
        would otherwise cut the crawl at the start page) but not listed; an ``exclude``d page is
        neither fetched nor followed.
        """
        start = self._start
        if not self._allowed(start):
            raise SourceError(
                f"robots.txt of {self._origin_url()} disallows the start URL {start} for user "
                f"agent {self._agent!r}: ask the site's owner, or crawl from a page it allows"
            )
        queue: deque[tuple[str, int]] = deque([(start, 0)])
        seen = {start}
        while queue:
            url, depth = queue.popleft()
            if self._capped():
                return False
            wanted = self._limits.wanted(url)
            page = self._fetch_page(url, prior.get(url), keep_links=True)
            if url == start and page.failed:
                if page.item is None:
                    raise SourceError(
                        f"could not crawl {start}: it redirects to {page.final_url}, on another "
                        "site, and only one site is synced — set start_url to that URL"
                    )
                raise SourceError(f"could not crawl {start}: {page.item.error}")
            final = normalise(page.final_url) if page.final_url else None
            if final is not None and final != url:
                if final in seen:
                    continue  # redirected to a page this crawl has listed or will list
                seen.add(final)
            if page.item is not None and wanted:
                yield self._count(page.item)
            if depth >= self._max_depth:
                continue
            for link in page.links:
                if link in seen:
                    continue
                seen.add(link)
                if self._excluded(link) or not self._allowed(link):
                    continue
                if depth + 1 >= self._max_depth and not self._limits.wanted(link):
                    continue  # neither listed nor followed: no point fetching it
                queue.append((link, depth + 1))
        return True

    # -- one fetch -----------------------------------------------------------------------------

    def _fetch_page(
        self, url: str, before: Prior | None, *, lastmod: str | None = None, keep_links: bool
    ) -> _Page:
        """Fetch one page, conditionally when the last sync saw it, into an item."""
        self._tally.pages += 1
        old = dict(before.meta) if before is not None else {}
        fallback_name = str(old.get("name") or file_name(url, ""))
        old_links = [str(link) for link in old.get("links") or []]
        headers: dict[str, str] = {}
        if before is not None and before.content_hash is not None:
            # Only a copy the last sync actually stored may be declared current.
            if old.get("etag"):
                headers["If-None-Match"] = str(old["etag"])
            if old.get("last_modified"):
                headers["If-Modified-Since"] = str(old["last_modified"])
        item_cap = self._limits.max_item_bytes
        left = self._max_bytes - self._used
        if left <= 0:
            raise _Stop
        try:
            result = self._get(url, max_bytes=min(item_cap + 1, left), headers=headers)
        except FetchError as exc:
            if exc.status_code in _GONE:
                # Not found, or gone for good: the page is no longer on the site (a sitemap or
                # a link that lags behind). Not listed, so the sync withdraws what it had.
                self._tally.failed += 1
                return _Page(None, failed=True)
            failed = Item(key=url, uri=url, name=fallback_name, error=str(exc), meta=old)
            return _Page(failed, old_links, failed=True)
        except RedirectRefused as exc:
            logger.info(
                "website %s: %s redirects off-site to %s; not followed", self._start, url,
                exc.target,
            )  # fmt: skip
            self._tally.off_site += 1
            return _Page(None, failed=True, final_url=exc.target)
        except UnsafeUrl as exc:
            # The last links known keep a crawl going past a page that failed just now.
            failed = Item(key=url, uri=url, name=fallback_name, error=str(exc), meta=old)
            return _Page(failed, old_links, failed=True)
        self._used += result.bytes_read
        final = result.final_url
        if not self._same_site(final):
            logger.info(
                "website %s: %s redirects off-site to %s; skipped",
                self._start,
                url,
                result.final_url,
            )
            self._tally.off_site += 1
            return _Page(None, failed=True, final_url=final)
        if result.status_code == 304:
            assert before is not None
            item = Item(
                key=url,
                uri=url,
                name=fallback_name,
                version=before.version,
                unchanged=True,
                meta=old,
            )
            return _Page(item, old_links, final_url=final)
        if result.bytes_read > item_cap:
            size = max(_content_length(result) or 0, result.bytes_read)
            failed = Item(
                key=url,
                uri=url,
                name=fallback_name,
                error=too_big(url, size, self._limits),
                meta=old,
            )
            return _Page(failed, old_links, failed=True, final_url=final)
        if result.truncated:
            raise _Stop  # the body outgrew what max_bytes leaves
        content_type = result.content_type.split(";", 1)[0].strip().lower()
        name = file_name(url, content_type)
        etag = result.headers.get("etag")
        last_modified = result.headers.get("last-modified")
        meta: dict[str, Any] = {"etag": etag, "last_modified": last_modified, "name": name}
        if lastmod:
            meta["lastmod"] = lastmod
        links: list[str] = []
        if keep_links and name.endswith((".html", ".htm")) and content_type in _HTML_TYPES | {""}:
            links = self._links(result)
            meta["links"] = links
        item = Item(
            key=url,
            uri=url,
            name=name,
            version=version_token(etag or last_modified or lastmod),
            data=result.content,
            meta=meta,
        )
        return _Page(item, links, final_url=final)

    def _get(
        self, url: str, *, max_bytes: int, headers: Mapping[str, str] | None = None
    ) -> FetchResult:
        return safe_get(
            url,
            max_bytes=max_bytes,
            timeout_s=self._timeout_s,
            transport=self._transport,
            user_agent=self._agent,
            headers=headers,
            allow_loopback=self._allow_loopback,
            follow=self._same_site,  # same site only: nothing is sent to another host
        )

    # -- robots.txt and sitemaps ---------------------------------------------------------------

    def _read_robots(self) -> urllib.robotparser.RobotFileParser | None:
        """The site's robots.txt rules, or None when it has none (a 4xx: everything allowed)."""
        url = f"{self._origin_url()}/robots.txt"
        try:
            result = self._get(url, max_bytes=_ROBOTS_MAX_BYTES)
        except UnsafeUrl as exc:
            raise SourceError(str(exc)) from exc
        except FetchError as exc:
            status = exc.status_code
            if status is not None and 400 <= status < 500 and status != 429:
                return None  # RFC 9309 §2.3.1.3: no robots.txt, no rules
            raise SourceError(
                f"could not read {url}, so the site's crawling rules are unknown ({exc}); "
                "a crawler must treat that as 'disallow all' (RFC 9309) — check that the site "
                "is up and reachable, then sync again"
            ) from exc
        self._used += result.bytes_read
        parser = urllib.robotparser.RobotFileParser(url)
        parser.parse(result.text.splitlines())
        return parser

    def _read_sitemap(self, url: str) -> tuple[str, list[tuple[str, str | None]]]:
        """A sitemap's kind (``urlset`` or ``sitemapindex``) and its same-site, normalised
        ``<loc>`` URLs with their ``<lastmod>``.

        Raises:
            SourceError: it is disallowed, cannot be fetched, is too big or is not a sitemap.
        """
        if not self._allowed(url):
            raise SourceError(
                f"robots.txt of {self._origin_url()} disallows the sitemap {url}: ask the "
                "site's owner, or crawl from a start_url instead"
            )
        cap = min(_SITEMAP_MAX_BYTES, self._max_bytes - self._used)
        if cap <= 0:
            raise SourceError(
                f"no max_bytes left to read the sitemap {url}: raise max_bytes "
                f"(now {self._max_bytes:,})"
            )
        try:
            result = self._get(url, max_bytes=cap)
        except (UnsafeUrl, FetchError) as exc:
            raise SourceError(f"could not read the sitemap {url}: {exc}") from exc
        self._used += result.bytes_read
        if not self._same_site(result.final_url):
            raise SourceError(
                f"the sitemap {url} redirects to another site ({result.final_url}); only one "
                "site is synced — set 'sitemap' to a sitemap on the site itself"
            )
        if result.truncated:
            raise SourceError(
                f"the sitemap {url} is over {cap:,} bytes (the sitemap limit of 50 MB, or what "
                "this source's max_bytes leaves): split it into a sitemap index, or raise max_bytes"
            )
        sitemap = parse_sitemap(url, result.content, cap)
        entries: list[tuple[str, str | None]] = []
        for raw, lastmod in sitemap.entries:
            loc = normalise(raw, base=result.final_url)
            if loc is None:
                continue
            if not self._same_site(loc):
                self._tally.off_site += 1
                continue
            entries.append((loc, lastmod))
        return sitemap.kind, entries

    # -- helpers -------------------------------------------------------------------------------

    def _links(self, result: FetchResult) -> list[str]:
        """The page's same-site links, normalised, in order, once each (``nofollow``: none)."""
        found = page_links(result.text)
        if found.nofollow:
            return []
        base = result.final_url
        if found.base:
            base = urllib.parse.urljoin(base, found.base)
        links: dict[str, None] = {}
        for href in found.hrefs:
            link = normalise(href, base=base)
            if link is None:
                continue
            if not self._same_site(link):
                self._tally.off_site += 1
                continue
            links[link] = None
        return list(links)[:_MAX_LINKS]

    def _allowed(self, url: str) -> bool:
        if self._robots is None or self._robots.can_fetch(self._agent, url):
            return True
        self._tally.disallowed += 1
        return False

    def _excluded(self, url: str) -> bool:
        return not Limits(exclude=self._limits.exclude).wanted(url)

    def _capped(self) -> bool:
        """Whether a cap forbids another page: ``max_pages`` fetched or ``max_items`` listed."""
        if self._tally.pages >= self._max_pages or self._tally.items >= self._limits.max_items:
            logger.info(
                "website %s: stopped at %d page(s) / %d item(s) (max_pages %d, max_items %d)",
                self._start,
                self._tally.pages,
                self._tally.items,
                self._max_pages,
                self._limits.max_items,
            )
            return True
        return False

    def _count(self, item: Item) -> Item:
        self._tally.items += 1
        self._tally.unchanged += item.unchanged
        self._tally.failed += item.error is not None
        return item

    def _same_site(self, url: str) -> bool:
        return origin(url) == self._origin

    def _origin_url(self) -> str:
        scheme, netloc = self._origin
        return f"{scheme}://{netloc}"


def _content_length(result: FetchResult) -> int | None:
    value = result.headers.get("content-length", "")
    return int(value) if value.isdigit() else None
