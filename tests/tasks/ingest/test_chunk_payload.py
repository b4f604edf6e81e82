"""The payload of a point ingest builds has the one shape `core.models.ChunkPayload` declares
(issue 43): every key it holds is declared, every required one is there, each value has its
declared type, and the keys come in the documented order. Real ingest (`index_batch`) into a
real Qdrant Edge store under tmp_path; the store's own `DelegatingStore` keeps what ingest
upserted."""

from __future__ import annotations

import dataclasses
import datetime as dt
import types
import typing
from collections.abc import Sequence
from typing import Any

from core.models import (
    Chunk,
    ChunkPayload,
    ChunkPoint,
    DocStatus,
    Location,
    LocationPayload,
    StoredHit,
)
from sinks.registry import SqlRegistry
from sinks.vectors import DelegatingStore, VectorStore
from tasks.text.points import chunk_to_point
from tests.conftest import index_records

ORDER = (
    *("org_id", "collection_path", "doc_id", "chunk_id", "chunk_index", "parse_status", "title"),
    *("uri", "content_hash", "heading_path", "text", "embedding_model", "status", "source_tag"),
    *("synthesis_run_id", "audience", "effective_date", "page", "slide", "sheet", "start_s"),
    "end_s",
)
"""The order `chunk_to_point` writes the keys in (what Qdrant stores, byte for byte)."""

MARKDOWN = {
    "key": "handbook",
    "title": "Handbook",
    "text": "# Leave\n\nStaff get 25 days of paid leave.\n\n## Carry over\n\nFive days carry.",
    "markdown": True,
}
PLAIN = {"key": "note", "title": "Note", "text": "Book trains for trips under four hours."}


class Recording(DelegatingStore):
    """The real store, keeping the points each upsert was given."""

    def __init__(self, inner: VectorStore) -> None:
        self.inner = inner
        self.upserted: list[ChunkPoint] = []

    def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "upsert":
            self.upserted.extend(args[0])
        return super()._run(name, *args, **kwargs)


def _conforms(value: object, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arm) for arm in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_conforms(v, item) for v in value)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, hint) and not (hint is int and isinstance(value, bool))


def _declared() -> tuple[frozenset[str], dict[str, Any]]:
    """ChunkPayload's required keys, and every key's value type. (Read from the hints: with
    ``from __future__ import annotations`` Python 3.11's ``__required_keys__`` misses
    ``NotRequired``.)"""
    hints = typing.get_type_hints(ChunkPayload, include_extras=True)
    optional = {k for k, h in hints.items() if typing.get_origin(h) is typing.NotRequired}
    optional |= LocationPayload.__optional_keys__  # total=False
    value_types = {
        k: typing.get_args(h)[0] if typing.get_origin(h) is typing.NotRequired else h
        for k, h in hints.items()
    }
    return frozenset(hints) - optional, value_types


def _shape_problems(payload: Any) -> list[str]:
    """What about ``payload`` the ChunkPayload does not allow (none: it conforms)."""
    required, value_types = _declared()
    problems = [f"undeclared key {k!r}" for k in payload if k not in value_types]
    problems += [f"lacks {k!r}" for k in sorted(required - set(payload))]
    problems += [
        f"{k!r} is {payload[k]!r}, not {value_types[k]}"
        for k in payload
        if k in value_types and not _conforms(payload[k], value_types[k])
    ]
    return problems


def _in_order(payloads: Sequence[Any]) -> None:
    for payload in payloads:
        assert list(payload) == [k for k in ORDER if k in payload], list(payload)


def test_order_names_every_declared_key_once_and_required_are_the_documented_ones() -> None:
    required, value_types = _declared()
    assert sorted(ORDER) == sorted(value_types) and len(ORDER) == len(set(ORDER))
    assert required == set(ORDER[: ORDER.index("embedding_model")])
    assert LocationPayload.__optional_keys__ == {f.name for f in dataclasses.fields(Location)}


def test_ingested_points_have_the_chunk_payload_shape_as_built_and_as_stored(
    registry: SqlRegistry, edge_store: Any, embedder: Any
) -> None:
    store = Recording(edge_store)
    kw: dict[str, Any] = {"store": store, "registry": registry, "embedder": embedder}
    full = index_records(
        [MARKDOWN],
        collection="policies/hr",
        status=DocStatus.APPROVED,
        audience="staff",
        effective_date=dt.date(2026, 1, 5),
        source_tag="handbook",
        **kw,
    )
    bare = index_records([PLAIN], org="globex", status=None, **kw)

    built = [p.payload for p in store.upserted]
    assert len(built) >= 3 and {p["doc_id"] for p in built} == {*full, *bare}
    for payload in built:
        assert _shape_problems(payload) == [], payload
    _in_order(built)
    first = next(p for p in built if p["doc_id"] == full[0])
    assert first["collection_path"] == ["policies", "policies/hr"] and first["heading_path"]
    assert {"status", "audience", "effective_date", "source_tag"} <= set(first)
    lean = next(p for p in built if p["doc_id"] == bare[0])
    assert not {"status", "audience", "effective_date", "source_tag"} & set(lean)

    stored: list[StoredHit] = [
        hit for doc_id in (*full, *bare) for hit in edge_store.inspect_document_chunks(doc_id)
    ]
    assert sorted(h.payload["chunk_id"] for h in stored) == sorted(p["chunk_id"] for p in built)
    for hit in stored:
        assert _shape_problems(hit.payload) == [], hit.payload
    by_chunk = {p["chunk_id"]: p for p in built}
    assert all(hit.payload == by_chunk[hit.payload["chunk_id"]] for hit in stored)


def test_a_point_with_every_optional_key_has_the_chunk_payload_shape(
    registry: SqlRegistry, edge_store: Any, embedder: Any
) -> None:
    """Every key at once, the ones a plain-text ingest cannot set among them (a research
    draft's run id, a chunk's location), built by `chunk_to_point` as ingest builds them."""
    (doc_id,) = index_records([PLAIN], store=edge_store, registry=registry, embedder=embedder)
    doc = dataclasses.replace(
        registry.documents.get_document(doc_id),
        synthesis_run_id="run-1",
        audience="staff",
        source_tag="agent_synthesis",
        effective_date=dt.date(2026, 1, 5),
    )
    chunk = Chunk(
        chunk_id=f"{doc_id}:9",
        doc_id=doc_id,
        chunk_index=9,
        text="Slide nine, minute one.",
        heading_path=("Deck",),
        location=Location(page=3, slide=9, sheet="Q1", start_s=61.5, end_s=72.0),
    )
    point = chunk_to_point(
        chunk, embedder.embed_documents([chunk.embed_text])[0], doc, model_id=embedder.model_id
    )
    assert _shape_problems(point.payload) == []
    _in_order([point.payload])
    assert set(point.payload) == set(ORDER)

    edge_store.upsert([point])
    (stored,) = [
        h for h in edge_store.inspect_document_chunks(doc_id) if h.point_id == point.point_id
    ]
    assert _shape_problems(stored.payload) == [] and stored.payload == point.payload
