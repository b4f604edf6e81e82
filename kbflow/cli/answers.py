"""``kbflow ask``, ``answer``, ``replay``, ``turns`` and ``provenance``: an agent's answers and the
ledger that records them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from core.errors import KbflowError
from core.settings import Settings
from kbflow.cli.common import (
    AgentOpt,
    JsonOpt,
    command,
    print_json,
    snippet,
    source_lines,
    sources_in,
)
from kbflow.render import console, err_console
from kbflow.services.query import answers as service
from kbflow.services.query.context import open_home
from tasks.text.citations import with_titles

commands = typer.Typer()
"""The top-level commands of this module (merged into ``kbflow``)."""


@commands.command()
@command
def ask(
    settings: Settings,
    queries: Annotated[list[str], typer.Argument(help="1 to 5 research queries.")],
    agent: AgentOpt,
    as_json: JsonOpt = False,
) -> None:
    """Search the agent's knowledge: yes / maybe / no, a cited synthesis and what to do next.

    yes: answer from the synthesis; maybe: use it and research the gaps; no: research live
    (the miss says why). Offline, the synthesis quotes the knowledge's own sentences. The turn
    is recorded in the ledger (`kbflow replay TURN_ID`).
    """
    with open_home(settings, degrade=True) as ctx:
        out = service.ask(ctx, agent, queries)
    if as_json:
        print_json(out)
        return
    colour = {"yes": "green", "maybe": "yellow", "no": "red"}[out["answer_status"]]
    console.print(f"[bold {colour}]{out['answer_status']}[/bold {colour}]  "
                  f"[dim]turn {out['turn_id']}[/dim]")  # fmt: skip
    if out["miss"]:
        console.print(f"[dim]miss: {out['miss']['reason']}: {escape(out['miss']['detail'])}[/dim]")
    sources = sources_in(*(c.get("sources", []) for c in out["citations"]))
    if out["synthesis"]:
        console.print(with_titles(out["synthesis"], sources), markup=False)
    for c in out["citations"]:
        console.print(f"  [dim]{escape(c['chunk_id'])} · {escape(c['uri'])}[/dim]")
    for line in source_lines(sources):
        console.print(f"  [dim]cites[/dim] {line}")
    console.print(f"[italic]{escape(out['steering'])}[/italic]")


@commands.command()
@command
def answer(
    settings: Settings,
    question: Annotated[str, typer.Argument(help="The question.")],
    agent: AgentOpt,
    as_json: JsonOpt = False,
) -> None:
    """Answer from approved knowledge with a citation on every claim, or refuse.

    "No chunk, no answer": when no retrieved chunk reaches KBFLOW_ANSWER_MIN_CONFIDENCE the
    standard refusal comes back with the evidence it lacked (offline, chunks down to
    KBFLOW_ANSWER_EVIDENCE_FLOOR are handed over instead, as an unproven "maybe"). "answered"
    only when a quote of the cited text holds the answer (a value of the asked kind, a table's
    cell with its header, a superlative computed over the rows); otherwise "maybe", with the
    closest evidence and what it lacks. The turn is recorded in the ledger.
    """
    with open_home(settings, degrade=True) as ctx:
        out = service.answer(ctx, agent, question)
    if as_json:
        print_json(out)
        return
    if out["status"] == "refused":
        console.print(f"[yellow]{escape(out['answer'])}[/yellow]")
        r = out["refusal"]
        assert r is not None  # a refusal says why
        console.print(f"[dim]{escape(r['reason'])} · policy {r['policy_id']} v"
                      f"{r['policy_version']} · turn {out['turn_id']}[/dim]")  # fmt: skip
        return
    if out["status"] == "maybe":
        console.print(f"[yellow]Maybe:[/yellow] {escape(out.get('missing') or '')}")
    # A draft's citation tags read as their sources' titles; the sources follow.
    sources = sources_in(*(c.get("sources", []) for c in out["citations"]))
    console.print(with_titles(out["answer"], sources), markup=False)
    for line in source_lines(sources):
        console.print(f"[dim]cites[/dim] {line}")
    console.print(f"[dim]turn {out['turn_id']} · {out['model']}[/dim]")


@commands.command()
@command
def replay(
    settings: Settings,
    turn_id: Annotated[str, typer.Argument(help="A turn id from `kbflow ask/answer`.")],
    prompt: Annotated[
        Path | None,
        typer.Option(help="A system prompt file to replay with instead of the recorded one."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-run a recorded turn's synthesis on its recorded chunks (no retrieval, no embedding)
    and show the diff. Exit code 1 when the replay differs."""
    try:
        system = prompt.read_text(encoding="utf-8") if prompt else None
    except OSError as exc:
        raise KbflowError(f"cannot read --prompt {prompt}: {exc.strerror}") from exc
    result, note = service.replay(settings, turn_id, system)
    if as_json:
        print_json({"turn_id": turn_id, "model": result.model, "identical": result.identical,
                    "recorded": result.recorded, "replayed": result.replayed,
                    "diff": result.diff(), "note": note})  # fmt: skip
    else:
        if note:
            err_console.print(f"[dim]note: {escape(note)}[/dim]")
        if result.identical:
            console.print(f"[green]identical[/green]: {turn_id} replays byte for byte "
                          f"({result.model})")  # fmt: skip
        else:
            console.print(result.diff(), markup=False, highlight=False)
    if not result.identical:
        raise typer.Exit(1)


@commands.command()
@command
def turns(
    settings: Settings,
    org: Annotated[str | None, typer.Option(help="Only this org's turns.")] = None,
    since: Annotated[
        str | None, typer.Option(help="Only turns since: 7d, 12h, 30m, 2w or an ISO date.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List recent ask/answer turns from the ledger, newest first."""
    rows = service.turns(settings, org=org, since=since, limit=limit)
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("[dim]no turn recorded yet.[/dim]")
        return
    for r in rows:
        console.print(f"{r['created_at']:%Y-%m-%d %H:%M} {r['turn_id']} {r['kind']:<6} "
                      f"{r['outcome']:<8} {escape(r['agent_id'])}  "
                      f"{escape(snippet(r['question'], 80))}")  # fmt: skip


@commands.command()
@command
def provenance(
    settings: Settings,
    doc: Annotated[
        str | None, typer.Option(help="The document id whose citing answers to list.")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Only answers since: 7d, 12h, 30m, 2w or an ISO date.")
    ] = None,
    stale: Annotated[
        bool,
        typer.Option(
            help="Only answers citing documents later rejected, superseded, withdrawn or changed."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """List the recorded answers that cited a document, flagging those to revisit."""
    rows = service.provenance(settings, doc=doc, since=since, stale=stale)
    if as_json:
        print_json(rows)
        return
    if not rows and doc is not None:  # a known document: the service refuses an unknown id
        which = ("citing it needs revisiting" if stale else "cites it") + (
            f" (since {since})" if since else ""
        )
        console.print(f"[dim]document {escape(doc)}: no recorded answer {escape(which)}.[/dim]")
        return
    if not rows:
        console.print("[dim]no recorded answer matches.[/dim]")
        return
    for r in rows:
        flag = f"[red]revisit: {escape(r['stale'])}[/red]" if r["stale"] else "[green]ok[/green]"
        console.print(f"{r['created_at']:%Y-%m-%d %H:%M} {r['turn_id']} {r['kind']} "
                      f"{escape(r['agent_id'])} {flag}")  # fmt: skip
        console.print(f"   {escape(snippet(r['question'], 100))}  [dim]cites "
                      f"{escape(r['chunk_id'])} ({escape(r['doc_id'])})[/dim]")  # fmt: skip
