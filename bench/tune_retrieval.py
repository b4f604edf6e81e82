"""Tune retrieval on the SciFact dev split: BM25 parameters, fusion and candidate depth.

Every configuration runs through the real path (`evals.retrieval`: the ingest pipeline into
Qdrant Edge, gated search, document-level metrics). Fusion settings need no re-index; each BM25
setting gets its own index (embeddings come from the cache, so only sparse vectors are rebuilt).
Prints a table per phase and saves everything to bench/results/tune_retrieval.json.

Run: ``.venv/bin/python bench/tune_retrieval.py [--home DIR]`` (the first run embeds the
corpus: ~7 min on 2 cores; later runs reuse the embedding cache).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))

FUSIONS: list[dict[str, Any]] = [
    {"fusion": "rrf", "rrf_k": 60, "prefetch_limit": 100},
    {"fusion": "rrf", "rrf_k": 20, "prefetch_limit": 100},
    {"fusion": "rrf", "rrf_k": 60, "prefetch_limit": 50},
    {"fusion": "rrf", "rrf_k": 60, "prefetch_limit": 300},
    {"fusion": "weighted", "dense_weight": 0.3, "prefetch_limit": 100},
    {"fusion": "weighted", "dense_weight": 0.5, "prefetch_limit": 100},
    {"fusion": "weighted", "dense_weight": 0.7, "prefetch_limit": 100},
]
BM25: list[tuple[float, float]] = [(1.2, 0.75), (0.9, 0.4), (1.5, 0.75), (1.2, 0.3), (2.0, 0.75)]


def _row(label: str, metrics: dict[str, float]) -> str:
    cells = " | ".join(f"{metrics[m]:.4f}" for m in ("mrr@10", "ndcg@10", "recall@100"))
    return f"| {label} | {cells} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=REPO / ".kbflow-bench")
    parser.add_argument("--phases", default="fusion,bm25")
    args = parser.parse_args()

    from core.settings import Settings, configure_environment

    base = Settings(home=args.home)
    configure_environment(base)
    from core.models import SearchMode
    from evals.beir import load_beir
    from evals.retrieval import run_eval
    from tasks.text import sparse

    dataset = load_beir(DATASETS / "scifact", "dev")
    out: dict[str, Any] = {"dataset": dataset.name, "queries": len(dataset.queries)}
    started = time.perf_counter()

    if "fusion" in args.phases:
        single = run_eval(dataset, base, (SearchMode.KEYWORD, SearchMode.DENSE))
        out["single"] = single.record.modes
        print("| leg | MRR@10 | nDCG@10 | Recall@100 |\n|---|---|---|---|")
        for mode, metrics in single.record.modes.items():
            print(_row(mode, metrics))
        out["fusion"] = []
        print("\n| fusion | MRR@10 | nDCG@10 | Recall@100 |\n|---|---|---|---|")
        for variant in FUSIONS:
            settings = base.replace(**variant)
            result = run_eval(dataset, settings, (SearchMode.HYBRID,))
            metrics = result.record.modes["hybrid"]
            out["fusion"].append({"settings": variant, "hybrid": metrics})
            print(_row(json.dumps(variant), metrics), flush=True)

    if "bm25" in args.phases:
        out["bm25"] = []
        print("\n| BM25 k1, b | keyword nDCG@10 | hybrid MRR@10 | hybrid nDCG@10 |")
        print("|---|---|---|---|")
        defaults = (sparse.BM25_K1, sparse.BM25_B)
        try:
            for k1, b in BM25:
                sparse.BM25_K1, sparse.BM25_B = k1, b
                result = run_eval(dataset, base, (SearchMode.KEYWORD, SearchMode.HYBRID))
                modes = result.record.modes
                out["bm25"].append({"k1": k1, "b": b, "modes": modes})
                print(
                    f"| {k1}, {b} | {modes['keyword']['ndcg@10']:.4f} | "
                    f"{modes['hybrid']['mrr@10']:.4f} | {modes['hybrid']['ndcg@10']:.4f} |",
                    flush=True,
                )
        finally:
            sparse.BM25_K1, sparse.BM25_B = defaults

    out["seconds"] = round(time.perf_counter() - started, 1)
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "tune_retrieval.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nsaved bench/results/tune_retrieval.json in {out['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
