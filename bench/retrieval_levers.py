"""Measure retrieval levers on SciFact dev, chosen on even query positions, held out on odd ones.

Levers (`bench/levers.py`; none is in the query path): RM3 pseudo-relevance feedback on the
keyword leg, Rocchio feedback on the dense leg, document-level score summing. Each variant runs
through the real gated path (`evals.retrieval`: the Qdrant Edge eval index, `search` with only its
store step replaced, the eval's document rankings) and is scored per half with the split the
embedder fine-tuning uses (`tasks.text.finetune.split_by_position`).

Phases (``--phases``, comma-separated):

1. ``tune``: each grid variant is scored; per lever, the best by nDCG@10 on the even half is
   chosen. The odd half is reported, never used to choose.
2. ``latency``: the default and each chosen variant answer every query as an agent asks
   (top 10), interleaved query by query so machine load hits them alike; p50/p95 per variant.
   Query embeddings come from the eval's cache, so the figures are the search's own cost (a
   served query adds one MiniLM embedding to every variant alike, so real ratios are lower).
3. ``model`` (with ``--model DIR``): the default and the chosen variants on that embedder's index.
4. ``simulate``: an offline replay of the index (`bench/retrieval_levers_sim.py`) for a wider
   Rocchio grid and a logistic fusion fitted on the even half (with ``--model``, on both models).

Prints tables and saves ``--out`` (default bench/results/retrieval_levers.json).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python bench/retrieval_levers.py --home DIR
[--model DIR] [--phases tune,latency,model,simulate]`` (the home's embedding cache must hold
SciFact's vectors, or the first run embeds the corpus: ~7 min on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))

# Lever -> grid of `bench.levers.Levers` fields (the default path is {}).
GRIDS: dict[str, list[dict[str, Any]]] = {
    "prf": [
        {"prf_docs": k, "prf_terms": n, "prf_weight": w}
        for k in (3, 5, 10)
        for n in (10, 20)
        for w in (0.3, 0.5)
    ],
    "rocchio": [{"rocchio_docs": k, "rocchio_beta": b} for k in (2, 3, 5) for b in (0.25, 0.5)],
    "doc_sum": [{"doc_sum_weight": w} for w in (0.1, 0.25, 0.5, 1.0)],
}
LATENCY_ROUNDS = 1


def _row(label: str, halves: dict[str, Any], ratio: str = "") -> str:
    cells = " | ".join(
        f"{halves[h]['ndcg@10']:.4f} / {halves[h]['mrr@10']:.4f}"
        for h in ("train", "held_out", "all")
    )
    return f"| {label} | {cells} | {ratio} |"


HEADER = (
    "| variant | even nDCG@10 / MRR@10 | odd (held out) | all | p95 ratio |\n|---|---|---|---|---|"
)


def _label(override: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in override.items()) or "default"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=REPO / ".kbflow-bench")
    parser.add_argument("--model", type=Path, help="also score the chosen variants with this model")
    parser.add_argument("--phases", default="tune,latency")
    parser.add_argument("--levers", default=",".join(GRIDS))
    parser.add_argument(
        "--latency-of",
        type=json.loads,
        help='JSON {"name": {lever fields}}: time these variants (and the default) instead of '
        "the tune phase's choices, e.g. each lever's best even-half setting",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/retrieval_levers.json")
    args = parser.parse_args()

    from core.settings import Settings, configure_environment

    base = Settings(home=args.home.resolve())
    configure_environment(base)
    from bench.levers import Levers, export_vectors, levers_applied
    from core.models import SearchMode
    from evals.adapt import scores_by_half
    from evals.beir import load_beir
    from evals.retrieval import build_index, cached_embedder, eval_settings, run_queries
    from sinks.connect import open_vector_store
    from tasks.query.retrieve import RetrievalConfig
    from tasks.text.finetune import split_by_position

    dataset = load_beir(DATASETS / "scifact", "dev")
    split = split_by_position(list(dataset.queries))
    default = RetrievalConfig.from_settings(base)
    t0 = time.perf_counter()
    out: dict[str, Any] = {
        "dataset": dataset.name,
        "commit": _commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "split": {
            "rule": "choose on even query positions, hold out odd ones",
            "even": len(split.train),
            "odd": len(split.held_out),
        },
        "default": asdict(default),
    }

    vectors: dict[str, dict[str, Any]] = {}

    def index_vectors(settings: Settings) -> dict[str, Any]:
        key = settings.ingest.embedding_model
        if key not in vectors:
            with open_vector_store(eval_settings(settings, dataset)) as store:
                vectors[key] = export_vectors(store)
        return vectors[key]

    def score(settings: Settings, override: dict[str, Any]) -> dict[str, Any]:
        embedder = cached_embedder(settings)
        try:
            build_index(dataset, settings, embedder=embedder)
            feedback = index_vectors(settings) if "rocchio_docs" in override else None
            with levers_applied(Levers(**override), feedback):
                runs = run_queries(
                    dataset, settings, (SearchMode.HYBRID,), embedder=embedder, config=default
                )
        finally:
            embedder.close()
        mode_run = runs[SearchMode.HYBRID]
        halves = scores_by_half(mode_run.run, dataset.qrels, split)
        return {"override": override, "halves": halves, "seconds": round(mode_run.seconds, 1)}

    chosen: dict[str, dict[str, Any]] = {"default": {}}
    if "tune" in args.phases:
        print(HEADER)
        rows = [score(base, {})]
        print(_row("default", rows[0]["halves"]), flush=True)
        for lever in args.levers.split(","):
            best = rows[0]
            for override in GRIDS[lever]:
                row = score(base, override)
                rows.append(row)
                print(_row(_label(override), row["halves"]), flush=True)
                if row["halves"]["train"]["ndcg@10"] > best["halves"]["train"]["ndcg@10"]:
                    best = row
            chosen[lever] = best["override"]
        chosen = {name: o for name, o in chosen.items() if name == "default" or o}
        out["tune"] = rows
        out["chosen"] = chosen
        print(f"\nchosen on the even half: {json.dumps(chosen)}", flush=True)

    if "latency" in args.phases:
        timed = {"default": {}, **args.latency_of} if args.latency_of else chosen
        feedback = index_vectors(base) if any("rocchio_docs" in o for o in timed.values()) else None
        out["latency"] = latency(base, dataset, default, timed, feedback)
        for name, figures in out["latency"].items():
            print(f"latency {name}: p50 {figures['p50_ms']:.1f} ms, p95 {figures['p95_ms']:.1f} "
                  f"ms, p95 ratio {figures['p95_ratio']:.2f}")  # fmt: skip

    if "simulate" in args.phases:
        out["simulate"] = simulate(base, dataset, split)
        if args.model is not None:
            settings = base.replace(embedding_model=str(args.model.resolve()))
            out["simulate_model"] = simulate(settings, dataset, split)

    if args.model is not None and "model" in args.phases:
        settings = base.replace(embedding_model=str(args.model.resolve()))
        out["model"] = {"path": str(args.model), "runs": []}
        print(f"\n{args.model.name}\n{HEADER}")
        for name, override in chosen.items():
            row = score(settings, override)
            out["model"]["runs"].append({"variant": name, **row})
            print(_row(f"{name}: {_label(override)}", row["halves"]), flush=True)

    out["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nsaved {args.out} in {out['seconds']:.0f}s")
    return 0


ROCCHIO = [(k, beta) for k in (2, 3, 5, 10) for beta in (0.1, 0.25, 0.5, 1.0)]


def simulate(settings: Any, dataset: Any, split: Any) -> dict[str, Any]:
    """Replay the index offline (`bench.retrieval_levers_sim`): Rocchio on the dense leg and a
    logistic fusion fitted on the even half; each choice made on the even half."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from bench.retrieval_levers_sim import FEATURES, Replay, doc_ranking, features, weighted
    from evals.adapt import scores_by_half
    from evals.retrieval import cached_embedder, corpus_ids, eval_settings
    from sinks.connect import open_vector_store
    from sinks.registry import SqlRegistry
    from tasks.text.sparse import query_sparse_vector

    home = eval_settings(settings, dataset)
    registry = SqlRegistry.open(home.registry_url)
    try:
        ids = corpus_ids(registry)
    finally:
        registry.close()
    with open_vector_store(home) as store:
        replay = Replay.export(store, ids)
    embedder = cached_embedder(settings)
    try:
        queries = {q: np.asarray(embedder.embed_query(t)) for q, t in dataset.queries.items()}
    finally:
        embedder.close()
    sparse = {q: query_sparse_vector(t) for q, t in dataset.queries.items()}
    legs = {
        q: (replay.dense(queries[q]), replay.sparse(sparse[q].indices, sparse[q].values))
        for q in dataset.queries
    }
    rows: list[dict[str, Any]] = []

    def record(label: str, run: dict[str, list[str]]) -> dict[str, Any]:
        halves = scores_by_half(run, dataset.qrels, split)
        rows.append({"variant": label, "halves": halves})
        print(_row(f"replay: {label}", halves), flush=True)
        return halves

    print(HEADER)
    fused = {q: weighted(*legs[q]) for q in dataset.queries}
    record("default", {q: doc_ranking(replay, [r for r, _ in f]) for q, f in fused.items()})
    best: tuple[float, str] = (-1.0, "")
    for k, beta in ROCCHIO:
        run = {}
        for q, f in fused.items():
            fb = replay.vectors[[r for r, _ in f[:k]]].mean(axis=0)
            qv = queries[q] / np.linalg.norm(queries[q]) + beta * fb
            run[q] = doc_ranking(replay, [r for r, _ in weighted(replay.dense(qv), legs[q][1])])
        label = f"rocchio k={k} beta={beta}"
        halves = record(label, run)
        best = max(best, (halves["train"]["ndcg@10"], label))
    # Logistic fusion: a candidate chunk is positive when its document is judged relevant.
    cand = {q: features(*legs[q]) for q in dataset.queries}
    even = [q for q in split.train if q in dataset.qrels]
    x = np.vstack([cand[q][1] for q in even])
    y = np.concatenate(
        [[dataset.qrels[q].get(replay.docs[r], 0) > 0 for r in cand[q][0]] for q in even]
    )
    for c in (0.1, 1.0, 10.0):
        model = LogisticRegression(C=c, max_iter=2000).fit(x, y)
        run = {}
        for q, (cands, feats) in cand.items():
            s = model.decision_function(feats)
            run[q] = doc_ranking(replay, [cands[i] for i in np.argsort(-s, kind="stable")])
        label = f"logistic C={c}"
        halves = record(label, run)
        rows[-1]["coef"] = dict(zip(FEATURES, model.coef_[0].round(3).tolist(), strict=True))
        best = max(best, (halves["train"]["ndcg@10"], label))
    print(f"replay: best on the even half: {best[1]}", flush=True)
    return {"rows": rows, "chosen": best[1]}


def latency(
    settings: Any,
    dataset: Any,
    default: Any,
    chosen: dict[str, dict[str, Any]],
    feedback: dict[str, Any] | None,
) -> dict[str, dict[str, float]]:
    """Each variant's top-10 search time per query, the variants interleaved query by query."""
    from bench.levers import Levers, levers_applied
    from core.models import Scope
    from evals.retrieval import EVAL_ORG, cached_embedder, eval_settings
    from sinks.connect import open_vector_store
    from sinks.registry import SqlRegistry
    from tasks.query.retrieve import search

    home = eval_settings(settings, dataset)
    configs = {name: Levers(**override) for name, override in chosen.items()}
    times: dict[str, list[float]] = {name: [] for name in configs}
    embedder = cached_embedder(settings)
    registry = SqlRegistry.open(home.registry_url)
    scope = Scope(org_id=EVAL_ORG)
    try:
        with open_vector_store(home) as store:
            for n, text in enumerate(list(dataset.queries.values()) * LATENCY_ROUNDS):
                embedder.embed_query(text)  # warm the cache: every variant then reads it alike
                names = list(configs)
                names = names[n % len(names) :] + names[: n % len(names)]  # rotate the order
                for name in names:
                    with levers_applied(configs[name], feedback):
                        started = time.perf_counter()
                        search(
                            text, scope, store=store, registry=registry, embedder=embedder,
                            top_k=10, config=default,
                        )  # fmt: skip
                        times[name].append((time.perf_counter() - started) * 1000)
    finally:
        registry.close()
        embedder.close()
    p95 = {name: statistics.quantiles(t, n=20)[-1] for name, t in times.items()}
    return {
        name: {
            "p50_ms": round(statistics.median(t), 2),
            "p95_ms": round(p95[name], 2),
            "p95_ratio": round(p95[name] / p95["default"], 3),
            "queries": len(t),
        }
        for name, t in times.items()
    }


def _commit() -> str | None:
    found = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    )
    return found.stdout.strip() or None


if __name__ == "__main__":
    raise SystemExit(main())
