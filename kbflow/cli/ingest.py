"""``kbflow ingest``: documents into an org's collection (long media handed to a background job,
followed with ``kbflow jobs``)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape

from core.contracts import IngestReport, IngestRequest
from core.errors import ConfigError, KbflowError
from core.models import DocStatus
from core.settings import Settings
from kbflow.cli.common import JsonOpt, OrgOpt, command, counted, print_json
from kbflow.render import console, ingest_progress
from kbflow.services import ingest as service
from kbflow.services.catalog import documents as catalog

commands = typer.Typer()
"""The top-level commands of this module (merged into ``kbflow``)."""


@commands.command()
@command
def ingest(
    settings: Settings,
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Files, directories, globs or JSONL(.gz) corpora. Symbolic links are never "
            "followed: one named here is refused (name its target), one inside a folder is "
            "skipped with a note."
        ),
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
    wait: Annotated[
        bool,
        typer.Option(
            "--wait", help="Ingest audio, video and large files here too, instead of as a job."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Ingest documents into an org's collection (unchanged files are skipped).

    The org must exist (`kbflow orgs create ORG`). Audio, video and files over
    KBFLOW_JOB_THRESHOLD_MB are handed to a background job, whose id is printed at once:
    follow it with `kbflow jobs status ID`. `--wait` ingests them here. A file or folder that
    cannot be read, and a symbolic link, is reported per path and the rest is ingested.
    """
    try:
        eff = dt.date.fromisoformat(effective_date) if effective_date else None
    except ValueError as exc:
        raise KbflowError(
            f"--effective-date must be YYYY-MM-DD. Currently it is {effective_date!r}."
        ) from exc
    # Checked before anything is read or stored: a bad --audience is exit 1 with the rule.
    request = _request(
        org=org,
        collection=catalog.collection_path(settings, org, collection),  # a name: its path
        status=status,
        audience=audience,
        effective_date=eff,
        source_tag=source_tag,
    )
    from kbflow.flow_cli import quiet_expected_failures

    # quiet: an IngestFailed is one message, not a traceback
    with quiet_expected_failures(), ingest_progress(enabled=not as_json) as progress:
        report = service.run_ingest(settings, paths, request, wait=wait, progress=progress)
    if as_json:
        print_json(report)
        return
    print_ingest_report(report)


def _request(**fields: Any) -> IngestRequest:
    """The options as an `IngestRequest`, its checks (the audience rule, …) failing as one
    `ConfigError` per bad option, named as the option: ``--audience: audience 'EXEC' is not
    valid: use …``."""
    try:
        return IngestRequest(**fields)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            cause = (error.get("ctx") or {}).get("error")
            why = str(cause) if isinstance(cause, KbflowError) else error["msg"]
            option = "--" + "-".join(str(part) for part in error["loc"]).replace("_", "-")
            problems.append(f"{option}: {why}")
        raise ConfigError(" ".join(problems)) from None


def print_ingest_report(r: IngestReport | dict[str, Any]) -> None:
    """An ingest report: the counts on one line, then each note, empty file, skip and job."""
    r = r.to_dict() if isinstance(r, IngestReport) else r  # a job's report is its JSON
    empty = f", {len(r['empty'])} empty" if r.get("empty") else ""
    # A killed run's files are redone in place: neither new nor changed, but counted.
    resumed = f", {r['resumed']} resumed" if r.get("resumed") else ""
    console.print(
        f"[bold]{escape(r['org'])}/{escape(r['collection'])}[/bold]: {r['discovered']} found, "
        f"{r['new']} new, {r['changed']} changed, {r['unchanged']} unchanged{resumed} → "
        f"{r['documents']} indexed ({counted(r['chunks'], 'chunk')}), "
        f"{r['superseded']} superseded, "
        f"{len(r['skipped'])} skipped{empty} in {r['seconds']:.1f}s"
    )
    for item in r.get("notes", []):
        console.print(f"  [cyan]note[/cyan] {escape(item['source'])}: {escape(item['note'])}")
    for item in r.get("empty", []):
        console.print(f"  [cyan]empty[/cyan] {escape(item['source'])}: {escape(item['reason'])}")
    for item in r["skipped"]:
        console.print(
            f"  [yellow]skipped[/yellow] {escape(item['source'])}: {escape(item['reason'])}"
        )
    for job in r.get("jobs", []):
        console.print(
            f"  [bold]job {job['id']}[/bold] {job['status']}: {counted(job['files'], 'long file')} "
            f"(audio, video or large) ingesting in the background — `kbflow jobs status "
            f"{job['id']}`"
        )
