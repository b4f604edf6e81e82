"""``kbflow agents``: the agents (specialists) of an org, the collections each may read and the
audiences it reads as. Changing an agent needs ``--as`` a superadmin or its org's assigned
account manager; its audiences, a superadmin (audited)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from core.settings import Settings
from kbflow.cli.common import (
    AdminOpt,
    JsonOpt,
    OrgAdminOpt,
    OrgOpt,
    command,
    command_group,
    print_json,
)
from kbflow.render import console
from kbflow.services.catalog import documents as service

group = command_group("agents", "Agents (specialists) and the collections they may read.")

AgentArg = Annotated[str, typer.Argument(help="The agent's id.")]
CollectionsArg = Annotated[list[str], typer.Argument(help="Collection ids or paths.")]


@group.command("create")
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
    actor: OrgAdminOpt = None,
) -> None:
    """Create an agent; it may read every collection of its org until you `allow` some.
    Needs --as a superadmin or the org's assigned account manager (--audience: a superadmin).

    Its audiences are a property of the agent (never of a request): documents ingested for an
    audience reach only agents given it here or with `kbflow agents audience`.
    """
    made = service.create_agent(
        settings, org, agent_id, name=name, enabled=not disabled, audiences=audience or (),
        actor=actor,
    )  # fmt: skip
    console.print(f"created agent {escape(made.id)} in {escape(made.org_id)}")


def _allow(
    settings: Settings, agent_id: str, refs: list[str], *, allow: bool, actor: str | None
) -> None:
    agent, allowed = service.set_allowed(settings, agent_id, refs, allow=allow, actor=actor)
    shown = ", ".join(f"{escape(c.path)} (id {c.id})" for c in allowed) or "every collection"
    console.print(f"{escape(agent.id)} may read: {shown}")


@group.command("allow")
@command
def agents_allow(
    settings: Settings, agent_id: AgentArg, collection: CollectionsArg, actor: OrgAdminOpt = None
) -> None:
    """Let an agent read these collections (and their descendants). Needs --as a superadmin or
    the assigned account manager of the agent's org."""
    _allow(settings, agent_id, collection, allow=True, actor=actor)


@group.command("disallow")
@command
def agents_disallow(
    settings: Settings, agent_id: AgentArg, collection: CollectionsArg, actor: OrgAdminOpt = None
) -> None:
    """Take collections off an agent's allow-list. The last one cannot be removed (an empty
    list means every collection): allow another first, or `agents show ID --disable`. Needs
    --as a superadmin or the assigned account manager of the agent's org."""
    _allow(settings, agent_id, collection, allow=False, actor=actor)


@group.command("audience")
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


@group.command("show")
@command
def agents_show(
    settings: Settings,
    agent_id: AgentArg,
    enable: Annotated[
        bool | None, typer.Option("--enable/--disable", help="Switch its knowledge base.")
    ] = None,
    as_json: JsonOpt = False,
    actor: OrgAdminOpt = None,
) -> None:
    """Show an agent, what it may read; `--enable/--disable` flips its master switch (needs
    --as a superadmin or the assigned account manager of the agent's org)."""
    data = service.show_agent(settings, agent_id, enable=enable, actor=actor)
    if as_json:
        print_json(data)
        return
    state = "on" if data["knowledge_base_enabled"] else "OFF"
    console.print(f"{escape(data['id'])} ({escape(data['org_id'])}): knowledge base {state}")
    for c in data["readable"]:
        console.print(f"  {c['id']:>4}  {escape(c['path'])}")
