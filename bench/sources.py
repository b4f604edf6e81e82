"""Benchmark: synced sources — an S3 bucket (moto's server) and a website (a local HTTP server).

On a fresh temp KBFLOW_HOME, for each kind, times three syncs of one approved source:

- the first sync (every item new: read, extracted, embedded, published) — items/s;
- an unchanged re-sync — seconds and its share of the first (target: at most 2 %);
- a re-sync after 1 % of the items changed — seconds.

S3: ``--objects`` small Markdown objects (a heading, a paragraph, sometimes a list or a table;
deterministic text) put into a bucket of a ``moto.server`` on loopback, one ``filesystem``
source ``s3://kbbench/docs`` with ``endpoint_url``. The moto log tells how many object bodies
each sync read (an unchanged re-sync must read none).

Website: ``--pages`` HTML pages served by a ThreadingHTTPServer on 127.0.0.1 with ETags
(``If-None-Match`` -> 304), a robots.txt allowing all and a sitemap.xml listing every page; one
``website`` source on the sitemap (``max_pages`` raised to fit). The handler counts its 200 and
304 answers per sync (an unchanged re-sync must see only 304s for pages).

Each sync is ``flows.source_sync.sync_source(settings, source)``, the flow's body: the CLI's
start-up and the Prefect flow run around it are excluded. Before the timed syncs a warm-up sync
of a one-file local folder (another source) loads the embedder, the task engine and the
extraction code, so the first timed sync does not pay for them. The bench checks correctness
and exits 1 when a check fails (documents after the first sync, counts of each re-sync, object
reads, 304s) and prints a table; a missed time target is reported, not fatal.

Run: ``.venv/bin/python bench/sources.py [--objects 10000] [--pages 1000] [--quick]``
(``--quick``: 300 objects, 100 pages). Saves bench/results/sources.json.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.server
import json
import os
import platform
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ORG = "benchco"
ROOT = "root"
BUCKET = "kbbench"
PREFIX = "docs"
UNCHANGED_TARGET = 0.02  # an unchanged re-sync at most 2 % of the first sync's time
CHANGE_SHARE = 0.01

# --- deterministic, varied Markdown -----------------------------------------------------------

_TOPICS = [
    "leave", "parking", "travel", "expenses", "security", "onboarding", "payroll", "pensions",
    "training", "equipment", "remote work", "overtime", "health and safety", "recruitment",
    "procurement", "data protection", "fire drills", "visitors", "canteen", "maintenance",
]  # fmt: skip
_SUBJECTS = [
    "Every employee", "A contractor", "The line manager", "The finance team", "A new starter",
    "The facilities desk", "Each department", "The on-call engineer", "A visitor", "HR",
]  # fmt: skip
_VERBS = [
    "must submit", "may request", "should review", "is expected to confirm", "can book",
    "has to record", "will receive", "needs to approve", "is entitled to", "must keep",
]  # fmt: skip
_OBJECTS = [
    "a written form", "the monthly report", "two days of notice", "a signed receipt",
    "the approved budget", "a badge at the gate", "a desk in the east wing", "the travel plan",
    "an updated contract", "the safety checklist", "a parking permit", "the expense claim",
]  # fmt: skip
_TAILS = [
    "before the end of the month.", "within 30 days.", "through the intranet portal.",
    "unless the director agrees otherwise.", "at least once a quarter.", "by email to the desk.",
    "before any purchase over 500 euros.", "in the shared folder.", "on the first working day.",
]  # fmt: skip


def _sentence(rng: random.Random) -> str:
    return (
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}"
    )


def markdown_doc(index: int, seed: int, revision: int = 0) -> str:
    """Document ``index``'s Markdown (a heading, a paragraph, sometimes a list or a table);
    ``revision`` > 0 changes its text."""
    rng = random.Random(seed * 1_000_003 + index)
    topic = rng.choice(_TOPICS)
    title = f"{topic.capitalize()} policy {index}"
    para = " ".join(_sentence(rng) for _ in range(rng.randint(3, 7)))
    parts = [f"# {title}", "", para, ""]
    shape = rng.random()
    if shape < 0.35:
        parts += [f"- {_sentence(rng)}" for _ in range(rng.randint(2, 5))] + [""]
    elif shape < 0.6:
        parts += ["| grade | days | allowance |", "|---|---|---|"]
        parts += [
            f"| {g} | {rng.randint(20, 35)} | {rng.randint(100, 900)} euros |"
            for g in "ABCD"[: rng.randint(2, 4)]
        ] + [""]
    if rng.random() < 0.4:
        parts += [f"## Exceptions for {topic}", "", " ".join(_sentence(rng) for _ in range(2)), ""]
    if revision:
        parts += [
            f"Revised (revision {revision}): {_sentence(random.Random(index + revision))}",
            "",
        ]
    return "\n".join(parts)


def html_doc(index: int, seed: int, revision: int = 0) -> str:
    """The same document as a small HTML page."""
    out = ["<!doctype html><html><head><meta charset='utf-8'>"]
    lines = markdown_doc(index, seed, revision).splitlines()
    title = lines[0].removeprefix("# ")
    out.append(f"<title>{title}</title></head><body>")
    table: list[list[str]] = []
    items: list[str] = []

    def flush() -> None:
        if items:
            out.append("<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>")
            items.clear()
        if table:
            head, *rows = table
            out.append(
                "<table><tr>" + "".join(f"<th>{c}</th>" for c in head) + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
                + "</table>"
            )  # fmt: skip
            table.clear()

    for line in lines:
        if line.startswith("|"):
            if not line.startswith("|---"):
                table.append([c.strip() for c in line.strip("|").split("|")])
            continue
        if line.startswith("- "):
            items.append(line[2:])
            continue
        flush()
        if line.startswith("## "):
            out.append(f"<h2>{line[3:]}</h2>")
        elif line.startswith("# "):
            out.append(f"<h1>{line[2:]}</h1>")
        elif line:
            out.append(f"<p>{line}</p>")
    flush()
    out.append("</body></html>")
    return "\n".join(out)


# --- helpers ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Probe:
    """Where a sync's time goes, measured from outside `flows.source_sync` and
    `tasks.sources.sync` (their module globals wrapped for the run): the sync's registry opens
    (each migrates), the extract and index task calls,
    and within extraction the files that started a fresh extraction worker apart from the rest.
    The rest of a sync is listing, reading, hashing, staging, planning, recording."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.t: dict[str, float] = {
            "registry_open": 0.0, "extract": 0.0, "index": 0.0,
            "extract_file_new_worker": 0.0, "extract_file": 0.0,
        }  # fmt: skip
        self.n: dict[str, int] = {k: 0 for k in self.t}

    def snapshot(self) -> dict[str, Any]:
        return {k: {"calls": self.n[k], "seconds": round(self.t[k], 3)} for k in self.t}

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            at = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.t[name] += time.perf_counter() - at
                self.n[name] += 1

        return call

    def install(self) -> None:
        import flows.source_sync as flow_mod
        import sinks.connect
        import tasks.sources.sync as sync_mod
        from sinks.registry import SqlRegistry

        probe = self
        original_open = sinks.connect.open_registry

        @contextlib.contextmanager
        def open_registry(settings: Any) -> Iterator[Any]:
            at = time.perf_counter()
            registry = SqlRegistry.open(settings.registry_url)
            probe.t["registry_open"] += time.perf_counter() - at
            probe.n["registry_open"] += 1
            try:
                yield registry
            finally:
                registry.close()

        assert original_open is sync_mod.open_registry
        sync_mod.open_registry = open_registry  # type: ignore[assignment]
        flow_mod.extract_batch_task = self._timed("extract", flow_mod.extract_batch_task)  # type: ignore[assignment]
        flow_mod.index_batch_task = self._timed("index", flow_mod.index_batch_task)  # type: ignore[assignment]
        from tasks.ingest.isolate import ExtractionPool

        original_extract = ExtractionPool.extract

        def extract(pool: Any, *args: Any, **kwargs: Any) -> Any:
            fresh = pool._worker is None  # this file starts the step's extraction worker
            name = "extract_file_new_worker" if fresh else "extract_file"
            at = time.perf_counter()
            try:
                return original_extract(pool, *args, **kwargs)
            finally:
                probe.t[name] += time.perf_counter() - at
                probe.n[name] += 1

        ExtractionPool.extract = extract  # type: ignore[method-assign,assignment]


class Failed(Exception):
    """A correctness check of the bench failed."""


def check(ok: bool, what: str, got: Any) -> None:
    if not ok:
        raise Failed(f"{what}: got {got}")


def timed_sync(settings: Any, name: str, probe: Probe) -> tuple[float, dict[str, Any], dict]:
    from flows.source_sync import sync_source
    from kbflow.services.sources.definitions import resolve_source

    record = resolve_source(settings, name, ORG)
    probe.reset()
    at = time.perf_counter()
    summary = sync_source(settings, record)
    seconds = time.perf_counter() - at
    return seconds, summary.to_dict(), probe.snapshot()


def source_docs(settings: Any, name: str) -> list[Any]:
    from kbflow.services.sources.definitions import resolve_source
    from sinks.connect import open_registry
    from tasks.sources.state import source_doc_key

    record = resolve_source(settings, name, ORG)
    prefix = source_doc_key(record.id, "")
    with open_registry(settings) as registry:
        return [
            d
            for d in registry.documents.list_documents(ORG)
            if (d.source_key or "").startswith(prefix)
        ]


def three_syncs(
    settings: Any,
    name: str,
    total: int,
    probe: Probe,
    change: Callable[[list[int]], None],
    reads: Callable[[], int | None],
    seed: int,
) -> dict[str, Any]:
    """First sync, unchanged re-sync, re-sync after ``CHANGE_SHARE`` of the items changed;
    correctness checked after each."""
    out: dict[str, Any] = {}
    r0 = reads()
    first_s, first, first_probe = timed_sync(settings, name, probe)
    c = first["counts"]
    print(f"  first sync: {first_s:.1f} s, counts {c}", flush=True)
    check(first["outcome"] == "ok", "first sync outcome", first["outcome"])
    check(c["new"] == total and c["failed"] == 0, f"first sync new == {total}", c)
    docs = source_docs(settings, name)
    check(len(docs) == total, f"documents after the first sync == {total}", len(docs))
    out["first"] = {
        "seconds": round(first_s, 3),
        "items_per_s": round(total / first_s, 2),
        "counts": c,
        "documents": len(docs),
        "object_reads": _delta(reads(), r0),
        "where": first_probe,
    }

    r1 = reads()
    again_s, again, again_probe = timed_sync(settings, name, probe)
    c = again["counts"]
    print(f"  unchanged re-sync: {again_s:.2f} s, counts {c}", flush=True)
    check(again["outcome"] == "ok", "unchanged re-sync outcome", again["outcome"])
    check(c["unchanged"] == total and c["listed"] == total, f"unchanged == {total}", c)
    check(sum(c[k] for k in ("new", "changed", "returned", "withdrawn", "failed")) == 0,
          "unchanged re-sync: new/changed/returned/withdrawn/failed == 0", c)  # fmt: skip
    unchanged_reads = _delta(reads(), r1)
    check(unchanged_reads in (None, 0), "object bodies read by the unchanged re-sync",
          unchanged_reads)  # fmt: skip
    out["unchanged"] = {
        "seconds": round(again_s, 3),
        "share_of_first": round(again_s / first_s, 5),
        "counts": c,
        "object_reads": unchanged_reads,
        "where": again_probe,
    }

    k = max(1, round(total * CHANGE_SHARE))
    picked = sorted(random.Random(seed + 1).sample(range(total), k))
    change(picked)
    r2 = reads()
    changed_s, changed, changed_probe = timed_sync(settings, name, probe)
    c = changed["counts"]
    print(f"  re-sync after {k} changed: {changed_s:.2f} s, counts {c}", flush=True)
    check(changed["outcome"] == "ok", "changed re-sync outcome", changed["outcome"])
    check(c["changed"] == k and c["unchanged"] == total - k and c["new"] == 0 and c["failed"] == 0,
          f"changed == {k}, unchanged == {total - k}", c)  # fmt: skip
    docs = source_docs(settings, name)
    check(
        len(docs) == total + k, f"documents (versions) after the change == {total + k}", len(docs)
    )
    out["changed"] = {
        "items_changed": k,
        "seconds": round(changed_s, 3),
        "share_of_first": round(changed_s / first_s, 5),
        "counts": c,
        "object_reads": _delta(reads(), r2),
        "where": changed_probe,
    }
    return out


def _delta(now: int | None, before: int | None) -> int | None:
    return None if now is None or before is None else now - before


# --- S3 ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def moto_server(work: Path) -> Iterator[dict[str, Any]]:
    import boto3
    from botocore.config import Config

    port = free_port()
    log = work / "moto.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="kbflow-bench", AWS_SECRET_ACCESS_KEY="kbflow-bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
    )  # fmt: skip
    try:
        client = boto3.client("s3", endpoint_url=endpoint,
                              config=Config(max_pool_connections=32))  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                client.create_bucket(Bucket=BUCKET)
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield {"client": client, "endpoint": endpoint, "log": log, "pid": proc.pid}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def object_reads(log: Path) -> int:
    """GETs of object bodies moto answered (a listing is a GET of the bucket with a query)."""
    text = log.read_text(errors="replace")
    return len(re.findall(rf'"GET /{BUCKET}/{PREFIX}/[^ ?]+ HTTP', text))


def bench_s3(settings: Any, work: Path, n: int, seed: int, probe: Probe) -> dict[str, Any]:
    from kbflow.services.sources import definitions as service

    print(f"S3: {n} objects", flush=True)
    with moto_server(work) as s3:
        client = s3["client"]

        def put(i: int, revision: int = 0) -> None:
            body = markdown_doc(i, seed, revision).encode()
            client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{i // 1000:03d}/doc-{i:05d}.md",
                              Body=body, ContentType="text/markdown")  # fmt: skip

        at = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, range(n)))
        put_s = time.perf_counter() - at
        print(f"  put {n} objects in {put_s:.1f} s", flush=True)
        service.add_source(settings, ORG, "bucket", service.source_fields(
            "filesystem", {"url": f"s3://{BUCKET}/{PREFIX}", "endpoint_url": s3["endpoint"]},
            collection="s3", status="approved", max_items=max(10_000, 2 * n),
        ), actor=ROOT)  # fmt: skip

        def change(picked: list[int]) -> None:
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda i: put(i, 1), picked))

        out = three_syncs(settings, "bucket", n, probe, change,
                          lambda: object_reads(s3["log"]), seed)  # fmt: skip
    return {"objects": n, "put_seconds": round(put_s, 2), **out}


# --- website ----------------------------------------------------------------------------------


class Site:
    """Pages in memory, served with ETags; answers counted by status for pages and for the
    rest (robots.txt, sitemap.xml)."""

    def __init__(self, m: int, seed: int, lastmod: bool = False) -> None:
        self.seed = seed
        self.lastmod = lastmod  # the sitemap dates each page (a CMS's sitemap does)
        self.pages: dict[str, bytes] = {}
        self.dates: dict[str, str] = {}
        for i in range(m):
            self.pages[self.path(i)] = html_doc(i, seed).encode()
            self.dates[self.path(i)] = "2026-11-01"
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.port = 0

    @staticmethod
    def path(i: int) -> str:
        return f"/handbook/{i // 100:02d}/page-{i:05d}.html"

    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sitemap(self) -> bytes:
        urls = "".join(
            f"<url><loc>{self.base()}{p}</loc>"
            + (f"<lastmod>{self.dates[p]}</lastmod>" if self.lastmod else "")
            + "</url>"
            for p in self.pages
        )
        return ('<?xml version="1.0" encoding="UTF-8"?>'
                f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'
                ).encode()  # fmt: skip

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def take_counts(self) -> dict[str, int]:
        with self.lock:
            counts, self.counts = self.counts, {}
        return dict(sorted(counts.items()))


@contextlib.contextmanager
def serve(site: Site) -> Iterator[Site]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/robots.txt":
                return self._answer("other", 200, b"User-agent: *\nAllow: /\n", "text/plain")
            if path == "/sitemap.xml":
                return self._answer("other", 200, site.sitemap(), "application/xml")
            body = site.pages.get(path)
            if body is None:
                return self._answer("other", 404, b"not found", "text/plain")
            etag = '"' + hashlib.sha1(body).hexdigest()[:16] + '"'
            if self.headers.get("If-None-Match") == etag:
                return self._answer("page", 304, b"", None, etag)
            return self._answer("page", 200, body, "text/html; charset=utf-8", etag)

        def _answer(
            self, kind: str, status: int, body: bytes, ctype: str | None, etag: str | None = None
        ) -> None:
            site.count(f"{kind} {status}")
            self.send_response(status)
            if etag:
                self.send_header("ETag", etag)
            if status != 304:
                self.send_header("Content-Type", ctype or "text/plain")
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if status != 304:
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    site.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()


def bench_website(
    settings: Any, m: int, seed: int, probe: Probe, *, lastmod: bool = False
) -> dict[str, Any]:
    """A sitemap without dates (each unchanged page costs a conditional request answered 304)
    or, with ``lastmod``, with them (an unchanged page costs no request at all)."""
    from kbflow.services.sources import definitions as service

    name = "site-lastmod" if lastmod else "site"
    print(f"website{' (sitemap with lastmod)' if lastmod else ''}: {m} pages", flush=True)
    site = Site(m, seed, lastmod=lastmod)
    with serve(site):
        service.add_source(settings, ORG, name, service.source_fields(
            "website", {"sitemap": f"{site.base()}/sitemap.xml", "max_pages": max(500, 2 * m)},
            collection="web-lastmod" if lastmod else "web", status="approved",
            max_items=max(10_000, 2 * m),
        ), actor=ROOT)  # fmt: skip
        answers: list[dict[str, int]] = []

        def change(picked: list[int]) -> None:
            answers.append(site.take_counts())
            for i in picked:
                site.pages[site.path(i)] = html_doc(i, seed, 1).encode()
                site.dates[site.path(i)] = "2026-12-01"

        def reads() -> int | None:
            answers.append(site.take_counts())
            return None

        out = three_syncs(settings, name, m, probe, change, reads, seed)
        # answers: [0 before first, 1 first, 2 before unchanged (empty), 3 unchanged,
        #           4 at the change (empty), 5 before the changed re-sync (empty), 6 changed]
        first, unchanged, changed = answers[1], answers[3], answers[6]
    out["first"]["answers"] = first
    out["unchanged"]["answers"] = unchanged
    out["changed"]["answers"] = changed
    print(f"  answers: first {first}, unchanged {unchanged}, changed {changed}", flush=True)
    check(first.get("page 200", 0) == m, f"first sync: page 200s == {m}", first)
    k = out["changed"]["items_changed"]
    if lastmod:  # the unchanged pages are not asked for at all
        check(unchanged.get("page 304", 0) == 0 and unchanged.get("page 200", 0) == 0,
              f"unchanged re-sync: no request for the {m} pages", unchanged)  # fmt: skip
        check(changed.get("page 200", 0) == k and changed.get("page 304", 0) == 0,
              f"changed re-sync: {k} 200s and nothing else", changed)  # fmt: skip
    else:
        check(unchanged.get("page 304", 0) == m and unchanged.get("page 200", 0) == 0,
              f"unchanged re-sync: only 304s for the {m} pages", unchanged)  # fmt: skip
        check(changed.get("page 200", 0) == k and changed.get("page 304", 0) == m - k,
              f"changed re-sync: {k} 200s, {m - k} 304s", changed)  # fmt: skip
    return {"pages": m, "sitemap_lastmod": lastmod, **out}


# --- the run ----------------------------------------------------------------------------------


def warm_up(settings: Any, work: Path, probe: Probe) -> float:
    """One sync of a one-file local folder: embedder, extraction code, Prefect's task engine."""
    from flows.source_sync import sync_source
    from kbflow.services.sources import definitions as service

    folder = work / "warm"
    folder.mkdir()
    (folder / "warm.md").write_text(markdown_doc(999_999, 1))
    record = service.add_source(settings, ORG, "warm", service.source_fields(
        "filesystem", {"url": str(folder)}, collection="warm", status="approved",
    ), actor=ROOT)  # fmt: skip
    at = time.perf_counter()
    summary = sync_source(settings, record)
    check(summary["counts"]["new"] == 1, "warm-up sync", summary["counts"])
    return time.perf_counter() - at


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--objects", type=int, default=10_000, help="S3 objects (0: skip S3)")
    parser.add_argument("--pages", type=int, default=1_000, help="website pages (0: skip)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 300 objects, 100 pages")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the temp home")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "sources.json")
    args = parser.parse_args()
    if args.quick:
        args.objects, args.pages = min(args.objects, 300), min(args.pages, 100)
    out_path = args.out
    work = Path(tempfile.mkdtemp(prefix="kbflow-bench-sources-"))
    home = work / "home"
    os.environ["KBFLOW_HOME"] = str(home)
    os.environ.setdefault("PREFECT_HOME", str(work / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    load_before = load()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"home {home}; load average {load_before} on {os.cpu_count()} cpus", flush=True)

    from core.models import Role
    from core.settings import Settings, configure_environment
    from sinks.registry import SqlRegistry

    settings = Settings(home=home, sources_test_allow_loopback=True)  # type: ignore[call-arg]
    configure_environment(settings)
    reg = SqlRegistry.open(settings.registry_url)
    reg.people.ensure_user(ROOT, Role.SUPERADMIN, bootstrap=True)
    reg.people.ensure_org(ORG)
    reg.close()
    probe = Probe()
    probe.install()

    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_before": load_before,
        },
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip(),
        "started": started,
        "quick": args.quick,
        "excluded": "CLI start-up and the Prefect flow run: each sync is "
        "flows.source_sync.sync_source(settings, source), after a warm-up sync",
        "batch_items": settings.sources.sources_batch_items,
        "embedding": f"{settings.ingest.embedding_model} ({settings.ingest.embedding_backend}, "
        f"{settings.ingest.embedding_precision})",
    }
    status = 0
    try:
        result["warm_up_s"] = round(warm_up(settings, work, probe), 2)
        print(f"warm-up sync: {result['warm_up_s']} s", flush=True)
        if args.objects:
            result["s3"] = bench_s3(settings, work, args.objects, args.seed, probe)
        if args.pages:
            result["website"] = bench_website(settings, args.pages, args.seed, probe)
            result["website_lastmod"] = bench_website(
                settings, args.pages, args.seed, probe, lastmod=True
            )
    except Failed as exc:
        print(f"CHECK FAILED: {exc}", file=sys.stderr, flush=True)
        result["failed_check"] = str(exc)
        status = 1
    finally:
        result["machine"]["load_average_after"] = load()
        result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        targets: dict[str, Any] = {}
        for kind in ("s3", "website", "website_lastmod"):
            if kind in result and "unchanged" in result[kind]:
                share = result[kind]["unchanged"]["share_of_first"]
                targets[f"{kind}_unchanged_share_of_first"] = {
                    "target": f"<= {UNCHANGED_TARGET:.0%}",
                    "value": f"{share:.2%}",
                    "pass": share <= UNCHANGED_TARGET,
                }
        result["targets"] = targets
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print_table(result)
        print(f"saved {out_path}")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    return status


def print_table(result: dict[str, Any]) -> None:
    print()
    print(f"{'sync':<34} {'seconds':>9} {'items/s':>9} {'of first':>9}  counts")
    for kind, label in (("s3", "S3"), ("website", "website"), ("website_lastmod", "web+lastmod")):
        data = result.get(kind)
        if not data:
            continue
        n = data.get("objects") or data.get("pages")
        for phase, what in (("first", "first"), ("unchanged", "unchanged re-sync"),
                            ("changed", "re-sync, 1 % changed")):  # fmt: skip
            row = data.get(phase)
            if not row:
                continue
            items = n if phase != "changed" else row["items_changed"]
            share = row.get("share_of_first")
            counts = {k: v for k, v in row["counts"].items() if v}
            print(
                f"{label + ' ' + what + f' ({n})':<34} {row['seconds']:>9.2f} "
                f"{items / row['seconds']:>9.1f} "
                f"{'' if share is None else f'{share:.2%}':>9}  {counts}"
            )
    for name, target in result.get("targets", {}).items():
        print(f"target {name}: {target['value']} ({target['target']}): "
              f"{'pass' if target['pass'] else 'FAIL'}")  # fmt: skip
    print(f"load average {result['machine']['load_average_before']} -> "
          f"{result['machine'].get('load_average_after')} on {result['machine']['cpus']} cpus; "
          "CLI start-up and Prefect's flow run excluded")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
