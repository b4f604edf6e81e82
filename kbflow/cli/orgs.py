"""``kbflow orgs`` and ``kbflow users``: client orgs, their account managers, and who may review."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from core import ids
from core.models import Role
from core.settings import Settings
from kbflow.cli.common import AdminOpt, JsonOpt, checked, command, print_json
from kbflow.render import console
from kbflow.services import orgs as service

orgs_app = typer.Typer(help="Client orgs and their account managers.", no_args_is_help=True)
users_app = typer.Typer(help="Users and their roles (who may review what).", no_args_is_help=True)


@orgs_app.command("create")
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

    The id is a short lowercase slug (letters, digits, '-' and '_'). Assigning the account
    manager needs --as a superadmin.
    """
    record = service.create_org(settings, org, name=name, am=am, actor=actor)
    if as_json:
        print_json(service.org_dict(record))
        return
    console.print(
        f"org [bold]{escape(record.id)}[/bold] ({escape(record.name)}), account manager: "
        f"{escape(record.am_user_id or 'none')}"
    )


@orgs_app.command("assign-am")
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


@orgs_app.command("list")
@command
def orgs_list(settings: Settings, as_json: JsonOpt = False) -> None:
    """List organisations and their assigned account managers."""
    orgs = service.list_orgs(settings)
    if as_json:
        print_json([service.org_dict(o) for o in orgs])
        return
    table = Table(title=f"orgs ({len(orgs)})")
    for col in ("id", "name", "account manager"):
        table.add_column(col)
    for o in orgs:
        table.add_row(escape(o.id), escape(o.name), escape(o.am_user_id or "—"))
    console.print(table)


@users_app.command("add")
@command
def users_add(
    settings: Settings,
    user: Annotated[str, typer.Argument(help="User id, e.g. an email address or a handle.")],
    role: Annotated[
        Role,
        typer.Option(
            help="superadmin: decides for every org; account_manager: decides for the orgs "
            "assigned to them; expert: reads the drafts of their org (or of every org without "
            "--org); engineer: no review rights."
        ),
    ],
    name: Annotated[str | None, typer.Option(help="Display name (default: the id).")] = None,
    org: Annotated[
        str | None,
        typer.Option(
            "--org",
            help="The user's organisation (must exist; omit for agency-wide).",
            callback=checked(ids.org_id),
        ),
    ] = None,
    actor: AdminOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a user, or update an existing one (its role and org are replaced by what you give).

    Managing users and roles needs --as a superadmin; only the very first superadmin of a
    registry that has none is created without it. Every change is audited
    (`kbflow audit`).
    """
    record = service.add_user(settings, user, role, name=name, org=org, actor=actor)
    if as_json:
        print_json(service.user_dict(record))
        return
    console.print(
        f"user [bold]{escape(record.id)}[/bold] ({escape(record.name)}): {record.role.value}"
        + (f" of {escape(record.org_id)}" if record.org_id else "")
    )


@users_app.command("list")
@command
def users_list(settings: Settings, as_json: JsonOpt = False) -> None:
    """List users with their roles and organisations."""
    users = service.list_users(settings)
    if as_json:
        print_json([service.user_dict(u) for u in users])
        return
    table = Table(title=f"users ({len(users)})")
    for col in ("id", "name", "role", "org"):
        table.add_column(col)
    for u in users:
        table.add_row(escape(u.id), escape(u.name), u.role.value, escape(u.org_id or "—"))
    console.print(table)
