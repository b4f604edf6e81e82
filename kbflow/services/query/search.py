"""Gated search and the agent's tools, for one call each (`kbflow search`, `kbflow tools`).

A long-lived server keeps one `kbflow.services.query.context.OpenHome` open and calls
`tasks.query.scopes`
and `kbflow.services.query.tools` on it; these functions open one per call. No Prefect here: this
is the query path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from core.errors import KbflowError
from core.models import RetrievalResult, SearchMode
from kbflow.services.query.context import OpenHome
from kbflow.services.query.types import SearchJson
from sinks.registry import AgentRecord, CollectionRecord
from tasks.query.bounds import CheckedQuery, check_query
from tasks.query.scopes import agent_scope, narrow_audiences, person_scope


@dataclass(frozen=True)
class SearchOutcome:
    """What a search found, and for which org (an agent's search names its agent's org)."""

    org: str | None
    result: RetrievalResult

    def to_dict(self, query: str) -> SearchJson:
        """The JSON `kbflow search --json` prints."""
        return cast("SearchJson", {"query": query, "org": self.org} | self.result.to_dict())


def search(
    ctx: OpenHome,
    query: str | CheckedQuery,
    *,
    agent: str | None = None,
    org: str | None = None,
    actor: str | None = None,
    mode: SearchMode = SearchMode.HYBRID,
    top_k: int = 10,
    audiences: Sequence[str] = (),
    collections: Sequence[str] = (),
    agent_read: tuple[AgentRecord, Sequence[CollectionRecord]] | None = None,
) -> SearchOutcome:
    """Search as an agent (its collections and audiences) or org-wide as a person (``org`` and
    ``actor``: an engineer or superadmin); exactly one of ``agent`` and ``org``.

    A vector store that cannot be opened degrades to the keyword fallback (marked so); an
    agent whose knowledge base is off finds nothing, with the reason.

    Raises:
        KbflowError: neither or both of ``agent`` and ``org``; Forbidden or NotFound from the
            scope (an unknown agent, a person who may not search org-wide).

    ``agent_read``: the agent's record and readable collections, when the caller (a tool that
    checked its arguments against them) has just read them.

    ``query``: a `CheckedQuery` from the edge that checked it (``search_knowledge_base``), taken
    as it is; or the plain text ``kbflow search`` (and a test, a backup check) passes, checked
    here, once: this function is their edge.
    """
    checked = query if isinstance(query, CheckedQuery) else check_query(query)
    if (agent is None) == (org is None):
        raise KbflowError(
            "say whose search this is: --agent AGENT (scoped to its collections), or "
            "--org ORG --as USER (org-wide, for engineers and admins)"
        )
    if agent is not None:
        scope = agent_scope(ctx.registry, agent, tuple(collections), read=agent_read)
        who = f"agent {agent}"
    else:
        assert org is not None
        scope = person_scope(ctx.registry, actor, org, tuple(collections))
        who = f"user {actor}"
    if scope is None:
        result = RetrievalResult([], mode, reason=f"knowledge base is off for {agent}")
    else:
        scope = narrow_audiences(scope, tuple(audiences), who)
        result = ctx.retrieve(checked, scope, mode=mode, top_k=top_k)
    return SearchOutcome(scope.org_id if scope else org, result)
