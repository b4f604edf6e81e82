"""Calibrate the "no chunk, no answer" threshold on SciFact dev (issue 8 groundwork).

For every dev claim we take two situations from the same index:
- answerable: the knowledge base as it is (the claim's relevant abstracts are in it);
- unanswerable: the claim's relevant abstracts removed (their chunks are dropped from the
  ranking, which is what searching a knowledge base without them returns).
The confidence signal is the best gated chunk's dense cosine similarity (MiniLM, normalised
vectors), which, unlike the fused score, means the same thing from query to query. For each
candidate threshold we report refusal precision (refused claims that were unanswerable) and
refusal recall (unanswerable claims that were refused), and pick the threshold with the best
F1. Saves bench/results/refusal_calibration.json.

Run after ``kbflow eval run --dataset ../shared/datasets/scifact`` with the same KBFLOW_HOME:
``.venv/bin/python bench/refusal_calibration.py``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))


def main() -> int:
    from kbflow.settings import Settings, configure_environment

    settings = Settings()
    configure_environment(settings)
    from evals.beir import load_beir
    from evals.retrieval import EVAL_ORG, cached_embedder, eval_settings
    from evals.retrieval import corpus_ids as eval_corpus_ids
    from kbflow.models import Scope, SearchMode
    from sinks.registry import SqlRegistry
    from sinks.vectors import open_vector_store
    from tasks.retrieve import RetrievalConfig, search

    dataset = load_beir(DATASETS / "scifact", "dev")
    home = eval_settings(settings, dataset)
    embedder = cached_embedder(settings)
    registry = SqlRegistry.open(home.registry_url)
    answerable: list[float] = []
    unanswerable: list[float] = []
    try:
        corpus_ids = eval_corpus_ids(registry)
        if not corpus_ids:
            sys.stderr.write("no eval index here: run `kbflow eval run` first\n")
            return 2
        with open_vector_store(home) as store:
            for qid, text in dataset.queries.items():
                hits = search(
                    text, Scope(EVAL_ORG), store=store, registry=registry, embedder=embedder,
                    mode=SearchMode.DENSE, top_k=50, config=RetrievalConfig(),
                )  # fmt: skip
                relevant = {d for d, grade in dataset.qrels[qid].items() if grade > 0}
                scores = [h.score for h in hits]
                kept = [h.score for h in hits if corpus_ids.get(h.doc_id) not in relevant]
                answerable.append(scores[0] if scores else 0.0)
                unanswerable.append(kept[0] if kept else 0.0)
    finally:
        registry.close()
        embedder.close()

    rows = []
    for step in range(20, 81):
        threshold = step / 100
        refused_unanswerable = sum(s < threshold for s in unanswerable)
        refused_answerable = sum(s < threshold for s in answerable)
        refused = refused_unanswerable + refused_answerable
        precision = refused_unanswerable / refused if refused else 1.0
        recall = refused_unanswerable / len(unanswerable)
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        answered_ok = 1 - refused_answerable / len(answerable)
        rows.append(
            {
                "threshold": threshold,
                "refusal_precision": round(precision, 4),
                "refusal_recall": round(recall, 4),
                "f1": round(f1, 4),
                "answerable_answered": round(answered_ok, 4),
            }
        )
    best = max(rows, key=lambda r: (r["f1"], -r["threshold"]))
    out = {
        "dataset": dataset.name,
        "signal": "best gated chunk's dense cosine similarity (MiniLM)",
        "queries": len(answerable),
        "mean_top_cosine": {
            "answerable": round(sum(answerable) / len(answerable), 4),
            "unanswerable": round(sum(unanswerable) / len(unanswerable), 4),
        },
        "best_f1": best,
        "curve": rows,
    }
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "refusal_calibration.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "curve"}, indent=2))
    for r in rows[::5]:
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
