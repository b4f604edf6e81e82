"""The regression alarm: compare an eval run with the stored baseline of its dataset.

A baseline is a JSON file, ``evals/baselines/<dataset>.json`` by default:
``{"dataset": "scifact/dev", "tolerance": 0.02, "modes": {"hybrid": {"ndcg@10": 0.71, ...}}}``.
A metric regresses when it falls below its baseline minus the tolerance (or, for a metric in
`LOWER_IS_BETTER` such as the answer eval's ``answered_wrong_rate``, rises above its baseline
plus the tolerance); the alarm names the metric, the mode and the change.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError, KbflowError

BASELINES = Path(__file__).resolve().parent / "baselines"
DEFAULT_TOLERANCE = 0.02
LOWER_IS_BETTER: frozenset[str] = frozenset({"answered_wrong_rate"})
"""Metrics that regress by rising (`evals.answers`: the share of questions answered wrong)."""


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
    """One line per metric below baseline - tolerance, or above baseline + tolerance for a
    metric in `LOWER_IS_BETTER` (modes absent from the run are skipped)."""
    allowed = baseline.tolerance if tolerance is None else tolerance
    found: list[str] = []
    for mode, metrics in baseline.modes.items():
        if mode not in current:
            continue
        for metric, expected in metrics.items():
            got = current[mode].get(metric)
            if got is None:
                continue
            if metric in LOWER_IS_BETTER:
                if got > expected + allowed:
                    found.append(
                        f"{mode} {metric} rose {got - expected:.4f} ({expected:.4f} -> "
                        f"{got:.4f}; tolerance {allowed:.4f})"
                    )
            elif got < expected - allowed:
                found.append(
                    f"{mode} {metric} dropped {expected - got:.4f} ({expected:.4f} -> {got:.4f}; "
                    f"tolerance {allowed:.4f})"
                )
    return found


def check(
    current: dict[str, dict[str, float]],
    baseline: Baseline,
    tolerance: float | None = None,
    *,
    what: str = "retrieval",
) -> None:
    """Raise `EvalRegression` naming every regressed metric and mode (``what`` regressed:
    ``retrieval``, ``answers``)."""
    found = regressions(current, baseline, tolerance)
    if found:
        again = (
            "kbflow eval answers --write-baseline" if what == "answers" else "kbflow eval baseline"
        )
        raise EvalRegression(
            f"{what} regressed on {baseline.dataset}: " + "; ".join(found) + " — find the "
            "change that caused it (`kbflow eval report` shows the history), or, if the drop is "
            f"intended, record a new baseline with `{again}`"
        )


# --- answer correctness (`evals.answers`) --------------------------------------------------

BASELINE_METRICS: tuple[str, ...] = (
    "answered_wrong_rate",
    "answered_correct_rate",
    "maybe_evidence_rate",
)
"""What a baseline holds, over all of a corpus's questions: the alarm fires when answered-wrong
rises, or answered-correct or the evidence handed over for what is not answered falls, by more
than the tolerance."""
ANSWER_TOLERANCE = 0.05
"""About two of the demo's 60 questions: one answer flipping is not an alarm."""


def answer_baseline(
    summary: dict[str, Any], corpus: str, tolerance: float = ANSWER_TOLERANCE
) -> Baseline:
    """A corpus's answer summary (`evals.answers.summarise`) as its baseline."""
    from evals.answers import answers_dataset, metrics_of

    rates_all = metrics_of(summary)["all"]
    return Baseline(
        answers_dataset(corpus),
        tolerance,
        {"all": {m: rates_all[m] for m in BASELINE_METRICS if m in rates_all}},
    )


def check_answer_baselines(
    report: dict[str, Any], baseline_dir: Path | None = None, tolerance: float | None = None
) -> list[str]:
    """Compare each corpus of an answer report (`evals.answers.run_answers`) with its
    baseline (``answers-<corpus>.json`` in ``baseline_dir``, default ``evals/baselines``);
    returns notes on the corpora that have none.

    Raises:
        EvalRegression: A corpus regressed; the message names every metric that did.
    """
    from evals.answers import answers_dataset, metrics_of

    problems: list[str] = []
    notes: list[str] = []
    for corpus, summary in report["by_corpus"].items():
        path = baseline_path(answers_dataset(corpus))
        if baseline_dir is not None:
            path = Path(baseline_dir) / path.name
        if not path.exists():
            notes.append(f"no baseline for {answers_dataset(corpus)} at {path}: not compared")
            continue
        try:
            check(metrics_of(summary), load_baseline(path), tolerance, what="answers")
        except EvalRegression as exc:
            problems.append(str(exc))
    if problems:
        raise EvalRegression(" | ".join(problems))
    return notes
