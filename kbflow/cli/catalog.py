"""``kbflow collections``, ``kbflow agents`` and ``kbflow tools``: where an org's documents are
filed, which agents read them, and the tools those agents call."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape

from core import ids
from core.errors import KbflowError
from core.settings import Settings
from kbflow.cli.common import AdminOpt, JsonOpt, OrgOpt, checked, command, print_json
from kbflow.render import console
from kbflow.services import catalog as service

collections_app = typer.Typer(
    help="An org's named, described, nested collections.", no_args_is_help=True
)
agents_app = typer.Typer(
    help="Agents (specialists) and the collections they may read.", no_args_is_help=True
)
tools_app = typer.Typer(
    help="The agent's knowledge tools and their JSON schemas.", no_args_is_help=True
)

CollectionRef = Annotated[str, typer.Argument(help="Collection id or path (e.g. policies/hr).")]
AgentArg = Annotated[str, typer.Argument(help="The agent's id.")]
CollectionsArg = Annotated[list[str], typer.Argument(help="Collection ids or paths.")]


@collections_app.command("create")
@command
def collections_create(
    settings: Settings,
    org: OrgOpt,
    name: Annotated[str, typer.Argument(help="The collection's name (no '/').")],
    description: Annotated[
        str, typer.Option(help="What it holds: agents read this to pick a collection.")
    ],
    parent: Annotated[str | None, typer.Option(help="Parent collection id or path.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a collection (optionally nested under a parent); a description is required."""
    made = service.create_collection(settings, org, name, description, parent)
    if as_json:
        print_json(made.to_dict())
        return
    console.print(f"created collection {made.id} {escape(made.path)}")


@collections_app.command("list")
@command
def collections_list(settings: Settings, org: OrgOpt, as_json: JsonOpt = False) -> None:
    """List an org's collections as a tree."""
    found = service.list_collections(settings, org)
    if as_json:
        print_json([c.to_dict() for c in found])
        return
    for c in found:
        indent = "  " * c.path.count("/")
        console.print(f"{indent}{c.id:>4}  {escape(c.name)}  [dim]{escape(c.description)}[/dim]")


@collections_app.command("describe")
@command
def collections_describe(
    settings: Settings,
    org: OrgOpt,
    ref: CollectionRef,
    description: Annotated[str, typer.Argument(help="The new description.")],
) -> None:
    """Set a collection's description."""
    done = service.describe_collection(settings, org, ref, description)
    console.print(f"described {escape(done.path)}")


@collections_app.command("move")
@command
def collections_move(
    settings: Settings,
    org: OrgOpt,
    ref: CollectionRef,
    parent: Annotated[
        str | None, typer.Option(help="New parent id or path; omit for the top level.")
    ] = None,
) -> None:
    """Move a collection (with its sub-collections and documents) under another parent."""
    moved, docs = service.move_collection(settings, org, ref, parent)
    console.print(f"moved to {escape(moved.path)}; {docs} document(s) re-filed")


@collections_app.command("delete")
@command
def collections_delete(
    settings: Settings,
    org: OrgOpt,
    ref: CollectionRef,
    move_to: Annotated[
        str | None, typer.Option(help="Move its documents to this collection first.")
    ] = None,
    delete_contents: Annotated[
        bool, typer.Option("--delete-contents", help="Delete its documents too.")
    ] = False,
) -> None:
    """Delete a collection and its sub-collections; refused while it holds documents unless
    they are moved (--move-to) or deleted (--delete-contents)."""
    counts = service.delete_collection(
        settings, org, ref, move_to=move_to, delete_contents=delete_contents
    )
    console.print(f"deleted; {counts['moved']} document(s) moved, {counts['deleted']} deleted")


@agents_app.command("create")
@command
def agents_create(
    settings: Settings,
    org: OrgOpt,
    agent_id: Annotated[str, typer.Argument(help="The agent's id.")],
    name: Annotated[str | None, typer.Option(help="Display name.")] = None,
    disabled: Annotated[
        bool, typer.Option("--disabled", help="Create with the knowledge base switched off.")
    ] = False,
    audience: Annotated[
        list[str] | None,
        typer.Option(
            help="An audience the agent reads as (repeatable; needs --as a superadmin). "
            "Without: only documents meant for everyone."
        ),
    ] = None,
    actor: AdminOpt = None,
) -> None:
    """Create an agent; it may read every collection of its org until you `allow` some.

    Its audiences are a property of the agent (never of a request): documents ingested for an
    audience reach only agents given it here or with `kbflow agents audience`.
    """
    made = service.create_agent(
        settings, org, agent_id, name=name, enabled=not disabled, audiences=audience or (),
        actor=actor,
    )  # fmt: skip
    console.print(f"created agent {escape(made.id)} in {escape(made.org_id)}")


def _allow(settings: Settings, agent_id: str, refs: list[str], *, allow: bool) -> None:
    agent = service.set_allowed(settings, agent_id, refs, allow=allow)
    allowed = agent.allowed_collection_ids
    console.print(f"{agent.id} may read: {', '.join(map(str, allowed)) or 'every collection'}")


@agents_app.command("allow")
@command
def agents_allow(settings: Settings, agent_id: AgentArg, collection: CollectionsArg) -> None:
    """Let an agent read these collections (and their descendants)."""
    _allow(settings, agent_id, collection, allow=True)


@agents_app.command("disallow")
@command
def agents_disallow(settings: Settings, agent_id: AgentArg, collection: CollectionsArg) -> None:
    """Take collections off an agent's allow-list. The last one cannot be removed (an empty
    list means every collection): allow another first, or `agents show ID --disable`."""
    _allow(settings, agent_id, collection, allow=False)


@agents_app.command("audience")
@command
def agents_audience(
    settings: Settings,
    agent_id: AgentArg,
    audience: Annotated[
        list[str] | None,
        typer.Argument(help="The audiences it reads as (replacing the current ones)."),
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Remove every audience (documents for everyone only).")
    ] = False,
    actor: AdminOpt = None,
) -> None:
    """Set the audiences an agent reads as (a superadmin's decision: --as; audited).

    Documents ingested with `--audience A` reach only agents that read as A; documents without
    an audience (or for `all`) reach every agent in scope. Seed inputs reach none.
    """
    agent = service.set_audiences(settings, agent_id, audience or (), clear=clear, actor=actor)
    shown = ", ".join(agent.audiences) or "none (documents for everyone only)"
    console.print(f"{escape(agent.id)} reads as: {escape(shown)}")


@agents_app.command("show")
@command
def agents_show(
    settings: Settings,
    agent_id: AgentArg,
    enable: Annotated[
        bool | None, typer.Option("--enable/--disable", help="Switch its knowledge base.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show an agent, what it may read; `--enable/--disable` flips its master switch."""
    data = service.show_agent(settings, agent_id, enable=enable)
    if as_json:
        print_json(data)
        return
    state = "on" if data["knowledge_base_enabled"] else "OFF"
    console.print(f"{escape(data['id'])} ({escape(data['org_id'])}): knowledge base {state}")
    for c in data["readable"]:
        console.print(f"  {c['id']:>4}  {escape(c['path'])}")


@tools_app.command("schema")
def tools_schema() -> None:
    """Print the tools' names, descriptions and JSON schemas (inputs and outputs)."""
    from kbflow.services.tools import export_schemas

    print_json(export_schemas())


@tools_app.command("call")
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
    from kbflow.services.context import search_context
    from kbflow.services.tools import call_tool

    with search_context(settings, degrade=True) as ctx:
        print_json(call_tool(ctx, name, agent, arguments))
