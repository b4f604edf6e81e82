"""The ``kbflow`` command line (typer + rich).

Heavy imports (Prefect, Docling, torch) happen inside the commands that need them, so ``--help``
is instant and ``search`` never loads Prefect.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from kbflow.errors import KbflowError
from kbflow.models import DocStatus, Scope, SearchMode
from kbflow.settings import Settings, configure_environment

app = typer.Typer(
    name="kbflow",
    help="kbflow: ingest an org's documents, gate them by review, and serve gated hybrid search.",
    no_args_is_help=True,
    add_completion=False,
)
docs_app = typer.Typer(help="Inspect the document registry.", no_args_is_help=True)
store_app = typer.Typer(help="Vector store maintenance.", no_args_is_help=True)
app.add_typer(docs_app, name="docs")
app.add_typer(store_app, name="store")

console = Console()
err_console = Console(stderr=True)

OrgOpt = Annotated[str, typer.Option("--org", help="Organisation id (a short slug).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def _settings() -> Settings:
    try:
        settings = Settings()
    except ValueError as exc:
        err_console.print(f"[red]invalid settings:[/red] {exc}")
        raise typer.Exit(2) from exc
    configure_environment(settings)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return settings


def _fail(exc: Exception) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {exc}")
    return typer.Exit(1)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@app.command()
def ingest(
    paths: Annotated[
        list[str], typer.Argument(help="Files, directories, globs or JSONL(.gz) corpora.")
    ],
    org: OrgOpt,
    collection: Annotated[
        str, typer.Option("--collection", help="Collection path, e.g. 'policies/hr'.")
    ] = "default",
    status: Annotated[
        DocStatus, typer.Option(help="Review status of new documents.")
    ] = DocStatus.APPROVED,
    audience: Annotated[
        str | None, typer.Option(help="Audience of the documents (default: everyone).")
    ] = None,
    effective_date: Annotated[
        str | None, typer.Option(help="YYYY-MM-DD; hidden from agents before this day.")
    ] = None,
    source_tag: Annotated[
        str | None, typer.Option(help="Free tag recorded on each document.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Ingest documents into an org's collection (unchanged files are skipped)."""
    settings = _settings()
    try:
        eff = dt.date.fromisoformat(effective_date) if effective_date else None
    except ValueError as exc:
        bad = KbflowError(
            f"--effective-date must be YYYY-MM-DD. Currently it is {effective_date!r}."
        )
        raise _fail(bad) from exc
    try:
        report = run_ingest(
            settings,
            paths,
            org=org,
            collection=collection,
            status=status,
            audience=audience,
            effective_date=eff,
            source_tag=source_tag,
            show_progress=not as_json,
        )
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(report)
        return
    _print_ingest_report(report)


def run_ingest(
    settings: Settings,
    paths: list[str],
    *,
    org: str,
    collection: str,
    status: DocStatus | None = DocStatus.APPROVED,
    audience: str | None = None,
    effective_date: dt.date | None = None,
    source_tag: str | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Plan without Prefect; start the ingest flow only when there is work to do."""
    import time

    from kbflow.wiring import open_registry
    from tasks.discover import discover_sources
    from tasks.extract import SUPPORTED_SUFFIXES
    from tasks.index import BatchReport, IngestSummary, plan_ingest

    started = time.perf_counter()
    sources = discover_sources(paths, SUPPORTED_SUFFIXES)
    with open_registry(settings) as registry:
        plan = plan_ingest(sources, registry, org)
    if not plan.work:
        return IngestSummary.build(
            plan,
            BatchReport(),
            org=org,
            collection=collection,
            discovered=len(sources),
            seconds=time.perf_counter() - started,
        ).to_dict()
    from flows.ingest import ingest as ingest_flow

    kwargs: dict[str, Any] = dict(
        paths=paths,
        org=org,
        collection=collection,
        status=status,
        audience=audience,
        effective_date=effective_date,
        source_tag=source_tag,
    )
    if not show_progress:
        return ingest_flow(**kwargs)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from kbflow import progress

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
    ) as bar:
        task_id = bar.add_task(f"ingest {len(plan.work)} documents", total=len(plan.work))

        def on_progress(stage: str, by: int, total: int | None) -> None:
            if total is not None:
                bar.update(task_id, total=total)
            bar.advance(task_id, by)

        with progress.listening(on_progress):
            return ingest_flow(**kwargs)


def _print_ingest_report(r: dict[str, Any]) -> None:
    console.print(
        f"[bold]{r['org']}/{r['collection']}[/bold]: {r['discovered']} found, "
        f"{r['new']} new, {r['changed']} changed, {r['unchanged']} unchanged → "
        f"{r['documents']} indexed ({r['chunks']} chunks), {r['superseded']} superseded, "
        f"{len(r['skipped'])} skipped in {r['seconds']:.1f}s"
    )
    for item in r["skipped"]:
        console.print(f"  [yellow]skipped[/yellow] {item['source']}: {item['reason']}")


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    org: OrgOpt,
    mode: Annotated[SearchMode, typer.Option(help="Retrieval engine.")] = SearchMode.HYBRID,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, max=200)] = 10,
    audience: Annotated[
        list[str] | None, typer.Option(help="Caller's audiences (repeatable).")
    ] = None,
    collection: Annotated[
        list[str] | None, typer.Option(help="Restrict to these collections (repeatable).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Search approved, effective documents of one org (hybrid BM25 + dense by default)."""
    settings = _settings()
    from kbflow.wiring import search_context

    scope = Scope(
        org_id=org,
        audiences=tuple(audience or ()),
        collections=tuple(collection) if collection else None,
    )
    try:
        with search_context(settings) as ctx:
            hits = ctx.search(query, scope, mode=mode, top_k=top_k)
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(
            {"query": query, "org": org, "mode": mode.value, "hits": [h.to_dict() for h in hits]}
        )
        return
    if not hits:
        console.print("[yellow]no approved document matches.[/yellow]")
        return
    for rank, hit in enumerate(hits, start=1):
        where = " > ".join(hit.heading_path)
        console.print(
            f"[bold]{rank}. {hit.title}[/bold]  [dim]{hit.score:.4f} · {hit.collection} · "
            f"{hit.uri}[/dim]"
        )
        if where:
            console.print(f"   [cyan]{where}[/cyan]")
        console.print(f"   {_snippet(hit.text)}")


def _snippet(text: str, width: int = 240) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


@docs_app.command("list")
def docs_list(
    org: OrgOpt,
    status: Annotated[list[DocStatus] | None, typer.Option(help="Only these statuses.")] = None,
    collection: Annotated[
        str | None, typer.Option(help="Only this collection (and below).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1)] = 200,
    as_json: JsonOpt = False,
) -> None:
    """List an org's documents with their version, review and parse status."""
    settings = _settings()
    from kbflow.wiring import open_registry

    try:
        with open_registry(settings) as registry:
            docs = registry.list_documents(
                org,
                statuses=[s.value for s in status] if status else None,
                collection=collection,
                limit=limit,
            )
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json([d.to_dict() for d in docs])
        return
    table = Table(title=f"documents of {org} ({len(docs)})")
    for col in ("id", "title", "collection", "v", "status", "parse", "chunks"):
        table.add_column(col)
    for d in docs:
        table.add_row(
            d.id[:12],
            d.title[:60],
            d.collection_path,
            str(d.version),
            d.status or "—",
            d.parse_status,
            str(d.chunk_count),
        )
    console.print(table)


@store_app.command("optimize")
def store_optimize() -> None:
    """Build the vector indexes (slow at scale: run it as maintenance, not during queries)."""
    settings = _settings()
    from sinks.vectors import open_vector_store

    try:
        with open_vector_store(settings) as store:
            store.optimize()
            count = store.count()
    except KbflowError as exc:
        raise _fail(exc) from exc
    console.print(f"optimized: {count} points")


@app.command()
def demo(as_json: JsonOpt = False) -> None:
    """End-to-end demo: a fictional client's documents, the approval gate, hybrid search."""
    settings = _settings()
    from kbflow.demo import run_demo

    try:
        result = run_demo(settings, show_progress=not as_json, console=None if as_json else console)
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(result)
    elif not result["ok"]:
        raise typer.Exit(1)


@app.command()
def server(
    port: Annotated[int, typer.Option(help="Port for the Prefect UI/API.")] = 4200,
) -> None:
    """Start a Prefect server (UI, pause/resume, schedules) with kbflow's data directory."""
    import os
    import subprocess

    _settings()
    console.print(
        f"Prefect UI on http://127.0.0.1:{port} — in other shells, "
        f"export PREFECT_API_URL=http://127.0.0.1:{port}/api"
    )
    cmd = [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    raise typer.Exit(subprocess.call(cmd, env=os.environ.copy()))


def main() -> None:  # pragma: no cover - console script shim
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
