"""Benchmark: what the embedding-model check adds to a search.

Fills a temporary home with ``--chunks`` chunks of one org (registry rows through
``put_chunks``, Edge points with random unit vectors and real BM25 vectors, the payload an
ingest writes), plus as many of a second org, then times gated hybrid retrieval
(`tasks.query.retrieve.retrieve`, the path every search and answer takes) with the check and
with it switched off, interleaved, over the same queries (their embeddings cached, so the figures
are the store, the registry and the check). Also times the check alone
(`require_org_model`).

Run: ``.venv/bin/python bench/model_check_latency.py [--chunks 20000] [--rounds 200]``.
Saves bench/results/model_check_latency.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

QUERIES = [
    "paid leave days per year",
    "expense claims deadline",
    "train travel under four hours",
    "remote work policy",
]
WORDS = [
    "leave",
    "expense",
    "travel",
    "policy",
    "claim",
    "train",
    "remote",
    "office",
    "budget",
    "approval",
    "manager",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=20000, help="chunks per org")
    parser.add_argument("--rounds", type=int, default=200, help="timed searches per variant")
    args = parser.parse_args()

    import numpy as np

    import tasks.query.retrieve as retrieve_module
    from core.models import Chunk, Scope
    from core.settings import Settings
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.registry import SqlRegistry
    from tasks.query.retrieve import retrieve
    from tasks.text.embed import embedder_for
    from tasks.text.model_check import require_org_model
    from tasks.text.points import chunk_to_point

    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(home=Path(tmp) / "home")
        registry = SqlRegistry.open(settings.registry_url)
        store = QdrantEdgeStore.open(settings.vectors_dir)
        embedder = embedder_for(settings)
        model = embedder.model_id
        started = time.perf_counter()
        for org in ("acme", "globex"):
            registry.people.ensure_org(org)
            coll = registry.catalog.ensure_collection(org, "docs")
            per_doc = 200  # few, large documents: the fill is bounded by commits and flushes
            for d in range(args.chunks // per_doc):
                doc = registry.documents.create_document(
                    org_id=org, collection_id=coll.id, source_key=f"k{d}", title=f"Doc {d}",
                    uri=f"bench://{org}/{d}", content_hash=f"h{d}",
                )  # fmt: skip
                chunks = [
                    Chunk(
                        f"{doc.id}:{i}",
                        doc.id,
                        i,
                        " ".join(rng.choice(WORDS, size=30)),
                    )
                    for i in range(per_doc)
                ]
                vectors = rng.normal(size=(per_doc, 384)).astype(np.float32)
                vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                registry.chunks.put_chunks(doc, doc.content_hash, chunks, embedding_model=model)
                store.upsert(
                    [
                        chunk_to_point(c, v.tolist(), doc, model_id=model)
                        for c, v in zip(chunks, vectors, strict=True)
                    ]
                )
                registry.documents.publish({doc.id: per_doc}, retire_older=[], actor="bench")
        fill_s = time.perf_counter() - started
        scope = Scope(org_id="acme")
        for q in QUERIES:
            embedder.embed_query(q)  # cached from here on

        real_check = retrieve_module.require_org_model

        def no_check(*_a: Any, **_k: Any) -> None:
            return None

        timings: dict[str, list[float]] = {"with_check": [], "without_check": []}
        for r in range(args.rounds + 20):
            for variant, check in (("with_check", real_check), ("without_check", no_check)):
                retrieve_module.require_org_model = check  # type: ignore[assignment]
                q = QUERIES[r % len(QUERIES)]
                t0 = time.perf_counter()
                result = retrieve(q, scope, store=store, registry=registry, embedder=embedder)
                elapsed = (time.perf_counter() - t0) * 1000
                assert result.hits and not result.degraded
                if r >= 20:  # warm-up rounds not counted
                    timings[variant].append(elapsed)
        retrieve_module.require_org_model = real_check
        check_alone: list[float] = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            require_org_model(registry, "acme", model)
            check_alone.append((time.perf_counter() - t0) * 1000)
        store.close()
        registry.close()

    def summary(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {
            "median_ms": round(statistics.median(ordered), 3),
            "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 3),
        }

    out = {
        "chunks_per_org": args.chunks,
        "orgs": 2,
        "rounds": args.rounds,
        "fill_seconds": round(fill_s, 1),
        "search_with_check": summary(timings["with_check"]),
        "search_without_check": summary(timings["without_check"]),
        "check_alone": summary(check_alone),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "note": "hybrid retrieval, query embeddings cached; SQLite registry, Qdrant Edge "
        "without optimize(); the two variants interleaved",
    }
    print(json.dumps(out, indent=2))
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / "model_check_latency.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
