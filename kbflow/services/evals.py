"""Retrieval evals: run one, read the history, set a baseline, write the golden set, serve the
nightly (`kbflow eval`, `kbflow serve-schedules`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict, cast

from core.errors import ConfigError, KbflowError
from core.settings import Settings
from evals.schedule import NIGHTLY_CRON, NIGHTLY_DEPLOYMENT, NIGHTLY_TIMEZONE

REPO = Path(__file__).resolve().parents[2]

NO_SCHEDULER = (
    "PREFECT_API_URL is not set: schedules need a running Prefect server — start "
    "`kbflow server` and export PREFECT_API_URL=http://127.0.0.1:4200/api"
)


class EvalSummary(TypedDict):
    """A retrieval eval run, summed up (`evals.retrieval.EvalResult.summary`): the means of
    each mode, and the refusal metrics at the configured threshold (empty without hybrid)."""

    dataset: str
    run_id: str
    queries: int
    modes: dict[str, dict[str, float]]
    refusal: dict[str, float]
    seconds: float
    index: dict[str, int]
    settings: dict[str, Any]
    notes: list[str]


EvalRunRow = dict[str, Any]
"""One recorded run of one mode (`evals.warehouse.read_history`): the ``eval_runs`` table's
columns, one per metric of `evals.warehouse.RUN_METRIC_COLUMNS` among them, which a typed dict
would have to copy."""


def run_eval(
    settings: Settings,
    dataset: Path,
    *,
    split: str | None = None,
    modes: str | None = None,
    record: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
) -> EvalSummary:
    """Evaluate retrieval on a BEIR folder in each mode (comma-separated ``modes``; default
    keyword, dense, hybrid and hybrid+rerank when a reranker is set), recorded in the warehouse
    when ``record``. ``progress`` hears (stage, done, total).

    Returns:
        The run's summary (`evals.retrieval.EvalResult.summary`).
    """
    from evals.beir import load_beir
    from evals.retrieval import parse_modes
    from evals.retrieval import run_eval as evaluate
    from evals.warehouse import write_eval

    ds = load_beir(dataset, split)
    chosen = parse_modes(modes)
    result = evaluate(ds, settings, chosen, progress=progress)
    if record:
        write_eval(result.record, home=settings.home, url=settings.stores.warehouse_url)
    return cast("EvalSummary", result.summary())


def eval_history(
    settings: Settings, dataset: str | None, plot: Path | None
) -> tuple[list[EvalRunRow], Path | None]:
    """The recorded runs (of one dataset, or all) and the PNG plotting each metric over time
    (``plot``, default ``<home>/evals/history.png``; None when nothing is recorded)."""
    from evals.warehouse import plot_history, read_history

    rows = read_history(settings.home, dataset, url=settings.stores.warehouse_url)
    out = plot or settings.home / "evals" / "history.png"
    return rows, plot_history(rows, out) if rows else None


def save_baseline(settings: Settings, dataset: str, tolerance: float, out: Path | None) -> Path:
    """Make the latest recorded run of ``dataset`` its baseline; returns where it was written
    (default ``evals/baselines/<name>.json``)."""
    from evals.regression import Baseline, baseline_path
    from evals.regression import save_baseline as save
    from evals.warehouse import latest

    modes = latest(settings.home, dataset, url=settings.stores.warehouse_url)
    if not modes:
        raise KbflowError(
            f"no recorded run of {dataset!r} — run `kbflow eval run --dataset DIR` first"
        )
    from evals.refusal import AT_THRESHOLD

    modes = {
        mode: {k: v for k, v in metrics.items() if k not in AT_THRESHOLD}
        for mode, metrics in modes.items()
    }
    return save(out or baseline_path(dataset), Baseline(dataset, tolerance, modes))


def write_golden(out: Path) -> Path:
    """Write the small golden set over the demo corpus as a BEIR folder; returns it."""
    from evals.golden import write_golden_set

    return write_golden_set(out)


def default_eval_dataset() -> str:
    """SciFact in the shared datasets folder (``KBFLOW_DATASETS``, default ../shared/datasets)."""
    return str(
        Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets")) / "scifact"
    )


def nightly_deployment(
    datasets: Sequence[Path],
    cron: str = NIGHTLY_CRON,
    timezone: str = NIGHTLY_TIMEZONE,
    question_sets: Sequence[str] | None = None,
) -> tuple[Any, list[str]]:
    """The nightly eval as a deployment to serve from this process, on ``datasets`` and the
    ``question_sets`` (default, when neither is given: SciFact and both question sets); returns
    it and what it evaluates (folders, then ``questions-<corpus>``).

    Raises:
        KbflowError: no Prefect server is set (schedules need one).
    """
    from kbflow.services.orchestration import require_prefect_server

    require_prefect_server(NO_SCHEDULER)
    from prefect.schedules import Cron

    from evals.nightly import nightly_eval, question_set_name
    from evals.questions import CORPORA

    corpora: list[str]
    if not datasets and question_sets is None:
        folders, corpora = [default_eval_dataset()], list(CORPORA)
    else:
        folders, corpora = [str(p.resolve()) for p in datasets], list(question_sets or ())
    unknown = sorted(set(corpora) - set(CORPORA))
    if unknown:
        raise ConfigError(f"unknown question set(s) {unknown}: choose from {', '.join(CORPORA)}")
    deployment = nightly_eval.to_deployment(
        name=NIGHTLY_DEPLOYMENT,
        schedule=Cron(cron, timezone=timezone),
        parameters={"datasets": folders, "question_sets": corpora},
    )
    return deployment, folders + [question_set_name(c) for c in corpora]


def serve(deployment: Any) -> None:
    """Serve ``deployment``'s schedule from this process until it is stopped."""
    from prefect import serve as serve_deployments

    serve_deployments(deployment)
