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
