"""Benchmark: the review inbox's pages (``kbflow serve``, /review) with 200 pending drafts, and
the library and seed pages of an org that serves 2,000 documents.

A fresh home in a temp dir: 10 orgs, each with its account manager and an approved seed
document, and 20 pending drafts per org (200) shaped like research drafts (~30 lines: headings,
list items, a table, ``[doc:<seed>]`` citations, a Citations footer), embedded with MiniLM; one
superadmin. ``kbflow serve`` runs on it; users log in through the login form (one httpx client
each, requests in sequence); each page is warmed up 10 times, then timed ``--requests`` times:
``inbox_superadmin`` (GET /review: 10 orgs, 200 drafts), ``inbox_am`` (GET /review as one org's
AM: 20 drafts), ``draft_superadmin`` (GET /review/drafts/<id>, cycling over the 200 drafts).
Org ``org00`` also serves ``--library-docs`` documents (2,000: short approved documents in 20
collections, every 50th withdrawn, a tenth from a synced source) and has 12 seed inputs:
``library_am`` (GET /review/library?org=org00: the first page of 50 and the total),
``library_filtered_am`` (cycling over a title search, a collection, a status, a source and a
page in the middle), ``seeds_am`` (GET /review/seeds?org=org00), and 30 research runs (jobs:
26 done with their reports, 2 failed, 2 running, one of them fetching): ``research_am`` (GET
/review/research?org=org00: the newest 10 runs, the running ones refreshed on each load).

Target: p95 <= 100 ms per page, warm. Prints a table, saves bench/results/inbox_pages.json
(with the load average and CPU count: the machine is shared); exits 1 when a page misses it.

Run: ``.venv/bin/python bench/inbox_pages.py [--requests 200] [--keep]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from kbflow.api.launch import launched  # noqa: E402

ORGS, DRAFTS_PER_ORG, WARMUP, TARGET_MS = 10, 20, 10, 100.0
PASSWORD = "bench-password-long-enough-1"
DRAFT = """# {title}

## Who they are

{name} runs {n} shops and sells city bikes to commuters [doc:{seed}].
Its brand voice is plain, warm and practical [doc:{seed}].

## What customers ask

- Delivery takes five to seven working days [doc:{seed}].
- Returns are accepted within 30 days with a receipt.
- Frames carry a five year warranty [doc:{seed}].
- Servicing is free for the first year.
- Financing is offered on orders over 500 EUR.

## Prices

| Model | Price | Warranty |
|---|---|---|
| Wren {n} | 899 EUR | 5 years |
| Kestrel {n} | 2,400 EUR | 5 years |
| Swift {n} | 1,250 EUR | 3 years |

## How to answer

1. Greet the customer by name.
2. Answer the question first, then offer help.
3. Never promise a delivery date [url:https://{org}.example/delivery].

---
## Citations
- [doc:{seed}] {name} brand brief
- [url:https://{org}.example/delivery] Delivery page
"""


def build_home(home: Path, library_docs: int) -> dict[str, Any]:
    """The orgs, users, seeds and drafts; returns who logs in and the draft ids."""
    from core.models import DocStatus, Role
    from core.settings import Settings
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.registry import SqlRegistry
    from tasks.text.embed import get_embedder
    from tests.conftest import index_records

    settings = Settings(home=home)
    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=5)
    kw = {"store": store, "registry": registry, "embedder": get_embedder()}
    drafts: list[str] = []
    try:
        registry.people.ensure_user("root", Role.SUPERADMIN)
        for i in range(ORGS):
            org, name = f"org{i:02d}", f"Cycles {i:02d}"
            registry.people.ensure_org(org)
            registry.people.ensure_user(f"am{i:02d}", Role.ACCOUNT_MANAGER)
            registry.people.assign_am(org, f"am{i:02d}")
            (seed,) = index_records(
                [{"key": "brief", "title": f"{name} brand brief",
                  "text": f"{name} sells city bikes to commuters."}], org=org, **kw,
            )  # fmt: skip
            records = [
                {"key": f"draft-{k}", "title": f"{name} draft {k}", "markdown": True,
                 "text": DRAFT.format(title=f"{name} draft {k}", name=name, n=k, seed=seed,
                                      org=org)}
                for k in range(DRAFTS_PER_ORG)
            ]  # fmt: skip
            drafts += index_records(
                records, org=org, status=DocStatus.PENDING_REVIEW,
                cite_uris={f"doc:{seed}": f"upload:{org}/brief.pdf"}, **kw,
            )  # fmt: skip
            print(f"  {org}: seed + {DRAFTS_PER_ORG} drafts indexed", flush=True)
        _library(registry, kw, library_docs)
        _research_runs(registry)
        for user in ["root"] + [f"am{i:02d}" for i in range(ORGS)]:
            registry.logins.set_password(user, PASSWORD, actor="root")
    finally:
        store.close()
        registry.close()
    return {"drafts": drafts}


RESEARCH_RUNS = 30


def _research_runs(registry: Any) -> None:
    """org00's research history: `RESEARCH_RUNS` jobs, the newest two still running (no process
    of theirs to check: they stay running), two failed, the rest done with a report."""
    from core.models import JobStatus
    from kbflow.services.jobs import RESEARCH_KIND

    params = {"client_name": "Cycles 00", "model": None, "budget_tokens": 200_000,
              "reviewer": "am00"}  # fmt: skip
    report = {
        "documents": [{"filename": f"doc{k}.md"} for k in range(4)],
        "budget": {"tokens": 12_345, "max_tokens": 200_000},
        "notes": [f"public_x https://x.com/cycles00: unreachable ({k})" for k in range(3)],
    }
    for k in range(RESEARCH_RUNS):
        job = registry.jobs.create_job("org00", kind=RESEARCH_KIND, inputs=[], params=params)
        if k == RESEARCH_RUNS - 1:
            registry.jobs.note_progress(job.id, {"stage": "fetching", "done": 2, "total": 4})
        elif k == RESEARCH_RUNS - 2:
            pass  # started, nothing reported yet
        elif k in (3, 11):
            registry.jobs.finish_job(job.id, JobStatus.FAILED, reason="research budget exceeded")
        else:
            registry.jobs.finish_job(job.id, JobStatus.COMPLETE, report=report)


def _library(registry: Any, kw: dict[str, Any], count: int) -> None:
    """``count`` approved documents for org00 in 20 collections (a tenth synced), every 50th
    withdrawn afterwards, and 12 seed inputs."""
    from tasks.research.seed import SEED_COLLECTION
    from tasks.review.machine import held, withdraw
    from tests.conftest import index_records

    made: list[str] = []
    for shelf in range(20):
        records = [
            {"key": f"lib-{shelf:02d}-{k:03d}", "title": f"Shop policy {shelf:02d}.{k:03d}",
             "text": f"Policy {shelf}.{k}: opening hours, returns and repairs for shop {k}."}
            for k in range(count // 20)
        ]  # fmt: skip
        made += index_records(
            records, org="org00", collection=f"policies/shelf-{shelf:02d}",
            source_tag="source:crm" if shelf % 10 == 0 else None, **kw,
        )  # fmt: skip
    for doc_id in made[::50]:
        withdraw(doc_id, "root", registry=registry, open_store=held(kw["store"]), note="bench")
    index_records(
        [{"key": f"seed-{k}", "title": f"Seed brief {k}", "text": f"Seed input {k}.",
          "uri": f"upload:org00/brief-{k}.pdf"} for k in range(12)],
        org="org00", collection=SEED_COLLECTION, source_tag="am_file", **kw,
    )  # fmt: skip
    print(f"  org00: {len(made)} library documents, {len(made[::50])} withdrawn", flush=True)


def login(base: str, user: str) -> httpx.Client:
    client = httpx.Client(base_url=base, follow_redirects=False, timeout=60)
    page = client.get("/review/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    if not csrf:
        raise SystemExit(f"no csrf input on the login page: {page.text[:500]}")
    answer = client.post(
        "/review/login", data={"user": user, "password": PASSWORD, "csrf": csrf.group(1)}
    )
    if answer.status_code != 303 or "kbflow_session" not in client.cookies:
        raise SystemExit(f"login as {user} failed: {answer.status_code} {answer.text[:500]}")
    return client


def timed(client: httpx.Client, paths: list[str], n: int, expect: str) -> dict[str, Any]:
    """``n`` GETs cycling over ``paths`` after a warm-up of WARMUP each; latency figures."""
    for k in range(WARMUP):
        client.get(paths[k % len(paths)])
    ms: list[float] = []
    sizes: list[int] = []
    for k in range(n):
        start = time.perf_counter()
        response = client.get(paths[k % len(paths)])
        ms.append((time.perf_counter() - start) * 1000)
        if response.status_code != 200 or expect not in response.text:
            raise SystemExit(f"GET {paths[k % len(paths)]}: {response.status_code} "
                             f"{response.text[:500]}")  # fmt: skip
        sizes.append(len(response.content))
    ms.sort()
    p95 = ms[min(len(ms) - 1, round(0.95 * len(ms)) - 1)]
    return {
        "requests": n,
        "p50_ms": round(statistics.median(ms), 1),
        "p95_ms": round(p95, 1),
        "max_ms": round(ms[-1], 1),
        "mean_ms": round(statistics.fmean(ms), 1),
        "bytes_median": int(statistics.median(sizes)),
        "ok": p95 <= TARGET_MS,
    }


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200, help="timed GETs per page (200)")
    parser.add_argument("--keep", action="store_true", help="keep the temp home and its log")
    parser.add_argument("--library-docs", type=int, default=2000,
                        help="documents org00 serves, for the library (2000)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "inbox_pages.json")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kbflow-bench-inbox-"))
    home, log = tmp / "home", tmp / "serve.log"
    load_start = [round(x, 2) for x in os.getloadavg()]
    try:
        print(f"building {home}: {ORGS} orgs x {DRAFTS_PER_ORG} pending drafts ...", flush=True)
        start = time.perf_counter()
        drafts = build_home(home, args.library_docs)["drafts"]
        built_s = round(time.perf_counter() - start, 1)
        with launched(home, log, require_ready=False) as service:
            root, am = login(service.base, "root"), login(service.base, "am00")
            pages = {
                "inbox_superadmin": timed(root, ["/review"], args.requests, "org09"),
                "inbox_am": timed(am, ["/review"], args.requests, "org00"),
                "draft_superadmin": timed(
                    root, [f"/review/drafts/{d}" for d in drafts], args.requests, "Sources"
                ),
                "library_am": timed(  # the library documents and the org's brand brief
                    am,
                    ["/review/library?org=org00"],
                    args.requests,
                    f"{args.library_docs + 1} documents",
                ),
                "library_filtered_am": timed(
                    am,
                    [
                        "/review/library?org=org00&q=policy+07.01",
                        "/review/library?org=org00&collection=policies%2Fshelf-03",
                        "/review/library?org=org00&status=withdrawn",
                        "/review/library?org=org00&source=source%3Acrm",
                        "/review/library?org=org00&page=20",
                    ],
                    args.requests,
                    "Library",
                ),
                "seeds_am": timed(am, ["/review/seeds?org=org00"], args.requests, "Seed brief 11"),
                "research_am": timed(
                    am, ["/review/research?org=org00"], args.requests, "public pages: 2 of 4"
                ),
            }
        load_end = [round(x, 2) for x in os.getloadavg()]
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"\n{'page':<18} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'bytes':>8}  p95 <= 100 ms")
    for name, f in pages.items():
        verdict = "pass" if f["ok"] else "FAIL"
        print(f"{name:<18} {f['p50_ms']:>8} {f['p95_ms']:>8} {f['max_ms']:>8} "
              f"{f['bytes_median']:>8}  {verdict}")  # fmt: skip
    print(f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end, "
          f"{os.cpu_count()} CPUs; home built in {built_s:.1f} s")  # fmt: skip
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty_tree": bool(git("status", "--porcelain")),
        "machine": dict(cpus=os.cpu_count(), loadavg_start=load_start, loadavg_end=load_end),
        "setup": dict(
            orgs=ORGS,
            drafts_per_org=DRAFTS_PER_ORG,
            warmup=WARMUP,
            build_s=built_s,
            library_docs=args.library_docs,
            research_runs=RESEARCH_RUNS,
        ),
        "target_p95_ms": TARGET_MS,
        "pages": pages,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"saved {args.out}")
    over = [name for name, f in pages.items() if not f["ok"]]
    if over:
        print(f"p95 over {TARGET_MS:g} ms: {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
