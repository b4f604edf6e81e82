"""A small website on 127.0.0.1 for the ``website`` source tests (the ``site`` fixture of
`tests/tasks/sources/conftest.py`): ETags and 304s, a robots.txt, forced answers and redirects,
a log of what was asked for; and the helpers that walk it through the connector."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from core.settings import Settings
from tasks.sources import website
from tasks.sources.base import Item, Limits, Prior

SETTINGS = Settings(sources_test_allow_loopback=True, sources_fetch_timeout_s=5)

PAGES = {
    "robots.txt": "User-agent: *\nDisallow: /private.html\n",
    "index.html": (
        '<html><body><a href="/a.html">A</a> <a href="b.html#part">B</a> '
        '<a href="/private.html">private</a> <a href="https://elsewhere.example/x">away</a> '
        '<a href="/broken.html">broken</a> <a href="doc.txt">notes</a> '
        '<a href="mailto:x@example.com">mail</a></body></html>'
    ),
    "a.html": '<html><body><a href="/c.html">C</a> <a href="/">home</a></body></html>',
    "b.html": "<html><body>B page</body></html>",
    "c.html": '<html><body>C page <a href="/d.html">D</a></body></html>',
    "d.html": "<html><body>D page</body></html>",
    "private.html": "<html><body>secret</body></html>",
    "doc.txt": "plain notes",
    "broken.html": "<html><body>fails when a test says so</body></html>",
}
# Enough for robots.txt, the home page and a.html, not for b.html after them.
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".txt": "text/plain", ".xml": "text/xml"}


@dataclass
class Site:
    """The served folder, what the server answered per path, and answers to force."""

    root: Path
    port: int = 0
    log: list[tuple[str, int, bool]] = field(default_factory=list)  # (path, status, conditional)
    status: dict[str, int] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.base}/{path}"

    def write(self, path: str, text: str) -> None:
        (self.root / path).write_text(text)

    def requested(self, path: str) -> list[tuple[int, bool]]:
        return [(status, cond) for p, status, cond in self.log if p == "/" + path]


@contextlib.contextmanager
def serve_site(root: Path) -> Iterator[Site]:
    """Serve ``root``, written with `PAGES`, on 127.0.0.1 until the block ends."""
    for name, text in PAGES.items():
        (root / name).write_text(text)
    served = Site(root)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            conditional = "If-None-Match" in self.headers
            if path in served.status:
                return self._answer(path, served.status[path], conditional, b"failing")
            if path in served.redirects:
                served.log.append((path, 302, conditional))
                self.send_response(302)
                self.send_header("Location", served.redirects[path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            file = served.root / (path.lstrip("/") or "index.html")
            if not file.is_file():
                return self._answer(path, 404, conditional, b"not found")
            body = file.read_bytes()
            etag = '"' + hashlib.sha1(body).hexdigest()[:12] + '"'
            if self.headers.get("If-None-Match") == etag:
                return self._answer(path, 304, conditional, b"", etag)
            return self._answer(path, 200, conditional, body, etag, file.suffix)

        def _answer(
            self,
            path: str,
            status: int,
            conditional: bool,
            body: bytes,
            etag: str | None = None,
            suffix: str = ".txt",
        ) -> None:
            served.log.append((path, status, conditional))
            self.send_response(status)
            if etag:
                self.send_header("ETag", etag)
            if status != 304:
                self.send_header("Content-Type", CONTENT_TYPES.get(suffix, "text/plain"))
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    served.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()


def walk(
    config: dict[str, Any],
    prior: dict[str, Prior] | None = None,
    *,
    limits: Limits | None = None,
    settings: Settings = SETTINGS,
    own_transports: bool = False,
) -> tuple[dict[str, Item], bool]:
    """Run one walk; the items by key and ``complete``. One transport serves the walk (a fresh
    one per fetch, the default, costs ~20 ms each in TLS setup) unless ``own_transports``."""
    if own_transports:
        return _walk(config, prior, limits, settings, None)
    with httpx.HTTPTransport(retries=0) as transport:
        return _walk(config, prior, limits, settings, transport)


def _walk(
    config: dict[str, Any],
    prior: dict[str, Prior] | None,
    limits: Limits | None,
    settings: Settings,
    transport: httpx.BaseTransport | None,
) -> tuple[dict[str, Item], bool]:
    conn = website.connector(config, limits or Limits(), settings=settings, transport=transport)
    items: dict[str, Item] = {}
    for item in conn.items(prior or {}):
        assert item.key not in items, f"{item.key} listed twice"
        items[item.key] = item
    return items, conn.complete


def prior_of(items: dict[str, Item]) -> dict[str, Prior]:
    """What the sync records of a walk's items (failed ones have no content)."""
    return {
        key: Prior(
            version=item.version,
            content_hash=hashlib.sha256(item.data).hexdigest() if item.data is not None else None,
            meta=item.meta,
        )
        for key, item in items.items()
    }


def sitemap(site: Site, *paths: str, extra: str = "") -> str:
    urls = "".join(
        f"<url><loc>{site.url(p)}</loc><lastmod>2024-05-0{i + 1}</lastmod></url>"
        for i, p in enumerate(paths)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}{extra}</urlset>'
    )
