"""``kbflow eval`` and ``kbflow serve-schedules``: retrieval evals on BEIR datasets, and the
nightly eval served on its schedule."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from core.settings import Settings
from evals.schedule import NIGHTLY_CRON, NIGHTLY_DEPLOYMENT, NIGHTLY_TIMEZONE
from kbflow.cli.common import JsonOpt, command, command_group, counted, print_json, print_table
from kbflow.render import console, err_console, stage_progress
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
    print_table(
        f"{escape(summary['dataset'])} — {counted(summary['queries'], 'query', 'queries')}",
        ("mode", *METRICS),
        (
            (mode, *(f"{metrics[m]:.4f}" for m in METRICS))
            for mode, metrics in summary["modes"].items()
        ),
        right=METRICS,
    )
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
        f"run {summary['run_id']} in {summary['seconds']:.0f}s; index: "
        f"{counted(index['documents'], 'document')} ({index['indexed']} indexed now), "
        "embeddings computed "
        f"{index.get('embeddings_computed', 0)}, cached {index.get('embeddings_cached', 0)}"
        + ("" if record else "; not recorded")
    )
    for note in summary["notes"]:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")


@group.command("answers")
@command
def eval_answers(
    settings: Settings,
    corpus: Annotated[
        list[str] | None,
        typer.Option(help="Question set to answer: demo, real-docs (repeatable; default both)."),
    ] = None,
    home: Annotated[
        Path | None,
        typer.Option(
            help="Home to ingest the corpora into, kept and reused by the next run "
            "(default: a temporary one, removed afterwards)."
        ),
    ] = None,
    record: Annotated[
        bool, typer.Option("--record/--no-record", help="Save to the eval warehouse.")
    ] = True,
    baseline: Annotated[
        bool,
        typer.Option(
            "--baseline/--no-baseline",
            help="Compare with evals/baselines/answers-<corpus>.json; exit 1 on a regression.",
        ),
    ] = True,
    write_baseline: Annotated[
        bool,
        typer.Option("--write-baseline", help="Make this run the baseline (instead of comparing)."),
    ] = False,
    provider: Annotated[
        str | None,
        typer.Option(
            help="Who reads: none (offline), anthropic or openai (KBFLOW_LLM_BASE_URL, "
            "KBFLOW_LLM_MODEL). Default: KBFLOW_LLM_PROVIDER's choice. The report names the "
            "provider and model."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure whether answers are right: every question of the sets goes through `kbflow
    answer`, and each answer is judged answered-correct, answered-wrong, maybe or refused.

    Correct: the expected answer is in the answer's quoted text and a relevant file is cited.
    Rates are reported over all questions, per corpus and kind, and per group: the even and
    odd halves of the question set and the held-out questions.
    """
    from evals.answers import answer_records, run_answers
    from evals.regression import answer_baseline, baseline_path, check_answer_baselines
    from evals.regression import save_baseline as save
    from tasks.llm_choice import provider_settings

    settings = provider_settings(settings, provider)
    with stage_progress(enabled=not as_json) as progress:
        report = run_answers(settings, _answerer, corpus, home=home, progress=progress)
    if record:
        from evals.warehouse import write_eval

        for run in answer_records(report, settings):
            write_eval(run, home=settings.home, url=settings.stores.warehouse_url)
    notes: list[str] = []
    if write_baseline:
        for name, summary in report["by_corpus"].items():
            wanted = answer_baseline(summary, name)
            notes.append(f"baseline written to {save(baseline_path(wanted.dataset), wanted)}")
    if as_json:
        print_json(report)
    else:
        _print_answers(report)
    if baseline and not write_baseline:
        notes += check_answer_baselines(report)  # raises on a regression: exit 1
    for note in notes:
        err_console.print(f"[yellow]note:[/yellow] {escape(note)}")


@contextmanager
def _answerer(settings: Settings) -> Iterator[Callable[[str, str], dict[str, Any]]]:
    """`kbflow answer`'s path on ``settings``' home, for `evals.answers.run_answers`."""
    from kbflow.services.query.answers import answer
    from kbflow.services.query.context import open_home

    with open_home(settings) as ctx:
        yield lambda agent, question: dict(answer(ctx, agent, question))


def _print_answers(report: dict[str, Any]) -> None:
    """The buckets and rates per corpus and group, then each wrong answer."""
    from evals.answers import ANSWER_METRICS, BUCKETS

    sets = dict(report["by_corpus"])
    if len(sets) > 1:
        sets["both"] = report
    numbers = ("questions", *BUCKETS, *_RATE_HEADERS)
    print_table(
        f"answer correctness — {escape(str(report.get('provider')))}: model "
        f"{escape(str(report['model']))}, "
        f"threshold {report['threshold']:.3f}",
        ("set", *numbers),
        (
            (
                escape(f"{name} · {group}"),
                str(r["questions"]),
                *(str(r["counts"][b]) for b in BUCKETS),
                *("—" if r[m] is None else f"{r[m]:.1%}" for m in ANSWER_METRICS),
            )
            for name, summary in sets.items()
            for group, r in {"all": summary["all"], **summary["groups"]}.items()
        ),
        right=numbers,
    )
    for wrong in report["wrong"]:
        console.print(
            f"[red]answered-wrong[/red] {escape(wrong['id'])} ({escape(wrong['corpus'])}, "
            f"{escape(wrong['kind'])}): {escape(wrong['question'])}\n"
            f"  status {escape(wrong['status'])}; expected {escape(str(wrong['expected']))}; "
            f"cited {escape(', '.join(wrong['cited']) or 'nothing')}\n"
            f"  quote: {escape(wrong['quote'])}"
        )
    console.print(f"{counted(report['all']['questions'], 'question')} in {report['seconds']:.0f}s")


# The column heads of `evals.answers.ANSWER_METRICS`, in its order.
_RATE_HEADERS = (
    "wrong / all",
    "correct / answered",
    "answered / answerable",
    "near-misses not answered",
    "near-misses refused",
    "near-misses maybe",
    "unanswered with evidence",
)


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
    print_table(
        "eval history",
        ("started", "run", "dataset", "mode", *shown),
        (
            (
                str(row["started_at"])[:16],
                escape(str(row["run_id"])),
                escape(str(row["dataset"])),
                escape(str(row["mode"])),
                *("—" if row.get(c) is None else f"{row[c]:.4f}" for c in shown.values()),
            )
            for row in rows
        ),
        right=shown,
    )
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
