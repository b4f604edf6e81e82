"""``kbflow research``: the four KB drafts of an org, drafted from its seed bundle (``kbflow
seed``) and paused for review."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from core.settings import Settings
from kbflow.cli.common import JsonOpt, OrgOpt, command, counted, print_json, reported
from kbflow.render import console, err_console
from kbflow.services.research import runs as service

commands = typer.Typer()
"""The top-level commands of this module (merged into ``kbflow``)."""


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
    review_failed = report.review_failed
    if as_json:
        print_json(report)
        if review_failed:
            err_console.print(f"[red]review failed:[/red] {escape(review_failed)}", soft_wrap=True)
            raise typer.Exit(1)
        return
    if report.budget_exceeded:
        # Which cap stopped it (the fetch cap or the token budget) and what raises that one.
        console.print(f"[red]research budget exceeded[/red]: {escape(report.budget_stop or '')}")
        for note in report.notes:
            console.print(f"  {escape(note)}")
        raise typer.Exit(1)
    reviewed = report.review
    decided = {o.doc_id: o for o in reviewed.outcomes if o.result == "applied"} if reviewed else {}
    waiting = len(report.documents) - len(decided)
    summary = f"{counted(len(report.documents), 'draft')}, {waiting} pending review"
    if reviewed is not None:
        summary += f"; {reviewed.reviewer or 'nobody'} decided {len(decided)}"
    console.print(
        f"research run [bold]{report.synthesis_run_id}[/bold] ({report.synthesizer}, "
        f"{counted(report.consumed_tokens, 'token')}): {summary}"
    )
    for doc_id, doc in zip(report.doc_ids, report.documents, strict=False):
        outcome = decided.get(doc_id)
        state = f"{outcome.action}: {outcome.status}" if outcome else "pending_review"
        console.print(f"  {doc_id}  {escape(doc.filename)}  ({state})")
    for note in report.notes:
        console.print(f"  [dim]{escape(note)}[/dim]")
    if review_failed:
        err_console.print(f"[red]review failed:[/red] {escape(review_failed)}", soft_wrap=True)
    if report.review is None or review_failed:
        console.print(
            f"review them: kbflow review list --org {org} --as USER, then "
            "kbflow review approve|edit|reject DOC_ID --as USER"
        )
    if review_failed:
        raise typer.Exit(1)
