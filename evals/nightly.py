"""The nightly eval as a Prefect flow: run every mode on each dataset, record the results in
the warehouse, and fail loudly when a metric falls below its baseline.

Scheduled in ``prefect.yaml`` (deployment ``nightly-eval``) or served locally with
``kbflow serve-schedules``; when it runs (deployment name, cron, time zone) is defined once, in
`evals.schedule`. The flow lives in ``evals/`` because it orchestrates evals, which the
product's flows never import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from core.errors import KbflowError
from core.settings import Settings
from evals.answers import answers_dataset
from evals.beir import load_beir
from evals.regression import baseline_path, check, check_answer_baselines, load_baseline
from evals.retrieval import EvalResult, parse_modes, run_eval
from evals.warehouse import write_eval

REPO = Path(__file__).resolve().parents[1]


@task(name="eval-dataset", cache_policy=NO_CACHE)
def eval_dataset_task(folder: str, split: str | None, modes: str | None) -> EvalResult:
    settings = Settings()
    return run_eval(load_beir(Path(folder), split), settings, parse_modes(modes))


@task(name="record-eval", cache_policy=NO_CACHE)
def record_eval_task(result: EvalResult) -> dict[str, int]:
    settings = Settings()
    return write_eval(result.record, home=settings.home, url=settings.stores.warehouse_url)


@task(name="write-question-set", cache_policy=NO_CACHE)
def question_set_task(corpus: str) -> str | None:
    """Write one corpus's question set (`evals.questions`) as a BEIR folder under
    ``<home>/evals/question-sets``; None when its documents are not on this machine."""
    from typing import cast

    from evals.questions import Corpus, datasets_folder, write_question_set

    if corpus == "real-docs" and not (datasets_folder() / "real-docs").is_dir():
        get_run_logger().warning(
            "question set %s skipped: no %s (set KBFLOW_DATASETS)",
            corpus,
            datasets_folder() / "real-docs",
        )
        return None
    folder = Settings().home / "evals" / "question-sets" / question_set_name(corpus)
    return str(write_question_set(folder, corpus=cast(Corpus, corpus)))


@task(name="answer-eval", cache_policy=NO_CACHE)
def answer_eval_task(corpus: str) -> dict[str, Any] | None:
    """Judge every answer to one corpus's questions: ``kbflow eval answers`` in a child process
    (the answer path is the app's, a floor above ``evals/``), in a home kept under
    ``<home>/evals/answers-home`` so the corpus is ingested once; the command records the run
    in the warehouse. Returns its report; None when the documents are not on this machine."""
    from evals.questions import datasets_folder

    if corpus == "real-docs" and not (datasets_folder() / "real-docs").is_dir():
        get_run_logger().warning("answer eval of %s skipped: no real-docs documents", corpus)
        return None
    home = Settings().home / "evals" / "answers-home"
    command = [sys.executable, "-m", "kbflow.cli", "eval", "answers", "--corpus", corpus,
               "--home", str(home), "--no-baseline", "--json"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=False)
    if done.returncode != 0:
        raise KbflowError(
            f"kbflow eval answers --corpus {corpus} failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-1500:]}"
        )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def question_set_name(corpus: str) -> str:
    """The folder, and so the dataset name, of a corpus's question set: ``questions-<corpus>``."""
    return f"questions-{corpus}"


@flow(name="nightly-eval")
def nightly_eval(
    datasets: list[str],
    split: str | None = None,
    modes: str | None = None,
    baseline_dir: str | None = None,
    tolerance: float | None = None,
    question_sets: list[str] | None = None,
    answer_sets: list[str] | None = None,
) -> dict[str, Any]:
    """Evaluate retrieval on each BEIR folder, record it, then compare with the baselines.

    ``question_sets`` (``demo``, ``real-docs``) adds kbflow's own question sets
    (`evals.questions`): written afresh each run, evaluated like any BEIR folder, their
    near-misses scored by the refusal metric. ``answer_sets`` (``demo``, ``real-docs``) judges
    every answer of those question sets, held-out questions included (`evals.answers`), and
    compares answered-wrong and answered-correct with ``answers-<corpus>.json``. Every dataset
    is evaluated and recorded before any alarm is raised, so one regression does not hide
    another dataset's figures. A dataset without a baseline is recorded only.
    """
    logger = get_run_logger()
    summaries: dict[str, Any] = {}
    problems: list[str] = []
    folders = list(datasets)
    for corpus in question_sets or ():
        written = question_set_task(corpus)
        if written is not None:
            folders.append(written)
    for folder in folders:
        result = eval_dataset_task(folder, split, modes)
        record_eval_task(result)
        summary = result.summary()
        summaries[result.record.dataset] = summary
        logger.info("%s: %s", result.record.dataset, summary["modes"])
        path = (
            Path(baseline_dir) / baseline_path(result.record.dataset).name
            if baseline_dir
            else baseline_path(result.record.dataset)
        )
        if not path.exists():
            logger.warning("no baseline for %s at %s: recorded only", result.record.dataset, path)
            continue
        try:
            check(result.record.modes, load_baseline(path), tolerance)
        except Exception as exc:
            problems.append(str(exc))
    for corpus in answer_sets or ():
        report = answer_eval_task(corpus)
        if report is None:
            continue
        # Who read beside the figures: rates of one provider and model say nothing of another.
        summaries[answers_dataset(corpus)] = {
            **report["all"], "provider": report.get("provider"), "model": report.get("model")
        }  # fmt: skip
        logger.info("%s (%s, %s): %s", answers_dataset(corpus), report.get("provider"),
                    report.get("model"), report["all"])  # fmt: skip
        try:
            for note in check_answer_baselines(
                report, Path(baseline_dir) if baseline_dir else None, tolerance
            ):
                logger.warning(note)
        except Exception as exc:
            problems.append(str(exc))
    if problems:
        from evals.regression import EvalRegression

        raise EvalRegression(" | ".join(problems))
    return summaries
