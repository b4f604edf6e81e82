"""Who is asking, as a :class:`~core.models.Scope`: an agent (its org, readable collections and
audiences), or a person searching org-wide (engineers and superadmins, reading the audiences
of their role). A request may narrow a scope, never widen it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from core.errors import Forbidden
from core.models import Scope
from sinks.registry import AgentRecord, CollectionRecord, SqlRegistry, named_collection
from tasks.review.access import authorize_org_wide_search, person_audiences


def agent_scope(
    registry: SqlRegistry,
    agent_id: str,
    collections: tuple[str, ...] = (),
    *,
    read: tuple[AgentRecord, Sequence[CollectionRecord]] | None = None,
) -> Scope | None:
    """The scope a search on behalf of this agent gets: its org and readable collections
    (narrowed to ``collections``, which must be readable); None when its knowledge base is off.

    ``read``: the agent's record and readable collections, when the caller has just read them
    from ``registry`` (a tool checking its arguments): they are not read twice.
    """
    agent = read[0] if read is not None else registry.catalog.get_agent(agent_id)
    if not agent.knowledge_base_enabled:
        return None
    readable_records = read[1] if read is not None else registry.catalog.readable_collections(agent)
    readable = [c.path for c in readable_records]
    if collections:
        collections = tuple(_readable_named(c, readable, readable_records) for c in collections)
        outside = [
            c for c in collections if not any(c == r or c.startswith(r + "/") for r in readable)
        ]
        if outside:
            raise Forbidden(
                f"agent {agent_id} may not read {', '.join(outside)}; it may read: "
                f"{', '.join(readable) or 'nothing'}"
            )
        readable = list(collections)
    return Scope(agent.org_id, collections=tuple(readable), audiences=agent.audiences)


def _readable_named(text: str, readable: Sequence[str], records: Sequence[CollectionRecord]) -> str:
    """``text`` as it is when it is (under) a readable path, as it always was; else the path of
    the readable collection whose path or display name it is in any case (``Default``), if
    one is. Only readable collections are looked at: an agent learns no other path."""
    if any(text == r or text.startswith(r + "/") for r in readable):
        return text
    found = named_collection(records, text, "the collections this agent may read")
    return found.path if found is not None else text


def person_scope(
    registry: SqlRegistry, actor_id: str | None, org_id: str, collections: tuple[str, ...] = ()
) -> Scope:
    """The scope of an org-wide search by a person (engineers and superadmins only): every
    collection of the org (or ``collections``: paths, or names as `CatalogRepository.
    collection_path` reads them), the audiences their role reads as."""
    user = authorize_org_wide_search(registry, actor_id, org_id)
    audiences = person_audiences(user)
    # After the check: the error for an unknown name lists the org's collection paths.
    collections = tuple(registry.catalog.collection_path(org_id, c) for c in collections)
    return Scope(
        org_id,
        collections=collections or None,
        audiences=audiences or (),
        all_audiences=audiences is None,
    )


def narrow_audiences(scope: Scope, requested: tuple[str, ...], who: str) -> Scope:
    """``scope`` limited to the ``requested`` audiences, each of which it must already read:
    a request may narrow what a caller sees, never widen it."""
    if not requested:
        return scope
    wanted = tuple(dict.fromkeys(requested))
    beyond = [a for a in wanted if not scope.all_audiences and a not in scope.audiences]
    if beyond:
        mine = ", ".join(scope.audiences) or "none beyond documents for everyone"
        raise Forbidden(
            f"{who} does not read the audience {', '.join(beyond)}: its audiences are {mine}. "
            "--audience only narrows a search; an agent's audiences are set by a superadmin "
            "(`kbflow agents audience`), a person's follow from their role."
        )
    return replace(scope, audiences=wanted, all_audiences=False)
