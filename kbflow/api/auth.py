"""Who is calling, from the bearer token alone, and what the process holds open for them.

An agent token fixes the agent (hence its org, audiences and readable collections); a user
token fixes the person, whose role and org the registry says at each request. Nothing in a
request's body or query names the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Request

from core.errors import Forbidden, Unauthorized
from core.settings import Settings
from kbflow.api.limits import Metrics, TokenBuckets
from kbflow.api.steward import StoreSteward
from kbflow.wiring import SearchContext


@dataclass(frozen=True)
class Caller:
    """Who a request comes from, as its token says: an agent or a user (exactly one)."""

    token_id: str
    agent_id: str | None
    user_id: str | None


@dataclass
class Service:
    """What the process holds open for every request.

    The store, the model and the registry each take care of their own threads (the store
    through its steward's lock, held for one shard call at a time). ``lock`` is for the
    routes that write the answer ledger or decide documents: one of those at a time.
    """

    settings: Settings
    ctx: SearchContext
    lock: threading.Lock
    buckets: TokenBuckets
    metrics: Metrics
    steward: StoreSteward

    @contextmanager
    def use(self) -> Iterator[SearchContext]:
        """The context, for a route that writes (one such route at a time)."""
        with self.lock:
            yield self.ctx

    def count_outcome(self, route: str, result: dict[str, Any]) -> None:
        """Count an answer (answered / refused) or a knowledge search (yes / maybe / no)."""
        outcome = result.get("answer_status") or result.get("status") or "unknown"
        self.metrics.outcomes.labels(route, str(outcome)).inc()

    def read(self) -> SearchContext:
        """The context, for a route that only reads (searches run side by side)."""
        return self.ctx


def service_of(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def caller_of(
    request: Request,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Caller:
    """The caller named by the ``Authorization: Bearer`` token (401 without a valid one)."""
    if not authorization:
        raise Unauthorized(
            "no token: send `Authorization: Bearer <token>` (`kbflow tokens create` makes one)"
        )
    scheme, _, secret = authorization.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized("the Authorization header must be `Bearer <token>`")
    service = service_of(request)
    record = service.ctx.registry.verify_token(secret.strip())
    service.buckets.take(record.id)  # 429 past the token's rate
    return Caller(record.id, record.agent_id, record.user_id)


def agent_of(caller: Annotated[Caller, Depends(caller_of)]) -> str:
    """The agent a request acts for; a user's token is refused on the agent routes."""
    if caller.agent_id is None:
        raise Forbidden(
            "this route is for agents: call it with an agent's token "
            "(`kbflow tokens create --agent AGENT`)"
        )
    return caller.agent_id


def user_of(caller: Annotated[Caller, Depends(caller_of)]) -> str:
    """The person a request acts for; an agent's token is refused on the admin routes."""
    if caller.user_id is None:
        raise Forbidden(
            "this route is for people (account managers, experts, admins): an agent's token "
            "reaches only the agent routes"
        )
    return caller.user_id


AgentId = Annotated[str, Depends(agent_of)]
UserId = Annotated[str, Depends(user_of)]
ServiceDep = Annotated[Service, Depends(service_of)]
