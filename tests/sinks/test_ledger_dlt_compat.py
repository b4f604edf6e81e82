"""Ledgers that dlt wrote, one pipeline run per turn, before issue 30: the ledger reads them as
they are, appends to them, and replays their turns (`kbflow turns`, `replay`, `provenance`).

`record_with_dlt` (tests/sinks/ledger_support.py) loads turns exactly as `Ledger.record` did
then.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from core.errors import NotFound
from core.models import Turn
from core.settings import Settings
from kbflow.cli import app
from kbflow.services.query import answers
from kbflow.services.query.context import OpenHome
from sinks.ledger import Ledger, ledger_path
from sinks.registry import SqlRegistry
from tests.sinks.ledger_support import (
    ANSWERED,
    HISTORY,
    KEYS,
    OTHER_ORG,
    REFUSED,
    SMALLER,
    T0,
    half_written_turns,
    make_turn,
    reads,
    record_with_dlt,
    rows_of,
)
from tests.tasks.answer.handbook import index_handbook

QUESTION = "How many days do employees have to submit expense reports?"


def schema_of(path: Path) -> list[tuple[Any, ...]]:
    """Every column of the ledger's tables and ``_dlt_loads``: name, type, nullability, order."""
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(
            "SELECT table_name, column_index, column_name, data_type, is_nullable"
            " FROM duckdb_columns() WHERE schema_name = 'ledger'"
            " AND table_name NOT IN ('_dlt_version', '_dlt_pipeline_state')"
            " ORDER BY table_name, column_index"
        ).fetchall()


def test_a_new_ledger_has_the_tables_columns_and_types_dlt_made(tmp_path: Path) -> None:
    record_with_dlt(tmp_path / "old", ANSWERED)
    Ledger(tmp_path / "new").record(ANSWERED)

    made_by_dlt = schema_of(ledger_path(tmp_path / "old"))
    assert {row[0] for row in made_by_dlt} == {*KEYS, "_dlt_loads"}
    assert schema_of(ledger_path(tmp_path / "new")) == made_by_dlt


def test_a_ledger_dlt_wrote_reads_as_the_same_turns_recorded_now(tmp_path: Path) -> None:
    record_with_dlt(tmp_path / "old", *HISTORY)
    now = Ledger(tmp_path / "new")
    for turn in HISTORY:
        now.record(turn)
    old = Ledger(tmp_path / "old")

    assert reads(old) == reads(now)
    assert old.get_turn(ANSWERED.turn_id) == SMALLER
    assert [r["turn_id"] for r in old.turns()] == ["turn-3", "turn-2", "turn-1"]
    # dlt left the first version's citations behind; the new ledger replaced them.
    assert rows_of(old.path, ANSWERED.turn_id)["ledger_citations"] == 2
    assert rows_of(now.path, ANSWERED.turn_id)["ledger_citations"] == 0


def test_a_ledger_dlt_wrote_takes_new_turns_and_new_versions(tmp_path: Path) -> None:
    home = tmp_path / "home"
    record_with_dlt(home, *HISTORY)
    ledger = Ledger(home)
    later = make_turn("turn-4", T0 + timedelta(hours=3), cited=("doc-c",))
    changed = dataclasses.replace(REFUSED, question="Reworded?", citations=())

    ledger.record(later)
    ledger.record(changed)
    ledger.record(ANSWERED)  # over the version dlt left stale citation rows under

    assert ledger.get_turn("turn-4") == later
    assert ledger.get_turn(REFUSED.turn_id) == changed
    assert ledger.get_turn(ANSWERED.turn_id) == ANSWERED
    assert ledger.get_turn(OTHER_ORG.turn_id) == OTHER_ORG  # untouched, as dlt left it
    assert [r["turn_id"] for r in ledger.turns()] == ["turn-4", "turn-3", "turn-2", "turn-1"]
    assert [(r["turn_id"], r["doc_id"]) for r in ledger.citations()] == [
        ("turn-4", "doc-c"),
        ("turn-3", "doc-a"),
        ("turn-1", "doc-a"),
        ("turn-1", "doc-b"),
    ]
    assert rows_of(ledger.path, ANSWERED.turn_id) == {
        "ledger_turns": 1,
        "ledger_llm_calls": 2,
        "ledger_retrievals": 2,
        "ledger_retrieval_hits": 3,
        "ledger_citations": 2,
    }
    assert half_written_turns(ledger.path) == set()
    # dlt can still load into it afterwards (its own bookkeeping tables were left alone).
    record_with_dlt(home, make_turn("turn-5", T0 + timedelta(hours=4)))
    assert [r["turn_id"] for r in ledger.turns(limit=2)] == ["turn-5", "turn-4"]


def test_a_turn_dlt_left_half_written_stays_hidden_until_recorded_again(tmp_path: Path) -> None:
    from dlt.pipeline.exceptions import PipelineStepFailed

    home = tmp_path / "home"
    first = make_turn("turn-1", T0, cited=("doc-a",))
    record_with_dlt(home, first)
    # A constraint makes dlt's citations job fail while its other tables may take their rows.
    with duckdb.connect(str(ledger_path(home))) as con:
        con.execute("CREATE UNIQUE INDEX one_per_doc ON ledger.ledger_citations (doc_id)")
    broken = make_turn("turn-2", T0 + timedelta(hours=1), cited=("doc-b", "doc-b"))
    with pytest.raises(PipelineStepFailed):
        record_with_dlt(home, broken)
    with duckdb.connect(str(ledger_path(home))) as con:
        con.execute("DROP INDEX ledger.one_per_doc")

    ledger = Ledger(home)
    assert half_written_turns(ledger.path) <= {"turn-2"}
    said = "failed half-way" if half_written_turns(ledger.path) else "check the id"
    with pytest.raises(NotFound, match=f"no turn 'turn-2' .*{said}"):
        ledger.get_turn("turn-2")
    assert [r["turn_id"] for r in ledger.turns()] == ["turn-1"]
    assert [r["turn_id"] for r in ledger.citations()] == ["turn-1"]

    fixed = make_turn("turn-2", T0 + timedelta(hours=1), cited=("doc-b",))
    ledger.record(fixed)
    assert half_written_turns(ledger.path) == set()
    assert ledger.get_turn("turn-2") == fixed
    assert [r["turn_id"] for r in ledger.turns()] == ["turn-2", "turn-1"]


@pytest.fixture
def world(settings: Settings, registry: SqlRegistry, edge_store: Any, embedder: Any) -> Any:
    docs = index_handbook(registry, edge_store, embedder)
    registry.catalog.create_agent("acme", "helper")
    ctx = OpenHome(settings=settings, registry=registry, store=edge_store, embedder=embedder)
    return {"docs": docs, "ctx": ctx, "settings": settings, "store": edge_store}


def test_turns_dlt_recorded_replay_and_trace_through_the_cli(tmp_path: Path, world: Any) -> None:
    """Real turns (an answer and an ask) recorded by dlt into the home's ledger, as before
    issue 30; then `kbflow turns`, `replay` and `provenance` read them, and a new answer is
    recorded beside them."""
    settings: Settings = world["settings"]
    scratch = Ledger(tmp_path / "scratch")
    out = answers.answer(world["ctx"], "helper", QUESTION, ledger=scratch)
    asked = answers.ask(world["ctx"], "helper", ["days to submit expense reports"], ledger=scratch)
    recorded: list[Turn] = [scratch.get_turn(o["turn_id"]) for o in (out, asked)]
    record_with_dlt(settings.home, *recorded)
    world["store"].close()  # the commands open the store themselves

    runner = CliRunner()
    env = {"KBFLOW_HOME": str(settings.home)}

    def ok(*args: str) -> str:
        result = runner.invoke(app, list(args), env=env)
        assert result.exit_code == 0, result.output
        return result.stdout

    listed = json.loads(ok("turns", "--json"))
    assert {r["turn_id"] for r in listed} == {out["turn_id"], asked["turn_id"]}
    for turn_id in (out["turn_id"], asked["turn_id"]):
        replayed = json.loads(ok("replay", turn_id, "--json"))
        assert replayed["identical"] and replayed["diff"] == ""
    doc_id = out["citations"][0]["doc_id"]
    traced = json.loads(ok("provenance", "--doc", doc_id, "--json"))
    assert out["turn_id"] in {r["turn_id"] for r in traced}

    again = json.loads(ok("answer", "--agent", "helper", QUESTION, "--json"))
    assert json.loads(ok("replay", again["turn_id"], "--json"))["identical"]
    assert json.loads(ok("replay", out["turn_id"], "--json"))["identical"]
    assert {r["turn_id"] for r in json.loads(ok("turns", "--json"))} == {
        out["turn_id"],
        asked["turn_id"],
        again["turn_id"],
    }
    assert Ledger(settings.home).get_turn(out["turn_id"]) == recorded[0]
