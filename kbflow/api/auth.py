"""Who is calling, from the bearer token alone, and what the process holds open for them.

An agent token fixes the agent (hence its org, audiences and readable collections); a user
token fixes the person, whose role and org the registry says at each request. Nothing in a
request's body or query names the caller.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from core.errors import Forbidden, NotFound, Unauthorized
from core.settings import Settings
from kbflow.api.limits import DeadlineExceeded, TokenBuckets
from kbflow.api.logs import RequestFacts, current_request, request_facts
from kbflow.api.metrics import Metrics
from kbflow.api.steward import StoreSteward
from kbflow.services.query.context import OpenHome

T = TypeVar("T")


@dataclass(frozen=True)
class Caller:
    """Who a request comes from, as its token says: an agent or a user (exactly one)."""

    token_id: str
    agent_id: str | None
    user_id: str | None


@dataclass
class Service:
    """What the process holds open for every request.

    The store, the model, the registry and the ledger each take care of their own threads (the
    store through its steward's lock, held for one shard call at a time; the ledger for one
    write). So searches, asks and answers run side by side, one org's slow request never queues
    another's, and each runs under the request deadline (`within_deadline`). ``lock`` is for the
    routes that change documents or seeds (decisions, edits, seeding): one of those at a time,
    and never held by a search or an answer.
    """

    settings: Settings
    ctx: OpenHome
    lock: threading.Lock
    buckets: TokenBuckets
    metrics: Metrics
    steward: StoreSteward
    in_flight: int = 0  # agent requests running in worker threads (abandoned ones included)
    _agent_orgs: dict[str, str] = field(default_factory=dict)  # agent id -> its org
    _known_orgs: set[str] = field(default_factory=set)  # orgs seen to exist (metric labels)
    _in_flight_lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def use(self) -> Iterator[OpenHome]:
        """The context, for a route that changes documents or seeds (one such route at a time)."""
        with self.lock:
            yield self.ctx

    async def within_deadline(self, work: Callable[[], T]) -> T:
        """``work()`` in a worker thread, answered within ``api_request_timeout_s``.

        Past the deadline the caller gets `DeadlineExceeded` (503) at once and the thread is left
        to finish on its own: Python cannot stop a thread, and the query bounds
        (`tasks.query.bounds`) keep what one request does short.
        """
        limit = self.settings.api.api_request_timeout_s

        def tracked() -> T:
            with self._in_flight_lock:
                self.in_flight += 1
            try:
                return work()
            finally:
                with self._in_flight_lock:
                    self.in_flight -= 1

        try:
            with anyio.fail_after(limit):
                return await anyio.to_thread.run_sync(tracked, abandon_on_cancel=True)
        except TimeoutError as exc:
            raise DeadlineExceeded(
                f"the request took longer than the server's limit of {limit:g} s "
                "(KBFLOW_API_REQUEST_TIMEOUT_S) — retry later, or ask a shorter question"
            ) from exc

    def count_outcome(
        self, route: str, result: Mapping[str, Any], facts: RequestFacts | None = None
    ) -> None:
        """Count an answer (answered / refused) or a knowledge search (yes / maybe / no), and
        say it on the request's log line (``facts``: the MCP call's; default: the current
        request's)."""
        outcome = str(result.get("answer_status") or result.get("status") or "unknown")
        self.metrics.outcomes.labels(route, outcome).inc()
        if (facts := facts or current_request()) is not None:
            facts.outcome = outcome

    def count_degraded(self, facts: RequestFacts | None = None) -> None:
        """Count a search answered by the keyword fallback, and say so on its log line."""
        self.metrics.degraded.inc()
        if (facts := facts or current_request()) is not None:
            facts.degraded = True

    def org_of(self, agent_id: str | None, user_id: str | None) -> str | None:
        """The org of a token's holder: an agent's (kept: an agent never changes org), a
        person's own (looked up each time; an account manager or a superadmin has none)."""
        registry = self.ctx.registry
        try:
            if agent_id is not None:
                if agent_id not in self._agent_orgs:
                    self._agent_orgs[agent_id] = registry.catalog.get_agent(agent_id).org_id
                return self._agent_orgs[agent_id]
            return registry.people.get_user(user_id).org_id if user_id is not None else None
        except NotFound:  # deleted since its token was checked: nobody's org
            return None

    def org_exists(self, org_id: str) -> bool:
        """Whether ``org_id`` is an org of the registry (remembered once seen: orgs are not
        deleted while the service runs, and a rename keeps the id)."""
        if org_id in self._known_orgs:
            return True
        try:
            self.ctx.registry.people.get_org(org_id)
        except NotFound:
            return False
        self._known_orgs.add(org_id)
        return True

    def read(self) -> OpenHome:
        """The context, for a route that reads or answers (they run side by side)."""
        return self.ctx


def service_of(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


# The OpenAPI security scheme of every route that takes a token: /openapi.json declares it and
# those routes name it, so /docs's "Authorize" button sends the token. Only declared: with
# auto_error=False it refuses nothing, and `caller_of` reads the header and words the 401s.
bearer = HTTPBearer(
    scheme_name="bearerAuth",
    bearerFormat="kbflow token",
    description=(
        "A kbflow token (`kbflow tokens create`): an agent's for /v1/agent, "
        "a person's for /v1/admin."
    ),
    auto_error=False,
)


def caller_of(
    request: Request,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
    _declared: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None,
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
    record = service.ctx.registry.tokens.verify_token(secret.strip())
    _identify(request, service, record.agent_id, record.user_id)
    service.buckets.take(record.id)  # 429 past the token's rate
    return Caller(record.id, record.agent_id, record.user_id)


_ORG_IN_PATH = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # `kbflow.api.deps.OrgId`'s rule


def _identify(
    request: Request, service: Service, agent_id: str | None, user_id: str | None
) -> None:
    """Name the caller, and the org the request is for, on its log line and metrics
    (`kbflow.api.logs.RequestFacts`): an agent's org; for a person, the org an admin path names,
    else their own."""
    facts = request_facts(request.scope)
    if facts is None:
        return
    facts.agent, facts.user = agent_id, user_id
    named = request.path_params.get("org")
    if user_id is not None and isinstance(named, str) and _ORG_IN_PATH.fullmatch(named):
        # Only a real org gets a label: names of orgs that do not exist would fill the
        # label's slots (issue 41 #17) and crowd real orgs out under "other".
        facts.org = named if service.org_exists(named) else None
    else:
        facts.org = service.org_of(agent_id, user_id)


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
