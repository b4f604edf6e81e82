"""Benchmark: requests on one kept-alive connection against fresh connections (issue 45).

For each form of ``kbflow serve`` — the default single process, the same process after a SIGHUP
restart (serving on the socket it was handed, ``--fd``), and ``--workers 2`` — in one run:

- 30 mixed requests (``GET /v1/agent/collections`` and ``POST /v1/agent/search``, alternating)
  on ONE kept-alive connection, and the same 30 each on a fresh connection; the figure is the
  median of each, and their ratio (kept-alive over fresh; the bar: <= 1.5);
- 30 ``search_knowledge_base`` calls from one MCP SDK client session (its own pooled client).

For the "before", run this script from a ``git worktree`` of the older commit with this venv
and a home of its own (a home this tree migrated is newer than the old code can open); ``--code
DIR`` serves from another checkout over a home that checkout can read:

    git worktree add /tmp/kbflow-base ad21d18 && cp bench/keepalive.py /tmp/kbflow-base/bench/
    (cd /tmp/kbflow-base && PYTHONPATH=. "$OLDPWD/.venv/bin/python" bench/keepalive.py \
        --home /tmp/ka-home-base --out "$OLDPWD/bench/results/keepalive_ad21d18.json")
    .venv/bin/python bench/keepalive.py --home /tmp/ka-home

The home holds ``--docs`` SciFact abstracts (ingested once into ``--home``). Saves
bench/results/keepalive.json. Needs ../shared/datasets/scifact (or KBFLOW_DATASETS).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.serve import _agent_token  # noqa: E402
from bench.serve_paired import DATASETS, UNLIMITED, _home  # noqa: E402
from bench.stats import latency  # noqa: E402
from kbflow.api.launch import launched  # noqa: E402

CALLS = 30
FORMS = ("single", "single_after_sighup", "workers_2")


def _mixed(base: str, token: str, texts: list[str], *, fresh: bool) -> dict[str, Any]:
    """``CALLS`` requests alternating the collections list and a search, on one kept-alive
    connection or each on a fresh one."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    samples: list[float] = []
    errors = 0
    kept = None if fresh else httpx.Client(base_url=base, headers=headers, timeout=60)
    try:
        for i in range(CALLS):
            client = kept or httpx.Client(base_url=base, headers=headers, timeout=60)
            t = time.perf_counter()
            if i % 2:
                r = client.post("/v1/agent/search", json={"query": texts[i % len(texts)]})
            else:
                r = client.get("/v1/agent/collections")
            samples.append(time.perf_counter() - t)
            errors += r.status_code != 200
            if kept is None:
                client.close()
    finally:
        if kept is not None:
            kept.close()
    return {**latency(samples, digits=2), "errors": errors}


def _mcp(base: str, token: str, texts: list[str]) -> dict[str, Any]:
    """``CALLS`` ``search_knowledge_base`` calls in one MCP SDK client session."""
    import anyio
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    samples: list[float] = []

    async def main() -> int:
        errors = 0
        auth = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=auth, timeout=120) as http,
            streamable_http_client(f"{base}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            for i in range(CALLS):
                t = time.perf_counter()
                result = await session.call_tool(
                    "search_knowledge_base", {"query": texts[i % len(texts)]}
                )
                samples.append(time.perf_counter() - t)
                errors += bool(result.is_error)
        return errors

    errors = anyio.run(main)
    return {**latency(samples, digits=2), "errors": errors}


def _measure(base: str, token: str, texts: list[str]) -> dict[str, Any]:
    for q in texts[:5]:  # warm the model, the route and the caches once
        _mixed(base, token, [q], fresh=True)
    kept = _mixed(base, token, texts, fresh=False)
    fresh = _mixed(base, token, texts, fresh=True)
    return {
        "kept_alive": kept,
        "fresh": fresh,
        "kept_alive_over_fresh_p50": round(kept["median_ms"] / fresh["median_ms"], 2),
        "mcp_session": _mcp(base, token, texts),
    }


def _form(home: Path, token: str, texts: list[str], form: str, code: Path) -> dict[str, Any]:
    log = home / f"keepalive-{form}.log"
    args = ("--workers", "2") if form == "workers_2" else ()
    with launched(home, log, env=UNLIMITED, args=args, code=code) as served:
        if form == "single_after_sighup":
            os.kill(served.proc.pid, signal.SIGHUP)
            deadline = time.monotonic() + 240
            while log.read_text(errors="replace").count("Application startup complete") < 2:
                if time.monotonic() > deadline or served.proc.poll() is not None:
                    raise SystemExit(f"the restart did not finish:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)
        return _measure(served.base, token, texts)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--home", type=Path, default=None, help="data dir (default: a temp dir)")
    parser.add_argument("--docs", type=int, default=500, help="SciFact abstracts in the home")
    parser.add_argument("--code", type=Path, default=REPO, help="the checkout that serves")
    parser.add_argument(
        "--forms", type=lambda v: v.split(","), default=list(FORMS),
        help=f"comma-separated, of {', '.join(FORMS)} (default all)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "keepalive.json")
    args = parser.parse_args()

    if not (DATASETS / "scifact" / "corpus.jsonl.gz").exists():
        print(f"SciFact not found under {DATASETS}; set KBFLOW_DATASETS", file=sys.stderr)
        return 2
    home = (args.home or Path(tempfile.mkdtemp(prefix="kbflow-bench-keepalive-"))).resolve()
    os.environ["KBFLOW_HOME"] = str(home)
    _home(home, args.docs)
    token = _agent_token(home)
    rows = [json.loads(line) for line in (DATASETS / "scifact" / "dev" / "queries.jsonl").open()]
    random.Random(11).shuffle(rows)
    texts = [r["text"] for r in rows]
    code = args.code.resolve()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=code, capture_output=True, text=True
    ).stdout.strip()
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)},
        "commit": commit,
        "docs": args.docs,
        "calls": CALLS,
        "forms": {},
    }
    for form in args.forms:
        figures = _form(home, token, texts, form, code)
        result["forms"][form] = figures
        print(
            f"{form:<20} kept-alive p50 {figures['kept_alive']['median_ms']:>6} ms, fresh p50 "
            f"{figures['fresh']['median_ms']:>6} ms, ratio {figures['kept_alive_over_fresh_p50']}"
            f"; MCP session p50 {figures['mcp_session']['median_ms']} ms",
            flush=True,
        )
    worst = max(f["kept_alive_over_fresh_p50"] for f in result["forms"].values())
    result["worst_kept_alive_over_fresh_p50"] = worst
    result["median_mcp_p50_ms"] = statistics.median(
        f["mcp_session"]["median_ms"] for f in result["forms"].values()
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"worst kept-alive / fresh median: {worst} (bar: <= 1.5); saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
