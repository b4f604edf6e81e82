"""The eval warehouse and the answer ledger in PostgreSQL (``KBFLOW_WAREHOUSE_URL``): the eval
runs loaded by dlt, the ledger's turns written one transaction each (and ledgers dlt wrote before
issue 30 read and appended to), all read back through the same destination, never from a DuckDB
file that is not there.

The PostgreSQL tests run in the second pass (`make test-postgres`) and skip without
``KBFLOW_TEST_DATABASE_URL``; the bad-URL tests need no server and run everywhere.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from core import faults
from core.errors import ConfigError, LedgerError, NotFound
from core.settings import Settings
from evals.warehouse import WarehouseError, latest, read_history, warehouse_path, write_eval
from kbflow.services.query.answers import replay as replay_turn
from kbflow.services.query.context import OpenHome
from sinks.ledger import Ledger, ledger_path
from sinks.registry import SqlRegistry
from tests.conftest import free_port, warehouse_database_url
from tests.evals.support import NEW, OLD, make_record
from tests.kbflow.support import QUESTION, answer_question
from tests.sinks.ledger_support import (
    ANSWERED,
    FAULT_POINTS,
    HISTORY,
    KEYS,
    OTHER_ORG,
    REFUSED,
    SMALLER,
    T0,
    make_turn,
    race_two_writers,
    reads,
    record_with_dlt,
)
from tests.tasks.answer.handbook import index_handbook

# dlt's own sqlalchemy merge job (eval runs, and ledgers as dlt wrote them) trips a SQLAlchemy
# deprecation warning; nothing of ours.
pytestmark = pytest.mark.filterwarnings(
    "ignore:implicitly coercing SELECT:sqlalchemy.exc.SAWarning"
)


@pytest.fixture
def url() -> str:
    return warehouse_database_url()


def count(url: str, sql: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(sql)).scalar_one())
    finally:
        engine.dispose()


# --- the eval warehouse ----------------------------------------------------------------------


def test_eval_runs_load_into_postgres_and_read_back(tmp_path: Path, url: str) -> None:
    home = tmp_path / "home"
    assert read_history(home, url=url) == []  # a fresh database: no tables yet, no error
    for record in (NEW, OLD):  # out of time order: the read sorts
        assert write_eval(record, home=home, url=url) == {"eval_runs": 2, "eval_queries": 6}

    rows = read_history(home, url=url)

    assert [(r["run_id"], r["mode"]) for r in rows] == [
        ("run-old", "dense"),
        ("run-old", "keyword"),
        ("run-new", "dense"),
        ("run-new", "keyword"),
    ]
    assert rows[2]["started_at"] == NEW.started_at and rows[2]["started_at"].utcoffset() == (
        timedelta(0)
    )
    assert rows[0]["settings"] == OLD.settings and rows[0]["commit"] is None
    assert rows[3]["mrr_at_10"] == pytest.approx(NEW.modes["keyword"]["mrr@10"])
    assert [r["run_id"] for r in read_history(home, mode="keyword", url=url)] == [
        "run-old",
        "run-new",
    ]
    assert latest(home, "scifact-mini", url=url) == NEW.modes  # doubles, bit for bit
    assert not warehouse_path(home).exists()  # nothing went to (or came from) DuckDB
    assert read_history(home) == []  # ... which is a different, empty warehouse


def test_writing_a_run_again_replaces_its_rows_in_postgres(tmp_path: Path, url: str) -> None:
    # The URL as a user writes it: plain postgresql://, which kbflow runs on psycopg.
    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    home = tmp_path / "home"
    write_eval(make_record("run-1", T0, base=0.2), home=home, url=plain)
    write_eval(make_record("run-1", T0, base=0.6), home=home, url=plain)
    rows = read_history(home, url=plain)
    assert len(rows) == 2
    assert sorted(r["mrr_at_10"] for r in rows) == pytest.approx([0.61, 0.71])
    assert count(url, "SELECT count(*) FROM evals.eval_queries") == 6


# --- the answer ledger -----------------------------------------------------------------------


def test_turns_record_into_postgres_and_read_back_exactly(tmp_path: Path, url: str) -> None:
    ledger = Ledger(tmp_path / "home", url=url)
    with pytest.raises(NotFound):
        ledger.get_turn(ANSWERED.turn_id)
    assert ledger.turns() == [] and ledger.citations() == []
    for turn in (REFUSED, OTHER_ORG, ANSWERED, ANSWERED):  # the last one again: replaces
        ledger.record(turn)

    assert ledger.get_turn(ANSWERED.turn_id) == ANSWERED
    assert ledger.get_turn(REFUSED.turn_id) == REFUSED
    assert [t["turn_id"] for t in ledger.turns()] == [
        t.turn_id for t in sorted((ANSWERED, REFUSED, OTHER_ORG), key=lambda t: t.created_at)
    ][::-1]
    assert [t["turn_id"] for t in ledger.turns(org_id="globex")] == [OTHER_ORG.turn_id]
    cited = ledger.citations(doc_ids=["doc-b"], org_id="acme")
    assert {row["turn_id"] for row in cited} == {ANSWERED.turn_id, REFUSED.turn_id}
    assert all(row["created_at"].utcoffset() == timedelta(0) for row in cited)
    assert count(url, "SELECT count(*) FROM ledger.ledger_turns") == 3
    assert not ledger_path(tmp_path / "home").exists()


def execute(url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            result = conn.execute(text(sql))
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def half_written_turns(url: str) -> set[str]:
    """Turns holding a row from a load that never finished (not in ``_dlt_loads``)."""
    return {
        turn_id
        for table in KEYS
        for (turn_id,) in execute(
            url,
            f"SELECT turn_id FROM ledger.{table} WHERE _dlt_load_id NOT IN"
            " (SELECT load_id FROM ledger._dlt_loads WHERE status = 0)",
        )
    }


def key_counts(url: str) -> dict[str, tuple[int, int]]:
    """Per table: (rows, distinct primary keys)."""
    return {
        table: execute(
            url,
            f"SELECT count(*), count(DISTINCT ({', '.join(key)})) FROM ledger.{table}",
        )[0]
        for table, key in KEYS.items()
    }


def rows_of(url: str, turn_id: str) -> dict[str, int]:
    """How many rows ``turn_id`` (a test's own id, no quotes) has in each table."""
    counts = {}
    for table in KEYS:
        sql = f"SELECT count(*) FROM ledger.{table} WHERE turn_id = '{turn_id}'"
        [(count,)] = execute(url, sql)
        counts[table] = int(count)
    return counts


def test_a_record_that_fails_half_way_leaves_nothing_of_the_turn_in_postgres(
    tmp_path: Path, url: str
) -> None:
    """tests/sinks/test_ledger.py's half-way failure, on PostgreSQL: one transaction, so
    nothing of the new turn and all of the earlier version."""
    ledger = Ledger(tmp_path / "home", url=url)
    first = make_turn("turn-1", T0, cited=("doc-a",))
    ledger.record(first)
    execute(url, "CREATE UNIQUE INDEX one_per_doc ON ledger.ledger_citations (doc_id)")
    new = make_turn("turn-2", T0 + timedelta(hours=1), cited=("doc-b", "doc-b"))
    again = dataclasses.replace(first, outcome="refused", citations=first.citations * 2)

    with pytest.raises(LedgerError, match=r"could not record turn 'turn-2'.*duplicate key") as e:
        ledger.record(new)
    assert "[SQL" not in str(e.value) and "doc-b says so" not in str(e.value)  # no rows in it
    with pytest.raises(LedgerError, match=r"could not record turn 'turn-1'"):
        ledger.record(again)

    assert rows_of(url, "turn-2") == dict.fromkeys(KEYS, 0)
    assert half_written_turns(url) == set()
    with pytest.raises(NotFound, match="no turn 'turn-2'"):
        ledger.get_turn("turn-2")
    assert ledger.get_turn("turn-1") == first
    assert [r["turn_id"] for r in ledger.turns()] == ["turn-1"]

    execute(url, "DROP INDEX ledger.one_per_doc")
    ledger.record(new)
    ledger.record(again)
    assert ledger.get_turn("turn-2") == new
    assert ledger.get_turn("turn-1") == again


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_a_crash_between_two_inserts_shows_readers_nothing_in_postgres(
    tmp_path: Path, url: str, point: str
) -> None:
    """Crashed at each point between two statements: a reader on another connection at that
    instant sees the earlier version whole (or no turn), and so does every reader after."""
    ledger = Ledger(tmp_path / "home", url=url)
    first = make_turn("turn-1", T0, cited=("doc-a",))
    ledger.record(first)
    before = key_counts(url)
    changed = dataclasses.replace(first, outcome="refused", llm_calls=first.llm_calls[:1])
    seen: list[object] = []

    def read_then_crash(name: str, count: int) -> None:
        if name == point:
            reader = Ledger(tmp_path / "home", url=url)
            seen.append(reader.get_turn("turn-1"))
            seen.append([r["turn_id"] for r in reader.turns()])
            raise faults.InjectedCrash(name)

    for turn in (changed, REFUSED):
        with faults.armed(read_then_crash), pytest.raises(faults.InjectedCrash):
            ledger.record(turn)

    assert seen == [first, ["turn-1"]] * 2
    assert key_counts(url) == before
    assert ledger.get_turn("turn-1") == first
    ledger.record(changed)
    assert ledger.get_turn("turn-1") == changed


def test_a_turn_recorded_again_in_the_middle_of_a_read_reads_as_one_version(
    tmp_path: Path, url: str
) -> None:
    """Another process records the turn again between the read of its row and of its
    citations: the read still shows one version whole (it failed once in CI: READ COMMITTED
    gave the first version's row with no citations, since they belonged to the second)."""
    ledger = Ledger(tmp_path / "home", url=url)
    first = make_turn("turn-1", T0, cited=("doc-a",))
    second = make_turn("turn-1", T0 + timedelta(minutes=1), cited=("doc-b", "doc-c"))
    ledger.record(first)

    def record_again(name: str, count: int) -> None:
        if name == "ledger.read_after_turn" and count == 1:
            Ledger(tmp_path / "home", url=url).record(second)

    with faults.armed(record_again):
        read = ledger.get_turn("turn-1")

    assert read == first
    assert ledger.get_turn("turn-1") == second


def test_two_processes_recording_at_once_lose_and_mix_nothing_in_postgres(
    tmp_path: Path, url: str
) -> None:
    race_two_writers(tmp_path / "home", url)
    assert all(rows == keys for rows, keys in key_counts(url).values())
    assert half_written_turns(url) == set()


def test_threads_recording_one_turn_id_at_once_leave_one_version(tmp_path: Path, url: str) -> None:
    """Same-id records in one process, no lock of ours around them: the advisory lock per
    turn id makes each replace the other, never both insert."""
    ledger = Ledger(tmp_path / "home", url=url)
    ledger.record(ANSWERED)  # the tables exist: the threads race on the turn alone
    versions = [dataclasses.replace(ANSWERED, question=f"version {i}?") for i in range(8)]
    threads = [threading.Thread(target=ledger.record, args=(v,)) for v in versions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ledger.get_turn(ANSWERED.turn_id) in versions
    assert key_counts(url)["ledger_turns"] == (1, 1)
    assert rows_of(url, ANSWERED.turn_id)["ledger_retrieval_hits"] == 3


def columns_of(url: str) -> list[tuple[object, ...]]:
    return execute(
        url,
        "SELECT table_name, ordinal_position, column_name, data_type, is_nullable,"
        " character_maximum_length FROM information_schema.columns"
        " WHERE table_schema = 'ledger'"
        " AND table_name NOT IN ('_dlt_version', '_dlt_pipeline_state')"
        " ORDER BY table_name, ordinal_position",
    )


def test_a_ledger_dlt_wrote_in_postgres_reads_the_same_and_takes_new_turns(
    tmp_path: Path, url: str
) -> None:
    record_with_dlt(tmp_path / "old", *HISTORY, url=url)
    made_by_dlt = columns_of(url)
    old = Ledger(tmp_path / "old", url=url)
    before = reads(old)
    assert old.get_turn(ANSWERED.turn_id) == SMALLER

    later = make_turn("turn-4", T0 + timedelta(hours=3), cited=("doc-c",))
    old.record(later)
    old.record(ANSWERED)
    assert old.get_turn("turn-4") == later and old.get_turn(ANSWERED.turn_id) == ANSWERED
    assert old.get_turn(REFUSED.turn_id) == REFUSED
    assert [r["turn_id"] for r in old.turns()] == ["turn-4", "turn-3", "turn-2", "turn-1"]
    assert rows_of(url, ANSWERED.turn_id)["ledger_citations"] == 2

    execute(url, "DROP SCHEMA ledger CASCADE")  # the same turns, recorded now
    now = Ledger(tmp_path / "new", url=url)
    for turn in HISTORY:
        now.record(turn)
    assert columns_of(url) == made_by_dlt
    assert reads(now) == before


@pytest.fixture
def world(
    tmp_path: Path, url: str, registry: SqlRegistry, edge_store: Any, embedder: Any
) -> dict[str, Any]:
    index_handbook(registry, edge_store, embedder)
    registry.catalog.create_agent("acme", "helper")
    settings = Settings(home=tmp_path / "home", warehouse_url=url)
    ctx = OpenHome(settings=settings, registry=registry, store=edge_store, embedder=embedder)
    return {"ctx": ctx, "settings": settings}


def test_answers_are_recorded_in_postgres_and_replay_from_it(world: dict[str, Any]) -> None:
    settings: Settings = world["settings"]
    out = answer_question(world["ctx"], "helper", QUESTION)
    assert out["status"] == "answered"

    result, note = replay_turn(settings, out["turn_id"])

    assert result.identical and note is None
    assert (
        Ledger(settings.home, url=settings.stores.warehouse_url).get_turn(out["turn_id"]).output
        == out
    )
    assert not ledger_path(settings.home).exists()


# --- bad URLs: a clear error, never an empty answer from the wrong place -----------------------


def test_an_unreachable_warehouse_database_is_a_clear_error(tmp_path: Path) -> None:
    down = f"postgresql://kbflow@127.0.0.1:{free_port()}/kbflow"  # nothing listens there
    with pytest.raises(WarehouseError, match=r"could not reach .*KBFLOW_WAREHOUSE_URL"):
        read_history(tmp_path, url=down)
    ledger = Ledger(tmp_path, url=down, lock_wait_s=0)
    with pytest.raises(LedgerError, match=r"could not reach the ledger database .*127\.0\.0\.1"):
        ledger.turns()
    with pytest.raises(LedgerError, match="KBFLOW_WAREHOUSE_URL"):
        ledger.record(ANSWERED)


@pytest.mark.parametrize("bad", ["not a url", "http://example.com/kbflow"])
def test_a_warehouse_url_of_the_wrong_form_says_what_to_use(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match=r"KBFLOW_WAREHOUSE_URL must be .*postgresql://"):
        read_history(tmp_path, url=bad)
    with pytest.raises(ConfigError, match="KBFLOW_WAREHOUSE_URL"):
        Ledger(tmp_path, url=bad)
