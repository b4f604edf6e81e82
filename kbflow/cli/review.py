"""``kbflow review``, ``kbflow audit`` and ``kbflow reconcile``: read and decide drafts, the audit
log, and the index brought back in line with the registry.

Review commands speak in the review voice (`kbflow.cli.common.failure`): a decision that lost a
race exits `EXIT_CONFLICT`, a refusal says ``forbidden``.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.markup import escape
from rich.table import Table

from core.contracts import Report
from core.errors import ConfigError
from core.models import DocStatus
from core.settings import Settings
from kbflow.cli.common import (
    ActorOpt,
    JsonOpt,
    MaybeOrgOpt,
    NoteOpt,
    OrgOpt,
    command,
    command_group,
    counted,
    print_json,
    print_table,
    source_lines,
)
from kbflow.render import console, err_console
from kbflow.services.review import drafts as service

if TYPE_CHECKING:
    from kbflow.services.review.decisions import Decided

commands = typer.Typer()
"""The top-level commands of this module (merged into ``kbflow``)."""

group = command_group(
    "review",
    "Review drafts: list, read, approve, reject or edit them (only approved is searchable).",
)


def _when(at: dt.datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S") if at else "—"


@group.command("list")
@command(review=True)
def review_list(
    settings: Settings,
    org: OrgOpt,
    actor: ActorOpt,
    status: Annotated[
        list[DocStatus] | None,
        typer.Option(help="Statuses to list (repeatable). Default: pending_review and rejected."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """An org's drafts grouped by the synthesis run that produced them (experts may look too)."""
    groups = service.list_drafts(settings, actor, org, status or ())
    if as_json:
        print_json(
            {
                "org": org,
                "runs": [
                    {"synthesis_run_id": run, "documents": [d.to_dict() for d in docs]}
                    for run, docs in groups.items()
                ],
            }
        )
        return
    if not groups:
        console.print(f"[green]no drafts in {escape(org)}.[/green]")
        return
    for run, docs in groups.items():
        print_table(
            f"synthesis run {escape(run or 'none')} ({len(docs)})",
            ("id", "title", "collection", "v", "status", "tag", "updated"),
            (
                (
                    d.id,
                    escape(d.title[:60]),
                    escape(d.collection_path),
                    str(d.version),
                    d.status or "—",
                    escape(d.source_tag or "—"),
                    _when(d.updated_at),
                )
                for d in docs
            ),
            whole=("id",),  # whole: it is what `review approve` takes
        )


@group.command("show")
@command(review=True)
def review_show(
    settings: Settings,
    doc_id: Annotated[str, typer.Argument(help="Document id (see `kbflow review list`).")],
    actor: ActorOpt,
    as_json: JsonOpt = False,
) -> None:
    """A document's metadata and full stored text, chunk by chunk, whatever its status."""
    view = service.inspect(settings, doc_id, actor)
    if as_json:
        print_json({"document": view.doc.to_dict(), "chunks": view.chunks, "text": view.text})
        return
    d = view.doc
    meta = Table.grid(padding=(0, 2))
    meta.add_column(style="dim")
    meta.add_column()
    for key, value in (
        ("id", d.id),
        ("title", d.title),
        ("org / collection", f"{d.org_id} / {d.collection_path}"),
        ("uri", d.uri),
        ("version", str(d.version)),
        ("status", d.status or "—"),
        ("parse status", f"{d.parse_status}, {counted(d.chunk_count, 'chunk')}"),
        ("synthesis run", d.synthesis_run_id or "—"),
        ("source tag", d.source_tag or "—"),
        ("audience", d.audience or "all"),
        ("effective", d.effective_date.isoformat() if d.effective_date else "—"),
        ("approved", f"{d.approved_by} at {_when(d.approved_at)}" if d.approved_by else "—"),
        ("rejected", f"{d.rejected_by} at {_when(d.rejected_at)}" if d.rejected_by else "—"),
        ("edited", f"{d.edited_by} at {_when(d.edited_at)}" if d.edited_by else "—"),
    ):
        meta.add_row(key, escape(value))
    console.print(meta)
    if not view.chunks:
        console.print("[yellow]no chunks stored for this document.[/yellow]")
    for index, text in enumerate(view.chunks, start=1):
        console.rule(f"chunk {index}/{len(view.chunks)}", style="dim")
        console.print(text, markup=False, highlight=False)
    if d.citations:  # its Citations footer: kept with the document, never a chunk
        console.rule(f"citations ({len(d.citations)})", style="dim")
        for line in source_lines(d.citations):
            console.print(line, highlight=False)


def _print_decision(decided: Decided, verb: str, actor: str, as_json: bool) -> None:
    doc = decided.doc
    if as_json:
        print_json(doc.to_dict())
        return
    console.print(
        f"[green]{verb}[/green] {doc.id} “{escape(doc.title)}” ({escape(doc.org_id)}, "
        f"v{doc.version}) by {escape(actor)}: now {doc.status}"
    )
    if decided.via_run:  # a paused review run held the draft: the decision went through it
        console.print(escape(decided.message))


DECIDED_FIRST = (
    "Only a superadmin or the org's assigned account manager may. Exit code 3 means someone else\n"
    "decided first (nothing was changed)."
)


def _draft_decision(verb: Literal["approve", "reject"], done: str, summary: str) -> None:
    """Register ``kbflow review VERB DOC_ID``: one decision on a pending_review draft."""

    @group.command(verb, help=f"{summary}\n\n{DECIDED_FIRST}")
    @command(review=True)
    def decide(
        settings: Settings,
        doc_id: Annotated[str, typer.Argument(help="Document id of a pending_review draft.")],
        actor: ActorOpt,
        note: NoteOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        decided = service.decision(settings, verb, doc_id, actor, note=note)
        _print_decision(decided, done, actor, as_json)


_draft_decision(
    "approve",
    "approved",
    "Approve a draft: it becomes searchable and older versions of its source are superseded.",
)
_draft_decision(
    "reject", "rejected", "Reject a draft: it stays stored for reviewers but is never searchable."
)


@group.command("withdraw")
@command(review=True)
def review_withdraw(
    settings: Settings,
    doc_id: Annotated[str, typer.Argument(help="Document id of an approved document.")],
    actor: ActorOpt,
    note: Annotated[
        str,
        typer.Option("--note", help="Why it is taken out of service (required; audited)."),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Take an approved document out of service: hidden from every search at once, audited
    with your note; `kbflow provenance --stale` then flags the answers that cited it.

    Only a superadmin or the org's assigned account manager may. Exit code 3 means it was no
    longer approved (someone else acted first; nothing was changed).
    """
    decided = service.decision(settings, "withdraw", doc_id, actor, note=note)
    _print_decision(decided, "withdrew", actor, as_json)


@group.command("restore")
@command(review=True)
def review_restore(
    settings: Settings,
    doc_id: Annotated[str, typer.Argument(help="Document id of a withdrawn document.")],
    actor: ActorOpt,
    note: Annotated[
        str,
        typer.Option("--note", help="Why it goes back into service (required; audited)."),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Undo a withdrawal: the withdrawn document's text goes back into service as a new
    approved version (searchable at once, audited with your note; --json prints the new
    version). The withdrawn version stays withdrawn, so `kbflow provenance` still flags the
    answers that cited it.

    Only a superadmin or the org's assigned account manager may. Exit code 3 means it is not
    withdrawn, a newer version of its source is approved (or withdrawn too), or someone else
    acted first (nothing was changed).
    """
    decided = service.decision(settings, "restore", doc_id, actor, note=note)
    _print_decision(decided, f"restored {escape(doc_id)} as", actor, as_json)


@group.command("edit")
@command(review=True)
def review_edit(
    settings: Settings,
    doc_id: Annotated[
        str, typer.Argument(help="Document id of a pending_review draft or an approved document.")
    ],
    actor: ActorOpt,
    file: Annotated[
        Path | None,
        typer.Option("--file", help="Markdown file with the full corrected text ('-': stdin)."),
    ] = None,
    content: Annotated[
        str | None, typer.Option("--content", help="The full corrected text (Markdown).")
    ] = None,
    note: NoteOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replace a document's text with a corrected one, re-chunk and re-embed it, and approve it.

    A draft is approved with the new text; an approved document gets a new approved version
    that supersedes it (in one step: never both, never neither). Give the whole text (--file or
    --content), not a diff. Only a superadmin or the org's assigned account manager may. Exit
    code 3 means someone else decided first.
    """
    decided = service.decision(settings, "edit", doc_id, actor, note=note,
                               content=_edited_text(file, content))  # fmt: skip
    _print_decision(decided, "edited and approved", actor, as_json)


def _edited_text(file: Path | None, content: str | None) -> str:
    if (file is None) == (content is None):
        raise ConfigError(
            "give the corrected text with exactly one of --file PATH or --content TEXT. "
            f"Currently {'both are' if file is not None else 'neither is'} given."
        )
    if content is not None:
        return content
    assert file is not None
    if str(file) == "-":
        return sys.stdin.read()
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the edited text from {str(file)!r}: {exc}. Give a readable UTF-8 "
            "Markdown file."
        ) from exc


@group.command("code")
@command(review=True)
def review_code(
    settings: Settings,
    org: OrgOpt,
    actor: ActorOpt,
    run: Annotated[
        str | None,
        typer.Option("--run", help="Bind the code to one paused review run (its flow run id)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Get a one-time review code: the key that signs a paused review run's decisions.

    Only a superadmin or ORG's assigned account manager gets one. A program signs the exact
    decisions it sends to a paused run with it (`tasks.review.codes.sign_decisions(code,
    run_id, run_input)`) and puts the proof in the form's "code" field; the code itself never
    goes to Prefect (a bare code is refused there). To decide yourself, use the review inbox:
    it resumes the run for you. A code works once, for 15 minutes, for ORG only (and for one
    run, with --run). The registry keeps only its hash.
    """
    issued = service.review_code(settings, org, actor, flow_run_id=run)
    if as_json:
        print_json(
            {
                "code": issued.code,
                "user_id": issued.user_id,
                "org_id": issued.org_id,
                "flow_run_id": issued.flow_run_id,
                "expires_at": issued.expires_at.isoformat(timespec="seconds"),
            }
        )
        return
    console.print(issued.code, highlight=False)
    bound = f" in run {escape(run)}" if run else ""
    err_console.print(
        f"one-time review code for {escape(issued.user_id)} on org {escape(org)}{bound}: "
        f"valid once, until {issued.expires_at:%H:%M:%S} UTC. The review form takes a proof "
        "signed with it, never the code itself (tasks.review.codes.sign_decisions, sent in its "
        '"Your decision proof" field); to decide yourself, use the review inbox '
        "(kbflow serve, /review), which resumes the run for you."
    )


@group.command("flow")
@command(review=True)
def review_flow(
    settings: Settings,
    org: OrgOpt,
    actor: Annotated[
        str | None,
        typer.Option(
            "--as",
            help="Who is expected to decide (named in the run's logs); the reviewer is whoever "
            "the form's review code proves.",
        ),
    ] = None,
    timeout: Annotated[
        int,
        typer.Option(
            "--timeout",
            min=1,
            help="Seconds to wait for the form; then the run fails and nothing changes.",
        ),
    ] = 3600,
    as_json: JsonOpt = False,
) -> None:
    """Run the review flow: it pauses for decisions in the Prefect UI, then applies them.

    Start `kbflow server` in another shell first, then in this one export
    PREFECT_API_URL=http://127.0.0.1:4200/api

    While it waits, the run's id and UI link are printed on stderr: decide in the review inbox
    (`kbflow serve`, /review), or open the run, press Resume, enter a one-time review code
    (`kbflow review code --org ORG --as YOU`), pick approve, edit, reject or skip for each
    draft and submit. The form holds no draft text (read the drafts in the inbox or with
    `kbflow review show`); an edit carries the whole new text. Decisions are checked like
    `kbflow review approve`; a missing or wrong code, or a refused reviewer, ends the run
    Failed with nothing applied (the report still prints, exit code 1).
    """
    from kbflow.flow_cli import running_flow

    with running_flow(err_console):  # incl. ReviewTimeout: nobody answered in time
        report, failure = service.run_review_flow(settings, org, reviewer=actor, timeout_s=timeout)
    if as_json:
        print_json(report)
    else:
        print_report(report)
    if failure:  # it did not do its job (a refused reviewer, only invalid rows): exit 1
        err_console.print(f"[red]review run failed:[/red] {escape(failure)}", soft_wrap=True)
        raise typer.Exit(1)


def print_report(report: Report | dict[str, Any]) -> None:
    """Scalars as `key: value` lines, lists of records as tables, anything else as JSON."""
    if isinstance(report, Report):
        report = report.to_dict()
    for key, value in report.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            table = Table(title=escape(key))
            columns = list(dict.fromkeys(k for row in value for k in row))
            for col in columns:
                table.add_column(escape(col))
            for row in value:
                table.add_row(*(escape(_cell(row.get(col))) for col in columns))
            console.print(table)
        elif isinstance(value, dict | list):
            console.print(f"[dim]{escape(key)}:[/dim] {escape(json.dumps(value, default=str))}")
        else:
            console.print(f"[dim]{escape(key)}:[/dim] {escape(_cell(value))}")


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


def _audit_change(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    was = (before or {}).get("status") or "—"
    now = dict(after or {})
    change = f"{was} → {now.pop('status', None) or '—'}"
    extras = ", ".join(f"{k}={v}" for k, v in now.items())
    return f"{change} ({extras})" if extras else change


@commands.command()
@command
def audit(
    settings: Settings,
    org: MaybeOrgOpt = None,
    doc: Annotated[str | None, typer.Option("--doc", help="Only this document's rows.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show the most recent N rows.")] = 200,
    as_json: JsonOpt = False,
) -> None:
    """An org's audit log: who created, approved, rejected, edited, withdrew or superseded
    what, who assigned its account manager and changed its users, and when. Without --org:
    the agency-wide rows (users and roles of no org, refused admin actions)."""
    rows = service.audit_trail(settings, org, doc, limit=limit)
    if as_json:
        from sinks.registry.audit import audit_dict

        print_json([audit_dict(r) for r in rows])
        return
    title = f"audit log of {escape(org)}" if org else "agency-wide audit log"
    print_table(
        f"{title} ({counted(len(rows), 'row')})",
        ("time", "actor", "action", "doc", "run", "tag", "before → after"),
        (
            (_when(r.at), escape(r.actor), escape(r.action.removeprefix("kb.document.")),
             (r.doc_id or "—")[:12], escape((r.synthesis_run_id or "—")[:12]),
             escape(r.source_tag or "—"), escape(_audit_change(r.before, r.after)))
            for r in rows
        ),
    )  # fmt: skip


@commands.command()
@command
def reconcile(
    settings: Settings,
    org: Annotated[
        str | None, typer.Option("--org", help="Only this org's chunks (default: every org).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Report the drift; change nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Bring the search index in line with the registry (the source of truth).

    Rewrites chunk statuses that differ from the registry's and deletes chunks of documents the
    registry does not know. Safe to run any time; holds the embedded store while it runs.
    """
    report = service.reconcile(settings, org=org, dry_run=dry_run)
    if as_json:
        print_json({**report.to_dict(), "org": org, "dry_run": dry_run})
        return
    where = f" in {escape(org)}" if org else ""
    repaired, removed = len(report.repaired), len(report.orphans_removed)
    if dry_run:
        summary = (
            f"{counted(repaired, 'document')} to repair, {counted(removed, 'chunk')} of "
            "unknown documents to remove (dry run: nothing changed)"
        )
    else:
        summary = (
            f"{counted(repaired, 'document')} repaired, {counted(removed, 'chunk')} of unknown "
            "documents removed"
        )
    checked = (
        f"checked {counted(report.points, 'chunk')} of "
        f"{counted(report.documents, 'document')}{where}"
    )
    console.print(f"{checked}: {summary}")
    verb = ("would repair", "would remove") if dry_run else ("repaired", "removed")
    for item in report.repaired:
        console.print(
            f"  {verb[0]} {item['doc_id']}: {escape(', '.join(item['was']))} → "
            f"{escape(item['now'])}"
        )
    for doc_id in report.orphans_removed:
        console.print(f"  {verb[1]} the chunks of {escape(doc_id)} (not in the registry)")
