"""Benchmark: one agent turn of the answer path, in ms, on the current tree and, with
``--baseline DIR``, on an older checkout beside it.

A turn is what `kbflow.services.query.answers` runs before it records the turn: a cited answer
(`tasks.answer.cited_answer.answer`) or a knowledge search
(`tasks.answer.knowledge_search.knowledge_search`, two queries a turn), with the offline
extractive model, gated hybrid retrieval on the embedded store, support scores and the
citation checks, up to the scrubbed `Turn` (the ledger write is bench/turn_write.py's).

The store: the demo client's five approved documents (Larkspur Cycles, `evals.demo_corpus`; 38
chunks) and its pricing draft pending review, ingested once through ``kbflow ingest`` into
``--home`` (reused when it holds them). The questions: the 47 demo questions of
evals/questions/questions.jsonl (answerable ones and near-misses), in file order, round and
round.

Each tree runs in a worker process of its own (this file with ``--worker``), on its own copy of
the home: the current tree with ``PYTHONPATH`` and cwd the repository, the baseline with
``PYTHONPATH`` and cwd ``DIR`` (a ``git worktree`` of an older commit, same venv). A worker first
answers every question once on both paths (warm-up: the model, the support cache, the
registry; not timed) and reports a fingerprint of each turn (the `Turn` less its ids, times and
latencies); then the workers take ``--rounds`` rounds of ``--turns`` turns per path (default:
one per question, so every round asks the same questions) in turn, alternating which goes
first. Reported per tree and path: median and p95 ms per turn over all rounds, each round's
median, and baseline_ms / current_ms (> 1: the current tree is faster); and whether both trees
gave the same turns (the run exits 1 when they did not).

Run: ``.venv/bin/python bench/answer_turn.py [--baseline /tmp/kbflow-base] [--turns 47]
[--rounds 6] [--home DIR]``; saves bench/results/answer_turn.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ORG = "larkspur"
AGENT = "bench-helpdesk"
QUERIES_PER_ASK = 2
LINE = "ANSWER_TURN_JSON "  # prefix of a worker's reply lines (anything else it prints is noise)
VOLATILE = frozenset({"turn_id", "created_at", "latency_ms"})


# --- the worker: runs inside the tree under test (nothing of bench/ is imported) -------------


def _stable(value: Any) -> Any:
    """``value`` without the fields that differ from run to run (ids, clocks)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list | tuple):
        return [_stable(v) for v in value]
    return value


def _fingerprint(turn: Any) -> str:
    """A hash of everything the ledger records of ``turn`` but its ids and times, in order."""
    text = json.dumps(_stable(dataclasses.asdict(turn)), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _reply(payload: dict[str, Any]) -> None:
    sys.stdout.write(LINE + json.dumps(payload) + "\n")
    sys.stdout.flush()


def worker(home: Path, questions: list[str]) -> int:
    """Open ``home``, warm up, then answer ``run N`` lines from stdin until ``quit``."""
    import tasks
    from core.models import Scope
    from core.settings import Settings
    from sinks.connect import open_registry, open_vector_store
    from tasks.answer.cited_answer import answer
    from tasks.answer.extractive import ExtractiveKnowledgeModel
    from tasks.answer.knowledge_search import knowledge_search
    from tasks.answer.turns import AnswerConfig
    from tasks.query.retrieve import retrieve
    from tasks.text.embed import embedder_for

    settings = Settings(home=home)
    config = AnswerConfig(
        threshold=settings.answers.answer_min_confidence, top_k=settings.answers.answer_top_k
    )
    model = ExtractiveKnowledgeModel(settings.answers.answer_min_confidence)
    embedder = embedder_for(settings)
    scope = Scope(org_id=ORG)
    asks = [
        [questions[(i + j) % len(questions)] for j in range(QUERIES_PER_ASK)]
        for i in range(len(questions))
    ]
    with open_registry(settings) as registry, open_vector_store(settings, share=False) as store:

        def retrieve_fn(query: str, scope: Scope, top_k: int) -> Any:
            return retrieve(query, scope, store=store, registry=registry, embedder=embedder,
                            mode=config.mode, top_k=top_k)  # fmt: skip

        setup = {"org_id": ORG, "agent_id": AGENT, "retrieve_fn": retrieve_fn, "model": model,
                 "registry": registry, "embedder": embedder, "config": config}  # fmt: skip

        def timed(path: str, i: int) -> tuple[float, Any]:
            started = time.perf_counter()
            if path == "answer":
                turn = answer(questions[i % len(questions)], scope, **setup)
            else:
                turn = knowledge_search(asks[i % len(asks)], scope, **setup)
            return time.perf_counter() - started, turn

        started = time.perf_counter()
        prints: dict[str, list[str]] = {"answer": [], "ask": []}
        outcomes: dict[str, dict[str, int]] = {"answer": {}, "ask": {}}
        for i in range(len(questions)):
            for path in ("answer", "ask"):
                _, turn = timed(path, i)
                prints[path].append(_fingerprint(turn))
                outcomes[path][turn.outcome] = outcomes[path].get(turn.outcome, 0) + 1
        _reply({"tree": str(Path(tasks.__file__).resolve().parents[1]),
                "warmup_s": round(time.perf_counter() - started, 2), "outcomes": outcomes,
                "fingerprints": prints})  # fmt: skip

        cursor = 0
        for line in sys.stdin:
            command = line.split()
            if not command or command[0] == "quit":
                break
            samples: dict[str, list[float]] = {"answer": [], "ask": []}
            for _ in range(int(command[1])):
                for path in ("answer", "ask"):
                    samples[path].append(timed(path, cursor)[0])
                cursor += 1
            _reply(samples)
    return 0


# --- the parent: builds the home, drives the workers, reports ---------------------------------


def _kbflow(home: Path, *args: str, check: bool = True) -> None:
    env = {**os.environ, "KBFLOW_HOME": str(home), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "kbflow.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True)  # fmt: skip
    if check and done.returncode != 0:
        raise SystemExit(f"kbflow {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def build_home(home: Path) -> Path:
    """The demo store in ``home`` (ingested now unless a previous run left it); returns the
    marker file that says it is complete."""
    from evals.demo_corpus import PRICING_DRAFT_FILE
    from evals.questions import sources_for

    done = home / "answer_turn_home.json"
    if done.is_file():
        return done
    staged = home / "sources"
    approved = sources_for("demo", demo_folder=staged)
    print(f"ingesting the demo corpus into {home} (once, about a minute) ...", file=sys.stderr)
    # The home's first superadmin creates the org (the bootstrap fails harmlessly on a home a
    # previous, unfinished run left with one).
    _kbflow(home, "users", "add", "bench", "--role", "superadmin", check=False)
    _kbflow(home, "orgs", "create", ORG, "--as", "bench")
    _kbflow(home, "ingest", *map(str, approved), "--org", ORG)
    _kbflow(home, "ingest", str(staged / PRICING_DRAFT_FILE), "--org", ORG,
            "--status", "pending_review")  # fmt: skip
    done.write_text(json.dumps({"approved": [p.name for p in approved]}) + "\n")
    return done


class Worker:
    """One tree's worker process, on its own copy of the home."""

    def __init__(self, name: str, tree: Path, home: Path, questions: Path) -> None:
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(tree), "KBFLOW_HOME": str(home)}
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--home",
                   str(home), "--questions", str(questions)]  # fmt: skip
        self.process = subprocess.Popen(command, cwd=tree, env=env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        self.ready = self.read()

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(LINE):
                reply: dict[str, Any] = json.loads(line[len(LINE) :])
                return reply
        raise SystemExit(f"the {self.name} worker ended (exit {self.process.wait()})")

    def run(self, turns: int) -> dict[str, list[float]]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"run {turns}\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
        self.process.wait(timeout=60)


def _ms(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {"n": len(ms), "median_ms": round(statistics.median(ms), 2),
            "p95_ms": round(ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))], 2)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--baseline", type=Path, help="an older checkout to compare with")
    parser.add_argument(
        "--turns", type=int, help="turns per path per round (default: one per question)"
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--home", type=Path, help="where the demo store is built (kept)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--questions", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.home, json.loads(args.questions.read_text()))

    sys.path.insert(0, str(REPO))
    from bench.stats import save_results
    from evals.questions import load_questions

    load_at_start = [round(x, 2) for x in os.getloadavg()]
    home = (args.home or Path(tempfile.mkdtemp(prefix="kbflow-bench-answer-turn-"))).resolve()
    home.mkdir(parents=True, exist_ok=True)
    build_home(home / "store")
    work = Path(tempfile.mkdtemp(prefix="kbflow-bench-answer-turn-run-"))
    questions = work / "questions.json"
    texts = [q.text for q in load_questions("demo")]
    questions.write_text(json.dumps(texts))
    turns = args.turns or len(texts)
    trees = {"current": REPO}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    workers: dict[str, Worker] = {}
    try:
        for name, tree in trees.items():
            shutil.copytree(home / "store", work / name)
            workers[name] = Worker(name, tree, work / name, questions)
        samples = {name: {"answer": [], "ask": []} for name in workers}
        rounds: dict[str, dict[str, list[float]]] = {n: {"answer": [], "ask": []} for n in workers}
        names = list(workers)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                got = workers[name].run(turns)
                for path, values in got.items():
                    samples[name][path] += values
                    rounds[name][path].append(round(statistics.median(values) * 1000, 2))
    finally:
        for w in workers.values():
            w.close()
        shutil.rmtree(work, ignore_errors=True)

    out: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "store": {"org": ORG, "home": str(home / "store"), "questions": len(texts)},
        "turns_per_round": turns,
        "rounds": args.rounds,
        "queries_per_ask": QUERIES_PER_ASK,
    }
    for name, w in workers.items():
        out[name] = {
            "tree": w.ready["tree"],
            "warmup_s": w.ready["warmup_s"],
            "outcomes": w.ready["outcomes"],
            **{path: _ms(values) | {"round_medians_ms": rounds[name][path]}
               for path, values in samples[name].items()},
        }  # fmt: skip
    if "baseline" in workers:
        base, cur = out["baseline"], out["current"]
        out["ratio_baseline_over_current"] = {
            path: round(base[path]["median_ms"] / cur[path]["median_ms"], 3)
            for path in ("answer", "ask")
        }
        prints = {name: w.ready["fingerprints"] for name, w in workers.items()}
        base_prints, cur_prints = prints["baseline"], prints["current"]
        out["same_turns"] = {
            path: sum(a == b for a, b in zip(base_prints[path], cur_prints[path], strict=True))
            for path in ("answer", "ask")
        } | {"of": len(texts)}
    save_results("answer_turn", out)
    if "baseline" in workers:
        same = out["same_turns"]
        return 0 if same["answer"] == same["ask"] == same["of"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
