"""``kbflow orgs``: client orgs and the account manager who approves each one's documents."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from core.settings import Settings
from kbflow.cli.common import (
    AdminOpt,
    JsonOpt,
    command,
    command_group,
    print_json,
    print_listing,
)
from kbflow.render import console
from kbflow.services.catalog import orgs as service

group = command_group("orgs", "Client orgs and their account managers.")


@group.command("create")
@command
def orgs_create(
    settings: Settings,
    org: Annotated[str, typer.Argument(help="Organisation id, a short slug such as 'acme'.")],
    name: Annotated[str | None, typer.Option(help="Display name (default: the id).")] = None,
    am: Annotated[
        str | None,
        typer.Option(
            "--am",
            help="Assign this account manager (a user added with --role account_manager); "
            "needs --as a superadmin.",
        ),
    ] = None,
    actor: AdminOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create an org; if it exists, rename it (--name) or assign its account manager (--am).

    The id is a short lowercase slug (letters, digits, '-' and '_'). Creating, renaming and
    assigning the account manager need --as a superadmin (audited; a refusal exits 1).
    """
    record = service.create_org(settings, org, name=name, am=am, actor=actor)
    if as_json:
        print_json(service.org_dict(record))
        return
    console.print(
        f"org [bold]{escape(record.id)}[/bold] ({escape(record.name)}), account manager: "
        f"{escape(record.am_user_id or 'none')}"
    )


@group.command("assign-am")
@command
def orgs_assign_am(
    settings: Settings,
    org: Annotated[str, typer.Argument(help="Organisation id.")],
    user: Annotated[str, typer.Argument(help="User id of an account manager.")],
    actor: AdminOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make USER (an account manager) the one who approves ORG's documents (a superadmin's
    decision: --as; audited)."""
    record = service.assign_am(settings, org, user, actor=actor)
    if as_json:
        print_json(service.org_dict(record))
        return
    console.print(f"org [bold]{escape(record.id)}[/bold]: account manager is now {escape(user)}")


@group.command("list")
@command
def orgs_list(settings: Settings, as_json: JsonOpt = False) -> None:
    """List organisations and their assigned account managers."""
    print_listing(
        service.list_orgs(settings),
        as_json=as_json,
        to_json=service.org_dict,
        title="orgs",
        columns=("id", "name", "account manager"),
        row=lambda o: (escape(o.id), escape(o.name), escape(o.am_user_id or "—")),
    )
