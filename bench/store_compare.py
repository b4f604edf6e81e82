"""Benchmark: the embedded Qdrant Edge store against qdrant-client's local mode, same points.

For each size (default 1k, 10k, 50k points) both stores get the same points through their
kbflow store classes (`QdrantEdgeStore`, `QdrantServerStore` on ``:memory:``), then answer the
same gated dense queries (org + status=approved + collection, built by ``build_gate``). Figures
per store and size:
- upsert throughput (points/s, batches of 1,000 — Edge flushes after each batch);
- gated dense query latency, median and p95, and the ratio local mode / Edge;
- RSS growth of the process while the store is filled, per point (each store and size runs in
  a fresh child process, so one store's memory does not blur another's);
- Edge's on-disk size (local mode runs in memory here: persisted local-mode upserts take ~11 s
  per 1,000 points, FACTS.md);
- how often the two stores return the same top-10 (they should: both search exhaustively).

Points: real MiniLM embeddings and BM25 vectors of the first ``--embed`` SciFact abstracts (or
random unit vectors with ``--random``, said so in the output); larger sizes reuse them with
small Gaussian noise (re-normalised), spread over 5 orgs, 3 collections and 75 % approved, with
the payload an ingest writes (``chunk_to_point``: title, text, ids). Queries: SciFact dev
claims, embedded. Edge is timed without ``optimize()`` (no HNSW: an exact search like local
mode's), as a fresh ingest leaves it; local mode is always brute force in NumPy with a Python
filter loop.

Run: ``.venv/bin/python bench/store_compare.py [--sizes 1000,10000,50000] [--queries 20]``.
Saves bench/results/store_compare.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
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
ORGS = 5
COLLECTIONS = ("scifact", "scifact/claims", "reviews")
NOISE = 0.05
BATCH = 1000
TOP_K = 10


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--sizes", default="1000,10000,50000", help="points per run, comma-separated"
    )
    parser.add_argument("--queries", type=int, default=20, help="timed queries per run")
    parser.add_argument("--embed", type=int, default=1000, help="SciFact abstracts to embed")
    parser.add_argument("--random", action="store_true", help="random unit vectors, no model")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "store_compare.json"
    )
    parser.add_argument(
        "--child", nargs=3, metavar=("STORE", "SIZE", "WORKDIR"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        store, size, workdir = args.child
        print(json.dumps(run_child(store, int(size), Path(workdir), args.queries)))
        return 0

    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="kbflow-store-compare-"))
    try:
        started = time.perf_counter()
        vectors = prepare(work, embed=args.embed, queries=args.queries, random_vectors=args.random)
        prep_s = time.perf_counter() - started
        runs: list[dict[str, Any]] = []
        for size in sizes:
            pair = {}
            for store in ("edge", "local"):
                out = subprocess.run(
                    [sys.executable, __file__, "--queries", str(args.queries),
                     "--child", store, str(size), str(work)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                pair[store] = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"  {store:5} {size:>7,} points: done", file=sys.stderr)
            runs.append(summarise(size, pair["edge"], pair["local"]))
        report = {
            "bench": "store_compare",
            "vectors": vectors,
            "prepare_s": round(prep_s, 1),
            "queries": args.queries,
            "filter": "org_id=org0, status=approved (gate), collection scifact and below",
            "edge_optimized": False,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "runs": runs,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"saved {args.out}")
    return 0


def prepare(work: Path, *, embed: int, queries: int, random_vectors: bool) -> str:
    """Write the base points (vectors, sparse vectors, texts) and the query vectors to ``work``;
    returns how the vectors were made."""
    import numpy as np

    from tasks.text.sparse import document_sparse_vector

    corpus = DATASETS / "scifact" / "corpus.jsonl.gz"
    rows: list[dict[str, str]] = []
    with gzip.open(corpus, "rt", encoding="utf-8") as fh:
        for line in fh:
            rows.append(json.loads(line))
            if len(rows) == embed:
                break
    claims = [
        json.loads(line)["text"]
        for line in (DATASETS / "scifact" / "dev" / "queries.jsonl")
        .read_text()
        .splitlines()[:queries]
    ]
    texts = [f"{r['title']}\n{r['text']}" for r in rows]
    if random_vectors:
        rng = np.random.default_rng(7)
        dense = rng.normal(size=(len(texts), 384)).astype(np.float32)
        qvec = rng.normal(size=(len(claims), 384)).astype(np.float32)
        dense /= np.linalg.norm(dense, axis=1, keepdims=True)
        qvec /= np.linalg.norm(qvec, axis=1, keepdims=True)
        how = "random unit vectors (dim 384), SciFact texts and BM25 vectors in the payloads"
    else:
        from tasks.text.embed import get_embedder

        embedder = get_embedder()
        dense = np.asarray(embedder.embed_documents(texts), dtype=np.float32)
        qvec = np.asarray([embedder.embed_query(c) for c in claims], dtype=np.float32)
        how = (
            f"MiniLM embeddings of {len(texts)} SciFact abstracts (larger sizes: the same plus "
            f"Gaussian noise sd {NOISE}, re-normalised); queries: {len(claims)} SciFact dev claims"
        )
    np.save(work / "dense.npy", dense)
    np.save(work / "queries.npy", qvec)
    sparse = [document_sparse_vector(t) for t in texts]
    (work / "base.json").write_text(
        json.dumps(
            [
                {"id": r["_id"], "title": r["title"], "text": r["text"],
                 "sparse": [s.indices, s.values]}
                for r, s in zip(rows, sparse, strict=True)
            ]
        )
    )  # fmt: skip
    return how


def points(size: int, work: Path) -> Any:
    """The ``size`` points, in batches of `BATCH` (built lazily, so the process holds one batch
    at a time and its RSS growth is the store's)."""
    import dataclasses
    import datetime as dt

    import numpy as np

    from core.models import Chunk, SparseVec
    from core.settings import PACKAGED_MINILM
    from sinks.registry import DocRecord
    from tasks.text.points import chunk_to_point

    dense = np.load(work / "dense.npy")
    base = json.loads((work / "base.json").read_text())
    rng = np.random.default_rng(11)
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for start in range(0, size, BATCH):
        batch = []
        for i in range(start, min(size, start + BATCH)):
            b = i % len(base)
            row = base[b]
            vec = dense[b]
            if i >= len(base):
                vec = vec + rng.normal(scale=NOISE, size=vec.shape).astype(np.float32)
                vec = vec / np.linalg.norm(vec)
            doc = DocRecord(
                id=f"doc{i}", org_id=f"org{i % ORGS}", collection_path=COLLECTIONS[i % 3],
                source_key=f"scifact/{row['id']}/{i}", title=row["title"],
                uri=f"scifact#{row['id']}", content_hash=f"h{i}", version=1,
                status="pending_review" if i % 4 == 0 else "approved", source_tag=None,
                synthesis_run_id=None, audience=None, effective_date=None,
                parse_status="ingested", chunk_count=1, created_at=now, updated_at=now,
            )  # fmt: skip
            chunk = Chunk(f"doc{i}:0", doc.id, 0, row["text"], (row["title"],))
            point = chunk_to_point(chunk, [float(x) for x in vec], doc, model_id=PACKAGED_MINILM)
            # The base text's BM25 vector, computed once (the text is the same).
            batch.append(dataclasses.replace(point, sparse=SparseVec(*row["sparse"])))
        yield batch


def run_child(store_kind: str, size: int, work: Path, n_queries: int) -> dict[str, Any]:
    """Fill one store with ``size`` points and time the queries, in this (fresh) process."""
    import numpy as np
    import psutil

    from core.models import Scope
    from sinks.gate import build_gate

    proc = psutil.Process()
    queries = np.load(work / "queries.npy")[:n_queries]
    gate = build_gate(Scope(org_id="org0", collections=("scifact",)))
    shard = work / f"edge-{size}"
    store: Any
    if store_kind == "edge":
        from sinks.qdrant_edge import QdrantEdgeStore

        store = QdrantEdgeStore.open(shard)
    else:
        from sinks.qdrant_server import QdrantServerStore

        store = QdrantServerStore.connect(":memory:", collection="bench")
    import warnings

    warnings.filterwarnings("ignore", message="Local mode is not recommended")
    batches = points(size, work)
    first = next(batches)  # the first batch is built before measuring: imports, caches
    rss_before = proc.memory_info().rss
    upsert_s = 0.0
    for batch in [first]:
        t = time.perf_counter()
        store.upsert(batch)
        upsert_s += time.perf_counter() - t
    for batch in batches:
        t = time.perf_counter()
        store.upsert(batch)
        upsert_s += time.perf_counter() - t
    rss_after = proc.memory_info().rss
    assert store.count() == size
    for q in queries[:2]:  # warm-up
        store.query(gate, dense=[float(x) for x in q], sparse=None, limit=TOP_K)
    samples, tops = [], []
    for q in queries:
        vec = [float(x) for x in q]
        t = time.perf_counter()
        hits = store.query(gate, dense=vec, sparse=None, limit=TOP_K)
        samples.append(time.perf_counter() - t)
        assert all(gate.admits(h.payload) for h in hits)
        tops.append([h.point_id for h in hits])
    store.close()
    disk = None
    if store_kind == "edge":
        disk = sum(f.stat().st_size for f in shard.rglob("*") if f.is_file())
    return {
        "store": store_kind,
        "size": size,
        "upsert_s": round(upsert_s, 2),
        "upsert_points_per_s": round(size / upsert_s),
        "query": latency(samples),
        "rss_growth_mb": round((rss_after - rss_before) / 2**20, 1),
        "rss_per_point_bytes": round((rss_after - rss_before) / size),
        "disk_mb": round(disk / 2**20, 1) if disk is not None else None,
        "tops": tops,
    }


def summarise(size: int, edge: dict[str, Any], local: dict[str, Any]) -> dict[str, Any]:
    same = sum(a == b for a, b in zip(edge.pop("tops"), local.pop("tops"), strict=True))
    return {
        "size": size,
        "edge": edge,
        "local": local,
        "query_median_ratio_local_over_edge": round(
            local["query"]["median_ms"] / edge["query"]["median_ms"], 1
        ),
        "query_p95_ratio_local_over_edge": round(
            local["query"]["p95_ms"] / edge["query"]["p95_ms"], 1
        ),
        "same_top10_queries": f"{same}/{edge['query']['n']}",
    }


def print_table(report: dict[str, Any]) -> None:
    print(f"vectors: {report['vectors']}")
    print(f"filter: {report['filter']}; Edge not optimized (exact search)")
    head = (
        f"{'points':>7} {'store':6} {'upsert/s':>9} {'median ms':>10} {'p95 ms':>8} "
        f"{'RSS MB':>7} {'B/point':>8} {'disk MB':>8}"
    )
    print(head)
    for run in report["runs"]:
        for kind in ("edge", "local"):
            r = run[kind]
            disk = "—" if r["disk_mb"] is None else f"{r['disk_mb']:.1f}"
            print(
                f"{run['size']:>7,} {kind:6} {r['upsert_points_per_s']:>9,} "
                f"{r['query']['median_ms']:>10.2f} {r['query']['p95_ms']:>8.2f} "
                f"{r['rss_growth_mb']:>7.1f} {r['rss_per_point_bytes']:>8,} {disk:>8}"
            )
        print(
            f"{'':>7} local/edge: median ×{run['query_median_ratio_local_over_edge']}, "
            f"p95 ×{run['query_p95_ratio_local_over_edge']}; same top-10: "
            f"{run['same_top10_queries']}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
