"""How good is the keyword fallback? SciFact dev through `tasks.query.fallback` (rank-bm25 over the
registry's chunk texts), scored like the other modes; saves bench/results/fallback_eval.json.

Run after ``kbflow eval run --dataset ../shared/datasets/scifact`` with the same KBFLOW_HOME
(it reuses that run's eval index): ``.venv/bin/python bench/fallback_eval.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))


def main() -> int:
    from core.settings import Settings, configure_environment

    settings = Settings()
    configure_environment(settings)
    from core.models import Scope
    from evals.beir import load_beir
    from evals.metrics import evaluate
    from evals.retrieval import CHUNK_DEPTH, DOC_DEPTH, EVAL_ORG, eval_settings
    from evals.retrieval import corpus_ids as eval_corpus_ids
    from sinks.gate import build_gate
    from sinks.registry import SqlRegistry
    from tasks.query.fallback import KeywordFallback

    dataset = load_beir(DATASETS / "scifact", "dev")
    home = eval_settings(settings, dataset)
    registry = SqlRegistry.open(home.registry_url)
    try:
        corpus_ids = eval_corpus_ids(registry)
        if not corpus_ids:
            sys.stderr.write("no eval index here: run `kbflow eval run` first\n")
            return 2
        fallback, gate = KeywordFallback(), build_gate(Scope(EVAL_ORG))
        started = time.perf_counter()
        fallback.search("warm up", gate, registry=registry, top_k=1)
        built = time.perf_counter() - started
        run: dict[str, list[str]] = {}
        started = time.perf_counter()
        for qid, text in dataset.queries.items():
            ranking: list[str] = []
            for hit in fallback.search(text, gate, registry=registry, top_k=CHUNK_DEPTH):
                cid = corpus_ids[hit.doc_id]
                if cid not in ranking:
                    ranking.append(cid)
            run[qid] = ranking[:DOC_DEPTH]
        seconds = time.perf_counter() - started
    finally:
        registry.close()
    scores = evaluate(run, dataset.qrels)
    out = {
        "dataset": dataset.name,
        "keyword_fallback": {k: round(v, 4) for k, v in scores.mean.items()},
        "index_build_s": round(built, 2),
        "ms_per_query": round(1000 * seconds / len(run), 1),
    }
    (REPO / "bench" / "results" / "fallback_eval.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
