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
from kbflow.services.catalog import orgs as service

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


@group.command("set-password")
@command
def users_set_password(
    settings: Settings,
    user: Annotated[str, typer.Argument(help="The user whose review-inbox password is set.")],
    actor: Annotated[
        str | None,
        typer.Option("--as", help="Your user id: a superadmin, or USER for their own password."),
    ] = None,
    temporary: Annotated[
        bool,
        typer.Option(
            "--temporary",
            help="The user must choose their own password at their next login (a first "
            "login or a reset); without a password given, one is generated and shown once.",
        ),
    ] = False,
    password_stdin: Annotated[
        bool,
        typer.Option("--password-stdin", help="Read the password from the first line of stdin."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Set a user's password for the review inbox (`kbflow serve`, /review).

    A superadmin sets anyone's, a user their own. The password is prompted for (twice, not
    shown) unless --password-stdin, or --temporary generates one. Only an argon2 hash is
    stored; every session the user had ends; the change is audited.
    """
    import sys

    from kbflow.services.review import inbox

    password: str | None = None
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif not temporary:
        password = typer.prompt("New password", hide_input=True, confirmation_prompt=True)
    generated = inbox.set_password(settings, user, password, temporary=temporary, actor=actor)
    if as_json:
        print_json({"user_id": user, "must_change": temporary, "generated_password": generated})
        return
    later = " (temporary: they choose their own at their next login)" if temporary else ""
    console.print(f"password of [bold]{escape(user)}[/bold] set{later}")
    if generated:
        console.print(f"temporary password (shown once): {generated}", markup=False)
