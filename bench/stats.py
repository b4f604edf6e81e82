"""What the benchmarks share: a percentile, median / p95 of samples in ms, and saving results."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency(samples_s: list[float], digits: int = 3) -> dict[str, float]:
    """``n``, ``median_ms`` and ``p95_ms`` of samples given in seconds."""
    ms = [s * 1000 for s in samples_s]
    return {
        "n": len(ms),
        "median_ms": round(statistics.median(ms), digits),
        "p95_ms": round(pct(ms, 0.95), digits),
    }


def save_results(name: str, out: dict[str, Any], *, unprinted: str | None = None) -> Path:
    """Write ``out`` to ``bench/results/<name>.json`` and print it, less the key ``unprinted``
    (a long per-query list)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != unprinted}, indent=2))
    return path
