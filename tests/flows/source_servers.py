"""The real sources the sync tests sync from, each started by the test on loopback: a folder,
an S3 API (moto's server), a website (a ThreadingHTTPServer with ETags, a sitemap and
robots.txt), a REST API (JSON pages with a next link and a bearer token) and a SQL table
(PostgreSQL in the PostgreSQL pass, else SQLite).

Each `Kind` adds a source over its server and changes the source's items by key (``put``,
``delete``); ``reads()`` counts the item bodies the source served so far (None where a body
is not read apart from the listing).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ON_POSTGRES, _reset, _worker_database_url, free_port

KINDS = ("folder", "s3", "website", "rest", "sql")
TOKEN_ENV = "KBFLOW_TEST_REST_TOKEN"
SQL_URL_ENV = "KBFLOW_TEST_SOURCE_SQL_URL"
SYNC_ORG = "syncco"
"""The org the sync tests add their sources to: the one the operator's list
(``KBFLOW_SOURCES_SECRET_ENV``) lets name ``TOKEN_ENV`` and ``SQL_URL_ENV``."""
LOOPBACK = {"KBFLOW_SOURCES_TEST_ALLOW_LOOPBACK": "1"}
SECRET_ENV = "KBFLOW_SOURCES_SECRET_ENV"


@dataclass
class Kind:
    """A source kind under test: the config of a source over its server, and its items."""

    name: str
    kind: str
    config: dict[str, Any]
    put: Callable[[str, bytes], None]
    delete: Callable[[str], None]
    reads: Callable[[], int | None] = lambda: None
    env: dict[str, str] = field(default_factory=dict)  # for a kbflow subprocess


def _touch(path: Path) -> None:
    now = time.time_ns()
    os.utime(path, ns=(now, now + random.randint(1, 10**6)))


def folder(tmp_path: Path) -> Kind:
    share = tmp_path / "share"
    share.mkdir()

    def put(key: str, data: bytes) -> None:
        (share / key).write_bytes(data)
        _touch(share / key)

    return Kind("folder", "filesystem", {"url": str(share)}, put, lambda k: (share / k).unlink())


def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kind]:
    pytest.importorskip("moto")
    import boto3

    port = free_port()
    log = tmp_path / "moto.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    endpoint = f"http://127.0.0.1:{port}"
    creds = {
        "AWS_ACCESS_KEY_ID": "kbflow-test",
        "AWS_SECRET_ACCESS_KEY": "kbflow-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in creds.items():
        monkeypatch.setenv(key, value)
    try:
        client = boto3.client("s3", endpoint_url=endpoint)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket="kbdocs")
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        client.put_object(Bucket="kbdocs", Key="elsewhere/x.md", Body=b"# Outside\n\nNot ours.")

        def reads() -> int:
            text = log.read_text(errors="replace")
            return text.count('"GET /kbdocs/docs/')

        yield Kind(
            "s3",
            "filesystem",
            {"url": "s3://kbdocs/docs", "endpoint_url": endpoint},
            lambda k, data: client.put_object(Bucket="kbdocs", Key=f"docs/{k}", Body=data),
            lambda k: client.delete_object(Bucket="kbdocs", Key=f"docs/{k}"),
            reads,
            env=creds | LOOPBACK,  # the endpoint passes the SSRF guard at each sync
        )
    finally:
        proc.terminate()
        proc.wait(10)


class _Site:
    """Pages by path, served with ETags; counts the bodies it sent."""

    def __init__(self) -> None:
        self.pages: dict[str, bytes] = {}
        self.bodies = 0
        self.lock = threading.Lock()


def serve_http(handler: Callable[..., BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on a free 127.0.0.1 port until the generator is closed; yields the
    base URL (no trailing slash)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def website() -> Iterator[Kind]:
    site = _Site()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = urllib.parse.urlsplit(self.path).path
            if path == "/robots.txt":
                return self._send(200, b"User-agent: *\nAllow: /\n", "text/plain")
            if path == "/sitemap.xml":
                base = f"http://{self.headers['Host']}"
                with site.lock:
                    urls = "".join(f"<url><loc>{base}/{p}</loc></url>" for p in sorted(site.pages))
                body = (
                    '<?xml version="1.0" encoding="UTF-8"?><urlset xmlns='
                    f'"http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'
                ).encode()
                return self._send(200, body, "application/xml")
            with site.lock:
                data = site.pages.get(path.lstrip("/"))
            if data is None:
                return self._send(404, b"not found", "text/plain")
            etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
            if self.headers.get("If-None-Match") == etag:
                return self._send(304, b"", "text/markdown", etag)
            with site.lock:
                site.bodies += 1
            return self._send(200, data, "text/markdown", etag)

        def _send(self, code: int, body: bytes, ctype: str, etag: str | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            if etag:
                self.send_header("ETag", etag)
            if code != 304:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if code != 304:
                self.wfile.write(body)

    def put(key: str, data: bytes) -> None:
        with site.lock:
            site.pages[key] = data

    def delete(key: str) -> None:
        with site.lock:
            del site.pages[key]

    for base in serve_http(Handler):
        yield Kind(
            "website",
            "website",
            {"sitemap": f"{base}/sitemap.xml"},
            put,
            delete,
            lambda: site.bodies,
            env=LOOPBACK,
        )


def rest(monkeypatch: pytest.MonkeyPatch) -> Iterator[Kind]:
    records: dict[str, str] = {}
    lock = threading.Lock()
    monkeypatch.setenv(TOKEN_ENV, "rest-test-token")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.headers.get("Authorization") != "Bearer rest-test-token":
                return self._json(401, {"error": "unauthorized"})
            parts = urllib.parse.urlsplit(self.path)
            page = int(urllib.parse.parse_qs(parts.query).get("page", ["1"])[0])
            with lock:
                rows = [{"id": k, "body": v} for k, v in sorted(records.items())]
            chunk = rows[(page - 1) * 2 : page * 2]
            more = page * 2 < len(rows)
            nxt = f"http://{self.headers['Host']}/api/articles?page={page + 1}" if more else None
            return self._json(200, {"results": chunk, "next": nxt})

        def _json(self, code: int, payload: Any) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def put(key: str, data: bytes) -> None:
        with lock:
            records[key] = data.decode()

    def delete(key: str) -> None:
        with lock:
            del records[key]

    for base in serve_http(Handler):
        yield Kind(
            "rest",
            "rest",
            {
                "client": {
                    "base_url": f"{base}/api/",
                    "paginator": {"type": "json_link", "next_url_path": "next"},
                    "auth": {"type": "bearer", "token_env": TOKEN_ENV},
                },
                "resource": {"path": "articles", "data_selector": "results"},
                "key": "id",
                "template": "{body}",
            },
            put,
            delete,
            env=LOOPBACK | {TOKEN_ENV: "rest-test-token", SECRET_ENV: f"{SYNC_ORG}:{TOKEN_ENV}"},
        )


def sql(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kind]:
    from sqlalchemy import create_engine, text

    if ON_POSTGRES:
        url = _reset(_worker_database_url("sources"), "DROP TABLE IF EXISTS articles")
    else:
        url = f"sqlite:///{tmp_path / 'crm.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text("CREATE TABLE articles (id VARCHAR(100) PRIMARY KEY, body TEXT, rev INTEGER)")
        )
    monkeypatch.setenv(SQL_URL_ENV, url)
    revision = iter(range(1, 10**6))

    def put(key: str, data: bytes) -> None:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM articles WHERE id = :k"), {"k": key})
            conn.execute(
                text("INSERT INTO articles (id, body, rev) VALUES (:k, :b, :r)"),
                {"k": key, "b": data.decode(), "r": next(revision)},
            )

    def delete(key: str) -> None:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM articles WHERE id = :k"), {"k": key})

    try:
        yield Kind(
            "sql",
            "sql",
            {"url_env": SQL_URL_ENV, "table": "articles", "key": "id", "template": "{body}",
             "version_column": "rev"},
            put,
            delete,
            env={SQL_URL_ENV: url, SECRET_ENV: f"{SYNC_ORG}:{SQL_URL_ENV}"},
        )  # fmt: skip
    finally:
        engine.dispose()
