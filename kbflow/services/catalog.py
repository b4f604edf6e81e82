"""What an org's knowledge base holds and who reads it: documents, collections, agents, and the
vector store's maintenance (`kbflow docs`, `kbflow collections`, `kbflow agents`,
`kbflow store`).

Collections are named by id or path as text ("3", "policies/hr"); :func:`collection_ref` reads
one. Moves and deletes rewrite vector payloads, so they hold the store while they run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from core.errors import KbflowError
from core.models import AuditAction, DocStatus
from core.settings import Settings

if TYPE_CHECKING:
    from sinks.registry import AgentRecord, CollectionRecord, DocRecord, SqlRegistry
    from sinks.vectors import VectorStore


def collection_ref(value: str | None) -> int | str | None:
    """A collection reference as text: digits are an id, anything else a path."""
    return int(value) if value is not None and value.isdigit() else value


def _required_ref(value: str) -> int | str:
    return collection_ref(value) or value


@contextmanager
def _catalog_and_store(settings: Settings) -> Iterator[tuple[SqlRegistry, VectorStore]]:
    """The registry and the vector store, for moves and deletes (they rewrite payloads)."""
    from sinks.connect import open_registry, open_vector_store

    with open_registry(settings) as registry, open_vector_store(settings) as store:
        yield registry, store


def list_documents(
    settings: Settings,
    org: str,
    *,
    statuses: Sequence[DocStatus] = (),
    collection: str | None = None,
    limit: int = 200,
) -> list[DocRecord]:
    """An org's documents with their version, review and parse status (every status unless
    ``statuses``; a collection includes those below it)."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        return registry.list_documents(
            org,
            statuses=[s.value for s in statuses] if statuses else None,
            collection=collection,
            limit=limit,
        )


def optimize_store(settings: Settings) -> int:
    """Build the vector indexes (slow at scale: maintenance); returns the number of points."""
    from sinks.connect import open_vector_store

    with open_vector_store(settings) as store:
        store.optimize()
        return store.count()


def create_collection(
    settings: Settings, org: str, name: str, description: str, parent: str | None
) -> CollectionRecord:
    """A new collection, at the top or under ``parent``; a description is required."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        return registry.create_collection(org, name, description, collection_ref(parent))


def list_collections(settings: Settings, org: str) -> list[CollectionRecord]:
    """An org's collections, parents before their children."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        return registry.list_collections(org)


def describe_collection(
    settings: Settings, org: str, ref: str, description: str
) -> CollectionRecord:
    """Set a collection's description."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        return registry.describe_collection(org, _required_ref(ref), description)


def move_collection(
    settings: Settings, org: str, ref: str, parent: str | None
) -> tuple[CollectionRecord, int]:
    """Move a collection (with what it holds) under ``parent`` (None: the top level); returns
    it and how many documents were re-filed."""
    from tasks.review.collections import move_collection as move

    with _catalog_and_store(settings) as (registry, store):
        return move(registry, store, org, _required_ref(ref), collection_ref(parent))


def delete_collection(
    settings: Settings, org: str, ref: str, *, move_to: str | None, delete_contents: bool
) -> dict[str, int]:
    """Delete a collection and its sub-collections; refused while it holds documents unless
    they are moved (``move_to``) or deleted (``delete_contents``). Returns the counts."""
    from tasks.review.collections import delete_collection as delete

    with _catalog_and_store(settings) as (registry, store):
        return delete(
            registry, store, org, _required_ref(ref),
            move_to=collection_ref(move_to), delete_contents=delete_contents,
        )  # fmt: skip


def create_agent(
    settings: Settings,
    org: str,
    agent_id: str,
    *,
    name: str | None,
    enabled: bool,
    audiences: Sequence[str],
    actor: str | None,
) -> AgentRecord:
    """A new agent, reading every collection of its org until some are allowed; giving it
    audiences needs ``actor`` a superadmin."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        if audiences:
            from tasks.review.access import authorize_admin

            authorize_admin(registry, actor, "give agents audiences", org_id=org)
        return registry.create_agent(
            org, agent_id, name, enabled=enabled, audiences=tuple(audiences)
        )


def set_allowed(
    settings: Settings, agent_id: str, refs: Sequence[str], *, allow: bool
) -> AgentRecord:
    """Add collections to an agent's allow-list (``allow``) or take them off it."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        return registry.set_allowed(agent_id, [_required_ref(r) for r in refs], allow=allow)


def set_audiences(
    settings: Settings, agent_id: str, audiences: Sequence[str], *, clear: bool, actor: str | None
) -> AgentRecord:
    """Replace the audiences an agent reads as (``clear``: none); a superadmin's decision,
    audited."""
    if not audiences and not clear:
        raise KbflowError("name the audiences to set, or --clear to remove them all")
    from sinks.connect import open_registry
    from tasks.review.access import authorize_admin

    with open_registry(settings) as registry:
        agent = registry.get_agent(agent_id)
        admin = authorize_admin(registry, actor, "give agents audiences", org_id=agent.org_id)
        before = list(agent.audiences)
        agent = registry.set_audiences(agent_id, tuple(audiences))
        registry.record_admin(
            admin, AuditAction.AGENT_AUDIENCES, org_id=agent.org_id,
            before={"agent": agent_id, "audiences": before},
            after={"agent": agent_id, "audiences": list(agent.audiences)},
        )  # fmt: skip
        return agent


def show_agent(settings: Settings, agent_id: str, *, enable: bool | None) -> dict[str, Any]:
    """An agent and the collections it may read (``readable``); ``enable`` switches its
    knowledge base on or off first."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        agent = registry.get_agent(agent_id)
        if enable is not None:
            agent = registry.set_enabled(agent_id, enable)
        readable = registry.readable_collections(agent)
    return agent.to_dict() | {"readable": [c.to_dict() for c in readable]}
