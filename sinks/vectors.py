"""The vector store contract and how to open the configured one.

Every query method takes a :class:`~sinks.gate.Gate`; there is no ungated search. Reviewers read
drafts through :meth:`VectorStore.inspect_document_chunks`, an explicitly named path that search
never uses.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from core.models import ChunkPayload, ChunkPoint, PayloadPatch, SparseVec, StoredHit, chunk_payload
from sinks.gate import GATED_DATETIME_FIELDS, GATED_KEYWORD_FIELDS, Gate

DENSE = "dense"
SPARSE = "bm25"
DENSE_DIM = 384
_POINT_NAMESPACE = uuid.UUID("6f1c7a52-5b8e-4b0e-9a53-2f8d0c1e7b11")


@dataclass(frozen=True)
class PayloadIndex:
    """One payload index every store creates: a keyword or datetime index on ``field``;
    ``tenant`` marks the org key, which Qdrant uses to keep each org's points together."""

    field: str
    kind: Literal["keyword", "datetime"]
    tenant: bool = False


PAYLOAD_INDEXES: tuple[PayloadIndex, ...] = (
    *(PayloadIndex(f, "keyword", tenant=f == "org_id") for f in GATED_KEYWORD_FIELDS),
    *(PayloadIndex(f, "datetime") for f in GATED_DATETIME_FIELDS),
)
"""The payload indexes of the Edge shard and of a Qdrant collection alike: every gated field."""


def point_id_for(chunk_id: str) -> str:
    """Stable point id (UUIDv5) for a chunk id: re-upserting a chunk overwrites it."""
    return str(uuid.uuid5(_POINT_NAMESPACE, chunk_id))


class VectorStore(Protocol):
    """A store of chunk points with named ``dense`` and sparse ``bm25`` vectors."""

    def upsert(self, points: Sequence[ChunkPoint]) -> None:
        """Insert or overwrite points."""
        ...

    def set_vectors(self, points: Sequence[ChunkPoint], payload: PayloadPatch) -> None:
        """Replace both vectors of these points and set ``payload``'s keys on them, leaving
        the rest of their payload as it is (a status changed meanwhile stays changed; the
        points' own ``payload`` is not written). Points that no longer exist are skipped,
        never re-created."""
        ...

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
        """Gated search: hybrid RRF when both vectors are given, else the one leg given.
        ``with_payload=False``: ids and scores only (payloads empty), for fusing legs whose
        few winners' payloads `payloads` then fetches."""
        ...

    def payloads(self, point_ids: Sequence[str]) -> dict[str, ChunkPayload]:
        """The payloads of these points (those that exist), by point id. Ungated: only for
        ids a gated query just returned."""
        ...

    def set_document_payload(self, doc_id: str, payload: PayloadPatch) -> None:
        """Set payload fields (e.g. ``status``) on every chunk of a document."""
        ...

    def delete_stale_chunks(self, doc_id: str, *, keep_content_hash: str) -> None:
        """Remove a document's chunks whose ``content_hash`` is not ``keep_content_hash``."""
        ...

    def delete_document(self, doc_id: str) -> None:
        """Remove every chunk of a document."""
        ...

    def inspect_document_chunks(self, doc_id: str) -> list[StoredHit]:
        """Reviewer path: every chunk of one document, whatever its status. Not for search."""
        ...

    def iter_payloads(self, fields: Sequence[str]) -> Iterator[StoredHit]:
        """Maintenance path (the reconciler): every point with the named payload fields."""
        ...

    def count(self, org_id: str | None = None) -> int:
        """Number of points (of one org, if given)."""
        ...

    def optimize(self) -> None:
        """Build indexes. Slow at scale: a maintenance step, never on the query path."""
        ...

    def close(self) -> None:
        """Flush and release the store."""
        ...


class DelegatingStore:
    """A store that passes every call to another through :meth:`_run` — the one place a
    wrapper adds what it adds (a lock, a retry). Subclasses set ``inner`` and override
    ``_run``."""

    inner: VectorStore

    def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    def upsert(self, points: Sequence[ChunkPoint]) -> None:
        self._run("upsert", points)

    def set_vectors(self, points: Sequence[ChunkPoint], payload: PayloadPatch) -> None:
        self._run("set_vectors", points, payload)

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
        hits: list[StoredHit] = self._run(
            "query", gate, dense=dense, sparse=sparse, limit=limit,
            prefetch_limit=prefetch_limit, rrf_k=rrf_k, with_payload=with_payload,
        )  # fmt: skip
        return hits

    def payloads(self, point_ids: Sequence[str]) -> dict[str, ChunkPayload]:
        found: dict[str, ChunkPayload] = self._run("payloads", point_ids)
        return found

    def set_document_payload(self, doc_id: str, payload: PayloadPatch) -> None:
        self._run("set_document_payload", doc_id, payload)

    def delete_stale_chunks(self, doc_id: str, *, keep_content_hash: str) -> None:
        self._run("delete_stale_chunks", doc_id, keep_content_hash=keep_content_hash)

    def delete_document(self, doc_id: str) -> None:
        self._run("delete_document", doc_id)

    def inspect_document_chunks(self, doc_id: str) -> list[StoredHit]:
        hits: list[StoredHit] = self._run("inspect_document_chunks", doc_id)
        return hits

    def iter_payloads(self, fields: Sequence[str]) -> Iterator[StoredHit]:
        hits: Iterator[StoredHit] = self._run("iter_payloads", fields)
        return hits

    def count(self, org_id: str | None = None) -> int:
        return int(self._run("count", org_id))

    def optimize(self) -> None:
        self._run("optimize")

    def close(self) -> None:
        self._run("close")


def sort_hits(hits: list[StoredHit]) -> list[StoredHit]:
    """Order by score, then id, so tied scores rank the same on every backend."""
    return sorted(hits, key=lambda h: (-h.score, h.point_id))


def stored_point(point_id: Any, vectors: Any, payload: Any) -> ChunkPoint:
    """A point read back from either store (a record's id, named vectors and payload)."""
    named = vectors if isinstance(vectors, dict) else {}
    sparse = named.get(SPARSE)
    return ChunkPoint(
        point_id=str(point_id),
        dense=[float(x) for x in named.get(DENSE) or []],
        sparse=SparseVec(list(sparse.indices), list(sparse.values))
        if sparse is not None
        else SparseVec([], []),
        payload=chunk_payload(payload or {}),
    )
