"""``kbflow store``: the vector store's maintenance (indexes, copies between stores,
re-embedding)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from core.settings import Settings
from kbflow.cli.common import (
    JsonOpt,
    OrgOpt,
    command,
    command_group,
    counted,
    print_json,
    print_table,
)
from kbflow.render import console, err_console, stage_progress
from kbflow.services.catalog import documents as catalog
from kbflow.services.catalog import stores

group = command_group("store", "Vector store maintenance.")


@group.command("optimize")
@command
def store_optimize(settings: Settings) -> None:
    """Build the vector indexes (slow at scale: run it as maintenance, not during queries)."""
    count = catalog.optimize_store(settings)
    console.print(f"optimized: {counted(count, 'point')}")


@group.command("migrate")
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
            f"copied {counted(report.copied, 'point')} of org [bold]{escape(org)}[/bold] from "
            f"{escape(report.source)} to {escape(report.destination)}"
            + (f" (replaced {report.replaced})" if report.replaced else "")
            + f" in {report.seconds:.1f}s"
        )
        statuses = sorted(set(report.source_by_status) | set(report.destination_by_status))
        rows = [
            (escape(status), str(report.source_by_status.get(status, 0)),
             str(report.destination_by_status.get(status, 0)))
            for status in statuses
        ]  # fmt: skip
        rows.append(("all", str(report.source_count), str(report.destination_count)))
        print_table("points per status", ("status", "source", "destination"), rows)
    if not report.matched:
        for problem in report.problems:
            err_console.print(f"[red]error:[/red] {escape(problem)}", soft_wrap=True)
        raise typer.Exit(1)


@group.command("reembed")
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
        f"{verb} {counted(report.reembedded, 'chunk')} with [bold]{escape(report.model)}[/bold] in "
        f"{report.seconds:.1f}s" + (" (dry run: nothing changed)" if dry_run else "")
    )
    print_table(
        "chunks per org",
        ("org", "points", "recorded models before", verb, "registry rows"),
        (
            (escape(item.org), str(item.points), escape(_models_before(item.before)),
             str(item.reembedded), str(item.registry_rows))
            for item in report.orgs
        ),
    )  # fmt: skip
    for item in report.orgs:
        if item.skipped:
            err_console.print(
                f"[red]error:[/red] org {escape(item.org)}: {counted(len(item.skipped), 'chunk')} "
                "without text in the vector store, not re-embedded; re-ingest the documents",
                soft_wrap=True,
            )
    if any(item.skipped for item in report.orgs):
        raise typer.Exit(1)


def _models_before(models: dict[str, int]) -> str:
    """The embedding models a re-embed found recorded, with their chunk counts (``—``: none)."""
    return ", ".join(f"{m}: {n}" for m, n in models.items()) or "—"
