"""``kbflow server`` and ``kbflow demo``: the Prefect UI with kbflow's data dir, and the
end-to-end demo."""

from __future__ import annotations

import functools
from typing import Annotated

import typer
from rich.markup import escape

from core.settings import Settings
from kbflow.cli.common import JsonOpt, command, print_json
from kbflow.render import console, err_console
from kbflow.services.orchestration import server as orchestration

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
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on (0.0.0.0 for every interface: then --auth is the default)."
        ),
    ] = "127.0.0.1",
    auth: Annotated[
        bool | None,
        typer.Option(
            "--auth/--no-auth",
            help="Require Prefect's basic-auth credential on the API and UI "
            "(KBFLOW_PREFECT_AUTH_STRING, or one generated into KBFLOW_HOME/prefect-auth, "
            "mode 0600). Default: on unless --host is a loopback address.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start a Prefect server (UI, pause/resume, schedules) with kbflow's data directory.

    Web pages may call its API only from its own UI's origin (and KBFLOW_PREFECT_CORS_ORIGINS).
    SIGTERM, SIGINT (Ctrl-C) or SIGHUP stop it and everything it started.
    """
    plan = orchestration.plan_prefect_server(settings, port, host=host, auth=auth)
    console.print(
        f"Prefect UI on {plan.url} — in other shells, export PREFECT_API_URL={plan.api_url}"
    )
    _print_security(plan)
    raise typer.Exit(orchestration.run_prefect_server(settings, plan))


def _print_security(plan: orchestration.PrefectServerPlan) -> None:
    """Say on stderr who may call the server, and how a client passes its credential (never
    the credential itself)."""
    say = functools.partial(err_console.print, soft_wrap=True, highlight=False)
    say(
        "Browsers may call its API only from "
        + escape(", ".join(plan.origins))
        + " (add origins with KBFLOW_PREFECT_CORS_ORIGINS)."
    )
    if not plan.auth:
        if orchestration.is_loopback(plan.host):
            say("API authentication: off (loopback only; --auth requires a credential).")
        else:
            say(
                f"[red]warning:[/red] API authentication is off: anyone who can reach "
                f"{escape(plan.host)}:{plan.port} can read runs and resume them (--auth)."
            )
        return
    if plan.credential_file is not None:
        where = escape(str(plan.credential_file))
        say(
            f"API authentication: on. The credential is in {where} (mode 0600); kbflow "
            "commands with this KBFLOW_HOME send it. Remote workers and other Prefect "
            f'clients: export {orchestration.AUTH_ENV}="$(cat {where})". The UI asks for it.'
        )
    else:
        say(
            f"API authentication: on, with the credential in {orchestration.AUTH_SETTING_ENV}; "
            f"kbflow commands that have it send it. Remote workers and other Prefect clients: "
            f"export {orchestration.AUTH_ENV} with the same value. The UI asks for it."
        )


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
    fd: Annotated[
        int | None,
        typer.Option(
            "--fd",
            hidden=True,
            help="Serve on this inherited listening socket (set by a SIGHUP restart).",
        ),
    ] = None,
) -> None:
    """Serve agents over HTTP: the model stays warm, the registry and store stay open.

    Every request needs `Authorization: Bearer TOKEN` (`kbflow tokens create`); OpenAPI docs
    at /docs, health at /healthz and /readyz. Ctrl-C stops it.
    """
    from kbflow.api.app import serve_one, serve_workers
    from kbflow.api.logs import writing_json

    base = f"http://{host}:{port}"
    banner = f"kbflow API on {base} (docs: {base}/docs, MCP: {base}/mcp)"
    if fd is not None:
        banner += " (restarted)"
    if settings.api.log_format == "json":  # every line of the log JSON, this one too
        writing_json().info(banner)
    else:
        console.print(banner)
    # SIGHUP restarts either form without dropping a request (docs/OPERATIONS.md, "Restarts
    # and upgrades"); --fd is how the single process hands its socket to its new code.
    if workers > 1:
        serve_workers(settings, host, port, workers)
    else:
        serve_one(settings, host, port, fd)
