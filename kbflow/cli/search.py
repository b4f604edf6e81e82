"""``kbflow search``, ``kbflow docs`` and ``kbflow store``: gated search, the document registry,
and the vector store's maintenance."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from core import ids
from core.models import DocStatus, SearchMode
from core.settings import Settings
from kbflow.cli.common import (
    JsonOpt,
    OrgOpt,
    checked,
    command,
    print_json,
    snippet,
    source_lines,
)
from kbflow.render import console, err_console, stage_progress
from kbflow.services import catalog, stores
from kbflow.services import search as service
from tasks.text.citations import with_titles

commands = typer.Typer()
"""The top-level commands of this module (merged into ``kbflow``)."""

docs_app = typer.Typer(help="Inspect the document registry.", no_args_is_help=True)
store_app = typer.Typer(help="Vector store maintenance.", no_args_is_help=True)


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
    from kbflow.services.context import search_context

    with search_context(settings, degrade=True) as ctx:
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


@docs_app.command("list")
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
    table = Table(title=f"documents of {org} ({len(docs)})")
    for col in ("id", "title", "collection", "v", "status", "parse", "chunks"):
        table.add_column(col)
    for d in docs:
        table.add_row(
            d.id,
            d.title[:60],
            d.collection_path,
            str(d.version),
            d.status or "—",
            d.parse_status,
            str(d.chunk_count),
        )
    console.print(table)


@store_app.command("optimize")
@command
def store_optimize(settings: Settings) -> None:
    """Build the vector indexes (slow at scale: run it as maintenance, not during queries)."""
    count = catalog.optimize_store(settings)
    console.print(f"optimized: {count} points")


@store_app.command("migrate")
@command
def store_migrate(
    settings: Settings,
    org: OrgOpt,
    to_url: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="Copy to this Qdrant (http://host:6333, or file:///folder for qdrant-client "
            "local mode). Omitted: the embedded store of KBFLOW_HOME.",
        ),
    ] = None,
    from_url: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Copy from this Qdrant. Omitted: the embedded store of KBFLOW_HOME.",
        ),
    ] = None,
    collection: Annotated[
        str | None,
        typer.Option(
            help="Qdrant collection on the URL side(s) (default KBFLOW_QDRANT_COLLECTION)."
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="API key of the Qdrant server(s) (default KBFLOW_QDRANT_API_KEY).",
        ),
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="Points per upsert.")] = 256,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Delete the org's points in the destination first, so its copy is exactly "
            "the source's (without it, points only the destination has are kept and reported).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Copy an org's points (vectors and payload, same ids) between the embedded store and a
    Qdrant server, then check the counts per org and per status.

    `--to URL` copies from the embedded store to the server; `--from URL` copies back into the
    embedded store. Safe to re-run (upsert by point id). Exits 1 when the counts differ. Stop
    `kbflow serve` first: the copy opens the embedded store as its owner.
    """
    with stage_progress(enabled=not as_json and err_console.is_terminal) as progress:
        report = stores.migrate_org(
            settings,
            org,
            to_url=to_url,
            from_url=from_url,
            collection=collection,
            api_key=api_key,
            batch=batch,
            replace=replace,
            progress=progress,
        )
    if as_json:
        print_json(report)
    else:
        console.print(
            f"copied {report.copied} points of org [bold]{escape(org)}[/bold] from "
            f"{escape(report.source)} to {escape(report.destination)}"
            + (f" (replaced {report.replaced})" if report.replaced else "")
            + f" in {report.seconds:.1f}s"
        )
        table = Table(title="points per status")
        for col in ("status", "source", "destination"):
            table.add_column(col)
        statuses = sorted(set(report.source_by_status) | set(report.destination_by_status))
        for status in statuses:
            table.add_row(
                escape(status),
                str(report.source_by_status.get(status, 0)),
                str(report.destination_by_status.get(status, 0)),
            )
        table.add_row("all", str(report.source_count), str(report.destination_count))
        console.print(table)
    if not report.matched:
        for problem in report.problems:
            err_console.print(f"[red]error:[/red] {escape(problem)}", soft_wrap=True)
        raise typer.Exit(1)


@store_app.command("reembed")
@command
def store_reembed(
    settings: Settings,
    org: Annotated[
        str | None, typer.Option("--org", help="Only this org's chunks (default: every org).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be re-embedded; change nothing.")
    ] = False,
    batch: Annotated[int, typer.Option(min=1, help="Chunks embedded per upsert.")] = 128,
    as_json: JsonOpt = False,
) -> None:
    """Re-embed the chunks another embedding model made with the configured one
    (KBFLOW_EMBEDDING_MODEL, KBFLOW_EMBEDDING_PRECISION), so search and ingest accept the org
    again.

    Keeps each chunk's id and payload (review status included) and records the new model id
    in the vector store and the registry. Safe to re-run: chunks already embedded by the
    configured model are skipped, and a killed run is finished by the next. Holds the
    embedded store while it runs.
    """
    with stage_progress(enabled=not as_json and err_console.is_terminal) as progress:
        report = stores.reembed(settings, org=org, dry_run=dry_run, batch=batch, progress=progress)
    if as_json:
        print_json(report)
        return
    verb = "would re-embed" if dry_run else "re-embedded"
    console.print(
        f"{verb} {report.reembedded} chunks with [bold]{escape(report.model)}[/bold] in "
        f"{report.seconds:.1f}s" + (" (dry run: nothing changed)" if dry_run else "")
    )
    table = Table(title="chunks per org")
    for col in ("org", "points", "recorded models before", verb, "registry rows"):
        table.add_column(col)
    for item in report.orgs:
        before = ", ".join(f"{m}: {n}" for m, n in item.before.items()) or "—"
        table.add_row(
            escape(item.org),
            str(item.points),
            escape(before),
            str(item.reembedded),
            str(item.registry_rows),
        )
    console.print(table)
    for item in report.orgs:
        if item.skipped:
            err_console.print(
                f"[red]error:[/red] org {escape(item.org)}: {len(item.skipped)} chunks have no "
                "text in the vector store and were not re-embedded; re-ingest their documents",
                soft_wrap=True,
            )
    if any(item.skipped for item in report.orgs):
        raise typer.Exit(1)
