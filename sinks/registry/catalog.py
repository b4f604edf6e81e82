# Over 500 lines: one repository, the collection tree (and how text names a collection) and agents.
"""The registry's catalog: an org's named, described, nested collections and its agents.

Collections form a tree per org (a path like ``policies/hr`` names a collection and its
ancestors). Every org has a ``Default`` collection (path ``default``), which cannot be moved or
deleted. An agent reads the collections on its allow-list and their descendants (an empty list
means every collection of its org), and nothing at all when its knowledge base is switched off.
Vector payloads are not touched here: `tasks.review.collections` keeps them in line after a move.
Every change writes an audit row naming its ``actor`` in the same transaction; who may make it
is checked before (`tasks.review.access.authorize_org_admin`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from core import ids
from core.errors import ConfigError, NotFound
from core.models import AuditAction
from sinks.registry.audit import admin_audit
from sinks.registry.base import Repository
from sinks.registry.records import (
    NO_DESCRIPTION,
    SYSTEM_ACTOR,
    collection_ancestry,
    normalize_collection_path,
)
from sinks.registry.schema import AgentRow, ChunkRow, CollectionRow, DocumentRow, OrgRow

DEFAULT_PATH = "default"
DEFAULT_NAME = "Default"
DEFAULT_DESCRIPTION = "Documents not filed in a more specific collection."


@dataclass(frozen=True)
class CollectionRecord:
    id: int
    org_id: str
    path: str
    name: str
    description: str
    parent_id: int | None

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "name": self.name,
            "path": self.path,
            "description": self.description,
            "parent_id": self.parent_id,
        }


@dataclass(frozen=True)
class AgentRecord:
    id: str
    org_id: str
    name: str
    knowledge_base_enabled: bool
    allowed_collection_ids: tuple[int, ...]
    audiences: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "org_id": self.org_id,
            "name": self.name,
            "knowledge_base_enabled": self.knowledge_base_enabled,
            "allowed_collection_ids": list(self.allowed_collection_ids),
            "audiences": list(self.audiences),
        }


def _collection(row: CollectionRow) -> CollectionRecord:
    return CollectionRecord(
        row.id, row.org_id, row.path, row.name, row.description or "", row.parent_id
    )


def _agent(row: AgentRow) -> AgentRecord:
    return AgentRecord(
        row.id,
        row.org_id,
        row.name,
        bool(row.knowledge_base_enabled),
        tuple(sorted(int(i) for i in row.allowed_collection_ids or ())),
        tuple(row.audiences or ()),
    )


def _audiences(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(ids.audience(v) for v in values))


def _refuse_taken(s: Session, org_id: str, path: str) -> None:
    taken = s.scalar(
        select(CollectionRow).where(CollectionRow.org_id == org_id, CollectionRow.path == path)
    )
    if taken is not None:
        raise ConfigError(f"collection {path!r} already exists in org {org_id!r}")


_Named = TypeVar("_Named", CollectionRow, CollectionRecord)


def named_collection(collections: Sequence[_Named], text: str, where: str) -> _Named | None:
    """The one of ``collections`` whose path, or else display name, is ``text`` in any case
    (``Default`` names ``default``); None when none is. ConfigError naming their paths when
    several have that name (``where``: whose collections they are, for the message)."""
    wanted = text.strip().strip("/").strip().casefold()
    found = [c for c in collections if c.path.casefold() == wanted]  # paths are unique
    found = found or [c for c in collections if c.name.casefold() == wanted]
    if len(found) > 1:
        paths = ", ".join(sorted(c.path for c in found))
        raise ConfigError(
            f"collection {text!r} is ambiguous in {where}: it names {paths} — give the path"
        )
    return found[0] if found else None


SHOWN_PATHS = 30
"""How many of an org's collection paths an unknown-collection error lists."""


def _shown(paths: list[str]) -> str:
    """An org's collection paths for a message: the first `SHOWN_PATHS` of them."""
    shown = ", ".join(paths[:SHOWN_PATHS]) or "none"
    if len(paths) > SHOWN_PATHS:
        shown += f", … ({len(paths) - SHOWN_PATHS} more)"
    return shown


def _unknown(org_id: str, ref: object, paths: list[str]) -> str:
    """The message for a collection reference that names none of the org's collections: the
    valid paths and where to see them all."""
    return (
        f"collection {ref!r} does not exist in org {org_id!r}; its collection paths: "
        f"{_shown(paths)} — `kbflow collections list --org {org_id}` shows them"
    )


class CatalogRepository(Repository):
    """An org's collections (a tree per org, a Default one always) and its agents."""

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

    # --- collections ----------------------------------------------------------------------

    def list_collections(self, org_id: str) -> list[CollectionRecord]:
        with self.session() as s:
            rows = s.scalars(
                select(CollectionRow)
                .where(CollectionRow.org_id == org_id)
                .order_by(CollectionRow.path)
            )
            return [_collection(r) for r in rows]

    def get_collection(self, org_id: str, ref: int | str) -> CollectionRecord:
        """A collection by id or by path."""
        with self.session() as s:
            row = self._find(s, org_id, ref)
            return _collection(row)

    def _find(self, s: Session, org_id: str, ref: int | str) -> CollectionRow:
        """A collection by id (digits) or path; a text that is neither is tried as a
        collection's display name (or path) in any case (`_named`)."""
        if isinstance(ref, int) or str(ref).isdigit():
            row = s.get(CollectionRow, int(ref))
            if row is not None and row.org_id != org_id:
                row = None
        else:
            row = s.scalar(
                select(CollectionRow).where(
                    CollectionRow.org_id == org_id, CollectionRow.path == str(ref).strip("/")
                )
            )
            if row is None:
                row = self._named(s, org_id, str(ref))
        if row is None:
            raise NotFound(_unknown(org_id, ref, self._paths(s, org_id)))
        return row

    def _paths(self, s: Session, org_id: str) -> list[str]:
        return list(
            s.scalars(
                select(CollectionRow.path)
                .where(CollectionRow.org_id == org_id)
                .order_by(CollectionRow.path)
            )
        )

    def _named(self, s: Session, org_id: str, text: str) -> CollectionRow | None:
        rows = s.scalars(select(CollectionRow).where(CollectionRow.org_id == org_id)).all()
        return named_collection(rows, text, f"org {org_id!r}")

    def collection_path(self, org_id: str, ref: str) -> str:
        """The collection path a person's ``--collection`` text names, for commands that take
        a path whether or not it exists yet (ingest makes it, a filter matches nothing).

        A valid path is returned as it is, without reading the registry (as it always was);
        any other text must be the display name or path, in any case, of exactly one of the
        org's collections (``Default`` is ``default``). Unknown or ambiguous text raises an
        error naming the org's collection paths."""
        try:
            return normalize_collection_path(ref)
        except ConfigError as invalid:
            with self.session() as s:
                row = self._named(s, org_id, ref)
                if row is None:
                    raise NotFound(
                        f"collection {ref!r} is no collection of org {org_id!r} (its paths: "
                        f"{_shown(self._paths(s, org_id))}) nor a valid new path: {invalid}"
                    ) from None
                return str(row.path)

    def create_collection(
        self,
        org_id: str,
        name: str,
        description: str,
        parent: int | str | None = None,
        *,
        actor: str = SYSTEM_ACTOR,
    ) -> CollectionRecord:
        """Create a collection; a description is required (agents read it to pick one).
        Audited as ``actor``'s."""
        name = ids.collection_name(name.strip() if isinstance(name, str) else name)
        if not description or not description.strip():
            raise ConfigError(
                f"collection {name!r} needs a description: agents read it to decide where to "
                "search — say what documents it holds"
            )
        with self.session() as s, s.begin():
            if s.get(OrgRow, org_id) is None:
                raise NotFound(f"org {org_id!r} does not exist — create it first")
            parent_row = self._find(s, org_id, parent) if parent is not None else None
            path = f"{parent_row.path}/{name}" if parent_row else name
            _refuse_taken(s, org_id, path)
            row = CollectionRow(
                org_id=org_id,
                path=path,
                name=name,
                description=description.strip(),
                parent_id=parent_row.id if parent_row else None,
            )
            s.add(row)
            s.flush()
            s.add(
                admin_audit(
                    actor, AuditAction.COLLECTION_CREATED, org_id, None,
                    {"collection": row.path, "id": row.id, "description": row.description},
                )
            )  # fmt: skip
            return _collection(row)

    def describe_collection(
        self, org_id: str, ref: int | str, description: str, *, actor: str = SYSTEM_ACTOR
    ) -> CollectionRecord:
        """Set a collection's description (audited as ``actor``'s)."""
        if not description.strip():
            raise ConfigError("the description is empty — say what the collection holds")
        with self.session() as s, s.begin():
            row = self._find(s, org_id, ref)
            before = row.description
            row.description = description.strip()
            s.add(
                admin_audit(
                    actor, AuditAction.COLLECTION_DESCRIBED, org_id,
                    {"collection": row.path, "description": before},
                    {"collection": row.path, "description": row.description},
                )
            )  # fmt: skip
            return _collection(row)

    def collection_subtree(self, org_id: str, ref: int | str) -> list[CollectionRecord]:
        """The collection and all its descendants."""
        root = self.get_collection(org_id, ref)
        return [
            c
            for c in self.list_collections(org_id)
            if c.path == root.path or c.path.startswith(root.path + "/")
        ]

    def documents_in_collections(self, org_id: str, collection_ids: list[int]) -> list[str]:
        """Ids of every document version filed in these collections."""
        if not collection_ids:
            return []
        with self.session() as s:
            return list(
                s.scalars(
                    select(DocumentRow.id).where(
                        DocumentRow.org_id == org_id, DocumentRow.collection_id.in_(collection_ids)
                    )
                )
            )

    def move_collection_rows(
        self,
        org_id: str,
        ref: int | str,
        new_parent: int | str | None,
        *,
        actor: str = SYSTEM_ACTOR,
    ) -> tuple[CollectionRecord, list[str]]:
        """Re-parent a collection (None: to the top level); returns it and the ids of the
        documents whose collection path changed (their vector payloads need the new path).
        A move is audited as ``actor``'s (a move to where it already is changes nothing)."""
        with self.session() as s, s.begin():
            row = self._find(s, org_id, ref)
            if row.path == DEFAULT_PATH:
                raise ConfigError("the Default collection cannot be moved")
            parent = self._find(s, org_id, new_parent) if new_parent is not None else None
            if parent is not None and (
                parent.path == row.path or parent.path.startswith(row.path + "/")
            ):
                raise ConfigError(
                    f"cannot move {row.path!r} under {parent.path!r}: that is inside it"
                )
            old = row.path
            new = f"{parent.path}/{row.name}" if parent else row.name
            if new == old:
                return _collection(row), []
            _refuse_taken(s, org_id, new)
            moved = list(
                s.scalars(
                    select(CollectionRow).where(
                        CollectionRow.org_id == org_id,
                        (CollectionRow.path == old)
                        | (func.substr(CollectionRow.path, 1, len(old) + 1) == old + "/"),
                    )
                )
            )
            for c in moved:
                c.path = new + c.path[len(old) :]
            row.parent_id = parent.id if parent else None
            s.flush()
            ids = [c.id for c in moved]
            docs = list(s.scalars(select(DocumentRow.id).where(DocumentRow.collection_id.in_(ids))))
            s.add(
                admin_audit(
                    actor, AuditAction.COLLECTION_MOVED, org_id, {"collection": old},
                    {"collection": new, "documents": len(docs)},
                )
            )  # fmt: skip
            return _collection(row), docs

    def delete_collection_rows(
        self,
        org_id: str,
        ref: int | str,
        *,
        move_to: int | str | None = None,
        delete_contents: bool = False,
        actor: str = SYSTEM_ACTOR,
    ) -> tuple[list[str], list[str], CollectionRecord | None]:
        """Delete a collection and its sub-collections (audited as ``actor``'s).

        A non-empty collection is refused unless its documents are moved (``move_to``) or
        deleted (``delete_contents``). Returns (moved doc ids, deleted doc ids, target).
        The caller updates or deletes their vectors.
        """
        root = self.get_collection(org_id, ref)
        tree = self.collection_subtree(org_id, ref)
        if root.path == DEFAULT_PATH:
            raise ConfigError("the Default collection cannot be deleted")
        ids = [c.id for c in tree]
        docs = self.documents_in_collections(org_id, ids)
        target = self.get_collection(org_id, move_to) if move_to is not None else None
        if target is not None and target.id in ids:
            raise ConfigError(f"cannot move the contents into {target.path!r}: it is being deleted")
        if docs and target is None and not delete_contents:
            raise ConfigError(
                f"collection {root.path!r} holds {len(docs)} document version(s) — move them "
                "(`--move-to COLLECTION`) or delete them (`--delete-contents`) first"
            )
        with self.session() as s, s.begin():
            if docs and target is not None:
                s.execute(
                    update(DocumentRow)
                    .where(DocumentRow.id.in_(docs))
                    .values(collection_id=target.id)
                )
            elif docs:
                s.execute(delete(ChunkRow).where(ChunkRow.doc_id.in_(docs)))
                s.execute(delete(DocumentRow).where(DocumentRow.id.in_(docs)))
            for agent in s.scalars(select(AgentRow).where(AgentRow.org_id == org_id)):
                kept = [i for i in agent.allowed_collection_ids or () if i not in ids]
                if len(kept) != len(agent.allowed_collection_ids or ()):
                    agent.allowed_collection_ids = kept
                    if not kept:
                        # An empty list means "everything": fail safe and switch it off.
                        agent.knowledge_base_enabled = False
            for c in sorted(tree, key=lambda c: -c.path.count("/")):
                s.execute(delete(CollectionRow).where(CollectionRow.id == c.id))
            s.add(
                admin_audit(
                    actor, AuditAction.COLLECTION_DELETED, org_id,
                    {"collection": root.path, "collections": [c.path for c in tree]},
                    {"documents_moved": len(docs) if target is not None else 0,
                     "documents_deleted": len(docs) if target is None else 0,
                     "moved_to": target.path if target is not None else None},
                )
            )  # fmt: skip
        moved = docs if target is not None else []
        deleted = docs if target is None else []
        return moved, deleted, target

    # --- agents ---------------------------------------------------------------------------

    def create_agent(
        self,
        org_id: str,
        agent_id: str,
        name: str | None = None,
        *,
        enabled: bool = True,
        audiences: tuple[str, ...] = (),
        actor: str = SYSTEM_ACTOR,
    ) -> AgentRecord:
        """Create an agent (audited as ``actor``'s); it reads every collection of its org until
        some are allowed."""
        ids.agent_id(agent_id)
        wanted = _audiences(audiences)
        with self.session() as s, s.begin():
            if s.get(OrgRow, org_id) is None:
                raise NotFound(f"org {org_id!r} does not exist — create it first")
            if s.get(AgentRow, agent_id) is not None:
                raise ConfigError(f"agent {agent_id!r} already exists")
            row = AgentRow(
                id=agent_id,
                org_id=org_id,
                name=name or agent_id,
                knowledge_base_enabled=enabled,
                allowed_collection_ids=[],
                audiences=list(wanted),
            )
            s.add(row)
            s.flush()
            s.add(
                admin_audit(
                    actor, AuditAction.AGENT_CREATED, org_id, None,
                    {"agent": agent_id, "name": row.name, "knowledge_base_enabled": enabled,
                     "audiences": list(wanted)},
                )
            )  # fmt: skip
            return _agent(row)

    def get_agent(self, agent_id: str) -> AgentRecord:
        with self.session() as s:
            row = s.get(AgentRow, agent_id)
            if row is None:
                raise NotFound(
                    f"agent {agent_id!r} does not exist — create it with `kbflow agents create`"
                )
            return _agent(row)

    def set_allowed(
        self, agent_id: str, refs: list[int | str], *, allow: bool, actor: str = SYSTEM_ACTOR
    ) -> AgentRecord:
        """Add (``allow``) or remove collections from the agent's allow-list (a change is
        audited as ``actor``'s)."""
        agent = self.get_agent(agent_id)
        with self.session() as s, s.begin():
            ids = {self._find(s, agent.org_id, r).id for r in refs}
            row = s.get(AgentRow, agent_id)
            assert row is not None
            current = set(int(i) for i in row.allowed_collection_ids or ())
            wanted = current | ids if allow else current - ids
            if current and not wanted:
                raise ConfigError(
                    f"removing the last allowed collection would let agent {agent_id} read "
                    "every collection of its org (an empty list means all) — allow another "
                    "one first, or switch its knowledge base off (`kbflow agents show "
                    f"{agent_id} --disable`)"
                )
            row.allowed_collection_ids = sorted(wanted)
            if wanted != current:
                s.add(
                    admin_audit(
                        actor, AuditAction.AGENT_COLLECTIONS, agent.org_id,
                        {"agent": agent_id, "allowed_collection_ids": sorted(current)},
                        {"agent": agent_id, "allowed_collection_ids": sorted(wanted)},
                    )
                )  # fmt: skip
        return self.get_agent(agent_id)

    def set_audiences(self, agent_id: str, audiences: tuple[str, ...]) -> AgentRecord:
        """Replace the audiences the agent reads as (empty: only documents for everyone)."""
        wanted = _audiences(audiences)
        with self.session() as s, s.begin():
            row = s.get(AgentRow, agent_id)
            if row is None:
                raise NotFound(f"agent {agent_id!r} does not exist")
            row.audiences = list(wanted)
        return self.get_agent(agent_id)

    def set_enabled(
        self, agent_id: str, enabled: bool, *, actor: str = SYSTEM_ACTOR
    ) -> AgentRecord:
        """Switch the agent's knowledge base on or off (a change is audited as ``actor``'s)."""
        with self.session() as s, s.begin():
            row = s.get(AgentRow, agent_id)
            if row is None:
                raise NotFound(f"agent {agent_id!r} does not exist")
            before = bool(row.knowledge_base_enabled)
            row.knowledge_base_enabled = enabled
            if before != enabled:
                s.add(
                    admin_audit(
                        actor, AuditAction.AGENT_SWITCHED, row.org_id,
                        {"agent": agent_id, "knowledge_base_enabled": before},
                        {"agent": agent_id, "knowledge_base_enabled": enabled},
                    )
                )  # fmt: skip
        return self.get_agent(agent_id)

    def readable_collections(self, agent: AgentRecord) -> list[CollectionRecord]:
        """What the agent may read: its allowed collections and their descendants (all of the
        org's when the list is empty; none when its knowledge base is off)."""
        if not agent.knowledge_base_enabled:
            return []
        every = self.list_collections(agent.org_id)
        if not agent.allowed_collection_ids:
            return every
        roots = [c.path for c in every if c.id in agent.allowed_collection_ids]
        return [c for c in every if any(set(collection_ancestry(c.path)) & {r} for r in roots)]
