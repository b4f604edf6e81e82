"""Benchmark: ingest the SciFact corpus, re-ingest it, and time gated hybrid queries.

Prints a table and saves JSON (bench/results/ingest_scifact.json). Figures:
- first ingest: wall time, documents/s, chunks/s, share of wall time outside the embedding model;
- re-ingest of the unchanged corpus: wall time and its ratio to the first ingest;
- gated hybrid query latency (median, p95) at ~5k chunks and ~50k chunks (the SciFact chunks
  plus copies under other orgs, so the gate filters by tenant), both for the vector store alone
  (pre-computed query vectors) and for the whole ``search()`` (embedding + registry re-check);
  at 50k before and after the index build (``store optimize``).

Run: ``make bench`` or ``.venv/bin/python bench/ingest_scifact.py [--home DIR] [--queries N]``.
Needs ../shared/datasets/scifact (or KBFLOW_DATASETS).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stats import latency  # noqa: E402  (after the path is set)

DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--home", type=Path, default=None, help="data dir (default: a temp dir)")
    parser.add_argument("--queries", type=int, default=200, help="dev queries to time")
    parser.add_argument("--target-chunks", type=int, default=50_000, help="size of the large run")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "ingest_scifact.json"
    )
    args = parser.parse_args()

    corpus = DATASETS / "scifact" / "corpus.jsonl.gz"
    queries_path = DATASETS / "scifact" / "dev" / "queries.jsonl"
    if not corpus.exists():
        print(f"SciFact not found at {corpus}; set KBFLOW_DATASETS", file=sys.stderr)
        return 2
    home = args.home or Path(tempfile.mkdtemp(prefix="kbflow-bench-"))
    os.environ["KBFLOW_HOME"] = str(home)

    from core.settings import Settings, configure_environment

    settings = Settings()
    configure_environment(settings)

    from core.contracts import IngestRequest
    from core.models import Scope, SearchMode
    from kbflow.services.ingest import run_ingest
    from kbflow.services.query.context import open_home
    from sinks.gate import build_gate
    from tasks.text.sparse import query_sparse_vector

    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        registry.people.ensure_org("sci")  # ingest refuses an org that does not exist

    print("first ingest of SciFact ...", flush=True)
    t0 = time.perf_counter()
    first = run_ingest(settings, [str(corpus)], IngestRequest(org="sci", collection="scifact"))
    first_s = time.perf_counter() - t0
    print("re-ingest (unchanged) ...", flush=True)
    t0 = time.perf_counter()
    again = run_ingest(settings, [str(corpus)], IngestRequest(org="sci", collection="scifact"))
    again_s = time.perf_counter() - t0
    result["ingest"] = {
        "documents": first["documents"],
        "chunks": first["chunks"],
        "wall_s": round(first_s, 2),
        "docs_per_s": round(first["documents"] / first_s, 2),
        "chunks_per_s": round(first["chunks"] / first_s, 2),
        "embed_s": first["embed_seconds"],
        "share_outside_embedding": round(1 - first["embed_seconds"] / first_s, 3),
        "reingest_wall_s": round(again_s, 2),
        "reingest_embedded_documents": again["documents"],
        "reingest_ratio": round(again_s / first_s, 4),
    }

    rows = [json.loads(line) for line in queries_path.open(encoding="utf-8")]
    random.Random(7).shuffle(rows)
    texts = [r["text"] for r in rows[: args.queries]]
    scope = Scope(org_id="sci")
    gate = build_gate(scope)

    with open_home(settings) as ctx:
        dense = [ctx.embedder.embed_query(t) for t in texts]  # warm the model too
        sparse = [query_sparse_vector(t) for t in texts]

        def time_store() -> dict[str, float]:
            samples = []
            for d, s in zip(dense, sparse, strict=True):
                t = time.perf_counter()
                ctx.vector_store.query(gate, dense=d, sparse=s, limit=10, prefetch_limit=100)
                samples.append(time.perf_counter() - t)
            return latency(samples)

        def time_search() -> dict[str, float]:
            samples = []
            for text in texts:
                t = time.perf_counter()
                ctx.search(text, scope, mode=SearchMode.HYBRID, top_k=10)
                samples.append(time.perf_counter() - t)
            return latency(samples)

        small = ctx.vector_store.count()
        result["query_small"] = {"points": small, "store": time_store(), "search": time_search()}
        print(f"{small} points: {result['query_small']}", flush=True)

        # Grow to ~target chunks with copies under other orgs (the gate must filter them out).
        from core.models import ChunkPoint
        from sinks.vectors import point_id_for

        base = list(ctx.vector_store.export_points())  # type: ignore[attr-defined]
        rng = random.Random(11)
        copies = 0
        t0 = time.perf_counter()
        while ctx.vector_store.count() < args.target_chunks:
            copies += 1
            batch = []
            for p in base:
                noisy = [v + rng.uniform(-0.01, 0.01) for v in p.dense]
                payload = {**p.payload, "org_id": f"copy{copies}"}
                pid = point_id_for(f"copy{copies}:{p.payload['chunk_id']}")
                batch.append(ChunkPoint(pid, noisy, p.sparse, payload))
            for i in range(0, len(batch), 2000):
                ctx.vector_store.upsert(batch[i : i + 2000])
        upsert_s = time.perf_counter() - t0
        large = ctx.vector_store.count()
        result["query_large"] = {
            "points": large,
            "upsert_points_per_s": round((large - small) / upsert_s, 1),
            "store_before_optimize": time_store(),
            "search_before_optimize": time_search(),
        }
        t0 = time.perf_counter()
        ctx.vector_store.optimize()
        result["query_large"]["optimize_s"] = round(time.perf_counter() - t0, 2)
        result["query_large"]["store"] = time_store()
        result["query_large"]["search"] = time_search()
        print(f"{large} points: {result['query_large']}", flush=True)

    result["ratios"] = {
        "large_over_small_store_p95": round(
            result["query_large"]["store"]["p95_ms"] / result["query_small"]["store"]["p95_ms"], 2
        ),
        "reingest_over_first_ingest": result["ingest"]["reingest_ratio"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
