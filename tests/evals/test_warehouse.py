"""The eval warehouse: real dlt pipelines into a real DuckDB file under ``tmp_path``, no mocks."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
from PIL import Image

from core.errors import ConfigError, KbflowError
from evals.warehouse import (
    PLOT_DPI,
    PLOT_SIZE_INCHES,
    EvalRecord,
    WarehouseError,
    latest,
    plot_history,
    read_history,
    warehouse_path,
    write_eval,
)
from tests.conftest import held_by_another_process
from tests.evals.support import MODES, NEW, OLD, QUERIES, T0, make_record


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One warehouse with both runs, written newest first (history must sort by time)."""
    home = tmp_path_factory.mktemp("warehouse") / "home"
    assert write_eval(NEW, home=home) == {"eval_runs": 2, "eval_queries": 6}
    assert write_eval(OLD, home=home) == {"eval_runs": 2, "eval_queries": 6}
    return home


def query_rows(home: Path) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(warehouse_path(home)), read_only=True) as con:
        return con.execute(
            "SELECT run_id, dataset, mode, query_id, mrr_at_10, ndcg_at_10, recall_at_100"
            " FROM evals.eval_queries ORDER BY run_id, mode, query_id"
        ).fetchall()


def test_the_warehouse_lives_under_home(tmp_path: Path) -> None:
    assert warehouse_path(tmp_path) == tmp_path / "warehouse" / "kbflow.duckdb"


def test_history_has_one_row_per_run_and_mode_in_time_order(home: Path) -> None:
    rows = read_history(home)

    assert [(r["run_id"], r["mode"]) for r in rows] == [
        ("run-old", "dense"),
        ("run-old", "keyword"),
        ("run-new", "dense"),
        ("run-new", "keyword"),
    ]
    assert [r["started_at"] for r in rows] == [
        T0,
        T0,
        T0 + timedelta(days=1),
        T0 + timedelta(days=1),
    ]
    assert all(r["started_at"].utcoffset() == timedelta(0) for r in rows)
    new_dense = rows[2]
    assert new_dense["mrr_at_10"] == pytest.approx(NEW.modes["dense"]["mrr@10"])
    assert new_dense["ndcg_at_10"] == pytest.approx(NEW.modes["dense"]["ndcg@10"])
    assert new_dense["recall_at_100"] == pytest.approx(NEW.modes["dense"]["recall@100"])
    assert new_dense["queries"] == 3
    assert new_dense["seconds"] == 12.5
    assert new_dense["dataset"] == "scifact-mini"
    assert new_dense["settings"] == {"rrf_k": 60, "embedding_model": "minilm"}
    assert [r["commit"] for r in rows] == [None, None, "abc1234", "abc1234"]


def test_history_filters_by_dataset_and_mode(home: Path) -> None:
    keyword = read_history(home, mode="keyword")
    assert [(r["run_id"], r["mode"]) for r in keyword] == [
        ("run-old", "keyword"),
        ("run-new", "keyword"),
    ]
    assert len(read_history(home, dataset="scifact-mini")) == 4
    assert read_history(home, dataset="nfcorpus") == []


def test_per_query_rows_are_stored(home: Path) -> None:
    rows = query_rows(home)

    assert len(rows) == 12
    assert {(r[0], r[2], r[3]) for r in rows} == {
        (run, mode, qid) for run in ("run-old", "run-new") for mode in MODES for qid in QUERIES
    }
    new_dense_q2 = next(r for r in rows if r[0] == "run-new" and r[2] == "dense" and r[3] == "q2")
    expected = NEW.per_query["dense"]["q2"]
    assert new_dense_q2[1] == "scifact-mini"
    assert new_dense_q2[4:] == pytest.approx(
        (expected["mrr@10"], expected["ndcg@10"], expected["recall@100"])
    )


def test_writing_a_run_again_replaces_its_rows(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_eval(OLD, home=home)
    write_eval(OLD, home=home)
    assert len(read_history(home)) == 2
    assert len(query_rows(home)) == 6

    # Same run id, corrected numbers: merged on the key, not appended.
    write_eval(make_record("run-old", T0, base=0.9, commit=None), home=home)
    rows = read_history(home)
    assert len(rows) == 2
    assert rows[0]["mrr_at_10"] == pytest.approx(0.9 + 0.1 + 0.01)  # dense: m=1, mean of q
    assert len(query_rows(home)) == 6


def test_latest_gives_the_newest_runs_means(home: Path) -> None:
    got = latest(home, "scifact-mini")

    assert got is not None
    assert got.keys() == NEW.modes.keys()
    for mode, metrics in NEW.modes.items():
        assert got[mode] == pytest.approx(metrics)
    assert latest(home, "nfcorpus") is None


def test_plot_history_draws_a_png(home: Path, tmp_path: Path) -> None:
    out = plot_history(read_history(home), tmp_path / "plots" / "history.png")

    assert out == tmp_path / "plots" / "history.png"
    assert out.stat().st_size > 0
    with Image.open(out) as image:
        assert image.format == "PNG"
        assert image.size == (
            round(PLOT_SIZE_INCHES[0] * PLOT_DPI),
            round(PLOT_SIZE_INCHES[1] * PLOT_DPI),
        )
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 1, "the image is a single colour"


def test_a_missing_warehouse_has_no_history(tmp_path: Path) -> None:
    assert read_history(tmp_path / "nowhere") == []
    assert latest(tmp_path / "nowhere", "scifact-mini") is None
    assert not (tmp_path / "nowhere").exists()


def test_plotting_no_history_asks_for_an_eval_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no eval runs recorded yet.*kbflow eval run"):
        plot_history([], tmp_path / "history.png")
    assert not (tmp_path / "history.png").exists()


def test_dlt_state_stays_in_the_pipelines_dir_and_telemetry_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlt.common.runtime import anon_tracker, run_context

    # dlt's global dir (~/.dlt, or /var/dlt for root), redirected so we can see what lands there.
    global_dir = tmp_path / "dlt-global"
    monkeypatch.setattr(run_context, "global_dir", lambda: str(global_dir))
    monkeypatch.delenv("RUNTIME__DLTHUB_TELEMETRY", raising=False)
    monkeypatch.delenv("DLT_DATA_DIR", raising=False)
    home = tmp_path / "home"

    write_eval(OLD, home=home)
    write_eval(NEW, home=home, pipelines_dir=tmp_path / "elsewhere")

    assert (home / "dlt" / "kbflow_evals" / "state.json").is_file()
    assert (tmp_path / "elsewhere" / "kbflow_evals" / "state.json").is_file()
    assert not global_dir.exists()  # not even the tracker's .anonymous_id
    assert os.environ["RUNTIME__DLTHUB_TELEMETRY"] == "false"
    assert anon_tracker._ANON_TRACKER_ENDPOINT is None  # the tracker never started


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (make_record("naive", datetime(2025, 3, 1), base=0.1), "must be timezone-aware"),
        (
            EvalRecord(
                run_id="odd",
                dataset="d",
                started_at=T0,
                commit=None,
                settings={},
                modes={"dense": {"map@5": 0.3}},
                per_query={},
                seconds=1.0,
            ),
            r"unknown metric\(s\) \['map@5'\]",
        ),
        (
            EvalRecord(
                run_id="orphan",
                dataset="d",
                started_at=T0,
                commit=None,
                settings={},
                modes={},
                per_query={"dense": {"q1": {"mrr@10": 1.0}}},
                seconds=1.0,
            ),
            r"modes without means: \['dense'\]",
        ),
    ],
)
def test_malformed_records_are_refused_before_anything_is_written(
    tmp_path: Path, record: EvalRecord, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        write_eval(record, home=tmp_path / "home")
    assert not warehouse_path(tmp_path / "home").exists()


@pytest.mark.integration
def test_a_locked_warehouse_gives_a_clear_error_and_recovers(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_eval(OLD, home=home)

    with held_by_another_process(warehouse_path(home)):
        with pytest.raises(WarehouseError, match=r"another process is writing.*retry") as caught:
            write_eval(NEW, home=home)
        assert isinstance(caught.value, KbflowError) and isinstance(caught.value, RuntimeError)
        assert "run-new" in str(caught.value)
        with pytest.raises(WarehouseError, match=r"another process is writing.*retry"):
            read_history(home)

    write_eval(NEW, home=home)
    assert [r["run_id"] for r in read_history(home)] == ["run-old"] * 2 + ["run-new"] * 2


def test_refusal_metrics_ride_on_the_hybrid_row_and_old_warehouses_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    with monkeypatch.context() as before:  # the columns as they were before refusal existed
        import evals.warehouse as wh

        before.setattr(wh, "RUN_METRIC_COLUMNS", wh.METRIC_COLUMNS)
        before.setattr(wh, "QUERY_METRIC_COLUMNS", wh.METRIC_COLUMNS)
        for table in (wh._RUNS_COLUMNS, wh._QUERIES_COLUMNS):
            for column in (*wh.REFUSAL_COLUMNS, *wh.SUPPORT_COLUMNS):
                if column in table:
                    before.delitem(table, column)
        write_eval(OLD, home=home)
    with duckdb.connect(str(warehouse_path(home)), read_only=True) as con:
        columns = {row[0] for row in con.execute("DESCRIBE evals.eval_runs").fetchall()}
    assert "refusal_auc" not in columns
    old = read_history(home)
    assert len(old) == 2 and all(row["refusal_auc"] is None for row in old)

    hybrid = {"q1": {"mrr@10": 1.0, "ndcg@10": 1.0, "recall@100": 1.0,
                     "support_answerable": 0.7, "support_unanswerable": 0.4}}  # fmt: skip
    record = EvalRecord(
        run_id="run-refusal",
        dataset="scifact-mini",
        started_at=T0 + timedelta(days=2),
        commit=None,
        settings={},
        modes={
            "hybrid": {
                "mrr@10": 1.0,
                "ndcg@10": 1.0,
                "recall@100": 1.0,
                "refusal_auc": 0.75,
                "answered": 0.5,
                "refused": 0.6,
            }
        },
        per_query={"hybrid": hybrid},
        seconds=1.0,
    )
    assert write_eval(record, home=home) == {"eval_runs": 1, "eval_queries": 1}
    rows = {row["run_id"]: row for row in read_history(home, mode="hybrid")}
    assert rows["run-refusal"]["refusal_auc"] == 0.75
    assert latest(home, "scifact-mini") == {"hybrid": record.modes["hybrid"]}
    with duckdb.connect(str(warehouse_path(home)), read_only=True) as con:
        assert con.execute(
            "SELECT support_answerable, support_unanswerable FROM evals.eval_queries"
            " WHERE run_id = 'run-refusal'"
        ).fetchall() == [(0.7, 0.4)]


def test_a_support_is_a_per_query_value_not_a_run_mean(tmp_path: Path) -> None:
    record = make_record("run-bad", T0, base=0.3)
    record.modes["keyword"]["support_answerable"] = 0.5
    with pytest.raises(ConfigError, match="unknown metric"):
        write_eval(record, home=tmp_path)
