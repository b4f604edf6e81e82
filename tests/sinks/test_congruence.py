"""Congruence: the same gated queries on Qdrant Edge and qdrant-client ``:memory:`` agree."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from core.models import DocStatus, Scope
from sinks.gate import build_gate
from sinks.qdrant_server import QdrantServerStore
from tasks.text.points import chunk_to_point
from tasks.text.sparse import query_sparse_vector
from tests.conftest import datasets_dir

N_DOCS = 400


def _corpus() -> list[dict[str, str]]:
    path = datasets_dir("scifact", "corpus.jsonl.gz")
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            rows.append(json.loads(line))
            if len(rows) == N_DOCS:
                break
    return rows


@pytest.fixture(scope="module")
def points(embedder: Any) -> list[Any]:
    """SciFact abstracts as points; every 4th is pending_review, every 7th of another org."""
    from core.models import Chunk
    from sinks.registry import DocRecord

    rows = _corpus()
    vectors = embedder.embed_documents([f"{r['title']}\n{r['text']}" for r in rows])
    out = []
    for i, (row, vec) in enumerate(zip(rows, vectors, strict=True)):
        org = "other" if i % 7 == 0 else "sci"
        status = DocStatus.PENDING_REVIEW.value if i % 4 == 0 else DocStatus.APPROVED.value
        doc = DocRecord(
            id=f"doc{row['_id']}",
            org_id=org,
            collection_path="scifact",
            source_key=row["_id"],
            title=row["title"],
            uri=f"scifact#{row['_id']}",
            content_hash="h",
            version=1,
            status=status,
            source_tag=None,
            synthesis_run_id=None,
            audience=None,
            effective_date=None,
            parse_status="ingested",
            chunk_count=1,
            created_at=None,
            updated_at=None,  # type: ignore[arg-type]
        )
        chunk = Chunk(f"{doc.id}:0", doc.id, 0, row["text"], (row["title"],))
        out.append(chunk_to_point(chunk, vec, doc, model_id=embedder.model_id))
    return out


QUERIES = [
    "vitamin D deficiency and bone density",
    "gene expression in cancer cells",
    "antibiotic resistance in bacteria",
    "effect of exercise on cardiovascular health",
    "stem cell differentiation",
    "immune response to viral infection",
]


def test_edge_and_qdrant_client_return_the_same_documents(
    points: list[Any], edge_store: Any, embedder: Any
) -> None:
    memory = QdrantServerStore.connect(":memory:", collection="congruence")
    try:
        edge_store.upsert(points)
        memory.upsert(points)
        gate = build_gate(Scope(org_id="sci"))
        for q in QUERIES:
            dense = embedder.embed_query(q)
            sparse = query_sparse_vector(q)
            for kwargs in (
                {"dense": dense, "sparse": sparse},
                {"dense": dense, "sparse": None},
                {"dense": None, "sparse": sparse},
            ):
                a = edge_store.query(gate, limit=10, prefetch_limit=50, **kwargs)
                b = memory.query(gate, limit=10, prefetch_limit=50, **kwargs)
                assert a, q
                assert [h.payload["doc_id"] for h in a] == [h.payload["doc_id"] for h in b], (
                    q,
                    list(kwargs),
                )
                for ha, hb in zip(a, b, strict=True):
                    assert ha.score == pytest.approx(hb.score, rel=1e-4, abs=1e-6)
                assert all(gate.admits(h.payload) for h in a)
                # Ids and scores only, then the winners' payloads: the same on both stores.
                bare_a = edge_store.query(gate, limit=10, prefetch_limit=50, with_payload=False,
                                          **kwargs)  # fmt: skip
                bare_b = memory.query(gate, limit=10, prefetch_limit=50, with_payload=False,
                                      **kwargs)  # fmt: skip
                assert [h.point_id for h in bare_a] == [h.point_id for h in a]
                assert [h.point_id for h in bare_b] == [h.point_id for h in b]
                assert all(h.payload == {} for h in [*bare_a, *bare_b])
                ids = [h.point_id for h in a]
                assert edge_store.payloads(ids) == {h.point_id: h.payload for h in a}
                assert memory.payloads(ids) == edge_store.payloads(ids)
        assert edge_store.payloads([]) == {} and memory.payloads(["0" * 32]) == {}
    finally:
        memory.close()
