"""`kbflow store migrate`: an org's points from the embedded Edge store to a Qdrant (here
qdrant-client local mode in a folder, ``file://``), and back into a fresh Edge home — the same
points, the same search answers, the counts checked."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from core.models import ChunkPoint, DocStatus, Scope, SparseVec, StoredHit
from core.settings import Settings
from kbflow.cli import app
from sinks.gate import build_gate
from sinks.qdrant_edge import QdrantEdgeStore
from sinks.qdrant_server import QdrantServerStore
from sinks.registry import SqlRegistry
from tasks.text.sparse import query_sparse_vector
from tests.conftest import datasets_dir, index_records

runner = CliRunner()
QUERIES = ("vitamin D and bone density", "antibiotic resistance in bacteria", "stem cells")


def _records(n: int, skip: int = 0) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    with gzip.open(datasets_dir("scifact", "corpus.jsonl.gz"), "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i < skip:
                continue
            row = json.loads(line)
            rows.append({"key": row["_id"], "title": row["title"], "text": row["text"]})
            if len(rows) == n:
                break
    return rows


@pytest.fixture
def home_with_points(settings: Settings, embedder: Any) -> dict[str, int]:
    """acme: 30 approved and 10 pending documents; other: 12 approved. Counts by org."""
    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)
    try:
        common = {"store": store, "registry": registry, "embedder": embedder}
        index_records(_records(30), org="acme", **common)
        index_records(_records(10, skip=30), org="acme", status=DocStatus.PENDING_REVIEW, **common)
        index_records(_records(12, skip=40), org="other", **common)
        return {"acme": store.count("acme"), "other": store.count("other")}
    finally:
        store.close()
        registry.close()


def _answers(
    store: Any, embedder: Any, *, dense_only: bool = False
) -> list[list[tuple[str, float, dict[str, Any]]]]:
    """Gated hybrid, dense and keyword answers for acme to every query, payloads included."""
    gate = build_gate(Scope(org_id="acme"))
    out = []
    for q in QUERIES:
        dense, sparse = embedder.embed_query(q), query_sparse_vector(q)
        both = ((dense, sparse), (dense, None), (None, sparse))
        for legs in both[1:2] if dense_only else both:
            hits: list[StoredHit] = store.query(gate, dense=legs[0], sparse=legs[1], limit=8)
            assert hits
            out.append([(h.point_id, round(h.score, 4), h.payload) for h in hits])
    return out


def _migrate(*args: str) -> Any:
    return runner.invoke(app, ["store", "migrate", *args])


def test_an_org_goes_to_a_qdrant_and_back_with_the_same_answers(
    home_with_points: dict[str, int],
    settings: Settings,
    embedder: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"file://{tmp_path / 'qdrant'}"
    with _edge(settings) as edge:
        before = _answers(edge, embedder)

    result = _migrate("--org", "acme", "--to", url, "--batch", "7", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    acme = home_with_points["acme"]
    assert report["copied"] == report["source_count"] == report["destination_count"] == acme
    assert report["matched"] is True and report["problems"] == []
    assert report["source_by_status"] == report["destination_by_status"]
    assert set(report["source_by_status"]) == {"approved", "pending_review"}
    assert report["destination"] == url and "embedded store" in report["source"]

    server = QdrantServerStore.connect(url)
    try:
        assert server.count() == acme and server.count("other") == 0
        # Dense answers depend on the org's points only; keyword (BM25) scores also on the
        # IDF over the whole collection, which holds one org of two so far.
        assert _answers(server, embedder, dense_only=True) == [before[i] for i in (1, 4, 7)]
    finally:
        server.close()
    assert _migrate("--org", "other", "--to", url).exit_code == 0
    server = QdrantServerStore.connect(url)
    try:
        assert server.count("other") == home_with_points["other"]
        assert _answers(server, embedder) == before
    finally:
        server.close()

    # Again: the same ids, so the same count.
    again = _migrate("--org", "acme", "--to", url, "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["destination_count"] == acme

    # Back into a fresh home's embedded store.
    fresh = tmp_path / "fresh-home"
    monkeypatch.setenv("KBFLOW_HOME", str(fresh))
    back = _migrate("--org", "acme", "--from", url, "--json")
    assert back.exit_code == 0, back.output
    assert json.loads(back.stdout)["destination_count"] == acme
    assert _migrate("--org", "other", "--from", url).exit_code == 0
    with _edge(Settings(home=fresh)) as edge:
        assert edge.count("acme") == acme
        assert _answers(edge, embedder) == before
        original = {p.point_id: p for p in _edge_points(edge, "acme")}
    with _edge(settings) as edge:
        # Every point as it was: id, both vectors, payload.
        assert {p.point_id: p for p in _edge_points(edge, "acme")} == original


def test_points_only_the_destination_has_fail_the_check_until_replace(
    home_with_points: dict[str, int], tmp_path: Path
) -> None:
    url = f"file://{tmp_path / 'qdrant'}"
    assert _migrate("--org", "acme", "--to", url).exit_code == 0
    server = QdrantServerStore.connect(url)
    server.upsert(
        [
            ChunkPoint(
                point_id="00000000-0000-4000-8000-000000000001",
                dense=[1.0] + [0.0] * 383,
                sparse=SparseVec([1], [1.0]),
                payload={"org_id": "acme", "status": "approved", "doc_id": "gone"},
            )
        ]
    )
    server.close()
    acme = home_with_points["acme"]

    result = _migrate("--org", "acme", "--to", url, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["matched"] is False and report["destination_count"] == acme + 1
    assert "1 more than the source" in result.stderr and "--replace" in result.stderr
    assert "status approved" in result.stderr

    fixed = _migrate("--org", "acme", "--to", url, "--replace", "--json")
    assert fixed.exit_code == 0, fixed.output
    report = json.loads(fixed.stdout)
    assert report["replaced"] == acme + 1 and report["destination_count"] == acme
    assert report["matched"] is True


@pytest.mark.filterwarnings("ignore:Failed to obtain server version")  # the unreachable URL
def test_bad_requests_fail_clearly_and_lose_nothing(
    home_with_points: dict[str, int], settings: Settings, tmp_path: Path
) -> None:
    url = f"file://{tmp_path / 'qdrant'}"
    cases = [
        (("--org", "acme"), "give --to URL"),
        (("--org", "acme", "--to", url, "--from", url + "/"), "the same store"),
        (("--org", "nobody", "--to", url), "org 'nobody' has no points"),
        (("--org", "acme", "--to", "http://127.0.0.1:9"), "could not reach Qdrant"),
        (("--org", "acme", "--to", url, "--batch", "0"), ""),
    ]
    for args, message in cases:
        result = _migrate(*args)
        assert result.exit_code in (1, 2), (args, result.output)
        assert message in result.output, (args, result.output)
    with _edge(settings) as edge:
        assert edge.count("acme") == home_with_points["acme"]
        assert edge.count("other") == home_with_points["other"]


def _edge(settings: Settings) -> Any:
    from sinks.connect import open_vector_store

    return open_vector_store(settings, share=False)


def _edge_points(store: Any, org: str | None = None) -> list[ChunkPoint]:
    return list(store.export_points(org))
