"""Chunk texts kept beside their documents (the keyword fallback's corpus and the edit path)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import delete, func, select, tuple_, update

from core.models import (
    SERVABLE_PARSE_STATUSES,
    Chunk,
)
from sinks.registry.base import Repository, in_lists
from sinks.registry.records import (
    DocRecord,
    chunk_of,
    record_of,
)
from sinks.registry.schema import (
    ChunkRow,
    CollectionRow,
    DocumentRow,
)


class ChunksRepository(Repository):
    """Chunk texts kept beside their documents (the keyword fallback's corpus and the edit path)."""

    def put_chunks(
        self,
        doc: DocRecord,
        content_hash: str,
        chunks: Sequence[Chunk],
        *,
        embedding_model: str,
    ) -> None:
        """Record a document's chunk texts for one content version (replacing that version's),
        with the id of the embedding model that made their vectors."""
        self.put_chunks_of([(doc, content_hash, chunks)], embedding_model=embedding_model)

    def put_chunks_of(
        self,
        docs: Sequence[tuple[DocRecord, str, Sequence[Chunk]]],
        *,
        embedding_model: str,
    ) -> None:
        """`put_chunks` for several documents (an ingest batch's), in one transaction."""
        if not docs:
            return
        with self.session() as s, s.begin():
            pairs = [(doc.id, content_hash) for doc, content_hash, _ in docs]
            for some in in_lists(pairs):
                s.execute(
                    delete(ChunkRow).where(tuple_(ChunkRow.doc_id, ChunkRow.content_hash).in_(some))
                )
            s.add_all(
                ChunkRow(
                    chunk_id=c.chunk_id,
                    doc_id=doc.id,
                    org_id=doc.org_id,
                    content_hash=content_hash,
                    chunk_index=c.chunk_index,
                    text=c.text,
                    heading_path=list(c.heading_path),
                    location=c.location.to_payload() if c.location else None,
                    embedding_model=embedding_model,
                )
                for doc, content_hash, chunks in docs
                for c in chunks
            )

    def embedding_model_bounds(self, org_id: str) -> tuple[str | None, str | None]:
        """The smallest and largest embedding model id recorded on ``org_id``'s chunks (NULLs,
        chunks written before ids were recorded, are ignored; (None, None) when there are
        none). Equal bounds mean one model. Two seeks on ``ix_chunks_org_model``, whatever
        the org's size: cheap enough for every query."""
        of_org = ChunkRow.org_id == org_id
        low = select(func.min(ChunkRow.embedding_model)).where(of_org).scalar_subquery()
        high = select(func.max(ChunkRow.embedding_model)).where(of_org).scalar_subquery()
        with self.session() as s:
            row = s.execute(select(low, high)).one()
            return row[0], row[1]

    def embedding_models(self, org_id: str) -> dict[str | None, int]:
        """How many of ``org_id``'s chunks each embedding model id made (None: not recorded).
        Scans the org's chunks: for messages and reports, not for every query."""
        with self.session() as s:
            rows = s.execute(
                select(ChunkRow.embedding_model, func.count())
                .where(ChunkRow.org_id == org_id)
                .group_by(ChunkRow.embedding_model)
            )
            return {model: int(n) for model, n in rows}

    def chunk_orgs(self) -> list[str]:
        """The orgs that have chunks, sorted."""
        with self.session() as s:
            return sorted(s.scalars(select(ChunkRow.org_id).distinct()))

    def set_chunk_embedding_model(self, chunk_ids: Iterable[str], embedding_model: str) -> int:
        """Record ``embedding_model`` on these chunks (those that exist); returns how many."""
        wanted = list(dict.fromkeys(chunk_ids))
        done = 0
        with self.session() as s, s.begin():
            for some in in_lists(wanted):
                result = s.execute(
                    update(ChunkRow)
                    .where(ChunkRow.chunk_id.in_(some))
                    .values(embedding_model=embedding_model)
                )
                done += result.rowcount or 0  # type: ignore[attr-defined]
        return done

    def relabel_org_chunks(self, org_id: str, embedding_model: str) -> int:
        """Record ``embedding_model`` on every chunk of ``org_id`` that says otherwise (or
        nothing); returns how many changed. For `kbflow store reembed`, once every vector of
        the org is that model's: chunks left with another id then have no vectors at all
        (an older content version of an edited document)."""
        with self.session() as s, s.begin():
            result = s.execute(
                update(ChunkRow)
                .where(
                    ChunkRow.org_id == org_id,
                    (ChunkRow.embedding_model.is_(None))
                    | (ChunkRow.embedding_model != embedding_model),
                )
                .values(embedding_model=embedding_model)
            )
            return int(result.rowcount or 0)  # type: ignore[attr-defined]

    def current_chunks(self, org_id: str) -> list[tuple[DocRecord, Chunk]]:
        """Every servable document's chunks for its current content, in document order.

        The caller applies the gate (status, audience, dates, collections) to each document.
        """
        with self.session() as s:
            stmt = (
                select(ChunkRow, DocumentRow, CollectionRow.path)
                .join(DocumentRow, DocumentRow.id == ChunkRow.doc_id)
                .join(CollectionRow, CollectionRow.id == DocumentRow.collection_id)
                .where(
                    ChunkRow.org_id == org_id,
                    ChunkRow.content_hash == DocumentRow.content_hash,
                    DocumentRow.parse_status.in_(SERVABLE_PARSE_STATUSES),
                )
                .order_by(ChunkRow.doc_id, ChunkRow.chunk_index)
            )
            records: dict[str, DocRecord] = {}
            out: list[tuple[DocRecord, Chunk]] = []
            for chunk, row, path in s.execute(stmt):
                doc = records.setdefault(row.id, record_of(row, path))
                out.append((doc, chunk_of(chunk)))
            return out

    def document_chunks(self, doc_ids: Iterable[str]) -> dict[str, list[Chunk]]:
        """The chunks of each document's current content, in document order."""
        wanted = list(dict.fromkeys(doc_ids))
        out: dict[str, list[Chunk]] = {d: [] for d in wanted}
        if not wanted:
            return out
        with self.session() as s:
            stmt = (
                select(ChunkRow)
                .join(DocumentRow, DocumentRow.id == ChunkRow.doc_id)
                .where(
                    ChunkRow.doc_id.in_(wanted), ChunkRow.content_hash == DocumentRow.content_hash
                )
                .order_by(ChunkRow.doc_id, ChunkRow.chunk_index)
            )
            for row in s.scalars(stmt):
                out[row.doc_id].append(chunk_of(row))
        return out

    def chunk_owners(self, chunk_ids: Iterable[str]) -> dict[str, tuple[DocRecord, bool]]:
        """For each known chunk id: its document, and whether the chunk belongs to that
        document's current content (a chunk of an older content version is not current)."""
        wanted = list(dict.fromkeys(chunk_ids))
        if not wanted:
            return {}
        with self.session() as s:
            stmt = (
                select(ChunkRow.chunk_id, ChunkRow.content_hash, DocumentRow, CollectionRow.path)
                .join(DocumentRow, DocumentRow.id == ChunkRow.doc_id)
                .join(CollectionRow, CollectionRow.id == DocumentRow.collection_id)
                .where(ChunkRow.chunk_id.in_(wanted))
            )
            return {
                cid: (record_of(row, path), chash == row.content_hash)
                for cid, chash, row, path in s.execute(stmt)
            }

    def chunk_generation(self, org_id: str) -> tuple[int, str]:
        """Changes whenever an org's chunks or documents change (for caching derived indexes)."""
        with self.session() as s:
            chunks = s.scalar(select(func.count()).where(ChunkRow.org_id == org_id)) or 0
            stamp = s.scalar(
                select(func.max(DocumentRow.updated_at)).where(DocumentRow.org_id == org_id)
            )
            return int(chunks), str(stamp)
