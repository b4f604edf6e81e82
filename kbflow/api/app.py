"""``kbflow serve``: one long-running process that keeps the embedding model warm and the
registry and vector store open, and answers agents over HTTP.

Who calls is the bearer token's business, never the body's: an agent token fixes the agent,
hence its org, audiences and readable collections (`tasks.query.scopes`). The agent routes are
the same functions and JSON shapes as ``kbflow tools call`` and ``kbflow ask``/``answer``.

The query path imports no Prefect (tests/test_layers.py).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI

from core.settings import Settings
from kbflow.api import admin, agent, errors
from kbflow.api.auth import Service, ServiceDep
from kbflow.wiring import search_context


def create_app(settings: Settings) -> FastAPI:
    """The service, opening what it needs when it starts and closing it when it stops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with ExitStack() as stack:
            ctx = stack.enter_context(search_context(settings, degrade=True))
            ctx.embedder.embed_query("warm up")  # load the model now, not on the first request
            app.state.service = Service(settings, ctx, threading.Lock())
            yield

    app = FastAPI(
        title="kbflow",
        summary="Approved knowledge for agents: gated search, cited answers, and their review.",
        lifespan=lifespan,
    )
    errors.install(app)
    app.include_router(agent.router)
    app.include_router(admin.router)

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

    return app
