"""``kbflow server`` and ``kbflow demo``: the Prefect UI with kbflow's data dir, and the
end-to-end demo."""

from __future__ import annotations

from typing import Annotated

import typer

from core.settings import Settings
from kbflow.cli.common import JsonOpt, command, print_json
from kbflow.render import console
from kbflow.services import orchestration

commands = typer.Typer()
"""The top-level commands of this module (merged into ``kbflow``)."""


@commands.command()
@command
def demo(settings: Settings, as_json: JsonOpt = False) -> None:
    """End-to-end demo: a fictional client's documents, the approval gate, hybrid search."""
    from kbflow.demo import run_demo

    result = run_demo(settings, show_progress=not as_json, console=None if as_json else console)
    if as_json:
        print_json(result)
    elif not result["ok"]:
        raise typer.Exit(1)


@commands.command()
@command
def server(
    settings: Settings,
    port: Annotated[int, typer.Option(help="Port for the Prefect UI/API.")] = 4200,
) -> None:
    """Start a Prefect server (UI, pause/resume, schedules) with kbflow's data directory.

    SIGTERM, SIGINT (Ctrl-C) or SIGHUP stop it and everything it started.
    """
    console.print(
        f"Prefect UI on http://127.0.0.1:{port} — in other shells, "
        f"export PREFECT_API_URL=http://127.0.0.1:{port}/api"
    )
    raise typer.Exit(orchestration.serve_prefect(settings, port))


@commands.command()
@command
def serve(
    settings: Settings,
    host: Annotated[
        str, typer.Option(help="Address to listen on (0.0.0.0 for every interface).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8080,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="HTTP worker processes (each its own model and core); this process then owns "
            "the embedded store and serves it to them.",
        ),
    ] = 1,
) -> None:
    """Serve agents over HTTP: the model stays warm, the registry and store stay open.

    Every request needs `Authorization: Bearer TOKEN` (`kbflow tokens create`); OpenAPI docs
    at /docs, health at /healthz and /readyz. Ctrl-C stops it.
    """
    import uvicorn

    from kbflow.api.app import create_app, serve_workers

    base = f"http://{host}:{port}"
    console.print(f"kbflow API on {base} (docs: {base}/docs, MCP: {base}/mcp)")
    if workers > 1:
        serve_workers(settings, host, port, workers)
        return
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info",
                timeout_keep_alive=5,
                timeout_graceful_shutdown=settings.api.api_drain_s)  # fmt: skip
