"""`QdrantServerStore` on qdrant-client's local mode: the payload indexes it creates, and the
local-folder URL (``file:///path``) that lets two processes, one after the other, see one store."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import qdrant_client

from core.models import ChunkPoint, SparseVec
from sinks.qdrant_server import QdrantServerStore, local_path
from tests.sinks.support import EXPECTED, _client_schema


def _edge_schema(info: Any) -> tuple[str, bool]:
    """A Qdrant Edge ``PayloadIndexInfo`` as (kind, is_tenant)."""
    kind = str(info.data_type).rsplit(".", 1)[-1].lower()
    return kind, bool(info.params is not None and info.params.is_tenant)


class _RecordingClient(qdrant_client.QdrantClient):
    """The real qdrant-client (local mode here), noting each payload index it is asked for:
    local mode accepts them but reports none back in ``payload_schema``."""

    made: ClassVar[list[tuple[str, str, tuple[str, bool]]]] = []

    def create_payload_index(self, collection_name: str, field_name: str, *args: Any,
                             **kwargs: Any) -> Any:  # fmt: skip
        schema = kwargs.get("field_schema", args[0] if args else None)
        self.made.append((collection_name, field_name, _client_schema(schema)))
        return super().create_payload_index(collection_name, field_name, *args, **kwargs)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, tuple[str, bool]]]:
    made: ClassVar[list[tuple[str, str, tuple[str, bool]]]] = []
    monkeypatch.setattr(_RecordingClient, "made", made)
    monkeypatch.setattr(qdrant_client, "QdrantClient", _RecordingClient)
    return made


def test_local_mode_gets_the_same_payload_indexes_as_the_edge_store(
    recorded: list[tuple[str, str, tuple[str, bool]]], edge_store: Any, tmp_path: Path
) -> None:
    edge = {
        name: _edge_schema(info) for name, info in edge_store._shard.info().payload_schema.items()
    }
    assert edge == EXPECTED

    memory = QdrantServerStore.connect(":memory:", collection="idx")
    memory.close()
    assert {field: schema for _, field, schema in recorded} == EXPECTED
    assert len(recorded) == len(EXPECTED) and {c for c, _, _ in recorded} == {"idx"}

    recorded.clear()
    folder = QdrantServerStore.connect(f"file://{tmp_path / 'local'}", collection="idx")
    folder.close()
    assert {field: schema for _, field, schema in recorded} == EXPECTED


def test_a_local_folder_url_keeps_points_between_connections(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'qdrant'}"
    point = ChunkPoint(
        point_id="6f1c7a52-5b8e-4b0e-9a53-2f8d0c1e7b11",
        dense=[1.0] + [0.0] * 383,
        sparse=SparseVec([3, 7], [0.5, 1.5]),
        payload={"org_id": "acme", "status": "approved", "doc_id": "d1"},
    )
    first = QdrantServerStore.connect(url, collection="kept")
    first.upsert([point])
    first.close()
    again = QdrantServerStore.connect(url, collection="kept")
    try:
        assert again.count("acme") == 1 and again.count("other") == 0
        [back] = list(again.export_points("acme"))
        assert back.point_id == point.point_id and back.payload == point.payload
        assert back.sparse == point.sparse and back.dense == pytest.approx(point.dense)
        again.delete_org("acme")
        assert again.count() == 0
    finally:
        again.close()


def test_local_path_reads_file_urls_only() -> None:
    assert local_path("file:///tmp/q") == "/tmp/q"
    assert local_path("file:rel/q") == "rel/q"
    assert local_path("http://localhost:6333") is None
    assert local_path(":memory:") is None
