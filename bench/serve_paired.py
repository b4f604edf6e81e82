"""Benchmark: ``kbflow serve`` of this checkout beside a baseline checkout, in one run.

For a change that should not slow the service (issue 30 moved every surface onto one service
layer), the same home is served in turn by the baseline's code and by this tree's, rounds
alternating which goes first: warm searches (``POST /v1/agent/search``) from 1 client and from 8,
each client on one kept-alive connection (as agents call it) and then with a fresh connection
per request (the ``_fresh`` cases), and cited answers (``POST /v1/agent/answer``) from 1. Each
tree's figure is the median over its rounds of the round's median latency; the ratio is
baseline / current, so 1.0 is "as fast" and below 1.0 "slower than the baseline" (the bar:
>= 0.95).

The baseline is a ``git worktree`` of an older commit run with this venv (``PYTHONPATH`` and
the working directory set to it), e.g.::

    git worktree add /tmp/kbflow-base 3563993
    .venv/bin/python bench/serve_paired.py --baseline /tmp/kbflow-base

The home holds ``--docs`` SciFact abstracts, ingested once by this tree (kept in ``--home``).
Saves bench/results/serve_paired.json. Needs ../shared/datasets/scifact (or KBFLOW_DATASETS).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.serve import ORG, _agent_token, _answers, _http, _kbflow  # noqa: E402
from kbflow.api.launch import launched  # noqa: E402

DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))
UNLIMITED = {"KBFLOW_API_RATE_PER_MINUTE": "1000000", "KBFLOW_API_RATE_BURST": "100000"}
CASES = (
    "search_1_client",
    "search_8_clients",
    "search_1_client_fresh",
    "search_8_clients_fresh",
    "answer_1_client",
)


def _home(home: Path, docs: int) -> None:
    """``docs`` SciFact abstracts in ``home`` (ingested by this tree once)."""
    from core.settings import Settings
    from sinks.connect import open_registry

    with open_registry(Settings(home=home)) as registry:
        registry.people.ensure_org(ORG)
        have = len(registry.documents.current_documents(ORG))
    if have >= docs:
        return
    subset = home / "scifact-subset.jsonl"
    with gzip.open(DATASETS / "scifact" / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(docs), f, strict=False)]
    subset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"ingesting {docs} SciFact abstracts into {home} (once) ...", flush=True)
    done = _kbflow(home, "ingest", str(subset), "--org", ORG, "--json")
    if done.returncode != 0:
        raise SystemExit(f"the ingest failed:\n{done.stderr[-3000:]}")


def _round(base: str, token: str, texts: list[str], claims: list[str], n: int) -> dict[str, Any]:
    return {
        "search_1_client": _http(base, token, texts, 1, n),
        "search_8_clients": _http(base, token, texts, 8, n),
        "search_1_client_fresh": _http(base, token, texts, 1, n, fresh=True),
        "search_8_clients_fresh": _http(base, token, texts, 8, n, fresh=True),
        "answer_1_client": _answers(base, token, claims),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--baseline", type=Path, required=True, help="the baseline checkout")
    parser.add_argument("--home", type=Path, default=None, help="data dir (default: a temp dir)")
    parser.add_argument("--docs", type=int, default=1500, help="SciFact abstracts in the home")
    parser.add_argument("--requests", type=int, default=160, help="searches per case and round")
    parser.add_argument("--answers", type=int, default=24, help="answers per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per tree")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "serve_paired.json"
    )
    args = parser.parse_args()

    if not (DATASETS / "scifact" / "corpus.jsonl.gz").exists():
        print(f"SciFact not found under {DATASETS}; set KBFLOW_DATASETS", file=sys.stderr)
        return 2
    baseline = args.baseline.resolve()
    home = (args.home or Path(tempfile.mkdtemp(prefix="kbflow-bench-paired-"))).resolve()
    os.environ["KBFLOW_HOME"] = str(home)
    _home(home, args.docs)
    token = _agent_token(home)
    rows = [json.loads(line) for line in (DATASETS / "scifact" / "dev" / "queries.jsonl").open()]
    random.Random(7).shuffle(rows)
    texts = [r["text"] for r in rows]
    claims = texts[: args.answers]

    trees = {"baseline": baseline, "current": REPO}
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
    for k in range(args.rounds):
        order = ["baseline", "current"] if k % 2 == 0 else ["current", "baseline"]
        for name in order:
            log = home / f"serve-{name}.log"
            with launched(home, log, env=UNLIMITED, code=trees[name]) as service:
                figures = _round(service.base, token, texts, claims, args.requests)
            runs[name].append(figures)
            line = ", ".join(f"{c} p50 {figures[c]['median_ms']} ms" for c in CASES)
            print(f"round {k + 1} {name}: {line}", flush=True)

    summary: dict[str, Any] = {}
    for case in CASES:
        med = {n: statistics.median(r[case]["median_ms"] for r in runs[n]) for n in runs}
        p95 = {n: statistics.median(r[case]["p95_ms"] for r in runs[n]) for n in runs}
        errors = {n: sum(r[case]["errors"] for r in runs[n]) for n in runs}
        summary[case] = {
            "baseline_median_ms": med["baseline"],
            "current_median_ms": med["current"],
            "ratio_p50": round(med["baseline"] / med["current"], 3),
            "baseline_p95_ms": p95["baseline"],
            "current_p95_ms": p95["current"],
            "ratio_p95": round(p95["baseline"] / p95["current"], 3),
            "errors": errors,
        }
        print(f"{case}: baseline/current p50 {summary[case]['ratio_p50']}, "
              f"p95 {summary[case]['ratio_p95']}, errors {errors}")  # fmt: skip
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    base_commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=baseline, capture_output=True, text=True
    ).stdout.strip()
    result = {
        "machine": {"cpus": os.cpu_count()},
        "commit": commit,
        "baseline_commit": base_commit,
        "docs": args.docs,
        "rounds": args.rounds,
        "summary": summary,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"saved {args.out}")
    failed = sum(sum(row["errors"].values()) for row in summary.values())
    if failed:
        print(f"{failed} requests failed: the figures do not compare", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
