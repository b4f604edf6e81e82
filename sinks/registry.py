"""The registry: orgs, users, collections, documents and their review state, the audit log.

SQLite (WAL, ``BEGIN IMMEDIATE``, busy timeout) by default, PostgreSQL by URL. Status changes
are compare-and-set: ``UPDATE ... WHERE id=? AND status=?``; a lost race raises
:class:`~core.errors.ReviewConflict` and writes nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, delete, event, func, select, update
from sqlalchemy.orm import Session, aliased, sessionmaker

from core import ids
from core.errors import ConfigError, NotFound, ReviewConflict
from core.models import (
    RETIRABLE_STATUSES,
    SERVABLE_PARSE_STATUSES,
    AuditAction,
    Chunk,
    DocStatus,
    Location,
    ParseStatus,
    Role,
)
from sinks.registry_schema import (
    AuditRow,
    ChunkRow,
    CollectionRow,
    DocumentRow,
    OrgRow,
    UserRow,
    utcnow,
)

log = logging.getLogger(__name__)

_MIGRATIONS = Path(__file__).parent / "migrations"
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
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for key, value in out.items():
            if isinstance(value, dt.date):
                out[key] = value.isoformat()
        return out


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


class SqlRegistry:
    """Registry over a SQLAlchemy engine; migrated to the latest schema on open."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str) -> SqlRegistry:
        """Open (and migrate) the registry at ``url``."""
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url)
        if engine.dialect.name == "sqlite":
            _configure_sqlite(engine)
        registry = cls(engine)
        registry.migrate()
        return registry

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` with Alembic."""
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(_MIGRATIONS))
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)

    def close(self) -> None:
        self.engine.dispose()

    def session(self) -> Session:
        return self._sessions()

    # --- orgs, users, collections -------------------------------------------------------

    def ensure_org(
        self,
        org_id: str,
        name: str | None = None,
        am_user_id: str | None = None,
        *,
        actor: str = SYSTEM_ACTOR,
    ) -> bool:
        """Create the org if missing (its id must follow :func:`core.ids.org_id`); update its
        name or AM when given. Returns True when it was created."""
        ids.org_id(org_id)
        with self.session() as s, s.begin():
            org = s.get(OrgRow, org_id)
            if org is None:
                s.add(OrgRow(id=org_id, name=name or org_id, am_user_id=am_user_id))
                s.flush()
                # Every org has a Default collection (see migration 0006).
                s.add(
                    CollectionRow(
                        org_id=org_id,
                        path="default",
                        name="Default",
                        description="Documents not filed in a more specific collection.",
                    )
                )
                s.add(
                    _admin_audit(
                        actor, AuditAction.ORG_CREATED, org_id, None,
                        {"name": name or org_id, "am_user_id": am_user_id},
                    )
                )  # fmt: skip
                return True
            if name:
                org.name = name
            if am_user_id:
                org.am_user_id = am_user_id
            return False

    def get_org(self, org_id: str) -> OrgRecord:
        with self.session() as s:
            org = s.get(OrgRow, org_id)
            if org is None:
                raise NotFound(
                    f"org {org_id!r} does not exist. Create it with `kbflow orgs create {org_id}`."
                )
            return OrgRecord(org.id, org.name, org.am_user_id)

    def list_orgs(self) -> list[OrgRecord]:
        with self.session() as s:
            rows = s.scalars(select(OrgRow).order_by(OrgRow.id))
            return [OrgRecord(o.id, o.name, o.am_user_id) for o in rows]

    def assign_am(self, org_id: str, user_id: str, *, actor: str = SYSTEM_ACTOR) -> OrgRecord:
        """Make ``user_id`` (an account manager) the org's assigned AM (audited)."""
        user = self.get_user(user_id)
        if user.role is not Role.ACCOUNT_MANAGER:
            raise ConfigError(
                f"user {user_id!r} is a {user.role.value}, not an account_manager; only an "
                "account manager can be assigned to an org."
            )
        with self.session() as s, s.begin():
            org = s.get(OrgRow, org_id)
            if org is None:
                raise NotFound(f"org {org_id!r} does not exist. Create it first.")
            before = org.am_user_id
            org.am_user_id = user_id
            s.add(
                _admin_audit(
                    actor, AuditAction.AM_ASSIGNED, org_id, {"am_user_id": before},
                    {"am_user_id": user_id},
                )
            )  # fmt: skip
        return self.get_org(org_id)

    def ensure_user(
        self,
        user_id: str,
        role: Role,
        *,
        name: str | None = None,
        org_id: str | None = None,
        actor: str = SYSTEM_ACTOR,
    ) -> UserRecord:
        """Create the user, or update its role, name and org (audited; the id must follow
        :func:`core.ids.user_id`)."""
        ids.user_id(user_id)
        with self.session() as s, s.begin():
            if org_id is not None and s.get(OrgRow, org_id) is None:
                raise NotFound(f"org {org_id!r} does not exist. Create it before its users.")
            user = s.get(UserRow, user_id)
            before = None if user is None else {"role": user.role, "org_id": user.org_id}
            if user is None:
                s.add(UserRow(id=user_id, name=name or user_id, role=role.value, org_id=org_id))
            else:
                user.role = role.value
                user.name = name or user.name
                user.org_id = org_id
            s.add(
                _admin_audit(
                    actor, AuditAction.USER_SAVED, org_id, before,
                    {"user_id": user_id, "role": role.value, "org_id": org_id},
                )
            )  # fmt: skip
        return self.get_user(user_id)

    def count_superadmins(self) -> int:
        with self.session() as s:
            return int(
                s.scalar(select(func.count()).where(UserRow.role == Role.SUPERADMIN.value)) or 0
            )

    def record_admin(
        self,
        actor: str,
        action: AuditAction,
        *,
        org_id: str | None,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
    ) -> None:
        """An audit row for an administrative change made elsewhere (an agent's audiences)."""
        with self.session() as s, s.begin():
            s.add(_admin_audit(actor, action, org_id, before, after))

    def record_denied(self, actor: str, attempted: str, *, org_id: str | None, reason: str) -> None:
        """An audit row for an admin action that was refused (who tried what, and why not)."""
        with self.session() as s, s.begin():
            s.add(
                _admin_audit(
                    actor, AuditAction.DENIED, org_id, None,
                    {"attempted": attempted, "reason": reason[:500]},
                )
            )  # fmt: skip

    def get_user(self, user_id: str) -> UserRecord:
        with self.session() as s:
            user = s.get(UserRow, user_id)
            if user is None:
                raise NotFound(
                    f"user {user_id!r} does not exist. Add it with `kbflow users add {user_id} "
                    "--role ...`."
                )
            return UserRecord(user.id, user.name, Role(user.role), user.org_id)

    def list_users(self) -> list[UserRecord]:
        with self.session() as s:
            rows = s.scalars(select(UserRow).order_by(UserRow.id))
            return [UserRecord(u.id, u.name, Role(u.role), u.org_id) for u in rows]

    def ensure_collection(
        self, org_id: str, path: str, description: str | None = None
    ) -> CollectionRow:
        """Create the collection at ``path`` (and its ancestors) if missing; return it."""
        path = normalize_collection_path(path)
        with self.session() as s, s.begin():
            parent_id: int | None = None
            row: CollectionRow | None = None
            for sub in collection_ancestry(path):
                row = s.scalar(
                    select(CollectionRow).where(
                        CollectionRow.org_id == org_id, CollectionRow.path == sub
                    )
                )
                if row is None:
                    row = CollectionRow(
                        org_id=org_id,
                        path=sub,
                        name=sub.rsplit("/", 1)[-1],
                        parent_id=parent_id,
                        description=(description if sub == path else None) or NO_DESCRIPTION,
                    )
                    s.add(row)
                    s.flush()
                parent_id = row.id
            assert row is not None
            return row

    # --- documents ------------------------------------------------------------------------

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
    ) -> DocRecord:
        """Insert a document with ``parse_status=pending`` (not served until marked ingested)."""
        doc_id = uuid.uuid4().hex
        with self.session() as s, s.begin():
            s.add(
                DocumentRow(
                    id=doc_id,
                    org_id=org_id,
                    collection_id=collection_id,
                    source_key=source_key,
                    title=title[:500],
                    uri=uri[:2000],
                    content_hash=content_hash,
                    version=version,
                    status=status.value if status else None,
                    source_tag=source_tag,
                    synthesis_run_id=synthesis_run_id,
                    audience=audience,
                    effective_date=effective_date,
                    parse_status=ParseStatus.PENDING.value,
                    chunk_count=0,
                )
            )
            s.add(
                AuditRow(
                    actor=actor,
                    action=AuditAction.CREATED.value,
                    org_id=org_id,
                    doc_id=doc_id,
                    synthesis_run_id=synthesis_run_id,
                    source_tag=source_tag,
                    before=None,
                    after={"status": status.value if status else None, "version": version},
                )
            )
        return self.get_document(doc_id)

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
                after=_audit_after(new, changes, note),
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
            for start in range(0, len(keys or [None]), 500):
                chunk = stmt
                if keys is not None:
                    chunk = stmt.where(DocumentRow.source_key.in_(keys[start : start + 500]))
                out.extend((_record(row, path), str(by)) for row, path, by in s.execute(chunk))
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
            for start in range(0, len(ids), 500):
                stmt = (
                    select(DocumentRow, CollectionRow.path)
                    .join(CollectionRow, CollectionRow.id == DocumentRow.collection_id)
                    .where(DocumentRow.id.in_(ids[start : start + 500]))
                )
                for row, path in s.execute(stmt):
                    out[row.id] = _record(row, path)
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
                out[row.source_key] = _record(row, path)
        return out

    # --- chunk texts (the keyword fallback's corpus) --------------------------------------

    def put_chunks(self, doc: DocRecord, content_hash: str, chunks: Sequence[Chunk]) -> None:
        """Record a document's chunk texts for one content version (replacing that version's)."""
        with self.session() as s, s.begin():
            s.execute(
                delete(ChunkRow).where(
                    ChunkRow.doc_id == doc.id, ChunkRow.content_hash == content_hash
                )
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
                )
                for c in chunks
            )

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
                doc = records.setdefault(row.id, _record(row, path))
                out.append((doc, _chunk(chunk)))
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
                out[row.doc_id].append(_chunk(row))
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
                cid: (_record(row, path), chash == row.content_hash)
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

    def versions_of(self, org_id: str, source_key: str) -> list[DocRecord]:
        """Every version of one source, oldest first."""
        with self.session() as s:
            stmt = (
                select(DocumentRow, CollectionRow.path)
                .join(CollectionRow, CollectionRow.id == DocumentRow.collection_id)
                .where(DocumentRow.org_id == org_id, DocumentRow.source_key == source_key)
                .order_by(DocumentRow.version)
            )
            return [_record(row, path) for row, path in s.execute(stmt)]

    def list_documents(
        self,
        org_id: str,
        *,
        statuses: Sequence[str] | None = None,
        collection: str | None = None,
        limit: int | None = None,
    ) -> list[DocRecord]:
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
            return [_record(row, path) for row, path in s.execute(stmt)]

    def audit_trail(
        self, org_id: str | None, doc_id: str | None = None, *, last: int | None = None
    ) -> list[AuditRow]:
        """An org's audit rows (of one document, if given), oldest first; ``last`` keeps the
        most recent N. ``org_id=None``: the agency-wide rows (users and roles of no org)."""
        with self.session() as s:
            stmt = select(AuditRow).where(
                AuditRow.org_id == org_id if org_id is not None else AuditRow.org_id.is_(None)
            )
            if doc_id:
                stmt = stmt.where(AuditRow.doc_id == doc_id)
            if last is not None:
                recent = stmt.order_by(AuditRow.id.desc()).limit(last)
                return list(reversed(list(s.scalars(recent))))
            return list(s.scalars(stmt.order_by(AuditRow.id)))


def _admin_audit(
    actor: str,
    action: AuditAction,
    org_id: str | None,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> AuditRow:
    return AuditRow(actor=actor, action=action.value, org_id=org_id, before=before, after=after)


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


def _audit_after(
    new: DocStatus, changes: dict[str, Any] | None, note: str | None
) -> dict[str, Any]:
    after: dict[str, Any] = {"status": new.value}
    for key, value in (changes or {}).items():
        if key.endswith("_at"):
            continue  # the audit row has its own time
        after[key] = value.isoformat() if isinstance(value, dt.date) else value
    if note:
        after["note"] = note
    return after


def _chunk(row: ChunkRow) -> Chunk:
    return Chunk(
        chunk_id=row.chunk_id,
        doc_id=row.doc_id,
        chunk_index=row.chunk_index,
        text=row.text,
        heading_path=tuple(row.heading_path or ()),
        location=Location(**row.location) if row.location else None,
    )


def _record(row: DocumentRow, collection_path: str) -> DocRecord:
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
    )


def _configure_sqlite(engine: Engine) -> None:
    """WAL, a busy timeout and BEGIN IMMEDIATE: one writer at a time, waiting, never failing."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=15000")
        cur.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
