# Over 500 lines: every compare-and-set commit of a document version, kept beside the others.
"""Documents, their versions and review states: compare-and-set transitions, and the commits
that keep one servable version per source."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, aliased

from core.errors import NotFound, ReviewConflict
from core.models import (
    NEVER_SERVED_SOURCE_TAGS,
    RETIRABLE_STATUSES,
    SERVABLE_PARSE_STATUSES,
    AuditAction,
    DocStatus,
    ParseStatus,
    SourceRef,
)
from sinks.registry.audit import audit_after
from sinks.registry.base import Repository, in_lists
from sinks.registry.records import (
    SYSTEM_ACTOR,
    DocRecord,
    NewDocument,
    normalize_collection_path,
    record_of,
)
from sinks.registry.schema import (
    AuditRow,
    CollectionRow,
    DocumentRow,
    utcnow,
)


class DocumentsRepository(Repository):
    """Documents, their versions and review states."""

    def create_document(
        self,
        *,
        org_id: str,
        collection_id: int,
        source_key: str,
        title: str,
        uri: str,
        content_hash: str,
        version: int = 1,
        status: DocStatus | None = DocStatus.APPROVED,
        source_tag: str | None = None,
        synthesis_run_id: str | None = None,
        audience: str | None = None,
        effective_date: dt.date | None = None,
        actor: str = SYSTEM_ACTOR,
        citations: Sequence[SourceRef] = (),
    ) -> DocRecord:
        """Insert a document with ``parse_status=pending`` (not served until marked ingested).

        ``citations``: the sources its text cites (its Citations footer, which is not chunked).
        """
        new = NewDocument(
            org_id=org_id,
            collection_id=collection_id,
            source_key=source_key,
            title=title,
            uri=uri,
            content_hash=content_hash,
            version=version,
            status=status,
            source_tag=source_tag,
            synthesis_run_id=synthesis_run_id,
            audience=audience,
            effective_date=effective_date,
            actor=actor,
            citations=citations,
        )
        return self.create_documents([new])[0]

    def create_documents(self, docs: Sequence[NewDocument]) -> list[DocRecord]:
        """Insert documents like `create_document`, all in one transaction (an ingest batch's):
        each row and its ``created`` audit row, then one read of what was written.

        Returns:
            The records, in the order of ``docs``.
        """
        if not docs:
            return []
        ids = [uuid.uuid4().hex for _ in docs]
        with self.session() as s, s.begin():
            for doc_id, new in zip(ids, docs, strict=True):
                status = new.status.value if new.status else None
                s.add(
                    DocumentRow(
                        id=doc_id,
                        org_id=new.org_id,
                        collection_id=new.collection_id,
                        source_key=new.source_key,
                        title=new.title[:500],
                        uri=new.uri[:2000],
                        content_hash=new.content_hash,
                        version=new.version,
                        status=status,
                        source_tag=new.source_tag,
                        synthesis_run_id=new.synthesis_run_id,
                        audience=new.audience,
                        effective_date=new.effective_date,
                        parse_status=ParseStatus.PENDING.value,
                        chunk_count=0,
                        citations=citations_column(new.citations),
                        review_note=new.review_note,
                    )
                )
                s.add(
                    AuditRow(
                        actor=new.actor,
                        action=AuditAction.CREATED.value,
                        org_id=new.org_id,
                        doc_id=doc_id,
                        synthesis_run_id=new.synthesis_run_id,
                        source_tag=new.source_tag,
                        before=None,
                        after={"status": status, "version": new.version},
                    )
                )
        found = self.get_documents(ids)
        return [found[doc_id] for doc_id in ids]

    def mark_parsed(self, doc_id: str, *, parse_status: ParseStatus, chunk_count: int) -> None:
        with self.session() as s, s.begin():
            s.execute(
                update(DocumentRow)
                .where(DocumentRow.id == doc_id)
                .values(parse_status=parse_status.value, chunk_count=chunk_count)
            )

    def transition(
        self,
        doc_id: str,
        *,
        expected: DocStatus | None,
        new: DocStatus,
        actor: str,
        action: AuditAction,
        changes: dict[str, Any] | None = None,
        note: str | None = None,
    ) -> DocRecord:
        """Compare-and-set a document's status and write the audit row, in one transaction.

        ``changes`` sets further columns in the same conditional update (review stamps, the
        content fields of an edit); ``note`` is kept in the audit row.

        Raises:
            NotFound: no such document.
            ReviewConflict: the status was no longer ``expected`` (someone else won the race).
        """
        with self.session() as s, s.begin():
            self._compare_and_set(
                s, doc_id, expected=expected, new=new, actor=actor, action=action,
                changes=changes, note=note,
            )  # fmt: skip
        return self.get_document(doc_id)

    def transition_and_retire(
        self,
        doc_id: str,
        *,
        expected: DocStatus | None,
        new: DocStatus,
        actor: str,
        action: AuditAction,
        changes: dict[str, Any] | None = None,
        note: str | None = None,
    ) -> tuple[DocRecord, list[str]]:
        """:meth:`transition` to a servable status, and in the SAME transaction supersede every
        older live version of the document's source: no instant, crash or not, has two servable
        versions of one source. Returns the document and the ids it superseded."""
        with self.session() as s, s.begin():
            row = self._compare_and_set(
                s, doc_id, expected=expected, new=new, actor=actor, action=action,
                changes=changes, note=note,
            )  # fmt: skip
            retired = _supersede_older(s, row, actor=actor)
        return self.get_document(doc_id), retired

    def replace_version(
        self,
        old_id: str,
        new_id: str,
        *,
        expected_old: DocStatus | None,
        actor: str,
        changes: dict[str, Any] | None = None,
        note: str | None = None,
    ) -> tuple[DocRecord, list[str]]:
        """An edit of an approved document, in one transaction: ``old_id`` must still be
        ``expected_old`` (else ReviewConflict and nothing changes); the new version
        ``new_id`` goes pending_review -> approved with ``changes``, and every older live
        version of the source (``old_id`` among them) is superseded. Returns the new version
        and the ids it superseded."""
        with self.session() as s, s.begin():
            old = s.get(DocumentRow, old_id)
            if old is None:
                raise NotFound(f"document {old_id} does not exist.")
            if old.status != (expected_old.value if expected_old else None):
                raise ReviewConflict(
                    f"document {old_id} is no longer {expected_old or 'unset'} (it is "
                    f"{old.status or 'unset'}); another decision was applied first. Reload it "
                    "and decide again."
                )
            row = self._compare_and_set(
                s, new_id, expected=DocStatus.PENDING_REVIEW, new=DocStatus.APPROVED,
                actor=actor, action=AuditAction.EDITED_APPROVED,
                changes=changes, note=note,
            )  # fmt: skip
            retired = _supersede_older(s, row, actor=actor)
        return self.get_document(new_id), retired

    def restore_version(
        self,
        withdrawn_id: str,
        new_id: str,
        *,
        actor: str,
        changes: dict[str, Any] | None = None,
        note: str | None = None,
    ) -> tuple[DocRecord, list[str]]:
        """A withdrawn document back in service as a new version, in one transaction:
        ``withdrawn_id`` must still be withdrawn and no other version of its source above it
        may be approved, status-less or withdrawn (else ReviewConflict and nothing changes:
        another restore or decision came first); the new version ``new_id`` (its copy) goes
        pending_review -> approved with ``changes`` and a ``restored`` audit row naming
        ``withdrawn_id``, and every older live version of the source is superseded. The
        withdrawn version itself is not written. Returns the new version and the ids it
        superseded."""
        with self.session() as s, s.begin():
            old = s.scalars(
                select(DocumentRow).where(DocumentRow.id == withdrawn_id).with_for_update()
            ).first()
            if old is None:
                raise NotFound(f"document {withdrawn_id} does not exist.")
            if old.status != DocStatus.WITHDRAWN.value:
                raise ReviewConflict(
                    f"document {withdrawn_id} is no longer withdrawn (it is "
                    f"{old.status or 'unset'}); another decision was applied first. Reload it "
                    "and decide again."
                )
            newer = s.scalars(
                select(DocumentRow)
                .where(
                    DocumentRow.org_id == old.org_id,
                    DocumentRow.source_key == old.source_key,
                    DocumentRow.version > old.version,
                    DocumentRow.id != new_id,
                    DocumentRow.status.in_(RESTORE_BLOCKERS) | DocumentRow.status.is_(None),
                )
                .order_by(DocumentRow.version.desc())
            ).first()
            if newer is not None:
                raise ReviewConflict(
                    f"document {withdrawn_id} can no longer be restored: version "
                    f"v{newer.version} ({newer.id}) of its source is {newer.status or 'unset'} "
                    "now; another restore or decision was applied first. Reload it and decide "
                    "again."
                )
            row = self._compare_and_set(
                s, new_id, expected=DocStatus.PENDING_REVIEW, new=DocStatus.APPROVED,
                actor=actor, action=AuditAction.RESTORED, changes=changes, note=note,
                extra={"restored_from": withdrawn_id},
            )  # fmt: skip
            retired = _supersede_older(s, row, actor=actor)
        return self.get_document(new_id), retired

    def _compare_and_set(
        self,
        s: Session,
        doc_id: str,
        *,
        expected: DocStatus | None,
        new: DocStatus,
        actor: str,
        action: AuditAction,
        changes: dict[str, Any] | None,
        note: str | None,
        extra: dict[str, Any] | None = None,
    ) -> DocumentRow:
        row = s.get(DocumentRow, doc_id)
        if row is None:
            raise NotFound(f"document {doc_id} does not exist.")
        cond = (
            DocumentRow.status.is_(None)
            if expected is None
            else DocumentRow.status == expected.value
        )
        result = s.execute(
            update(DocumentRow)
            .where(DocumentRow.id == doc_id, cond)
            .values(status=new.value, updated_at=utcnow(), **(changes or {}))
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            s.rollback()
            raise ReviewConflict(
                f"document {doc_id} is no longer {expected.value if expected else 'unset'}; "
                f"another decision was applied first. Reload it and decide again."
            )
        s.add(
            AuditRow(
                actor=actor,
                action=action.value,
                org_id=row.org_id,
                doc_id=doc_id,
                synthesis_run_id=row.synthesis_run_id,
                source_tag=row.source_tag,
                before={"status": expected.value if expected else None},
                after=audit_after(new, changes, note) | (extra or {}),
            )
        )
        s.refresh(row)
        return row

    def publish(
        self, chunk_counts: dict[str, int], *, retire_older: Iterable[str] = (), actor: str
    ) -> list[str]:
        """Make freshly indexed documents servable (``parse_status=ingested`` with their chunk
        counts) and, in the same transaction, supersede the older live versions of the sources
        of ``retire_older`` (a subset of ``chunk_counts``). Returns the superseded ids."""
        if not chunk_counts:
            return []
        retiring = set(retire_older)
        retired: list[str] = []
        with self.session() as s, s.begin():
            for doc_id, count in chunk_counts.items():
                s.execute(
                    update(DocumentRow)
                    .where(DocumentRow.id == doc_id)
                    .values(parse_status=ParseStatus.INGESTED.value, chunk_count=count)
                    .execution_options(synchronize_session=False)
                )
                if doc_id in retiring:
                    row = s.get(DocumentRow, doc_id)
                    if row is not None:
                        s.refresh(row)
                        retired.extend(_supersede_older(s, row, actor=actor))
        return retired

    def shadowed_versions(
        self, org_id: str | None = None, source_keys: Iterable[str] | None = None
    ) -> list[tuple[DocRecord, str]]:
        """Versions that should have been retired: a live (approved, status-less or pending)
        version of a source below a newer version that is servable. Only a crash between the
        two writes of older kbflow releases leaves them. Returns (version, newer servable id)."""
        keys = None if source_keys is None else list(dict.fromkeys(source_keys))
        if keys == []:
            return []
        newer = aliased(DocumentRow)
        with self.session() as s:
            stmt = (
                select(DocumentRow, CollectionRow.path, func.max(newer.id))
                .join(CollectionRow, CollectionRow.id == DocumentRow.collection_id)
                .join(
                    newer,
                    (newer.org_id == DocumentRow.org_id)
                    & (newer.source_key == DocumentRow.source_key)
                    & (newer.version > DocumentRow.version),
                )
                .where(
                    _live(DocumentRow),
                    (newer.status == DocStatus.APPROVED.value) | newer.status.is_(None),
                    newer.parse_status.in_(SERVABLE_PARSE_STATUSES),
                )
                .group_by(DocumentRow.id, CollectionRow.path)
                .order_by(DocumentRow.org_id, DocumentRow.source_key, DocumentRow.version)
            )
            if org_id is not None:
                stmt = stmt.where(DocumentRow.org_id == org_id)
            out: list[tuple[DocRecord, str]] = []
            for some in [None] if keys is None else in_lists(keys):
                chunk = stmt if some is None else stmt.where(DocumentRow.source_key.in_(some))
                out.extend((record_of(row, path), str(by)) for row, path, by in s.execute(chunk))
            return out

    def retire_versions(self, doc_ids: Iterable[str], *, actor: str) -> list[str]:
        """Supersede these versions if each is still live, with an audit row each, in one
        transaction. Returns the ids that were retired (others changed state meanwhile)."""
        wanted = list(dict.fromkeys(doc_ids))
        if not wanted:
            return []
        with self.session() as s, s.begin():
            rows = list(
                s.scalars(
                    select(DocumentRow)
                    .where(DocumentRow.id.in_(wanted), _live(DocumentRow))
                    .with_for_update()
                )
            )
            return [_retire(s, row, actor=actor, by=None) for row in rows]

    def get_document(self, doc_id: str) -> DocRecord:
        found = self.get_documents([doc_id])
        if doc_id not in found:
            raise NotFound(f"document {doc_id} does not exist.")
        return found[doc_id]

    def get_documents(self, doc_ids: Iterable[str]) -> dict[str, DocRecord]:
        ids = list(dict.fromkeys(doc_ids))
        if not ids:
            return {}
        out: dict[str, DocRecord] = {}
        with self.session() as s:
            for some in in_lists(ids):
                stmt = (
                    select(DocumentRow, CollectionRow.path)
                    .join(CollectionRow, CollectionRow.id == DocumentRow.collection_id)
                    .where(DocumentRow.id.in_(some))
                )
                for row, path in s.execute(stmt):
                    out[row.id] = record_of(row, path)
        return out

    def current_documents(self, org_id: str) -> dict[str, DocRecord]:
        """The newest version of each source of an org, keyed by source key."""
        out: dict[str, DocRecord] = {}
        with self.session() as s:
            stmt = (
                select(DocumentRow, CollectionRow.path)
                .join(CollectionRow, CollectionRow.id == DocumentRow.collection_id)
                .where(DocumentRow.org_id == org_id)
                .order_by(DocumentRow.source_key, DocumentRow.version)
            )
            for row, path in s.execute(stmt):
                out[row.source_key] = record_of(row, path)
        return out

    def versions_of(self, org_id: str, source_key: str) -> list[DocRecord]:
        """Every version of one source, oldest first."""
        with self.session() as s:
            stmt = (
                select(DocumentRow, CollectionRow.path)
                .join(CollectionRow, CollectionRow.id == DocumentRow.collection_id)
                .where(DocumentRow.org_id == org_id, DocumentRow.source_key == source_key)
                .order_by(DocumentRow.version)
            )
            return [record_of(row, path) for row, path in s.execute(stmt)]

    def list_documents(
        self,
        org_id: str,
        *,
        statuses: Sequence[str] | None = None,
        collection: str | None = None,
        limit: int | None = None,
        source_keys: Sequence[str] | None = None,
    ) -> list[DocRecord]:
        """An org's documents (every version), by collection path, title and version;
        ``source_keys``: only the versions of those sources (one indexed query per
        `IN_LIST_MAX` of them)."""
        if source_keys is not None:
            keys = list(dict.fromkeys(source_keys))
            found: list[DocRecord] = []
            for part in in_lists(keys):
                with self.session() as s:
                    stmt = (
                        select(DocumentRow, CollectionRow.path)
                        .join(CollectionRow, CollectionRow.id == DocumentRow.collection_id)
                        .where(DocumentRow.org_id == org_id, DocumentRow.source_key.in_(part))
                    )
                    found += [record_of(row, path) for row, path in s.execute(stmt)]
            return sorted(found, key=lambda d: (d.collection_path, d.title, d.version))
        with self.session() as s:
            stmt = (
                select(DocumentRow, CollectionRow.path)
                .join(CollectionRow, CollectionRow.id == DocumentRow.collection_id)
                .where(DocumentRow.org_id == org_id)
                .order_by(CollectionRow.path, DocumentRow.title, DocumentRow.version)
            )
            if statuses:
                stmt = stmt.where(DocumentRow.status.in_(list(statuses)))
            if collection:
                path = normalize_collection_path(collection)
                prefix = path + "/"  # literal, case-sensitive subtree match (no LIKE wildcards)
                stmt = stmt.where(
                    (CollectionRow.path == path)
                    | (func.substr(CollectionRow.path, 1, len(prefix)) == prefix)
                )
            if limit:
                stmt = stmt.limit(limit)
            return [record_of(row, path) for row, path in s.execute(stmt)]

    def library(
        self,
        org_id: str,
        *,
        status: str | None = None,
        collection: str | None = None,
        source_tag: str | None = None,
        title: str | None = None,
        limit: int | None = 50,
        offset: int = 0,
    ) -> tuple[list[DocRecord], int]:
        """The documents an org serves or has withdrawn, one row per source: its newest
        approved, status-less or withdrawn version (a withdrawn version that a restore, or a
        newer decision, left behind is not listed). Seed inputs are never listed. Filters:
        ``status`` ``served`` (approved or status-less) or ``withdrawn``; ``collection``, its
        subtree; ``source_tag`` exactly (``""``: none); ``title``, a case-insensitive part of
        it. Sorted by collection path and title; returns one page and the total."""
        newer = aliased(DocumentRow)
        shown = DocumentRow.status.in_(RESTORE_BLOCKERS) | DocumentRow.status.is_(None)
        stmt = (
            select(DocumentRow, CollectionRow.path)
            .join(CollectionRow, CollectionRow.id == DocumentRow.collection_id)
            .where(
                DocumentRow.org_id == org_id,
                shown,
                DocumentRow.source_tag.not_in(NEVER_SERVED_SOURCE_TAGS)
                | DocumentRow.source_tag.is_(None),
                ~select(newer.id)
                .where(
                    newer.org_id == DocumentRow.org_id,
                    newer.source_key == DocumentRow.source_key,
                    newer.version > DocumentRow.version,
                    newer.status.in_(RESTORE_BLOCKERS) | newer.status.is_(None),
                )
                .exists(),
            )
        )
        if status == "served":
            stmt = stmt.where(
                (DocumentRow.status == DocStatus.APPROVED.value) | DocumentRow.status.is_(None)
            )
        elif status is not None:
            stmt = stmt.where(DocumentRow.status == status)
        if collection:
            path = normalize_collection_path(collection)
            prefix = path + "/"
            stmt = stmt.where(
                (CollectionRow.path == path)
                | (func.substr(CollectionRow.path, 1, len(prefix)) == prefix)
            )
        if source_tag == "":
            stmt = stmt.where(DocumentRow.source_tag.is_(None))
        elif source_tag is not None:
            stmt = stmt.where(DocumentRow.source_tag == source_tag)
        if title and title.strip():
            wanted = " ".join(title.split()).lower()
            stmt = stmt.where(func.lower(DocumentRow.title).contains(wanted, autoescape=True))
        with self.session() as s:
            total = int(s.scalar(select(func.count()).select_from(stmt.subquery())) or 0)
            page = stmt.order_by(CollectionRow.path, DocumentRow.title, DocumentRow.id)
            if limit is not None:
                page = page.limit(limit).offset(max(0, offset))
            return [record_of(row, path) for row, path in s.execute(page)], total

    def source_tags(self, org_id: str) -> list[str | None]:
        """The source tags an org's non-seed documents carry (None: no tag), for a filter."""
        with self.session() as s:
            stmt = (
                select(DocumentRow.source_tag)
                .where(
                    DocumentRow.org_id == org_id,
                    DocumentRow.source_tag.not_in(NEVER_SERVED_SOURCE_TAGS)
                    | DocumentRow.source_tag.is_(None),
                )
                .distinct()
            )
            return sorted(s.scalars(stmt), key=lambda tag: tag or "")

    def review_backlog(self) -> dict[str, tuple[int, dt.datetime]]:
        """Each org's documents waiting for review: how many, and when the oldest was made
        (one grouped query on the org/status index: cheap enough for every metrics scrape)."""
        with self.session() as s:
            stmt = (
                select(DocumentRow.org_id, func.count(), func.min(DocumentRow.created_at))
                .where(DocumentRow.status == DocStatus.PENDING_REVIEW.value)
                .group_by(DocumentRow.org_id)
            )
            return {org: (int(count), oldest) for org, count, oldest in s.execute(stmt)}


RESTORE_BLOCKERS: tuple[str, ...] = (DocStatus.APPROVED.value, DocStatus.WITHDRAWN.value)
"""A version above a withdrawn one in one of these statuses (or status-less) means the
withdrawn one can no longer be restored: a newer version is in service, or was itself withdrawn
(restore that one instead)."""


def citations_column(citations: Sequence[SourceRef]) -> list[dict[str, Any]] | None:
    """What the ``citations`` column holds for ``citations``: their dicts, or NULL for none."""
    return [c.to_dict() for c in citations] or None


def _live(table: Any) -> Any:
    """A version a newer one retires: approved, pending review, or status-less (legacy)."""
    statuses = [st for st in RETIRABLE_STATUSES if st is not None]
    return table.status.in_(statuses) | table.status.is_(None)


def _supersede_older(s: Session, row: DocumentRow, *, actor: str) -> list[str]:
    """Inside ``s``'s transaction: supersede every older live version of ``row``'s source."""
    older = s.scalars(
        select(DocumentRow)
        .where(
            DocumentRow.org_id == row.org_id,
            DocumentRow.source_key == row.source_key,
            DocumentRow.version < row.version,
            _live(DocumentRow),
        )
        .with_for_update()
    )
    return [_retire(s, old, actor=actor, by=row.id) for old in older]


def _retire(s: Session, row: DocumentRow, *, actor: str, by: str | None) -> str:
    before = row.status
    row.status = DocStatus.SUPERSEDED.value
    row.updated_at = utcnow()
    after: dict[str, Any] = {"status": DocStatus.SUPERSEDED.value}
    if by:
        after["superseded_by"] = by
    s.add(
        AuditRow(
            actor=actor,
            action=AuditAction.SUPERSEDED.value,
            org_id=row.org_id,
            doc_id=row.id,
            synthesis_run_id=row.synthesis_run_id,
            source_tag=row.source_tag,
            before={"status": before},
            after=after,
        )
    )
    return row.id
