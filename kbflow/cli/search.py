"""``kbflow search``: gated search over an org's approved, effective documents."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from core import ids
from core.models import SearchMode
from core.settings import Settings
from kbflow.cli.common import JsonOpt, checked, command, print_json, snippet, source_lines
from kbflow.render import console, err_console
from kbflow.services.query import search as service
from tasks.text.citations import with_titles

commands = typer.Typer()
"""The top-level commands of this module (merged into ``kbflow``)."""


@commands.command()
@command
def search(
    settings: Settings,
    query: Annotated[str, typer.Argument(help="What to look for.")],
    org: Annotated[
        str | None,
        typer.Option(
            help="Org-wide search (engineers and admins; needs --as).",
            callback=checked(ids.org_id),
        ),
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(
            help="Search as this agent: only the collections it may read.",
            callback=checked(ids.agent_id),
        ),
    ] = None,
    actor: Annotated[
        str | None, typer.Option("--as", help="Your user id (an engineer or superadmin).")
    ] = None,
    mode: Annotated[SearchMode, typer.Option(help="Retrieval engine.")] = SearchMode.HYBRID,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, max=200)] = 10,
    audience: Annotated[
        list[str] | None,
        typer.Option(
            help="Narrow to these audiences (repeatable). Only narrows: an agent reads the "
            "audiences set on it, a person those of their role."
        ),
    ] = None,
    collection: Annotated[
        list[str] | None, typer.Option(help="Restrict to these collections (repeatable).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Search approved, effective documents of one org (hybrid BM25 + dense by default).

    Modes: hybrid, dense, keyword, hybrid+rerank (Cohere with COHERE_API_KEY, or a local
    cross-encoder from KBFLOW_RERANK_MODEL). When the vector store is unavailable the answer
    comes from the keyword fallback over the registry and is marked degraded.
    """
    from kbflow.services.query.context import open_home

    with open_home(settings, degrade=True) as ctx:
        found = service.search(
            ctx,
            query,
            agent=agent,
            org=org,
            actor=actor,
            mode=mode,
            top_k=top_k,
            audiences=audience or (),
            collections=collection or (),
        )
    if as_json:
        print_json(found.to_dict(query))
        return
    result = found.result
    if result.paused:
        console.print(f"[yellow]paused:[/yellow] {escape(result.reason or '')}")
        return
    if result.degraded:
        err_console.print(f"[yellow]degraded:[/yellow] {escape(result.reason or '')}")
    elif result.reason:
        err_console.print(f"[dim]note: {escape(result.reason)}[/dim]")
    if not result.hits:
        console.print("[yellow]no approved document matches.[/yellow]")
        return
    for rank, hit in enumerate(result.hits, start=1):
        where = " > ".join(hit.heading_path)
        if hit.location is not None:
            where = f"{where} · {hit.location.describe()}" if where else hit.location.describe()
        console.print(
            f"[bold]{rank}. {escape(hit.title)}[/bold]  [dim]{hit.score:.4f} · "
            f"{escape(hit.collection)} · {escape(hit.uri)}[/dim]"
        )
        if where:
            console.print(f"   [cyan]{escape(where)}[/cyan]")
        # A citation tag reads as its source's title; the sources follow, with where they are.
        console.print(f"   {snippet(with_titles(hit.text, hit.sources))}", markup=False)
        for line in source_lines(hit.sources):
            console.print(f"   [dim]cites[/dim] {line}")
