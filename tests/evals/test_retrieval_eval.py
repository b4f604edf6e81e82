"""The retrieval eval end to end on the golden set: real ingest path, Edge, MiniLM, metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.errors import ConfigError
from core.models import SearchMode
from core.settings import Settings
from evals.beir import load_beir
from evals.golden import write_golden_set
from evals.regression import Baseline, EvalRegression, check, regressions, save_baseline
from evals.retrieval import parse_modes, run_eval
from kbflow.cli import app


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_golden_set(tmp_path_factory.mktemp("golden"))


def test_every_mode_is_scored_and_a_rerun_embeds_nothing(golden: Path) -> None:
    settings = Settings()
    dataset = load_beir(golden)

    first = run_eval(dataset, settings)
    summary = first.summary()
    assert summary["dataset"] == "golden" or summary["dataset"].startswith("golden")
    assert set(summary["modes"]) == {"keyword", "dense", "hybrid"}
    assert summary["queries"] == 5
    for metrics in summary["modes"].values():
        assert set(metrics) == {"mrr@10", "ndcg@10", "recall@100"}
        assert metrics["recall@100"] == 1.0  # five documents: every one is in the top 100
    # The demo questions are easy: hybrid puts the right document first for most of them.
    assert summary["modes"]["hybrid"]["mrr@10"] >= 0.8
    assert first.index["embeddings_computed"] > 0
    # The refusal metric: support with each question's document vs without it, beside hybrid.
    refusal = summary["refusal"]
    assert set(refusal) == {"refusal_auc", "answered", "refused"}
    assert 0.5 < refusal["refusal_auc"] <= 1.0  # the documents that answer support more
    assert first.record.modes["hybrid"]["refusal_auc"] == pytest.approx(refusal["refusal_auc"])
    supports = first.record.per_query["hybrid"]
    assert all(
        {"support_answerable", "support_unanswerable"} <= set(row) for row in supports.values()
    )

    again = run_eval(dataset, settings)
    assert again.index["indexed"] == 0 and again.index["embeddings_computed"] == 0
    assert again.record.modes == first.record.modes


def test_the_command_prints_the_documented_json(golden: Path) -> None:
    result = CliRunner().invoke(
        app, ["eval", "run", "--dataset", str(golden), "--modes", "keyword,hybrid", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data["modes"]) == {"keyword", "hybrid"}
    assert set(data["modes"]["hybrid"]) == {"mrr@10", "ndcg@10", "recall@100"}
    assert set(data["refusal"]) == {"refusal_auc", "answered", "refused"}

    report = CliRunner().invoke(app, ["eval", "report", "--json"])
    assert report.exit_code == 0, report.output
    history = json.loads(report.stdout)
    assert {r["mode"] for r in history["runs"]} == {"keyword", "hybrid"}
    rows = {r["mode"]: r for r in history["runs"]}
    assert rows["hybrid"]["refusal_auc"] == pytest.approx(data["refusal"]["refusal_auc"], abs=1e-4)
    assert rows["keyword"]["refusal_auc"] is None
    assert Path(history["plot"]).stat().st_size > 1000

    # keyword alone: the answer path's mode did not run, so no refusal figures
    alone = CliRunner().invoke(
        app, ["eval", "run", "--dataset", str(golden), "--modes", "keyword", "--json"]
    )
    assert alone.exit_code == 0, alone.output
    assert json.loads(alone.stdout)["refusal"] == {}


def test_the_regression_alarm_names_metric_mode_and_drop(tmp_path: Path) -> None:
    baseline = Baseline("golden", 0.02, {"hybrid": {"ndcg@10": 0.90, "mrr@10": 0.80}})
    current = {"hybrid": {"ndcg@10": 0.85, "mrr@10": 0.79}, "dense": {"ndcg@10": 0.1}}
    assert regressions(current, baseline) == [
        "hybrid ndcg@10 dropped 0.0500 (0.9000 -> 0.8500; tolerance 0.0200)"
    ]
    with pytest.raises(EvalRegression, match=r"hybrid ndcg@10 dropped 0\.0500"):
        check(current, baseline)
    check(current, baseline, tolerance=0.06)  # within a looser tolerance
    path = save_baseline(tmp_path / "golden.json", baseline)
    assert json.loads(path.read_text())["modes"]["hybrid"]["ndcg@10"] == 0.9


def test_modes_are_parsed_with_a_clear_error() -> None:
    assert parse_modes("keyword, hybrid+rerank") == (SearchMode.KEYWORD, SearchMode.HYBRID_RERANK)
    with pytest.raises(ConfigError, match="unknown mode 'bm25'"):
        parse_modes("bm25")


def test_a_chunker_change_gives_the_eval_a_fresh_index(monkeypatch: pytest.MonkeyPatch) -> None:
    import tasks.text.chunk
    from evals.retrieval import index_fingerprint

    settings = Settings()
    before = index_fingerprint(settings)
    assert index_fingerprint(settings) == before  # stable while nothing changes
    monkeypatch.setattr(tasks.text.chunk, "CHUNKER_VERSION", tasks.text.chunk.CHUNKER_VERSION + 1)
    assert index_fingerprint(settings) != before
