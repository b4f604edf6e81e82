"""``kbflow collections``: where an org's documents are filed — named, described, nested
collections that agents pick by their descriptions. Changing them needs ``--as`` a superadmin
or the org's assigned account manager (audited)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from core.settings import Settings
from kbflow.cli.common import (
    JsonOpt,
    OrgAdminOpt,
    OrgOpt,
    command,
    command_group,
    counted,
    print_json,
)
from kbflow.render import console
from kbflow.services.catalog import documents as service

group = command_group("collections", "An org's named, described, nested collections.")

CollectionRef = Annotated[str, typer.Argument(help="Collection id or path (e.g. policies/hr).")]
NewParentOpt = Annotated[
    str | None, typer.Option(help="New parent id or path; omit for the top level.")
]
MoveToOpt = Annotated[str | None, typer.Option(help="Move its documents to this collection first.")]


@group.command("create")
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
    actor: OrgAdminOpt = None,
) -> None:
    """Create a collection (optionally nested under a parent); a description is required.
    Needs --as a superadmin or the org's assigned account manager."""
    made = service.create_collection(settings, org, name, description, parent, actor=actor)
    if as_json:
        print_json(made.to_dict())
        return
    console.print(f"created collection {escape(made.path)} (id {made.id})")


@group.command("list")
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


@group.command("describe")
@command
def collections_describe(
    settings: Settings,
    org: OrgOpt,
    ref: CollectionRef,
    description: Annotated[str, typer.Argument(help="The new description.")],
    actor: OrgAdminOpt = None,
) -> None:
    """Set a collection's description (--as a superadmin or the org's account manager)."""
    done = service.describe_collection(settings, org, ref, description, actor=actor)
    console.print(f"described {escape(done.path)}")


@group.command("move")
@command
def collections_move(
    settings: Settings,
    org: OrgOpt,
    ref: CollectionRef,
    parent: NewParentOpt = None,
    actor: OrgAdminOpt = None,
) -> None:
    """Move a collection (with its sub-collections and documents) under another parent (--as a
    superadmin or the org's account manager)."""
    moved, docs = service.move_collection(settings, org, ref, parent, actor=actor)
    console.print(f"moved to {escape(moved.path)}; {counted(docs, 'document')} re-filed")


@group.command("delete")
@command
def collections_delete(
    settings: Settings,
    org: OrgOpt,
    ref: CollectionRef,
    move_to: MoveToOpt = None,
    delete_contents: Annotated[
        bool, typer.Option("--delete-contents", help="Delete its documents too.")
    ] = False,
    actor: OrgAdminOpt = None,
) -> None:
    """Delete a collection and its sub-collections; refused while it holds documents unless
    they are moved (--move-to) or deleted (--delete-contents). Needs --as a superadmin or the
    org's account manager."""
    counts = service.delete_collection(
        settings, org, ref, move_to=move_to, delete_contents=delete_contents, actor=actor
    )
    console.print(
        f"deleted; {counted(counts['moved'], 'document')} moved, {counts['deleted']} deleted"
    )
