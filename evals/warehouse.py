"""Eval results in DuckDB, loaded through dlt, and their history over time.

Every retrieval eval run is written to ``<home>/warehouse/kbflow.duckdb`` (dataset ``evals``),
or to schema ``evals`` of the database at ``KBFLOW_WAREHOUSE_URL`` when that is set (reads go to
the same place: ``sinks.warehouse.reading``):

- ``eval_runs``: one row per (run, mode) with the mean of each metric;
- ``eval_queries``: one row per (run, mode, query) with that query's metrics.

Answer-correctness runs (`evals.answers`) share the tables: dataset ``answers-<corpus>``, one
``eval_runs`` row per question group ("mode" ``all``, ``even``, ``odd``, ``holdout``) with the
answer rates, and ``eval_queries`` rows per question (under ``all`` and under its group) with a
0/1 column per bucket. Retrieval rows leave the answer columns null, and answer rows the
retrieval ones.

Both tables merge on their primary keys, so loading the same run twice replaces its rows
instead of duplicating them.

DuckDB allows ONE writer process per file, and a writer also shuts readers out: never run two
evals (or an eval and a history read) against the same home at the same time. A write or read
that meets another process's lock raises :class:`WarehouseError`; retry when that process ends.

dlt, duckdb and matplotlib are imported inside the functions: together they take about a
second to import, which commands that never touch the warehouse should not pay.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.errors import ConfigError, KbflowError
from evals.metrics import METRICS
from evals.refusal import REFUSAL_METRICS, SUPPORT_METRICS
from sinks.warehouse import (
    Destination,
    destination,
    dlt_pipeline,
    drop_unfinished_loads,
    is_lock_error,
    reading,
    without_dlt_usage_tracking,
)

log = logging.getLogger(__name__)

PIPELINE_NAME = "kbflow_evals"
DATASET_NAME = "evals"
RUNS_TABLE = "eval_runs"
QUERIES_TABLE = "eval_queries"

# Metric name as the eval reports it -> column name (SQL identifiers cannot hold "@").
METRIC_COLUMNS: dict[str, str] = {m: m.replace("@", "_at_") for m in METRICS}
# The refusal metrics (`evals.refusal`) ride on the hybrid rows: run means in ``eval_runs``,
# per-query supports in ``eval_queries``; other modes' rows leave them null.
REFUSAL_COLUMNS: dict[str, str] = {m: m for m in REFUSAL_METRICS}
SUPPORT_COLUMNS: dict[str, str] = {m: m for m in SUPPORT_METRICS}
# Answer-correctness runs (`evals.answers`): the rates of each question group, and per question
# a 0/1 column per bucket (answered-correct, answered-wrong, maybe, refused-answerable,
# refused-unanswerable). Named here, where they are columns; `evals.answers` imports them.
ANSWER_METRICS: tuple[str, ...] = (
    "answered_wrong_rate",
    "answered_correct_rate",
    "answered_rate",
    "near_miss_not_answered_rate",
    "near_miss_refused_rate",
    "near_miss_maybe_rate",
    "maybe_evidence_rate",
)
ANSWER_OUTCOMES: tuple[str, ...] = (
    "answer_answered_correct",
    "answer_answered_wrong",
    "answer_maybe",
    "answer_refused_answerable",
    "answer_refused_unanswerable",
)
ANSWER_COLUMNS: dict[str, str] = {m: m for m in ANSWER_METRICS}
ANSWER_OUTCOME_COLUMNS: dict[str, str] = {m: m for m in ANSWER_OUTCOMES}
RUN_METRIC_COLUMNS: dict[str, str] = {**METRIC_COLUMNS, **REFUSAL_COLUMNS, **ANSWER_COLUMNS}
QUERY_METRIC_COLUMNS: dict[str, str] = {
    **METRIC_COLUMNS,
    **SUPPORT_COLUMNS,
    **ANSWER_OUTCOME_COLUMNS,
}


def _hints(columns: dict[str, str]) -> dict[str, Any]:
    return {column: {"data_type": "double", "nullable": True} for column in columns.values()}


# Declared up front so the tables have the same columns whatever the first run holds (a run
# without a commit would otherwise create no ``commit`` column at all).
_RUNS_COLUMNS: dict[str, Any] = {
    "run_id": {"data_type": "text", "nullable": False},
    "dataset": {"data_type": "text", "nullable": False},
    "started_at": {"data_type": "timestamp", "timezone": True, "nullable": False},
    "commit": {"data_type": "text", "nullable": True},
    "mode": {"data_type": "text", "nullable": False},
    **_hints(RUN_METRIC_COLUMNS),
    "queries": {"data_type": "bigint", "nullable": False},
    "seconds": {"data_type": "double", "nullable": False},
    "settings": {"data_type": "text", "nullable": False},  # JSON, so dlt does not flatten it
}
_QUERIES_COLUMNS: dict[str, Any] = {
    "run_id": {"data_type": "text", "nullable": False},
    "dataset": {"data_type": "text", "nullable": False},
    "mode": {"data_type": "text", "nullable": False},
    "query_id": {"data_type": "text", "nullable": False},
    **_hints(QUERY_METRIC_COLUMNS),
}
_HISTORY_COLUMNS = tuple(_RUNS_COLUMNS)

PLOT_SIZE_INCHES = (10.0, 9.0)
PLOT_DPI = 100


class WarehouseError(KbflowError, RuntimeError):
    """The eval warehouse could not be written or read (e.g. another process holds it)."""


@dataclass(frozen=True)
class EvalRecord:
    """One retrieval eval run: its means per mode and its metrics per query.

    Attributes:
        run_id: Unique id of the run; writing the same id again replaces its rows.
        dataset: Name of the evaluated dataset.
        started_at: When the run started; must be timezone-aware (stored as UTC).
        commit: kbflow's git commit, when known.
        settings: Settings the run used (stored as JSON).
        modes: mode -> metric ("mrr@10", "ndcg@10", "recall@100") -> mean over queries.
        per_query: mode -> query id -> metric -> value.
        seconds: Wall-clock duration of the run.
    """

    run_id: str
    dataset: str
    started_at: datetime
    commit: str | None
    settings: dict[str, Any]
    modes: dict[str, dict[str, float]]
    per_query: dict[str, dict[str, dict[str, float]]]
    seconds: float


def warehouse_path(home: Path) -> Path:
    """The DuckDB file eval results live in: ``<home>/warehouse/kbflow.duckdb``."""
    return home / "warehouse" / "kbflow.duckdb"


def warehouse_destination(home: Path, url: str | None = None) -> Destination:
    """Where eval results live: ``warehouse_path(home)``, or the database at ``url``.

    Raises:
        ConfigError: ``url`` is not a database URL.
    """
    return destination(warehouse_path(home), url)


def write_eval(
    record: EvalRecord, *, home: Path, pipelines_dir: Path | None = None, url: str | None = None
) -> dict[str, int]:
    """Load one eval run into the warehouse (idempotent per run id).

    Only one process may write a DuckDB file at a time; see the module docstring.

    Args:
        record: The run to store.
        home: kbflow's data directory; the warehouse is ``warehouse_path(home)``.
        pipelines_dir: Where dlt keeps the pipeline's own state. Default: ``<home>/dlt``.
        url: A SQL database to load into instead (``KBFLOW_WAREHOUSE_URL``).

    Returns:
        Rows written per table: ``{"eval_runs": n, "eval_queries": m}``.

    Raises:
        ConfigError: The record is malformed (naive ``started_at``, unknown metric, a mode
            with per-query values but no means).
        WarehouseError: Another process holds the DuckDB file, or dlt failed to load.
    """
    runs = _run_rows(record)
    queries = list(_query_rows(record))
    pipeline_home = pipelines_dir if pipelines_dir is not None else home / "dlt"
    target = warehouse_destination(home, url)
    path = target.where
    pipeline = dlt_pipeline(
        PIPELINE_NAME, target=target, dataset=DATASET_NAME, pipelines_dir=pipeline_home
    )
    import dlt
    from dlt.pipeline.exceptions import PipelineStepFailed

    eval_runs = dlt.resource(
        runs,
        name=RUNS_TABLE,
        write_disposition="merge",
        primary_key=("run_id", "mode"),
        columns=_RUNS_COLUMNS,
    )
    eval_queries = dlt.resource(
        queries,
        name=QUERIES_TABLE,
        write_disposition="merge",
        primary_key=("run_id", "mode", "query_id"),
        columns=_QUERIES_COLUMNS,
    )
    started = time.perf_counter()
    try:
        with without_dlt_usage_tracking(pipeline):
            drop_unfinished_loads(pipeline, "eval warehouse")
            pipeline.run([eval_runs, eval_queries])
    except PipelineStepFailed as exc:
        if is_lock_error(exc):
            raise _locked(path, "write eval run " + repr(record.run_id)) from exc
        raise WarehouseError(
            f"could not load eval run {record.run_id!r} into {path} "
            f"(dlt step {exc.step!r} failed): {exc.exception} — fix the cause and run the eval "
            "again; loading the same run id again replaces its rows"
        ) from exc
    written = {RUNS_TABLE: len(runs), QUERIES_TABLE: len(queries)}
    log.info(
        "wrote eval run %s to %s: %s in %.2f s",
        record.run_id,
        path,
        written,
        time.perf_counter() - started,
    )
    return written


def read_history(
    home: Path, dataset: str | None = None, mode: str | None = None, *, url: str | None = None
) -> list[dict[str, Any]]:
    """Stored ``eval_runs`` rows, oldest first; ``[]`` when nothing has been written yet.

    Each row has the table's columns: ``run_id``, ``dataset``, ``started_at`` (UTC datetime),
    ``commit``, ``mode``, ``mrr_at_10``, ``ndcg_at_10``, ``recall_at_100``, ``queries``,
    ``seconds`` and ``settings`` (parsed back into a dict).

    Args:
        home: kbflow's data directory.
        dataset: Only runs of this dataset.
        mode: Only rows of this retrieval mode.
        url: The SQL database the runs were loaded into (``KBFLOW_WAREHOUSE_URL``).

    Raises:
        WarehouseError: Another process is writing the warehouse, or its database cannot be
            reached.
    """
    target = warehouse_destination(home, url)
    path = target.where
    if not target.may_hold_data():
        return []
    filters = {"dataset": dataset, "mode": mode}
    where = [f"{column} = ?" for column, value in filters.items() if value is not None]
    params = [value for value in filters.values() if value is not None]
    with reading(
        target,
        on_lock=lambda: _locked(path, "read eval history"),
        on_error=lambda exc: _unreachable(target, exc),
    ) as con:
        if RUNS_TABLE not in con.tables(DATASET_NAME):
            return []
        # a warehouse written before a column existed lacks it until the next write adds it
        present = con.columns(DATASET_NAME, RUNS_TABLE)
        selected = [c for c in _HISTORY_COLUMNS if c in present]
        columns = ", ".join(f'"{c}"' for c in selected)
        sql = (
            f"SELECT {columns} FROM {DATASET_NAME}.{RUNS_TABLE}"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + " ORDER BY started_at, run_id, mode"
        )
        result = con.execute(sql, params)
    rows = [
        {c: None for c in _HISTORY_COLUMNS} | dict(zip(selected, values, strict=True))
        for values in result
    ]
    for row in rows:
        row["started_at"] = row["started_at"].astimezone(UTC)
        row["settings"] = json.loads(row["settings"])
    return rows


def latest(
    home: Path, dataset: str, *, url: str | None = None
) -> dict[str, dict[str, float]] | None:
    """Means of the most recent run of ``dataset``: mode -> metric ("mrr@10", ...) -> value.

    Shaped like :attr:`EvalRecord.modes`, so a new run can be compared with it directly.
    Metrics the run did not record are left out. ``None`` when the dataset has no runs.
    """
    rows = read_history(home, dataset=dataset, url=url)
    if not rows:
        return None
    newest = max(rows, key=lambda row: (row["started_at"], row["run_id"]))
    return {
        row["mode"]: {
            metric: row[column]
            for metric, column in RUN_METRIC_COLUMNS.items()
            if row[column] is not None
        }
        for row in rows
        if row["run_id"] == newest["run_id"]
    }


def plot_history(rows: list[dict[str, Any]], out: Path) -> Path:
    """Draw ``read_history`` rows as a PNG: a subplot per metric, a line per (dataset, mode).

    Args:
        rows: Rows from :func:`read_history`.
        out: Where to write the PNG (its folder is created).

    Returns:
        ``out``.

    Raises:
        ConfigError: ``rows`` is empty.
    """
    if not rows:
        raise ConfigError("no eval runs recorded yet — run `kbflow eval run --dataset DIR` first")
    # Figure + the Agg canvas directly: no pyplot, so no GUI backend and no global figure state.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
    from matplotlib.figure import Figure

    plotted = {**METRIC_COLUMNS, "refusal_auc": REFUSAL_COLUMNS["refusal_auc"]}
    lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["started_at"]):
        # answer-correctness rows hold none of these metrics: they get no empty line
        if any(row.get(column) is not None for column in plotted.values()):
            lines.setdefault((row["dataset"], row["mode"]), []).append(row)

    fig = Figure(figsize=PLOT_SIZE_INCHES, dpi=PLOT_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(plotted), 1, sharex=True)
    for ax, (metric, column) in zip(axes, plotted.items(), strict=True):
        for (dataset, mode), points in sorted(lines.items()):
            ax.plot(
                [p["started_at"] for p in points],
                [math.nan if p[column] is None else p[column] for p in points],
                marker="o",
                label=f"{dataset} · {mode}",
            )
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
    locator = AutoDateLocator()
    axes[-1].xaxis.set_major_locator(locator)
    axes[-1].xaxis.set_major_formatter(ConciseDateFormatter(locator))
    axes[-1].set_xlabel("run started (UTC)")
    axes[0].legend(loc="best", fontsize="small")
    fig.suptitle("kbflow retrieval evals over time")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def _run_rows(record: EvalRecord) -> list[dict[str, Any]]:
    if record.started_at.tzinfo is None or record.started_at.utcoffset() is None:
        raise ConfigError(
            f"started_at of eval run {record.run_id!r} must be timezone-aware (UTC). "
            f"Currently {record.started_at.isoformat()} — pass datetime.now(UTC)"
        )
    orphans = sorted(set(record.per_query) - set(record.modes))
    if orphans:
        raise ConfigError(
            f"eval run {record.run_id!r} has per-query values for modes without means: "
            f"{orphans} — add them to `modes`"
        )
    started_at = record.started_at.astimezone(UTC)
    settings = json.dumps(record.settings, sort_keys=True, default=str)
    return [
        {
            "run_id": record.run_id,
            "dataset": record.dataset,
            "started_at": started_at,
            "commit": record.commit,
            "mode": mode,
            **_metric_values(metrics, f"{record.run_id}/{mode}", RUN_METRIC_COLUMNS),
            "queries": len(record.per_query.get(mode, {})),
            "seconds": record.seconds,
            "settings": settings,
        }
        for mode, metrics in record.modes.items()
    ]


def _query_rows(record: EvalRecord) -> Iterator[dict[str, Any]]:
    for mode, by_query in record.per_query.items():
        for query_id, metrics in by_query.items():
            yield {
                "run_id": record.run_id,
                "dataset": record.dataset,
                "mode": mode,
                "query_id": query_id,
                **_metric_values(
                    metrics, f"{record.run_id}/{mode}/{query_id}", QUERY_METRIC_COLUMNS
                ),
            }


def _metric_values(
    metrics: dict[str, float], where: str, columns: dict[str, str]
) -> dict[str, float | None]:
    unknown = sorted(set(metrics) - set(columns))
    if unknown:
        raise ConfigError(
            f"unknown metric(s) {unknown} in eval results {where}: the warehouse stores "
            f"{sorted(columns)} — add a column to evals/warehouse.py for a new metric"
        )
    return {column: metrics.get(metric) for metric, column in columns.items()}


def _unreachable(target: Destination, exc: Exception) -> WarehouseError:
    if target.is_duckdb:
        return WarehouseError(f"could not open the eval warehouse {target.where}: {exc}")
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return WarehouseError(
        f"could not reach the eval warehouse database {target.where}: {first} — check "
        "KBFLOW_WAREHOUSE_URL and that the server is up"
    )


def _locked(path: Path | str, action: str) -> WarehouseError:
    return WarehouseError(
        f"could not {action}: another process is writing the eval warehouse {path} "
        "(DuckDB allows one writer per file) — wait for it to finish and retry"
    )
