"""Latency figures the benchmarks share: a percentile, and median / p95 of samples in ms."""

from __future__ import annotations

import statistics


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
