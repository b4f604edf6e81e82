"""Detached snapshots of registry rows, and the collection-path helpers every layer uses."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core import ids
from core.models import Chunk, DocStatus, Location, Role, SourceRef
from sinks.registry.schema import ChunkRow, DocumentRow

SYSTEM_ACTOR = "system"
# Collections made on the fly (by ingest, say) get this until someone describes them.
NO_DESCRIPTION = "(no description yet: set one with `kbflow collections describe`)"


@dataclass(frozen=True)
class DocRecord:
    """A detached snapshot of one document row."""

    id: str
    org_id: str
    collection_path: str
    source_key: str
    title: str
    uri: str
    content_hash: str
    version: int
    status: str | None
    source_tag: str | None
    synthesis_run_id: str | None
    audience: str | None
    effective_date: dt.date | None
    parse_status: str
    chunk_count: int
    created_at: dt.datetime
    updated_at: dt.datetime
    approved_by: str | None = None
    approved_at: dt.datetime | None = None
    rejected_by: str | None = None
    rejected_at: dt.datetime | None = None
    edited_by: str | None = None
    edited_at: dt.datetime | None = None
    citations: tuple[SourceRef, ...] = ()
    """The sources its text cites, from its Citations footer (never served as chunks)."""
    review_note: str | None = None
    """A note for its reviewer only (an offline draft's banner): kept beside the text, never
    chunked nor served; the inbox shows it on a draft. Not part of `to_dict` (the record's
    JSON shape is a contract)."""

    def gate_record(self) -> dict[str, Any]:
        """The fields the gate checks, shaped like a vector payload."""
        return {
            "org_id": self.org_id,
            "status": self.status,
            "parse_status": self.parse_status,
            "effective_date": self.effective_date,
            "audience": self.audience,
            "source_tag": self.source_tag,
            "collection_path": collection_ancestry(self.collection_path),
        }

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "review_note"}
        for key, value in out.items():
            if isinstance(value, dt.date):
                out[key] = value.isoformat()
        out["citations"] = [c.to_dict() for c in self.citations]
        return out


@dataclass(frozen=True)
class NewDocument:
    """What `create_documents` needs to insert one document version (its id is made there)."""

    org_id: str
    collection_id: int
    source_key: str
    title: str
    uri: str
    content_hash: str
    version: int = 1
    status: DocStatus | None = DocStatus.APPROVED
    source_tag: str | None = None
    synthesis_run_id: str | None = None
    audience: str | None = None
    effective_date: dt.date | None = None
    actor: str = SYSTEM_ACTOR
    citations: Sequence[SourceRef] = ()
    review_note: str | None = None


@dataclass(frozen=True)
class UserRecord:
    id: str
    name: str
    role: Role
    org_id: str | None


@dataclass(frozen=True)
class OrgRecord:
    id: str
    name: str
    am_user_id: str | None


def collection_ancestry(path: str) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b", "a/b/c"]``: a collection and all its ancestors."""
    parts = [p for p in path.split("/") if p]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def normalize_collection_path(path: str) -> str:
    """``' /policies / hr/ '`` -> ``policies/hr``; refuses paths that break the id rule."""
    return ids.collection_path(path)


def chunk_of(row: ChunkRow) -> Chunk:
    return Chunk(
        chunk_id=row.chunk_id,
        doc_id=row.doc_id,
        chunk_index=row.chunk_index,
        text=row.text,
        heading_path=tuple(row.heading_path or ()),
        location=Location(**row.location) if row.location else None,
    )


def record_of(row: DocumentRow, collection_path: str) -> DocRecord:
    return DocRecord(
        id=row.id,
        org_id=row.org_id,
        collection_path=collection_path,
        source_key=row.source_key,
        title=row.title,
        uri=row.uri,
        content_hash=row.content_hash,
        version=row.version,
        status=row.status,
        source_tag=row.source_tag,
        synthesis_run_id=row.synthesis_run_id,
        audience=row.audience,
        effective_date=row.effective_date,
        parse_status=row.parse_status,
        chunk_count=row.chunk_count,
        created_at=row.created_at,
        updated_at=row.updated_at,
        approved_by=row.approved_by,
        approved_at=row.approved_at,
        rejected_by=row.rejected_by,
        rejected_at=row.rejected_at,
        edited_by=row.edited_by,
        edited_at=row.edited_at,
        citations=tuple(SourceRef.from_dict(c) for c in row.citations or ()),
        review_note=row.review_note,
    )
