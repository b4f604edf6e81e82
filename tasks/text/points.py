"""Chunk -> stored point: both vectors and the payload the gate filters on."""

from __future__ import annotations

from typing import Final, cast

from core.models import Chunk, ChunkPayload, ChunkPoint, LocationPayload, ParseStatus
from sinks.gate import format_datetime
from sinks.registry import DocRecord, collection_ancestry
from sinks.vectors import point_id_for
from tasks.text.sparse import document_sparse_vector

EMBEDDING_MODEL: Final = "embedding_model"
"""The payload key (and registry column) naming the model that made a point's dense vector."""


def chunk_to_point(
    chunk: Chunk, vector: list[float], doc: DocRecord, *, model_id: str
) -> ChunkPoint:
    """Build the stored point: both vectors, the payload the gate filters on, and the id of
    the embedding model that made ``vector`` (``model_id``: `Embedder.model_id`)."""
    payload: ChunkPayload = {
        "org_id": doc.org_id,
        "collection_path": collection_ancestry(doc.collection_path),
        "doc_id": doc.id,
        "chunk_id": chunk.chunk_id,
        "chunk_index": chunk.chunk_index,
        "parse_status": ParseStatus.INGESTED.value,
        "title": doc.title,
        "uri": doc.uri,
        "content_hash": doc.content_hash,
        "heading_path": list(chunk.heading_path),
        "text": chunk.text,
        EMBEDDING_MODEL: model_id,
    }
    # The keys a document may leave unset, in this order, only when set.
    if doc.status is not None:
        payload["status"] = doc.status
    if doc.source_tag is not None:
        payload["source_tag"] = doc.source_tag
    if doc.synthesis_run_id is not None:
        payload["synthesis_run_id"] = doc.synthesis_run_id
    if doc.audience is not None:
        payload["audience"] = doc.audience
    if doc.effective_date:
        payload["effective_date"] = format_datetime(doc.effective_date)
    if chunk.location is not None:
        payload.update(cast(LocationPayload, chunk.location.to_payload()))
    return ChunkPoint(
        point_id=point_id_for(chunk.chunk_id),
        dense=vector,
        sparse=document_sparse_vector(chunk.embed_text),
        payload=payload,
    )
