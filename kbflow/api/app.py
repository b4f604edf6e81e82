"""``kbflow serve``: one long-running process that keeps the embedding model warm and the
registry and vector store open, and answers agents over HTTP.

Who calls is the bearer token's business, never the body's: an agent token fixes the agent,
hence its org, audiences and readable collections (`tasks.query.scopes`). The agent routes are
the same functions and JSON shapes as ``kbflow tools call`` and ``kbflow ask``/``answer``, and
the same tools are served over MCP at ``/mcp`` (`kbflow.api.mcp`).

One router per domain (agent, review, seeds, research, documents, jobs, sources, provenance,
health), each declaring what its routes answer (`kbflow.api.schemas`); what they share is in
`kbflow.api.auth` (the caller, the service) and `kbflow.api.deps` (path ids, audited checks).

The query path imports no Prefect (tests/test_layers.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial

from fastapi import FastAPI
from starlette.types import ASGIApp

from core.errors import StoreError
from core.settings import Settings
from kbflow.api import (
    agent,
    api_docs,
    documents,
    errors,
    gauges,
    health,
    inbox,
    jobs,
    provenance,
    research,
    review,
    seeds,
    sources,
)
from kbflow.api.auth import Service
from kbflow.api.limits import BodyLimit, TokenBuckets
from kbflow.api.logs import drop_query_strings, uvicorn_logging
from kbflow.api.mcp import MCP_PATH, McpEndpoint
from kbflow.api.metrics import Measured, Metrics
from kbflow.api.steward import StoreSteward
from kbflow.api.uploads import UPLOAD_PATHS, upload_body_cap
from kbflow.services.query.context import open_home
from sinks.connect import open_vector_store
from sinks.vectors import VectorStore
from tasks.text.embed import MiniLMEmbedder

log = logging.getLogger(__name__)


def create_app(settings: Settings, *, worker: bool = False) -> FastAPI:
    """The service, opening what it needs when it starts and closing it when it stops.

    ``worker``: one of ``kbflow serve --workers N``'s processes, which reach the embedded store
    through their parent (`serve_workers`) instead of owning it.
    """

    mcp = McpEndpoint()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        drop_query_strings()  # after uvicorn has configured its loggers
        with ExitStack() as stack:
            ctx = stack.enter_context(
                open_home(settings, degrade=True, share=False, own=not worker)
            )
            steward = StoreSteward(settings, ctx, owner=not worker)
            steward.start()
            stack.callback(steward.close)
            metrics.watch_research(
                lambda after: ctx.registry.jobs.finished_jobs("research", after=after)
            )
            health.watch_knowledge(metrics, ctx, settings)  # review backlog, store size
            # each synced source's items and last sync
            metrics.registry.register(
                gauges.Sources(ctx.registry.sources.list_sources, ctx.registry.sources.item_counts)
            )
            threads = settings.api.api_torch_threads or (1 if worker else 0)
            if threads and isinstance(ctx.embedder, MiniLMEmbedder):
                # workers: one core each, so concurrent requests use them all
                ctx.embedder.limit_threads(threads)
            ctx.embedder.embed_query("warm up")  # load the model now, not on the first request
            app.state.service = Service(
                settings,
                ctx,
                threading.Lock(),
                TokenBuckets(settings.api.api_rate_per_minute, settings.api.api_rate_burst),
                metrics,
                steward,
            )
            # MCP requests are served inside this; it stops before the store closes.
            async with mcp.run():
                yield
        _stop_if_work_lingers(app.state.service, settings.api.api_drain_s)

    app = _Observed(
        title="kbflow",
        summary="Approved knowledge for agents: gated search, cited answers, and their review.",
        lifespan=lifespan,
        # /docs and /redoc load nothing from a CDN: `kbflow.api.api_docs` serves them
        docs_url=None,
        redoc_url=None,
    )
    metrics = Metrics()
    app.state.metrics = metrics  # /metrics reads it (`kbflow.api.health`)
    errors.install(app)
    app.add_middleware(
        BodyLimit,
        max_bytes=int(settings.api.api_max_body_mb * 1024 * 1024),
        uploads=UPLOAD_PATHS,
        upload_max_bytes=upload_body_cap(settings),
        read_timeout_s=settings.api.api_read_timeout_s,
    )

    # Outside every other middleware (`_Observed`): each answer gets its X-Request-ID.
    app.measured = partial(
        Measured,
        metrics=metrics,
        mounted=(MCP_PATH,),
        log_requests=settings.api.log_format == "json",
    )
    app.include_router(agent.router)
    app.include_router(review.router)
    # The MCP server, behind the same token checks as the agent routes. A plain route to an
    # ASGI app (Starlette's Route serves one as is; FastAPI's hint names request handlers only),
    # not a mount: a mount would answer /mcp with a redirect to /mcp/.
    app.add_route(MCP_PATH, mcp, include_in_schema=False)  # type: ignore[arg-type]
    for domain in (seeds, research, documents, jobs, sources, provenance, health):
        app.include_router(domain.router)
    app.include_router(inbox.router)  # the review inbox's pages for people (/review)
    api_docs.install(app)  # /docs and /redoc, their files served here (offline)
    return app


class _Observed(FastAPI):
    """FastAPI with `Measured` around all of its middleware, Starlette's error handler included:
    a 500 for an unexpected error gets its request id, its count and its log line like any other
    answer (a middleware added with ``add_middleware`` sits inside that handler, and never sees
    the 500 it sends)."""

    measured: Callable[[ASGIApp], ASGIApp] | None = None

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        return stack if self.measured is None else self.measured(stack)


def _stop_if_work_lingers(service: Service, grace_s: float) -> None:
    """After the drain: a request still running in a worker thread (one past its deadline, left
    to finish) would keep the process alive after uvicorn is done, since Python waits for such
    threads at exit. The store and registry are closed by now; give it ``grace_s``, then end
    the process, so SIGTERM stops the server within its drain timeout whatever is running."""
    if service.in_flight <= 0:
        return
    log.warning(
        "%d request(s) still running after the drain: the process ends in %g s",
        service.in_flight,
        grace_s,
    )

    def end() -> None:
        time.sleep(grace_s)
        if service.in_flight > 0:
            logging.shutdown()
            os._exit(0)

    threading.Thread(target=end, name="kbflow-drain", daemon=True).start()


def worker_app() -> FastAPI:
    """The app of one ``kbflow serve --workers`` process (uvicorn's factory; settings from the
    environment, which the parent set)."""
    return create_app(Settings(), worker=True)


@dataclass
class _Held:
    store: VectorStore | None = None
    store_error: str | None = None


def serve_workers(settings: Settings, host: str, port: int, workers: int) -> None:
    """``kbflow serve --workers N``: this process owns the embedded store and serves it on its
    socket; uvicorn runs N worker processes that answer HTTP, each reaching the store through
    this one (so each has its own model and its own core, and none owns the shard).

    Each worker keeps its own token buckets: a token's rate applies per worker. SIGHUP replaces
    the workers one at a time, each once its replacement answers (`kbflow.api.restart`).
    """
    import uvicorn

    from kbflow.api.restart import listening_socket, supervise

    os.environ["KBFLOW_HOME"] = str(settings.home.resolve())  # the workers' settings
    held = _Held()
    with ExitStack() as stack:
        if not settings.stores.qdrant_url:
            try:
                held.store = stack.enter_context(open_vector_store(settings, share=False))
            except StoreError as exc:  # held by a command: taken over when it lets go
                held.store_error = str(exc)
        steward = StoreSteward(settings, held)
        steward.start()
        stack.callback(steward.close)
        config = uvicorn.Config(
            "kbflow.api.app:worker_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level="info",
            timeout_keep_alive=5,
            timeout_graceful_shutdown=settings.api.api_drain_s,
            **uvicorn_logging(settings.api.log_format),  # json: a JSON line per request
        )
        supervise(config, listening_socket(config))


def serve_one(settings: Settings, host: str, port: int, fd: int | None = None) -> None:
    """``kbflow serve`` in one process, on a socket it binds, or on the listening socket ``fd``
    it was given by the process it replaced.

    SIGHUP restarts it in place (same pid, same socket): it stops accepting, drains, closes the
    store, then executes ``kbflow serve`` again, whose new code answers the connections that
    waited in the socket's backlog meanwhile (`kbflow.api.restart`).
    """
    import signal

    import uvicorn

    from kbflow.api.restart import DrainingServer, listening_socket, reexec

    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the server handles it
    config = uvicorn.Config(
        create_app(settings),
        host=host,
        port=port,
        log_level="info",
        timeout_keep_alive=5,
        timeout_graceful_shutdown=settings.api.api_drain_s,
        **uvicorn_logging(settings.api.log_format),
    )
    sock = listening_socket(config, fd)
    kept = os.dup(sock.fileno())  # uvicorn closes ``sock`` when it stops; the socket lives on
    server = DrainingServer(config, restartable=True)
    server.run(sockets=[sock])
    if server.restart:
        reexec(kept)
    os.close(kept)
