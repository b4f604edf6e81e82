"""``kbflow seed``: an account manager's seed bundle for research — files, URLs and free-text
prompts, readable by reviewers and never returned by any search."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from core import ids
from core.errors import KbflowError
from core.settings import Settings
from kbflow.cli.common import (
    ActorOpt,
    JsonOpt,
    OrgOpt,
    checked,
    command,
    counted,
    load_settings,
    print_json,
    print_table,
)
from kbflow.render import console
from kbflow.services.research import runs as service

group = typer.Typer(
    name="seed",
    help="An account manager's seed bundle for research: files, URLs and free-text prompts.",
    invoke_without_command=True,
)


@group.callback()
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
    console.print(f"seeded {counted(result['stored'], 'new input')} for {escape(org)}")
    stored = set(result["doc_ids"])
    for doc in service.list_seeds(settings, org, actor) if stored and actor else []:
        if doc.id in stored:  # what each input is, whole: the file, URL or prompt stored
            kind = (doc.source_tag or "").removeprefix("am_")
            console.print(f"  {doc.id}  {kind:<6} {escape(doc.uri)}", soft_wrap=True)
    for skipped in result["skipped"]:
        console.print(
            f"  [yellow]skipped[/yellow] {escape(skipped['source'])}: {escape(skipped['reason'])}"
        )


@group.command("list")
@command
def seed_list(settings: Settings, org: OrgOpt, actor: ActorOpt, as_json: JsonOpt = False) -> None:
    """List an org's seed inputs (am_file, am_url, am_prompt): for those who may read its
    drafts (a superadmin, its account manager, its experts)."""
    seeds = service.list_seeds(settings, org, actor)
    if as_json:
        print_json([d.to_dict() for d in seeds])
        return
    print_table(
        f"seed inputs of {org} ({len(seeds)})",
        ("id", "tag", "title", "uri"),
        ((d.id, d.source_tag or "", escape(d.title[:60]), escape(d.uri)) for d in seeds),
        whole=("id", "uri"),  # a URI cut short cannot be opened or copied
    )
