"""Congruence: the same gated queries on Qdrant Edge and qdrant-client ``:memory:`` agree."""

from __future__ import annotations

from typing import Any

import pytest

from core.models import Scope
from sinks.gate import build_gate
from sinks.qdrant_server import QdrantServerStore
from tasks.text.sparse import query_sparse_vector
from tests.sinks.support import QUERIES


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
