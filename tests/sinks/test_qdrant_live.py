"""The store contract against a real Qdrant server: the congruence queries of
``test_congruence`` (Edge and the server agree), every maintenance call, the payload indexes the
server reports, and `kbflow store migrate` there and back.

Runs wherever ``KBFLOW_TEST_QDRANT_URL`` names a server (``KBFLOW_TEST_QDRANT_API_KEY`` if it
needs one), e.g. ``docker run -p 6333:6333 qdrant/qdrant`` then
``KBFLOW_TEST_QDRANT_URL=http://localhost:6333 pytest tests/sinks/test_qdrant_live.py``; skipped
otherwise. Each test uses its own collection, deleted after.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.models import Scope
from sinks.gate import build_gate
from sinks.qdrant_server import QdrantServerStore, local_path
from tasks.text.sparse import query_sparse_vector
from tests.sinks.support import EXPECTED, QUERIES, _client_schema

URL = os.environ.get("KBFLOW_TEST_QDRANT_URL")
API_KEY = os.environ.get("KBFLOW_TEST_QDRANT_API_KEY") or None

pytestmark = pytest.mark.skipif(
    not URL,
    reason="set KBFLOW_TEST_QDRANT_URL to a Qdrant server to run the store contract against it",
)


def _collection() -> str:
    return f"kbflow_test_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def live_store() -> Iterator[QdrantServerStore]:
    """A fresh collection on the server, deleted after the test."""
    assert URL
    store = QdrantServerStore.connect(URL, collection=_collection(), api_key=API_KEY)
    try:
        yield store
    finally:
        store._client.delete_collection(store.collection)
        store.close()


def test_the_server_reports_the_edge_stores_payload_indexes(live_store: QdrantServerStore) -> None:
    if URL and local_path(URL) is not None:
        pytest.skip("qdrant-client local mode reports no payload indexes; needs a server")
    schema = live_store._client.get_collection(live_store.collection).payload_schema
    found = {}
    for name, info in schema.items():
        params = info.params
        tenant = bool(getattr(params, "is_tenant", False)) if params is not None else False
        found[name] = (_client_schema(info.data_type)[0], tenant)
    assert found == EXPECTED


def test_edge_and_the_server_return_the_same_documents(
    points: list[Any],
    edge_store: Any,
    live_store: QdrantServerStore,
    embedder: Any,
) -> None:
    edge_store.upsert(points)
    live_store.upsert(points)
    assert live_store.count() == edge_store.count() == len(points)
    assert live_store.count("sci") == edge_store.count("sci")
    gate = build_gate(Scope(org_id="sci"))
    for q in QUERIES:
        dense, sparse = embedder.embed_query(q), query_sparse_vector(q)
        for legs in ((dense, sparse), (dense, None), (None, sparse)):
            a = edge_store.query(gate, dense=legs[0], sparse=legs[1], limit=10, prefetch_limit=50)
            b = live_store.query(gate, dense=legs[0], sparse=legs[1], limit=10, prefetch_limit=50)
            assert a and [h.payload["doc_id"] for h in a] == [h.payload["doc_id"] for h in b], q
            for ha, hb in zip(a, b, strict=True):
                assert ha.score == pytest.approx(hb.score, rel=1e-4, abs=1e-6)
            assert all(gate.admits(h.payload) for h in b)
            ids = [h.point_id for h in b]
            assert live_store.payloads(ids) == edge_store.payloads(ids)


def test_the_maintenance_calls_behave_as_on_edge(
    points: list[Any],
    edge_store: Any,
    live_store: QdrantServerStore,
) -> None:
    some = points[:20]
    doc = some[0].payload["doc_id"]
    for store in (edge_store, live_store):
        store.upsert(some)
        store.set_document_payload(doc, {"status": "rejected"})
        assert [h.payload["status"] for h in store.inspect_document_chunks(doc)] == ["rejected"]
        store.delete_stale_chunks(doc, keep_content_hash="not-h")
        assert store.inspect_document_chunks(doc) == []
        store.delete_document(some[1].payload["doc_id"])
    assert sorted(h.point_id for h in live_store.iter_payloads(["org_id"])) == sorted(
        h.point_id for h in edge_store.iter_payloads(["org_id"])
    )
    exported = {p.point_id: p for p in live_store.export_points("sci")}
    assert exported.keys() == {p.point_id for p in edge_store.export_points("sci")}
    live_store.delete_org("sci")
    assert live_store.count("sci") == 0 and live_store.count() == edge_store.count("other")


def test_store_migrate_to_the_server_and_back(
    points: list[Any],
    edge_store: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from kbflow.cli import app

    assert URL
    edge_store.upsert(points)
    want = edge_store.count("sci")
    edge_store.close()  # the copy opens the embedded store as its owner
    collection = _collection()
    runner = CliRunner()
    key = ["--api-key", API_KEY] if API_KEY else []
    try:
        there = runner.invoke(app, ["store", "migrate", "--org", "sci", "--to", URL,
                                    "--collection", collection, "--json", *key])  # fmt: skip
        assert there.exit_code == 0, there.output
        assert json.loads(there.stdout)["destination_count"] == want
        monkeypatch.setenv("KBFLOW_HOME", str(tmp_path / "fresh"))
        back = runner.invoke(app, ["store", "migrate", "--org", "sci", "--from", URL,
                                   "--collection", collection, "--json", *key])  # fmt: skip
        assert back.exit_code == 0, back.output
        report = json.loads(back.stdout)
        assert report["matched"] and report["destination_count"] == want
    finally:
        server = QdrantServerStore.connect(URL, collection=collection, api_key=API_KEY)
        server._client.delete_collection(collection)
        server.close()
