"""Benchmark: ingest on the Dask task runner with 1 and with 2 local workers, against the
default runner, on the same corpus in the same run.

Each run ingests the same SciFact abstracts (a JSONL corpus: the work is chunking and
embedding, which is where ingest spends its time) into a fresh KBFLOW_HOME through the CLI,
exactly as a data engineer would (`KBFLOW_TASK_RUNNER=dask KBFLOW_DASK_WORKERS=N kbflow
ingest ...`), and reads the flow's own wall time from its ``--json`` report, so the Dask
cluster's start-up counts and the temporary Prefect server's does not. Runs alternate
(default, dask-1, dask-2, default, ...) so the shared machine's noise falls on all three.

Prints a table and saves JSON (bench/results/ingest_dask.json): docs/s per runner (median of
the rounds) and the ratios dask-2 / dask-1 and dask-1 / default.

Run: ``.venv/bin/python bench/ingest_dask.py [--docs 1500] [--rounds 2]``.
Needs ../shared/datasets/scifact (or KBFLOW_DATASETS).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))
sys.path.insert(0, str(REPO))

from bench.ingest_cli import subset as subset_corpus  # noqa: E402  (after the path is set)
from bench.ingest_cli import timed_ingest  # noqa: E402

RUNNERS: dict[str, dict[str, str]] = {
    "default": {"KBFLOW_TASK_RUNNER": "default"},
    "dask-1": {"KBFLOW_TASK_RUNNER": "dask", "KBFLOW_DASK_WORKERS": "1"},
    "dask-2": {"KBFLOW_TASK_RUNNER": "dask", "KBFLOW_DASK_WORKERS": "2"},
}


def _run(corpus: Path, runner: str, batch_docs: int) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix=f"kbflow-bench-dask-{runner}-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KBFLOW_")}
    env.update(RUNNERS[runner], KBFLOW_HOME=str(home), KBFLOW_INGEST_BATCH_DOCS=str(batch_docs))
    return {"runner": runner, **timed_ingest(corpus, runner, env, REPO)}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=1500, help="SciFact abstracts per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each runner")
    parser.add_argument("--batch-docs", type=int, default=64, help="KBFLOW_INGEST_BATCH_DOCS")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "ingest_dask.json")
    args = parser.parse_args()
    corpus = DATASETS / "scifact" / "corpus.jsonl.gz"
    if not corpus.exists():
        print(f"SciFact not found at {corpus}; set KBFLOW_DATASETS", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="kbflow-bench-dask-"))
    subset = subset_corpus(corpus, args.docs, work / "scifact-subset.jsonl.gz")

    runs: list[dict[str, Any]] = []
    for round_no in range(args.rounds):
        for runner in RUNNERS:
            run = _run(subset, runner, args.batch_docs) | {"round": round_no + 1}
            runs.append(run)
            print(
                f"round {round_no + 1} {runner:8s} {run['documents']} docs "
                f"{run['flow_s']:7.1f} s  {run['docs_per_s']:6.1f} docs/s",
                flush=True,
            )
    per = {
        name: statistics.median(r["docs_per_s"] for r in runs if r["runner"] == name)
        for name in RUNNERS
    }
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "docs": args.docs,
        "batch_docs": args.batch_docs,
        "runs": runs,
        "docs_per_s": per,
        "ratio_dask2_over_dask1": round(per["dask-2"] / per["dask-1"], 3),
        "ratio_dask1_over_default": round(per["dask-1"] / per["default"], 3),
    }
    print()
    print(f"{'runner':10s} {'docs/s (median)':>16s}")
    for name, value in per.items():
        print(f"{name:10s} {value:16.1f}")
    print(f"dask-2 / dask-1: {result['ratio_dask2_over_dask1']:.2f}x")
    print(f"dask-1 / default: {result['ratio_dask1_over_default']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
