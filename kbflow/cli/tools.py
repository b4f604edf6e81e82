"""``kbflow tools``: the agent's knowledge tools — their JSON schemas, and a call made as an
agent would make it."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from core import ids
from core.errors import KbflowError
from core.settings import Settings
from kbflow.cli.common import checked, command, command_group, print_json

group = command_group("tools", "The agent's knowledge tools and their JSON schemas.")


@group.command("schema")
def tools_schema() -> None:
    """Print the tools' names, descriptions and JSON schemas (inputs and outputs)."""
    from kbflow.services.query.tools import export_schemas

    print_json(export_schemas())


@group.command("call")
@command
def tools_call(
    settings: Settings,
    name: Annotated[
        str,
        typer.Argument(
            help="list_knowledge_collections, search_knowledge_base or research_knowledge_search"
        ),
    ],
    agent: Annotated[
        str, typer.Option(help="The agent the call is made for.", callback=checked(ids.agent_id))
    ],
    args: Annotated[str, typer.Option("--args", help="The arguments as a JSON object.")] = "{}",
) -> None:
    """Call a tool as an agent would; prints its JSON result."""
    try:
        arguments = json.loads(args)
    except json.JSONDecodeError as exc:
        raise KbflowError(f"--args is not JSON: {exc.msg} at {exc.pos}") from exc
    from kbflow.services.query.context import open_home
    from kbflow.services.query.tools import call_tool

    with open_home(settings, degrade=True) as ctx:
        print_json(call_tool(ctx, name, agent, arguments))
