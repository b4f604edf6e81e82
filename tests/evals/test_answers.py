"""Answer correctness (`evals.answers`): each bucket on hand-built answer outputs, the rates,
the baseline alarm, the warehouse rows; and, marked integration, `kbflow eval answers` end to
end over the demo corpus."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evals.answers import (
    ANSWER_METRICS,
    BUCKETS,
    Judged,
    answer_records,
    holds,
    judge,
    metrics_of,
    normalise,
    rates,
    summarise,
)
from evals.questions import Question
from evals.regression import (
    EvalRegression,
    answer_baseline,
    check_answer_baselines,
    save_baseline,
)

PRICE = Question(
    id="q-t-1",
    corpus="demo",
    text="What does the Meridian gravel bike sell for?",
    answerable=True,
    relevant=("product-sheet.html",),
    answer="2,190 EUR",
    kind="paraphrase",
)
NEAR = Question(
    id="q-t-2",
    corpus="demo",
    text="What will the Meridian cost in 2027?",
    answerable=False,
    relevant=(),
    answer=None,
    kind="near-miss",
)
FILES = {"doc-sheet": "product-sheet.html", "doc-policy": "returns-policy.docx"}


def output(status: str, text: str = "", doc: str = "doc-sheet", quote: str = "") -> dict[str, Any]:
    """An answer output shaped like `kbflow answer --json`'s."""
    citation = {
        "chunk_id": f"{doc}:1",
        "doc_id": doc,
        "uri": f"kbflow://demo/abc/{FILES.get(doc, 'other.md')}",
        "title": "t",
        "quote": quote,
        "sources": [],
    }
    if status == "refused":
        return {"status": "refused", "claims": [], "citations": []}
    return {
        "status": status,
        "claims": [{"text": text, "citations": [citation]}],
        "citations": [citation],
    }


# --- matching and judging ---------------------------------------------------------------------


def test_matching_ignores_case_whitespace_and_punctuation_but_keeps_word_edges() -> None:
    assert normalise("  2,190\nEUR. ") == "2 190 eur"
    assert holds("2,190 EUR", "“| Meridian Gravel | 2,190  eur |”")
    assert holds("+32 9 555 0301", "phone: +32-9-555-0301")
    assert not holds("2,190 EUR", "2,199 EUR")
    assert not holds("IV", "five items")  # a word edge is needed at a Latin end
    assert holds("IV", "| III | IV |")
    assert holds("158명", "사망자는 158명으로 나타났다")  # a Korean answer may take a particle
    assert not holds("", "anything")


@pytest.mark.parametrize(
    ("question", "out", "bucket"),
    [
        (PRICE, output("answered", "Gravel bike · 9.4 kg · 2,190 EUR"), "answered-correct"),
        # the fact is in a citation's quote rather than the claim's text
        (PRICE, output("answered", "See the sheet.", quote="2,190 EUR"), "answered-correct"),
        # the right figure, but only an irrelevant document is cited
        (PRICE, output("answered", "2,190 EUR", doc="doc-policy"), "answered-wrong"),
        # a relevant document, but the wrong figure
        (PRICE, output("answered", "Price: 3,190 EUR"), "answered-wrong"),
        (PRICE, output("maybe", "2,190 EUR"), "maybe"),
        (PRICE, output("partial", "2,190 EUR"), "maybe"),  # any other status is a maybe
        (PRICE, output("refused"), "refused-answerable"),
        (NEAR, output("answered", "Price: 2,190 EUR"), "answered-wrong"),
        (NEAR, output("maybe", "Price: 2,190 EUR"), "maybe"),
        (NEAR, output("refused"), "refused-unanswerable"),
    ],
)
def test_each_answer_lands_in_its_bucket(
    question: Question, out: dict[str, Any], bucket: str
) -> None:
    judged = judge(question, out, group="even", files=FILES)
    assert judged.bucket == bucket
    assert judged.status == out["status"]


def test_a_judged_answer_keeps_what_a_developer_needs_to_see() -> None:
    judged = judge(PRICE, output("answered", "Price: 3,190 EUR"), group="holdout", files=FILES)
    row = judged.to_dict()
    assert row["cited"] == ["product-sheet.html"] and row["group"] == "holdout"
    assert row["quote"] == "Price: 3,190 EUR" and row["expected"] == "2,190 EUR"
    # an unknown document is named by its URI's last part
    unknown = output("answered", "x", doc="doc-new")
    assert judge(PRICE, unknown, group="odd", files={}).cited == ("other.md",)


# --- rates ------------------------------------------------------------------------------------


def judged_row(
    bucket: str, *, answerable: bool, group: str = "even", kind: str = "direct"
) -> Judged:
    status = {"answered-correct": "answered", "answered-wrong": "answered", "maybe": "maybe"}
    return Judged(
        id=f"q-{bucket}-{answerable}-{group}",
        corpus="demo",
        kind=kind if answerable else "near-miss",
        group=group,  # type: ignore[arg-type]
        question="?",
        answerable=answerable,
        expected="x" if answerable else None,
        status=status.get(bucket, "refused"),
        bucket=bucket,  # type: ignore[arg-type]
        cited=(),
        quote="",
    )


def sample() -> list[Judged]:
    """4 answerable (2 correct, 1 wrong, 1 refused) and 4 near-misses (1 answered, 2 refused,
    1 maybe)."""
    return [
        judged_row("answered-correct", answerable=True),
        judged_row("answered-correct", answerable=True, group="odd", kind="table-cell"),
        judged_row("answered-wrong", answerable=True, group="holdout"),
        judged_row("refused-answerable", answerable=True, group="odd"),
        judged_row("answered-wrong", answerable=False),
        judged_row("refused-unanswerable", answerable=False, group="odd"),
        judged_row("refused-unanswerable", answerable=False, group="holdout"),
        judged_row("maybe", answerable=False, group="holdout"),
    ]


def test_the_rates_count_each_bucket_over_its_own_denominator() -> None:
    got = rates(sample())
    assert got["counts"] == {
        "answered-correct": 2,
        "answered-wrong": 2,
        "maybe": 1,
        "refused-answerable": 1,
        "refused-unanswerable": 2,
    }
    assert (got["questions"], got["answerable"], got["near_misses"], got["answered"]) == (
        8,
        4,
        4,
        4,
    )
    assert got["answered_wrong_rate"] == 0.25  # 2 wrong of 8 questions
    assert got["answered_correct_rate"] == 0.5  # 2 correct of 4 answered
    assert got["answered_rate"] == 0.75  # 3 of 4 answerable answered
    assert got["near_miss_not_answered_rate"] == 0.75
    assert got["near_miss_refused_rate"] == 0.5
    assert got["near_miss_maybe_rate"] == 0.25
    assert sum(got["counts"].values()) == got["questions"]


def test_a_rate_without_a_denominator_is_none() -> None:
    got = rates([judged_row("refused-answerable", answerable=True)])
    assert got["answered_correct_rate"] is None and got["near_miss_refused_rate"] is None
    assert rates([])["answered_wrong_rate"] is None


def test_the_summary_splits_by_group_corpus_and_kind() -> None:
    summary = summarise(sample())
    assert list(summary["groups"]) == ["even", "odd", "holdout"]
    assert summary["groups"]["holdout"]["questions"] == 3
    assert summary["corpora"]["demo"]["questions"] == 8
    assert summary["kinds"]["near-miss"]["questions"] == 4
    assert summary["kinds"]["table-cell"]["counts"]["answered-correct"] == 1
    modes = metrics_of(summary)
    assert set(modes) == {"all", "even", "odd", "holdout"}
    assert set(modes["all"]) == set(ANSWER_METRICS)


# --- the baseline alarm and the warehouse -----------------------------------------------------


def report_of(judged: list[Judged]) -> dict[str, Any]:
    summary = summarise(judged)
    return {
        **summary,
        "by_corpus": {"demo": summary},
        "questions": [j.to_dict() for j in judged],
        "model": "extractive-test",
        "threshold": 0.5,
        "seconds": 1.0,
    }


def test_an_equal_run_passes_and_a_worse_one_fails_naming_the_metric(tmp_path: Path) -> None:
    report = report_of(sample())
    save_baseline(
        tmp_path / "answers-demo.json", answer_baseline(report["by_corpus"]["demo"], "demo")
    )
    assert check_answer_baselines(report, tmp_path) == []
    worse = sample()
    worse[0] = judged_row("answered-wrong", answerable=True)  # a correct answer turns wrong
    with pytest.raises(EvalRegression) as err:
        check_answer_baselines(report_of(worse), tmp_path)
    message = str(err.value)
    assert "answers regressed on answers-demo" in message
    assert "all answered_wrong_rate rose 0.1250" in message
    assert "all answered_correct_rate dropped 0.2500" in message


def test_losing_the_evidence_of_a_maybe_is_a_regression(tmp_path: Path) -> None:
    """An offline change that still answers nothing wrong but hands the agent quotes without
    the answer (``maybe_evidence_rate``) fails the nightly alarm too."""
    from dataclasses import replace

    held = [replace(judged_row("maybe", answerable=True, group=g), id=f"q-m-{g}", evidence=True)
            for g in ("even", "odd", "holdout")]  # fmt: skip
    report = report_of(sample() + held)
    save_baseline(
        tmp_path / "answers-demo.json", answer_baseline(report["by_corpus"]["demo"], "demo")
    )
    assert check_answer_baselines(report, tmp_path) == []
    lost = [*held[:2], replace(held[2], evidence=False)]
    with pytest.raises(EvalRegression, match=r"all maybe_evidence_rate dropped 0\.2500"):
        check_answer_baselines(report_of(sample() + lost), tmp_path)


def test_a_change_within_the_tolerance_passes_and_no_baseline_is_a_note(tmp_path: Path) -> None:
    report = report_of(sample())
    baseline = answer_baseline(report["by_corpus"]["demo"], "demo", tolerance=0.3)
    save_baseline(tmp_path / "answers-demo.json", baseline)
    worse = sample()
    worse[0] = judged_row("answered-wrong", answerable=True)
    assert check_answer_baselines(report_of(worse), tmp_path) == []
    (notes,) = check_answer_baselines(report, tmp_path / "none")
    assert "no baseline for answers-demo" in notes


def test_fewer_wrong_answers_is_no_regression(tmp_path: Path) -> None:
    report = report_of(sample())
    save_baseline(
        tmp_path / "answers-demo.json", answer_baseline(report["by_corpus"]["demo"], "demo")
    )
    better = sample()
    better[2] = judged_row("answered-correct", answerable=True, group="holdout")
    assert check_answer_baselines(report_of(better), tmp_path) == []


def test_the_records_hold_a_mode_per_group_and_a_bucket_per_question(tmp_path: Path) -> None:
    from core.settings import Settings
    from evals.warehouse import latest, write_eval

    settings = Settings(home=tmp_path)
    (record,) = answer_records(report_of(sample()), settings)
    assert record.dataset == "answers-demo"
    assert set(record.modes) == {"all", "even", "odd", "holdout"}
    assert len(record.per_query["all"]) == 8 and len(record.per_query["holdout"]) == 3
    flags = record.per_query["all"]["q-maybe-False-holdout"]
    assert flags["answer_maybe"] == 1.0 and sum(flags.values()) == 1.0
    write_eval(record, home=tmp_path)
    stored = latest(tmp_path, "answers-demo")
    assert stored is not None
    assert stored["all"]["answered_wrong_rate"] == 0.25
    assert "ndcg@10" not in stored["all"]


# --- end to end ---------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow  # ~2 min on two cores: ingest plus 60 answers; `make test-all` runs it
def test_kbflow_eval_answers_on_the_demo_reports_every_question(tmp_path: Path) -> None:
    """`kbflow eval answers --corpus demo --json` on a fresh home: the report's shape, and the
    buckets add up to the questions asked (the demo's set and its held-out questions)."""
    from typer.testing import CliRunner

    from evals.questions import load_holdout, load_questions
    from kbflow.cli import app

    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "eval",
            "answers",
            "--corpus",
            "demo",
            "--home",
            str(tmp_path / "answers"),
            "--no-baseline",
            "--json",
        ],
        env={"KBFLOW_HOME": str(tmp_path / "home"), "KBFLOW_ANSWER_MODEL": "extractive"},
    )
    assert result.exit_code == 0, result.output[-3000:]
    report = json.loads(result.stdout)
    asked = len(load_questions("demo")) + len(load_holdout("demo"))
    assert report["all"]["questions"] == len(report["questions"]) == asked
    assert sum(report["all"]["counts"].values()) == asked
    assert set(report["all"]["counts"]) == set(BUCKETS)
    groups = report["groups"]
    assert sum(g["questions"] for g in groups.values()) == asked
    assert groups["holdout"]["questions"] == len(load_holdout("demo"))
    assert all(q["bucket"] in BUCKETS for q in report["questions"])
    assert "pricing-2027-draft.md" not in {f for q in report["questions"] for f in q["cited"]}
    assert report["wrong"] == [q for q in report["questions"] if q["bucket"] == "answered-wrong"]
    assert report["model"].startswith("extractive")


def test_the_warehouse_has_a_column_per_bucket_in_order() -> None:
    from evals.warehouse import ANSWER_OUTCOMES

    assert [f"answer_{b.replace('-', '_')}" for b in BUCKETS] == list(ANSWER_OUTCOMES)
