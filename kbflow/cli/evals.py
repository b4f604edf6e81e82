"""``kbflow eval`` and ``kbflow serve-schedules``: retrieval evals on BEIR datasets, and the
nightly eval served on its schedule."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from core.settings import Settings
from evals.schedule import NIGHTLY_CRON, NIGHTLY_DEPLOYMENT, NIGHTLY_TIMEZONE
from kbflow.cli.common import JsonOpt, command, command_group, print_json
from kbflow.render import console, stage_progress
from kbflow.services import evals as service

commands = typer.Typer()
"""The top-level commands of this module (merged into ``kbflow``)."""

group = command_group("eval", "Retrieval evals: BEIR datasets, every mode, a warehouse of results.")

DatasetOpt = Annotated[
    Path,
    typer.Option(
        "--dataset", help="A BEIR folder: corpus.jsonl[.gz], queries.jsonl, qrels.", exists=True
    ),
]


@group.command("run")
@command
def eval_run(
    settings: Settings,
    dataset: DatasetOpt,
    split: Annotated[
        str | None, typer.Option(help="Split to use (default: test, then dev, then none).")
    ] = None,
    modes: Annotated[
        str | None,
        typer.Option(help="Comma-separated modes (default: keyword,dense,hybrid [+rerank])."),
    ] = None,
    record: Annotated[
        bool, typer.Option("--record/--no-record", help="Save to the eval warehouse.")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate retrieval on a BEIR dataset in every mode: MRR@10, nDCG@10, Recall@100.

    The corpus is indexed into its own data directory (<home>/evals/<dataset>) with cached
    embeddings, so a re-run re-embeds nothing. Results go to the DuckDB warehouse.
    """
    from evals.metrics import METRICS

    with stage_progress(enabled=not as_json) as progress:
        summary = service.run_eval(
            settings, dataset, split=split, modes=modes, record=record, progress=progress
        )
    if as_json:
        print_json(summary)
        return
    table = Table(title=f"{summary['dataset']} — {summary['queries']} queries")
    table.add_column("mode")
    for metric in METRICS:
        table.add_column(metric, justify="right")
    for mode, metrics in summary["modes"].items():
        table.add_row(mode, *(f"{metrics[m]:.4f}" for m in METRICS))
    console.print(table)
    refusal = summary.get("refusal") or {}
    if refusal:
        console.print(
            "refusal (the answer path's support, threshold "
            f"{settings.answers.answer_min_confidence:.2f}):"
            f" ROC AUC {refusal['refusal_auc']:.4f}, answerable answered "
            f"{refusal['answered']:.1%}, unanswerable refused {refusal['refused']:.1%}"
        )
    index = summary["index"]
    console.print(
        f"run {summary['run_id']} in {summary['seconds']:.0f}s; index: {index['documents']} "
        f"documents ({index['indexed']} indexed now), embeddings computed "
        f"{index.get('embeddings_computed', 0)}, cached {index.get('embeddings_cached', 0)}"
        + ("" if record else "; not recorded")
    )
    for note in summary["notes"]:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")


@group.command("report")
@command
def eval_report(
    settings: Settings,
    dataset: Annotated[
        str | None, typer.Option(help="Only this dataset (e.g. scifact/dev).")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="PNG to write (default: <home>/evals/history.png).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the history of recorded eval runs and plot each metric over time (PNG)."""
    rows, written = service.eval_history(settings, dataset, plot)
    if as_json:
        print_json({"runs": rows, "plot": str(written) if written else None})
        return
    if not rows:
        console.print("no eval runs recorded yet — run `kbflow eval run --dataset DIR` first.")
        return
    from evals.warehouse import METRIC_COLUMNS

    shown = {**METRIC_COLUMNS, "refusal auc": "refusal_auc"}
    table = Table(title="eval history")
    for column in ("started", "run", "dataset", "mode", *shown):
        table.add_column(column)
    for row in rows:
        table.add_row(
            str(row["started_at"])[:16],
            str(row["run_id"]),
            str(row["dataset"]),
            str(row["mode"]),
            *("—" if row.get(c) is None else f"{row[c]:.4f}" for c in shown.values()),
        )
    console.print(table)
    console.print(f"plot: {written}")


@group.command("baseline")
@command
def eval_baseline(
    settings: Settings,
    dataset: Annotated[str, typer.Option(help="Recorded dataset name, e.g. scifact/dev.")],
    tolerance: Annotated[
        float, typer.Option(min=0, max=1, help="Allowed drop before the alarm fires.")
    ] = 0.02,
    out: Annotated[
        Path | None, typer.Option(help="Where to write it (default: evals/baselines/<name>.json).")
    ] = None,
) -> None:
    """Make the latest recorded run of a dataset its baseline (what the nightly compares to)."""
    path = service.save_baseline(settings, dataset, tolerance, out)
    console.print(f"baseline for {escape(dataset)} written to {path}")


@group.command("golden")
@command
def eval_golden(
    settings: Settings,  # unused, but read first like every command's: it sets up the data dir
    out: Annotated[Path, typer.Option(help="Folder to write the BEIR files to.")] = Path("golden"),
) -> None:
    """Write the small golden set over the demo corpus as a BEIR folder."""
    console.print(f"golden set written to {service.write_golden(out)}")


@commands.command("serve-schedules")
@command
def serve_schedules(
    settings: Settings,  # read first: it points Prefect at kbflow's data dir
    dataset: Annotated[
        list[Path] | None, typer.Option(help="BEIR folders the nightly eval runs (repeatable).")
    ] = None,
    cron: Annotated[str, typer.Option(help="When, as a cron expression.")] = NIGHTLY_CRON,
    timezone: Annotated[str, typer.Option(help="The cron's time zone.")] = NIGHTLY_TIMEZONE,
    questions: Annotated[
        list[str] | None,
        typer.Option(
            help="kbflow's question sets to add: demo, real-docs (repeatable). Default: both, "
            "with SciFact, when no --dataset is given; none otherwise."
        ),
    ] = None,
) -> None:
    """Serve kbflow's schedules from this process (the nightly eval) until stopped.

    Needs a Prefect server: `kbflow server` in another shell and
    PREFECT_API_URL=http://127.0.0.1:4200/api. Equivalent to `prefect deploy` of the
    `nightly-eval` deployment in prefect.yaml plus a process worker.
    """
    deployment, folders = service.nightly_deployment(dataset or [], cron, timezone, questions)
    console.print(f"serving {NIGHTLY_DEPLOYMENT} ({cron}, {timezone}) on {', '.join(folders)}")
    service.serve(deployment)
