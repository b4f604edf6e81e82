"""What an org's knowledge base holds and who reads it: documents, collections, agents, and the
vector store's maintenance (`kbflow docs`, `kbflow collections`, `kbflow agents`,
`kbflow store`).

Collections are named by id or path as text ("3", "policies/hr"), or by a display name that
one collection of the org has ("Default"); :func:`collection_ref` reads one. Moves and deletes
rewrite vector payloads, so they hold the store while they run.

Every change needs ``actor``: a superadmin or the org's assigned account manager (giving an
agent audiences: a superadmin), checked by `tasks.review.access` before anything is changed or
the store is opened; a refusal is audited and changes nothing, a change is audited as the
actor's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from core import ids
from core.errors import KbflowError
from core.models import AuditAction, DocStatus
from core.settings import Settings
from kbflow.services.catalog.types import AgentShown

if TYPE_CHECKING:
    from sinks.registry import AgentRecord, CollectionRecord, DocRecord


def collection_ref(value: str | None) -> int | str | None:
    """A collection reference as text: digits are an id, anything else a path."""
    return int(value) if value is not None and value.isdigit() else value


def _required_ref(value: str) -> int | str:
    return collection_ref(value) or value


def collection_path(settings: Settings, org: str, value: str) -> str:
    """The collection path a ``--collection`` value names, where a path that does not exist
    yet is welcome (ingest and sources make it, a filter matches nothing): a valid path as it
    is, without opening the registry; else the path of the one collection of ``org`` whose
    display name (or path) it is in any case (``Default``: ``default``). Unknown or ambiguous
    text raises an error naming the org's collection paths."""
    try:
        return ids.collection_path(value)
    except KbflowError:
        pass
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        return registry.catalog.collection_path(org, value)


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
        return registry.documents.list_documents(
            org,
            statuses=[s.value for s in statuses] if statuses else None,
            collection=registry.catalog.collection_path(org, collection) if collection else None,
            limit=limit,
        )


def optimize_store(settings: Settings) -> int:
    """Build the vector indexes (slow at scale: maintenance); returns the number of points."""
    from sinks.connect import open_vector_store

    with open_vector_store(settings) as store:
        store.optimize()
        return store.count()


def create_collection(
    settings: Settings,
    org: str,
    name: str,
    description: str,
    parent: str | None,
    *,
    actor: str | None,
) -> CollectionRecord:
    """A new collection, at the top or under ``parent``; a description is required. ``actor``:
    a superadmin or the org's assigned account manager."""
    from sinks.connect import open_registry
    from tasks.review.access import authorize_org_admin

    name = ids.collection_name(name.strip())  # a bad name is told before anything else
    with open_registry(settings) as registry:
        admin = authorize_org_admin(
            registry, actor, f"create collection {name!r} in org {org!r}", org
        )
        return registry.catalog.create_collection(
            org, name, description, collection_ref(parent), actor=admin
        )


def list_collections(settings: Settings, org: str) -> list[CollectionRecord]:
    """An org's collections, parents before their children."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        return registry.catalog.list_collections(org)


def describe_collection(
    settings: Settings, org: str, ref: str, description: str, *, actor: str | None
) -> CollectionRecord:
    """Set a collection's description (``actor``: a superadmin or the org's assigned AM)."""
    from sinks.connect import open_registry
    from tasks.review.access import authorize_org_admin

    with open_registry(settings) as registry:
        admin = authorize_org_admin(
            registry, actor, f"describe collection {ref!r} of org {org!r}", org
        )
        return registry.catalog.describe_collection(
            org, _required_ref(ref), description, actor=admin
        )


def move_collection(
    settings: Settings, org: str, ref: str, parent: str | None, *, actor: str | None
) -> tuple[CollectionRecord, int]:
    """Move a collection (with what it holds) under ``parent`` (None: the top level); returns
    it and how many documents were re-filed. ``actor``: a superadmin or the org's assigned AM
    (checked before the store is opened)."""
    from sinks.connect import open_registry, open_vector_store
    from tasks.review.access import authorize_org_admin
    from tasks.review.collections import move_collection as move

    with open_registry(settings) as registry:
        admin = authorize_org_admin(registry, actor, f"move collection {ref!r} of org {org!r}", org)
        with open_vector_store(settings) as store:
            return move(
                registry, store, org, _required_ref(ref), collection_ref(parent), actor=admin
            )


def delete_collection(
    settings: Settings,
    org: str,
    ref: str,
    *,
    move_to: str | None,
    delete_contents: bool,
    actor: str | None,
) -> dict[str, int]:
    """Delete a collection and its sub-collections; refused while it holds documents unless
    they are moved (``move_to``) or deleted (``delete_contents``). Returns the counts.
    ``actor``: a superadmin or the org's assigned AM (checked before the store is opened)."""
    from sinks.connect import open_registry, open_vector_store
    from tasks.review.access import authorize_org_admin
    from tasks.review.collections import delete_collection as delete

    with open_registry(settings) as registry:
        admin = authorize_org_admin(
            registry, actor, f"delete collection {ref!r} of org {org!r}", org
        )
        with open_vector_store(settings) as store:
            return delete(
                registry, store, org, _required_ref(ref),
                move_to=collection_ref(move_to), delete_contents=delete_contents, actor=admin,
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
    """A new agent, reading every collection of its org until some are allowed. ``actor``: a
    superadmin or the org's assigned account manager; giving it audiences needs a superadmin."""
    from sinks.connect import open_registry
    from tasks.review.access import authorize_admin, authorize_org_admin

    ids.agent_id(agent_id)  # a bad id is told before anything else
    with open_registry(settings) as registry:
        if audiences:
            admin = authorize_admin(registry, actor, "give agents audiences", org_id=org)
        else:
            admin = authorize_org_admin(
                registry, actor, f"create agent {agent_id!r} in org {org!r}", org
            )
        return registry.catalog.create_agent(
            org, agent_id, name, enabled=enabled, audiences=tuple(audiences), actor=admin
        )


def set_allowed(
    settings: Settings, agent_id: str, refs: Sequence[str], *, allow: bool, actor: str | None
) -> tuple[AgentRecord, list[CollectionRecord]]:
    """Add collections to an agent's allow-list (``allow``) or take them off it; returns the
    agent and the collections now on its list (none: it reads every collection). ``actor``: a
    superadmin or the assigned account manager of the agent's org."""
    from sinks.connect import open_registry
    from tasks.review.access import authorize_agent_admin

    verb = "allow" if allow else "disallow"
    with open_registry(settings) as registry:
        admin, _agent = authorize_agent_admin(
            registry, actor, f"{verb} collections for agent {agent_id!r}", agent_id
        )
        agent = registry.catalog.set_allowed(
            agent_id, [_required_ref(r) for r in refs], allow=allow, actor=admin
        )
        listed = registry.catalog.list_collections(agent.org_id)
    return agent, [c for c in listed if c.id in agent.allowed_collection_ids]


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
        agent = registry.catalog.get_agent(agent_id)
        admin = authorize_admin(registry, actor, "give agents audiences", org_id=agent.org_id)
        before = list(agent.audiences)
        agent = registry.catalog.set_audiences(agent_id, tuple(audiences))
        registry.people.record_admin(
            admin, AuditAction.AGENT_AUDIENCES, org_id=agent.org_id,
            before={"agent": agent_id, "audiences": before},
            after={"agent": agent_id, "audiences": list(agent.audiences)},
        )  # fmt: skip
        return agent


def show_agent(
    settings: Settings, agent_id: str, *, enable: bool | None, actor: str | None = None
) -> AgentShown:
    """An agent and the collections it may read (``readable``); ``enable`` switches its
    knowledge base on or off first, which needs ``actor``: a superadmin or the assigned account
    manager of the agent's org."""
    from sinks.connect import open_registry
    from tasks.review.access import authorize_agent_admin

    with open_registry(settings) as registry:
        if enable is None:
            agent = registry.catalog.get_agent(agent_id)
        else:
            switch = f"switch the knowledge base of agent {agent_id!r} {'on' if enable else 'off'}"
            admin, agent = authorize_agent_admin(registry, actor, switch, agent_id)
            agent = registry.catalog.set_enabled(agent_id, enable, actor=admin)
        readable = registry.catalog.readable_collections(agent)
    return cast("AgentShown", agent.to_dict() | {"readable": [c.to_dict() for c in readable]})
