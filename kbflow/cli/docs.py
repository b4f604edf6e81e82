"""``kbflow docs``: the document registry, as each org's documents stand in it."""

from __future__ import annotations

from typing import Annotated

import typer

from core.models import DocStatus
from core.settings import Settings
from kbflow.cli.common import JsonOpt, OrgOpt, command, command_group, print_json, print_table
from kbflow.services.catalog import documents as catalog

group = command_group("docs", "Inspect the document registry.")


@group.command("list")
@command
def docs_list(
    settings: Settings,
    org: OrgOpt,
    status: Annotated[list[DocStatus] | None, typer.Option(help="Only these statuses.")] = None,
    collection: Annotated[
        str | None, typer.Option(help="Only this collection (and below).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1)] = 200,
    as_json: JsonOpt = False,
) -> None:
    """List an org's documents with their version, review and parse status."""
    docs = catalog.list_documents(
        settings, org, statuses=status or (), collection=collection, limit=limit
    )
    if as_json:
        print_json([d.to_dict() for d in docs])
        return
    print_table(
        f"documents of {org} ({len(docs)})",
        ("id", "title", "collection", "v", "status", "parse", "chunks"),
        (
            (d.id, d.title[:60], d.collection_path, str(d.version), d.status or "—",
             d.parse_status, str(d.chunk_count))
            for d in docs
        ),
    )  # fmt: skip
