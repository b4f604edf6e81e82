"""Timing `kbflow ingest` as a user runs it, for the ingest benchmarks (`ingest_speed.py`,
`ingest_dask.py`): a SciFact subset, and one ingest of it into a fresh org in a subprocess."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KBFLOW = [sys.executable, "-m", "kbflow.cli"]


def subset(corpus: Path, docs: int, out: Path) -> Path:
    """The first ``docs`` records of a gzipped JSONL corpus, written to ``out`` (gzipped)."""
    with gzip.open(corpus, "rt", encoding="utf-8") as src, gzip.open(out, "wt") as dst:
        for n, line in enumerate(src):
            if n >= docs:
                break
            dst.write(line)
    return out


def timed_ingest(corpus: Path, label: str, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """Create org ``sci`` (as the home's first superadmin, ``bench``) and run ``kbflow ingest
    --json`` of ``corpus`` into it, with ``env`` (its own ``KBFLOW_HOME``) from ``cwd``; the
    report's figures, the flow's docs/s and the whole command's wall time.

    Raises:
        SystemExit: the ingest failed (its stderr is in the message).
    """
    # The bootstrap fails harmlessly on a home that already has its superadmin.
    bootstrap = [*KBFLOW, "users", "add", "bench", "--role", "superadmin"]
    subprocess.run(bootstrap, env=env, check=False, capture_output=True, cwd=cwd)
    run = [*KBFLOW, "orgs", "create", "sci", "--as", "bench"]
    subprocess.run(run, env=env, check=True, capture_output=True, cwd=cwd)
    started = time.perf_counter()
    done = subprocess.run(
        [*KBFLOW, "ingest", str(corpus), "--org", "sci", "--collection", "scifact", "--json"],
        env=env,
        capture_output=True,
        text=True,
        cwd=cwd,
    )
    command_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{label}: kbflow ingest failed ({done.returncode}):\n{done.stderr}")
    report = json.loads(done.stdout)
    return {
        "documents": report["documents"],
        "chunks": report["chunks"],
        "flow_s": report["seconds"],
        "embed_s": report["embed_seconds"],
        "command_s": round(command_s, 2),
        "docs_per_s": round(report["documents"] / report["seconds"], 2),
    }
