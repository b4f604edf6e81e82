"""``kbflow users``: users and their roles, which decide who may review what."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from core import ids
from core.models import Role
from core.settings import Settings
from kbflow.cli.common import (
    AdminOpt,
    JsonOpt,
    checked,
    command,
    command_group,
    print_json,
    print_listing,
)
from kbflow.render import console
from kbflow.services import orgs as service

group = command_group("users", "Users and their roles (who may review what).")


@group.command("add")
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


@group.command("list")
@command
def users_list(settings: Settings, as_json: JsonOpt = False) -> None:
    """List users with their roles and organisations."""
    print_listing(
        service.list_users(settings),
        as_json=as_json,
        to_json=service.user_dict,
        title="users",
        columns=("id", "name", "role", "org"),
        row=lambda u: (escape(u.id), escape(u.name), u.role.value, escape(u.org_id or "—")),
    )
