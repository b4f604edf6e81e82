"""Qdrant through qdrant-client: a Qdrant server by URL (at scale), or qdrant-client's local
mode in-process — ``:memory:`` or a folder as ``file:///path`` (tests, copies, benchmarks).

Same collection layout, the same payload indexes (`sinks.vectors.PAYLOAD_INDEXES`) and the same
gate as the embedded Edge store, so congruence tests can run one query on both and compare.
Local mode accepts payload indexes but ignores them (it filters in Python); they are still
created there, so the code that creates them runs on every path.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from core.errors import StoreError
from core.models import ChunkPayload, ChunkPoint, PayloadPatch, SparseVec, StoredHit, chunk_payload
from sinks.gate import Gate, to_qdrant_filter
from sinks.vectors import (
    DENSE,
    DENSE_DIM,
    PAYLOAD_INDEXES,
    SPARSE,
    PayloadIndex,
    sort_hits,
    stored_point,
)

log = logging.getLogger(__name__)


class QdrantServerStore:
    """Vector store in one Qdrant collection, multitenant by the indexed ``org_id``."""

    def __init__(self, client: Any, collection: str) -> None:
        self._client = client
        self.collection = collection

    @classmethod
    def connect(
        cls, url: str, *, collection: str = "kbflow_chunks", api_key: str | None = None
    ) -> QdrantServerStore:
        """Connect to ``url`` and ensure the collection and its payload indexes.

        ``url`` is a Qdrant server (``http://host:6333``), ``:memory:`` (in-process, gone on
        close) or ``file:///path`` (qdrant-client local mode persisted in that folder; one
        process at a time).
        """
        from qdrant_client import QdrantClient

        local = local_path(url)
        try:
            if url == ":memory:":
                client = QdrantClient(location=":memory:")
            elif local is not None:
                client = QdrantClient(path=local)
            else:
                client = QdrantClient(url=url, api_key=api_key)
            store = cls(client, collection)
            store._ensure_collection()
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(
                f"could not reach Qdrant at {url}: {exc}. Check the URL (KBFLOW_QDRANT_URL), "
                "or unset it to use the embedded store."
            ) from exc
        return store

    def _ensure_collection(self) -> None:
        """Create the collection if it is missing, then every payload index it lacks (a field
        the gate started filtering on after the collection was made)."""
        from qdrant_client import models as qm

        if not self._client.collection_exists(self.collection):
            self._client.create_collection(
                self.collection,
                vectors_config={
                    DENSE: qm.VectorParams(size=DENSE_DIM, distance=qm.Distance.COSINE)
                },
                sparse_vectors_config={SPARSE: qm.SparseVectorParams(modifier=qm.Modifier.IDF)},
            )
        have = set(self._client.get_collection(self.collection).payload_schema or {})
        with warnings.catch_warnings():
            # Local mode warns that indexes have no effect there; the call is still made so
            # the same code runs in tests as against a server.
            warnings.filterwarnings("ignore", message="Payload indexes have no effect")
            for index in PAYLOAD_INDEXES:
                if index.field not in have:
                    self._client.create_payload_index(
                        self.collection, index.field, field_schema=_index_schema(index), wait=True
                    )

    def upsert(self, points: Sequence[ChunkPoint]) -> None:
        from qdrant_client import models as qm

        if not points:
            return
        self._client.upsert(
            self.collection,
            points=[
                qm.PointStruct(id=p.point_id, vector=_named_vectors(p), payload=p.payload)
                for p in points
            ],
            wait=True,
        )

    def query(
        self,
        gate: Gate,
        *,
        dense: list[float] | None,
        sparse: SparseVec | None,
        limit: int,
        prefetch_limit: int = 100,
        rrf_k: int = 60,
        with_payload: bool = True,
    ) -> list[StoredHit]:
        from qdrant_client import models as qm

        flt = to_qdrant_filter(gate)
        legs: list[tuple[Any, str]] = []
        if dense is not None:
            legs.append((list(dense), DENSE))
        if sparse is not None and sparse.indices:
            legs.append((qm.SparseVector(indices=sparse.indices, values=sparse.values), SPARSE))
        if not legs:
            return []
        if len(legs) == 1:
            vector, using = legs[0]
            response = self._client.query_points(
                self.collection,
                query=vector,
                using=using,
                query_filter=flt,
                limit=limit,
                with_payload=with_payload,
            )
        else:
            response = self._client.query_points(
                self.collection,
                prefetch=[
                    qm.Prefetch(query=v, using=u, filter=flt, limit=prefetch_limit) for v, u in legs
                ],
                query=qm.RrfQuery(rrf=qm.Rrf(k=rrf_k)),
                query_filter=flt,
                limit=limit,
                with_payload=with_payload,
            )
        return sort_hits(
            [
                StoredHit(str(p.id), float(p.score), chunk_payload(p.payload or {}))
                for p in response.points
            ]
        )

    def _doc_filter(self, doc_id: str) -> Any:
        from qdrant_client import models as qm

        return qm.Filter(must=[qm.FieldCondition(key="doc_id", match=qm.MatchValue(value=doc_id))])

    def set_document_payload(self, doc_id: str, payload: PayloadPatch) -> None:
        self._client.set_payload(
            self.collection, payload=payload, points=self._doc_filter(doc_id), wait=True
        )

    def delete_stale_chunks(self, doc_id: str, *, keep_content_hash: str) -> None:
        from qdrant_client import models as qm

        stale = qm.Filter(
            must=[qm.FieldCondition(key="doc_id", match=qm.MatchValue(value=doc_id))],
            must_not=[
                qm.FieldCondition(key="content_hash", match=qm.MatchValue(value=keep_content_hash))
            ],
        )
        self._client.delete(self.collection, points_selector=stale, wait=True)

    def delete_document(self, doc_id: str) -> None:
        self._client.delete(self.collection, points_selector=self._doc_filter(doc_id), wait=True)

    def set_vectors(self, points: Sequence[ChunkPoint], payload: PayloadPatch) -> None:
        from qdrant_client import models as qm

        ids = [p.point_id for p in points]
        found = (
            {
                str(r.id)
                for r in self._client.retrieve(
                    self.collection, ids=ids, with_payload=False, with_vectors=False
                )
            }
            if ids
            else set()
        )
        present = [p for p in points if p.point_id in found]
        if not present:
            return
        self._client.update_vectors(
            self.collection,
            points=[qm.PointVectors(id=p.point_id, vector=_named_vectors(p)) for p in present],
            wait=True,
        )
        self._client.set_payload(
            self.collection, payload=payload, points=[p.point_id for p in present], wait=True
        )

    def payloads(self, point_ids: Sequence[str]) -> dict[str, ChunkPayload]:
        if not point_ids:
            return {}
        records = self._client.retrieve(
            self.collection, ids=list(point_ids), with_payload=True, with_vectors=False
        )
        return {str(r.id): chunk_payload(r.payload or {}) for r in records}

    def retrieve_points(self, point_ids: Sequence[str]) -> list[ChunkPoint]:
        """These points (those that exist) with their vectors and payloads. Ungated: for a
        document's own points (a restore copies a withdrawn version's vectors), never search."""
        if not point_ids:
            return []
        records = self._client.retrieve(
            self.collection, ids=list(point_ids), with_payload=True, with_vectors=True
        )
        return [stored_point(r.id, r.vector, r.payload) for r in records]

    def inspect_document_chunks(self, doc_id: str) -> list[StoredHit]:
        out: list[StoredHit] = []
        offset = None
        while True:
            records, offset = self._client.scroll(
                self.collection,
                scroll_filter=self._doc_filter(doc_id),
                limit=256,
                offset=offset,
                with_payload=True,
            )
            out.extend(StoredHit(str(r.id), 0.0, chunk_payload(r.payload or {})) for r in records)
            if offset is None:
                break
        return sorted(out, key=lambda h: h.payload.get("chunk_index", 0))

    def iter_payloads(self, fields: Sequence[str]) -> Iterator[StoredHit]:
        offset = None
        while True:
            records, offset = self._client.scroll(
                self.collection, limit=1000, offset=offset, with_payload=list(fields)
            )
            for r in records:
                yield StoredHit(str(r.id), 0.0, chunk_payload(r.payload or {}))
            if offset is None:
                return

    def export_points(self, org_id: str | None = None, batch: int = 1000) -> Iterator[ChunkPoint]:
        """Every point (of one org, if given) with its vectors and payload, for copying."""
        offset = None
        while True:
            records, offset = self._client.scroll(
                self.collection,
                scroll_filter=_org_filter(org_id),
                limit=batch,
                offset=offset,
                with_payload=True,
                with_vectors=True,
            )
            for r in records:
                yield stored_point(r.id, r.vector, r.payload)
            if offset is None:
                return

    def delete_org(self, org_id: str) -> None:
        """Remove every point of one org (a copy that replaces the org's points)."""
        self._client.delete(self.collection, points_selector=_org_filter(org_id), wait=True)

    def count(self, org_id: str | None = None) -> int:
        flt = _org_filter(org_id)
        return int(self._client.count(self.collection, count_filter=flt, exact=True).count)

    def optimize(self) -> None:
        """A Qdrant server optimizes in the background; nothing to do."""

    def close(self) -> None:
        self._client.close()


def local_path(url: str) -> str | None:
    """The folder of a ``file://`` URL (qdrant-client local mode), else None."""
    if not url.startswith("file:"):
        return None
    path = url.removeprefix("file://") if url.startswith("file://") else url.removeprefix("file:")
    return path or None


def _org_filter(org_id: str | None) -> Any:
    from qdrant_client import models as qm

    if org_id is None:
        return None
    return qm.Filter(must=[qm.FieldCondition(key="org_id", match=qm.MatchValue(value=org_id))])


def _index_schema(index: PayloadIndex) -> Any:
    """The qdrant-client schema of one of `PAYLOAD_INDEXES`."""
    from qdrant_client import models as qm

    if index.tenant:
        return qm.KeywordIndexParams(type=qm.KeywordIndexType.KEYWORD, is_tenant=True)
    if index.kind == "datetime":
        return qm.PayloadSchemaType.DATETIME
    return qm.PayloadSchemaType.KEYWORD


def _named_vectors(point: ChunkPoint) -> dict[str, Any]:
    """A point's dense and sparse vectors, named as the collection declares them."""
    from qdrant_client import models as qm

    sparse = qm.SparseVector(indices=point.sparse.indices, values=point.sparse.values)
    return {DENSE: list(point.dense), SPARSE: sparse}
