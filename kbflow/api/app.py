"""``kbflow serve``: one long-running process that keeps the embedding model warm and the
registry and vector store open, and answers agents over HTTP.

Who calls is the bearer token's business, never the body's: an agent token fixes the agent,
hence its org, audiences and readable collections (`tasks.query.scopes`). The agent routes are
the same functions and JSON shapes as ``kbflow tools call`` and ``kbflow ask``/``answer``.

The query path imports no Prefect (tests/test_layers.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Request
from pydantic import BaseModel, ConfigDict, Field

from core.errors import Forbidden, Unauthorized
from core.settings import Settings
from kbflow.api import errors
from kbflow.tool_models import ResearchInput, SearchInput
from kbflow.wiring import SearchContext, search_context

MAX_QUESTION_CHARS = 2000


@dataclass(frozen=True)
class Caller:
    """Who a request comes from, as its token says: an agent or a user (exactly one)."""

    token_id: str
    agent_id: str | None
    user_id: str | None


@dataclass
class Service:
    """What the process holds open for every request, and the lock that serialises use of
    the embedded store (one writer, one reader at a time inside this process)."""

    settings: Settings
    ctx: SearchContext
    lock: threading.Lock
    started: float

    @contextmanager
    def use(self) -> Iterator[SearchContext]:
        with self.lock:
            yield self.ctx


class SearchBody(SearchInput):
    """``search_knowledge_base``'s arguments, as strict as the tool's own check: ``true`` or
    ``5.0`` is not a ``top_k``."""

    model_config = ConfigDict(extra="forbid", strict=True)


class AskBody(ResearchInput):
    """``research_knowledge_search``'s arguments, as strict as the tool's own check."""

    model_config = ConfigDict(extra="forbid", strict=True)


class AnswerBody(BaseModel):
    """A question for the agent's knowledge base."""

    model_config = ConfigDict(extra="forbid", strict=True)

    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)


def create_app(settings: Settings) -> FastAPI:
    """The service, opening what it needs when it starts and closing it when it stops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with ExitStack() as stack:
            ctx = stack.enter_context(search_context(settings, degrade=True))
            ctx.embedder.embed_query("warm up")  # load the model now, not on the first request
            app.state.service = Service(settings, ctx, threading.Lock(), time.monotonic())
            yield

    app = FastAPI(
        title="kbflow",
        summary="Approved knowledge for agents: gated search, cited answers, and their tools.",
        lifespan=lifespan,
    )
    errors.install(app)
    _routes(app)
    return app


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def _caller(
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
    service = _service(request)
    record = service.ctx.registry.verify_token(secret.strip())
    return Caller(record.id, record.agent_id, record.user_id)


def _agent(caller: Annotated[Caller, Depends(_caller)]) -> str:
    """The agent a request acts for; a user's token is refused on the agent routes."""
    if caller.agent_id is None:
        raise Forbidden(
            "this route is for agents: call it with an agent's token "
            "(`kbflow tokens create --agent AGENT`)"
        )
    return caller.agent_id


Agent = Annotated[str, Depends(_agent)]
ServiceDep = Annotated[Service, Depends(_service)]


def _routes(app: FastAPI) -> None:
    from kbflow import answers, tools

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    def readyz(service: ServiceDep) -> dict[str, Any]:
        """The registry answers and the vector store is open (else degraded: keyword only)."""
        service.ctx.registry.list_orgs()
        store = "open" if service.ctx.store is not None else "unavailable"
        return {"status": "ready" if store == "open" else "degraded", "vector_store": store}

    @app.get("/v1/agent/collections", tags=["agent"])
    def list_collections(agent: Agent, service: ServiceDep) -> dict[str, Any]:
        """``list_knowledge_collections``: what the agent may read."""
        with service.use() as ctx:
            return tools.call_tool(ctx, "list_knowledge_collections", agent, {})

    @app.post("/v1/agent/search", tags=["agent"])
    def search(body: SearchBody, agent: Agent, service: ServiceDep) -> dict[str, Any]:
        """``search_knowledge_base``: gated hybrid search in the agent's collections."""
        with service.use() as ctx:
            return tools.call_tool(
                ctx, "search_knowledge_base", agent, body.model_dump(exclude_unset=True)
            )

    @app.post("/v1/agent/ask", tags=["agent"])
    def ask(body: AskBody, agent: Agent, service: ServiceDep) -> dict[str, Any]:
        """``research_knowledge_search``: yes / maybe / no with a cited synthesis."""
        with service.use() as ctx:
            return answers.ask(ctx, agent, body.queries)

    @app.post("/v1/agent/answer", tags=["agent"])
    def answer(body: AnswerBody, agent: Agent, service: ServiceDep) -> dict[str, Any]:
        """A cited answer from approved knowledge, or a refusal; recorded in the ledger."""
        with service.use() as ctx:
            return answers.answer_question(ctx, agent, body.question)
