"""Tables in an 80-column terminal: `kbflow eval report`, `review list` and every other table
printed through `print_table` show each value whole, a block per row when the table would not
fit, and stay a table when it does."""

from __future__ import annotations

import pytest

from kbflow.cli.common import print_table
from kbflow.render import console

METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10", "map@100", "p@1", "refusal auc")
ROWS = [
    ("2026-12-03 14:05", "run-7c1f0a", "scifact/dev", "hybrid", *("0.6712",) * 7),
    ("2026-12-04 02:00", "run-9e2b44", "scifact/dev", "dense", *("0.6402",) * 7),
]


def test_an_eval_history_in_80_columns_shows_every_value_whole(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(console, "width", 80)
    print_table("eval history", ("started", "run", "dataset", "mode", *METRICS), ROWS,
                right=METRICS)  # fmt: skip
    out = capsys.readouterr().out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert max(len(line) for line in out.splitlines()) <= 80, out
    for row in ROWS:
        assert row[0] in lines, out  # each row's head on its own line
        assert f"run {row[1]}" in lines and f"mode {row[3]}" in lines, out
        assert f"refusal auc {row[-1]}" in lines, out


def test_a_table_that_fits_stays_a_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(console, "width", 200)
    print_table("eval history", ("started", "run", "dataset", "mode", *METRICS), ROWS,
                right=METRICS)  # fmt: skip
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "started" in line)
    assert all(name in header for name in METRICS), out
    assert sum(1 for line in out.splitlines() if "scifact/dev" in line) == len(ROWS), out
