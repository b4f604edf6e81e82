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
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core.settings import Settings
from kbflow.api import admin, admin_jobs, agent, errors
from kbflow.api.auth import Service, ServiceDep
from kbflow.api.limits import BodyLimit, Metrics, TokenBuckets
from kbflow.wiring import search_context


def create_app(settings: Settings) -> FastAPI:
    """The service, opening what it needs when it starts and closing it when it stops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with ExitStack() as stack:
            ctx = stack.enter_context(search_context(settings, degrade=True))
            ctx.embedder.embed_query("warm up")  # load the model now, not on the first request
            app.state.service = Service(
                settings,
                ctx,
                threading.Lock(),
                TokenBuckets(settings.api_rate_per_minute, settings.api_rate_burst),
                metrics,
            )
            yield

    app = FastAPI(
        title="kbflow",
        summary="Approved knowledge for agents: gated search, cited answers, and their review.",
        lifespan=lifespan,
    )
    metrics = Metrics()
    errors.install(app)
    app.add_middleware(
        BodyLimit,
        max_bytes=int(settings.api_max_body_mb * 1024 * 1024),
        uploads=admin_jobs.UPLOAD_PATHS,
        upload_max_bytes=admin_jobs.upload_body_cap(settings),
    )

    @app.middleware("http")
    async def measure(request: Request, call_next: Any) -> Response:
        started = time.perf_counter()
        response: Response = await call_next(request)
        route = request.scope.get("route")
        template = getattr(route, "path", "unmatched")
        metrics.latency.labels(template, request.method, str(response.status_code)).observe(
            time.perf_counter() - started
        )
        if response.status_code in (401, 403, 413, 429):
            metrics.refused.labels(str(response.status_code)).inc()
        return response

    app.include_router(agent.router)
    app.include_router(admin.router)
    app.include_router(admin_jobs.router)

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

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse)
    def prometheus() -> PlainTextResponse:
        """Prometheus metrics: request latency by route, refusals, degraded searches."""
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
