"""``kbflow seed`` and ``kbflow research``: an account manager's inputs, and the four drafts
drafted from them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from core import ids
from core.errors import KbflowError
from core.settings import Settings
from kbflow.cli.common import (
    ActorOpt,
    JsonOpt,
    OrgOpt,
    checked,
    command,
    load_settings,
    print_json,
    reported,
)
from kbflow.render import console, err_console
from kbflow.services import research as service

commands = typer.Typer()
"""The top-level commands of this module (merged into ``kbflow``)."""

seed_app = typer.Typer(
    help="An account manager's seed bundle for research: files, URLs and free-text prompts.",
    invoke_without_command=True,
)


@seed_app.callback()
@command
def seed(
    ctx: typer.Context,
    org: Annotated[
        str | None, typer.Option("--org", help="Organisation id.", callback=checked(ids.org_id))
    ] = None,
    file: Annotated[
        list[Path] | None,
        typer.Option(
            "--file",
            help="A file to seed (repeatable; at most 20 in the org's bundle). Symbolic links "
            "are refused.",
        ),
    ] = None,
    url: Annotated[
        list[str] | None, typer.Option("--url", help="A URL to research (repeatable).")
    ] = None,
    prompt: Annotated[
        list[str] | None, typer.Option("--prompt", help="Free-text guidance (repeatable).")
    ] = None,
    actor: Annotated[
        str | None,
        typer.Option("--as", help="Your user id: the org's account manager or a superadmin."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Seed research inputs for an org (`kbflow seed --org ORG --as AM --file F --url U
    --prompt T`).

    Only the org's account manager or a superadmin may. Files are at most 25 MB each and 20
    in the org's bundle as a whole; a command that would pass a limit stores nothing. The
    first http(s) URL is taken as the client's homepage. Inputs are readable by reviewers
    (`kbflow seed list`, `kbflow review show`) and never returned by any search.
    """
    if ctx.invoked_subcommand is not None:  # `seed list`: that command loads the settings
        return
    if not org:
        raise KbflowError("--org is required to seed inputs.")
    settings = load_settings()
    result = service.seed(
        settings, org, actor=actor, files=file or (), urls=url or (), prompts=prompt or ()
    )
    if as_json:
        print_json(result)
        return
    console.print(f"seeded {result['stored']} new input(s) for {escape(org)}")
    for skipped in result["skipped"]:
        console.print(
            f"  [yellow]skipped[/yellow] {escape(skipped['source'])}: {escape(skipped['reason'])}"
        )


@seed_app.command("list")
@command
def seed_list(settings: Settings, org: OrgOpt, actor: ActorOpt, as_json: JsonOpt = False) -> None:
    """List an org's seed inputs (am_file, am_url, am_prompt): for those who may read its
    drafts (a superadmin, its account manager, its experts)."""
    seeds = service.list_seeds(settings, org, actor)
    if as_json:
        print_json([d.to_dict() for d in seeds])
        return
    table = Table(title=f"seed inputs of {org} ({len(seeds)})")
    for col in ("id", "tag", "title", "uri"):
        table.add_column(col)
    for d in seeds:
        table.add_row(d.id, d.source_tag or "", escape(d.title[:60]), escape(d.uri[:60]))
    console.print(table)


@commands.command()
@command
def research(
    settings: Settings,
    org: OrgOpt,
    client_name: Annotated[str, typer.Option("--client-name", help="The client's name.")],
    model: Annotated[
        str | None, typer.Option(help="Anthropic model (default: KB_RESEARCH_MODEL).")
    ] = None,
    budget: Annotated[
        int, typer.Option("--budget", min=1, help="Token budget for the run.")
    ] = service.DEFAULT_BUDGET_TOKENS,
    actor: Annotated[
        str | None,
        typer.Option(
            "--as",
            help="Your user id: the org's account manager or a superadmin (also prefilled as "
            "the reviewer in the review form).",
        ),
    ] = None,
    review_timeout: Annotated[
        int | None,
        typer.Option(
            help="Seconds to wait for the review form (default: 3600 with a Prefect server, "
            "else 0 = don't pause)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Draft the four KB documents for an org from its seed bundle, then pause for review.

    Only the org's account manager or a superadmin may (--as). Uses Anthropic when
    ANTHROPIC_API_KEY is set, else the offline extractive synthesizer. The drafts are
    pending_review (never searchable) until approved. With a Prefect server
    (`kbflow server`, PREFECT_API_URL exported) the run pauses for the review form in the UI;
    without one, review with `kbflow review list/approve/reject`.
    """
    with reported(review=True):  # a refusal says "forbidden", like the review commands
        service.authorize_research(settings, org, actor)
    from kbflow.flow_cli import running_flow

    with running_flow(err_console):
        report = service.run_research(
            settings,
            org,
            client_name=client_name,
            model=model,
            budget_tokens=budget,
            reviewer=actor,
            review_timeout_s=review_timeout,
        )
    # A review that failed (nobody answered, or it refused its reviewer) exits 1 after the
    # report: the drafts are still pending_review.
    review_failed = report.get("review_failed")
    if as_json:
        print_json(report)
        if review_failed:
            err_console.print(f"[red]review failed:[/red] {escape(review_failed)}", soft_wrap=True)
            raise typer.Exit(1)
        return
    if report["budget_exceeded"]:
        # Which cap stopped it (the fetch cap or the token budget) and what raises that one.
        console.print(f"[red]research budget exceeded[/red]: {escape(report['budget_stop'])}")
        for note in report["notes"]:
            console.print(f"  {escape(note)}")
        raise typer.Exit(1)
    console.print(
        f"research run [bold]{report['synthesis_run_id']}[/bold] ({report['synthesizer']}, "
        f"{report['consumed_tokens']} tokens): {len(report['documents'])} drafts pending review"
    )
    for doc_id, doc in zip(report["doc_ids"], report["documents"], strict=False):
        console.print(f"  {doc_id}  {escape(doc['filename'])}")
    for note in report["notes"]:
        console.print(f"  [dim]{escape(note)}[/dim]")
    if review_failed:
        err_console.print(f"[red]review failed:[/red] {escape(review_failed)}", soft_wrap=True)
    if "review" not in report or review_failed:
        console.print(
            f"review them: kbflow review list --org {org} --as USER, then "
            "kbflow review approve|edit|reject DOC_ID --as USER"
        )
    if review_failed:
        raise typer.Exit(1)
