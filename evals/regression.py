"""The regression alarm: compare an eval run with the stored baseline of its dataset.

A baseline is a JSON file, ``evals/baselines/<dataset>.json`` by default:
``{"dataset": "scifact/dev", "tolerance": 0.02, "modes": {"hybrid": {"ndcg@10": 0.71, ...}}}``.
A metric regresses when it falls below its baseline minus the tolerance; the alarm names the
metric, the mode and the drop.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError, KbflowError

BASELINES = Path(__file__).resolve().parent / "baselines"
DEFAULT_TOLERANCE = 0.02


class EvalRegression(KbflowError, RuntimeError):
    """A metric fell below its baseline minus the tolerance."""


@dataclass(frozen=True)
class Baseline:
    dataset: str
    tolerance: float
    modes: dict[str, dict[str, float]]


def baseline_path(dataset: str) -> Path:
    return BASELINES / f"{re.sub(r'[^a-z0-9]+', '-', dataset.lower()).strip('-')}.json"


def load_baseline(path: Path) -> Baseline:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Baseline(
            dataset=str(data["dataset"]),
            tolerance=float(data.get("tolerance", DEFAULT_TOLERANCE)),
            modes={m: {k: float(v) for k, v in ms.items()} for m, ms in data["modes"].items()},
        )
    except FileNotFoundError as exc:
        raise ConfigError(
            f"no baseline at {path} — record one with `kbflow eval baseline --dataset DIR`"
        ) from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"baseline {path} is not valid ({type(exc).__name__}: {exc}) — it needs "
            '{"dataset": ..., "tolerance": ..., "modes": {mode: {metric: value}}}'
        ) from exc


def save_baseline(path: Path, baseline: Baseline) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "dataset": baseline.dataset,
        "tolerance": baseline.tolerance,
        "modes": {m: {k: round(v, 4) for k, v in ms.items()} for m, ms in baseline.modes.items()},
    }
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return path


def regressions(
    current: dict[str, dict[str, float]], baseline: Baseline, tolerance: float | None = None
) -> list[str]:
    """One line per metric below baseline - tolerance (modes absent from the run are skipped)."""
    allowed = baseline.tolerance if tolerance is None else tolerance
    found: list[str] = []
    for mode, metrics in baseline.modes.items():
        if mode not in current:
            continue
        for metric, expected in metrics.items():
            got = current[mode].get(metric)
            if got is None:
                continue
            if got < expected - allowed:
                found.append(
                    f"{mode} {metric} dropped {expected - got:.4f} ({expected:.4f} -> {got:.4f}; "
                    f"tolerance {allowed:.4f})"
                )
    return found


def check(
    current: dict[str, dict[str, float]], baseline: Baseline, tolerance: float | None = None
) -> None:
    """Raise `EvalRegression` naming every regressed metric and mode."""
    found = regressions(current, baseline, tolerance)
    if found:
        raise EvalRegression(
            f"retrieval regressed on {baseline.dataset}: " + "; ".join(found) + " — find the "
            "change that caused it (`kbflow eval report` shows the history), or, if the drop is "
            "intended, record a new baseline with `kbflow eval baseline`"
        )
