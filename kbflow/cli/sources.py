"""``kbflow sources``: knowledge synced from where it lives — a folder or bucket, a website, a
SQL table, a REST API — on demand or on a schedule (docs/SOURCES.md).

Adding, changing, removing and syncing a source needs ``--as`` the org's account manager or a
superadmin (a local folder: a superadmin). Credentials never go on the command line: S3 reads
``AWS_*`` from the environment, SQL and REST name the environment variable that holds them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.markup import escape

from core.errors import ConfigError
from core.settings import Settings
from kbflow.cli.common import (
    JsonOpt,
    MaybeOrgOpt,
    OrgAdminOpt,
    OrgOpt,
    command,
    command_group,
    counted,
    print_json,
    print_table,
)
from kbflow.render import console, err_console, progress_bar
from kbflow.services.catalog import documents as catalog
from kbflow.services.sources import definitions as service
from kbflow.services.sources import sync as source_runs
from tasks.sources import KINDS

group = command_group(
    "sources", "Sources synced from where knowledge lives: folders, buckets, websites, SQL, REST."
)

NameArg = Annotated[str, typer.Argument(help="The source's name (or its id).")]
KindOpt = Annotated[
    str,
    typer.Option(
        "--kind",
        help=f"One of {', '.join(KINDS)} (filesystem: a folder, s3://, gs:// or az://); each "
        "kind's keys: docs/SOURCES.md.",
    ),
]
ConfigOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="A config value KEY=VALUE (repeat; VALUE may be JSON), e.g. --set url=s3://b/docs "
        "--set endpoint_url=http://minio:9000. See docs/SOURCES.md for each kind's keys.",
    ),
]
ConfigJsonOpt = Annotated[
    str | None,
    typer.Option("--config", help="The whole config as a JSON object (or @file.json)."),
]
UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Shorthand: filesystem url (folder or bucket), website sitemap (…/sitemap.xml) or "
        "start URL.",
    ),
]
CollectionOpt = Annotated[str, typer.Option(help="Collection its documents go to.")]
StatusOpt = Annotated[
    str,
    typer.Option(
        help="Status its documents enter with: pending_review (an AM approves each) or approved "
        "(a trusted source).",
    ),
]
AudienceOpt = Annotated[str | None, typer.Option(help="Audience its documents are tagged for.")]
IncludeOpt = Annotated[
    list[str] | None,
    typer.Option("--include", help="Only items whose key matches this glob (repeat)."),
]
ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option("--exclude", help="Skip items whose key matches this glob (repeat)."),
]
MaxItemsOpt = Annotated[int, typer.Option(help="Items synced at most (a cap stops the walk).")]
MaxBytesOpt = Annotated[int, typer.Option(help="Largest item read, in bytes.")]
ScheduleOpt = Annotated[
    str | None,
    typer.Option(help="Cron for scheduled syncs, e.g. '0 6 * * *' (see `sources schedule`)."),
]
TimezoneOpt = Annotated[str | None, typer.Option(help="The schedule's timezone (IANA name).")]


def _config(
    kind: str | None, url: str | None, pairs: list[str] | None, raw: str | None
) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if raw:
        text = raw
        if raw.startswith("@"):
            from pathlib import Path

            text = Path(raw[1:]).read_text(encoding="utf-8")
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config is not JSON: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError("--config must be a JSON object")
        config.update(loaded)
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair!r}: write KEY=VALUE")
        try:
            config[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            config[key.strip()] = value
    if url:
        if kind == "website":
            config["sitemap" if url.rstrip("/").endswith(".xml") else "start_url"] = url
        else:
            config["url"] = url
    return config


@group.command("add")
@command
def sources_add(
    settings: Settings,
    org: OrgOpt,
    name: Annotated[str, typer.Argument(help="A name for the source, unique in the org.")],
    kind: KindOpt,
    collection: CollectionOpt,
    url: UrlOpt = None,
    config: ConfigOpt = None,
    config_json: ConfigJsonOpt = None,
    status: StatusOpt = "pending_review",
    audience: AudienceOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    max_items: MaxItemsOpt = 10_000,
    max_item_bytes: MaxBytesOpt = 50_000_000,
    schedule: ScheduleOpt = None,
    timezone: TimezoneOpt = None,
    as_json: JsonOpt = False,
    actor: OrgAdminOpt = None,
) -> None:
    """Add a source to an org. Nothing is read until `kbflow sources sync NAME` (or its
    schedule). Needs --as the org's account manager or a superadmin (a local folder: a
    superadmin)."""
    fields = service.source_fields(
        kind, _config(kind, url, config, config_json),
        collection=catalog.collection_path(settings, org, collection), status=status,
        audience=audience, include=include, exclude=exclude, max_items=max_items,
        max_item_bytes=max_item_bytes, schedule=schedule, timezone=timezone,
    )  # fmt: skip
    made = service.add_source(settings, org, name, fields, actor=actor)
    if as_json:
        print_json(made.to_dict())
        return
    console.print(
        f"added source {escape(made.name)} ({made.kind}, id {made.id}) to org {made.org_id}: "
        f"documents enter {made.collection} as {made.status}. Sync it with `kbflow sources "
        f"sync {escape(made.name)} --org {made.org_id} --as {escape(made.created_by)}`."
    )


@group.command("list")
@command
def sources_list(settings: Settings, org: MaybeOrgOpt = None, as_json: JsonOpt = False) -> None:
    """List sources (one org's with --org) with their last sync."""
    found = service.list_sources(settings, org)
    if as_json:
        print_json(found)
        return
    print_table(
        f"Sources ({len(found)})",
        ["name", "org", "kind", "collection", "status", "last sync", "items", "failed"],
        (
            [
                escape(s["name"]),
                s["org_id"],
                s["kind"],
                escape(s["collection"]),
                s["status"],
                _last(s),
                str(s["items"]["present"]),
                str(s["items"]["failed"]),
            ]
            for s in found
        ),
        right=["items", "failed"],
        whole=["name"],
    )


def _last(source: service.SourceView) -> str:
    last = source.get("last_sync") or {}
    if not last:
        return "never"
    when = str(last.get("finished_at") or last.get("started_at") or "")[:19].replace("T", " ")
    return f"{last.get('outcome', '?')} {when}".strip()


@group.command("show")
@command
def sources_show(
    settings: Settings, name: NameArg, org: MaybeOrgOpt = None, as_json: JsonOpt = False
) -> None:
    """One source: its settings, last sync (counts, errors), items and next scheduled run."""
    found = service.get_source(settings, name, org)
    if as_json:
        print_json(found)
        return
    last = found.get("last_sync") or {}
    lines = [
        f"[bold]{escape(found['name'])}[/bold]  {found['kind']}  id {found['id']}  org "
        f"{found['org_id']}",
        f"  config      {escape(json.dumps(found['config'], sort_keys=True))}",
        f"  enters      {escape(found['collection'])} as {found['status']}"
        + (f", audience {escape(found['audience'])}" if found["audience"] else ""),
        f"  patterns    include {found['include'] or 'all'}, exclude {found['exclude'] or 'none'}",
        f"  caps        {counted(found['max_items'], 'item', grouped=True)}, "
        f"{counted(found['max_item_bytes'], 'byte', grouped=True)} an item",
        f"  schedule    {escape(found['schedule'] or 'none')}"
        + (f" ({found['timezone'] or 'UTC'}), next {found['next_run']}" if found["schedule"]
           else ""),
        f"  items       {found['items']['present']} present, {found['items']['failed']} failed, "
        f"{found['items']['gone']} gone from the source",
        f"  last sync   {_last(found)}" + (" (running now)" if found["running"] else ""),
    ]  # fmt: skip
    counts = last.get("counts") or {}
    if counts:
        lines.append("  counts      " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if last.get("error"):
        lines.append(f"  error       {escape(str(last['error']))}")
    if last.get("withdraw_held"):
        lines.append(f"  [yellow]held[/yellow]        {escape(last['withdraw_held']['message'])}")
    for err in (last.get("errors") or [])[:20]:
        lines.append(f"  [red]failed[/red]      {escape(err['key'])}: {escape(err['error'])}")
    for line in lines:
        console.print(line, soft_wrap=True)


@group.command("update")
@command
def sources_update(
    settings: Settings,
    name: NameArg,
    org: MaybeOrgOpt = None,
    url: UrlOpt = None,
    config: ConfigOpt = None,
    config_json: ConfigJsonOpt = None,
    collection: Annotated[str | None, typer.Option(help="New collection.")] = None,
    status: Annotated[str | None, typer.Option(help="approved or pending_review.")] = None,
    audience: AudienceOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    max_items: Annotated[int | None, typer.Option(help="New item cap.")] = None,
    max_item_bytes: Annotated[int | None, typer.Option(help="New item size cap.")] = None,
    schedule: Annotated[str | None, typer.Option(help="New cron; '' removes the schedule.")] = None,
    timezone: TimezoneOpt = None,
    as_json: JsonOpt = False,
    actor: OrgAdminOpt = None,
) -> None:
    """Change a source. Items the new patterns or caps leave out are withdrawn at the next
    complete sync; a new collection or status applies to items synced from then on."""
    found = service.get_source(settings, name, org)
    changes: dict[str, Any] = {}
    cfg = _config(found["kind"], url, config, config_json)
    if cfg:
        changes["config"] = cfg
    for key, value in (
        ("collection", collection), ("status", status), ("audience", audience),
        ("include", include), ("exclude", exclude), ("max_items", max_items),
        ("max_item_bytes", max_item_bytes), ("schedule", schedule), ("timezone", timezone),
    ):  # fmt: skip
        if value is not None:
            changes[key] = value
    if collection:  # a collection's name: its path
        changes["collection"] = catalog.collection_path(settings, found["org_id"], collection)
    done = service.update_source(settings, found["id"], None, changes, actor=actor)
    if as_json:
        print_json(done.to_dict())
        return
    console.print(f"updated source {escape(done.name)} ({', '.join(sorted(changes))})")


@group.command("remove")
@command
def sources_remove(
    settings: Settings,
    name: NameArg,
    org: MaybeOrgOpt = None,
    withdraw: Annotated[
        bool,
        typer.Option(help="Also take its documents out of service (audited: removed at source)."),
    ] = False,
    as_json: JsonOpt = False,
    actor: OrgAdminOpt = None,
) -> None:
    """Remove a source and its sync state. Its documents stay in service unless --withdraw."""
    done = service.remove_source(settings, name, org, actor=actor, withdraw=withdraw)
    if as_json:
        print_json(done)
        return
    console.print(
        f"removed source {escape(done['name'])} (org {done['org_id']}); "
        + (
            f"{counted(done['withdrawn'], 'document')} withdrawn"
            if withdraw
            else "its documents stay"
        )
    )


@contextmanager
def _sync_progress(enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    with progress_bar() as bar:
        task = bar.add_task("sync: items walked", total=None)

        def on_progress(stage: str, by: int, total: int | None) -> None:
            if stage == "sync":
                bar.advance(task, by)

        yield on_progress


@group.command("sync")
@command
def sources_sync(
    settings: Settings,
    name: NameArg,
    org: MaybeOrgOpt = None,
    as_json: JsonOpt = False,
    actor: OrgAdminOpt = None,
    confirm_withdraw: Annotated[
        bool,
        typer.Option(
            "--confirm-withdraw",
            help="Withdraw the items gone from the source even when more than "
            "KBFLOW_SOURCES_MAX_WITHDRAW_RATIO of them are (a sync holds such a deletion storm "
            "back until you confirm; audited).",
        ),
    ] = False,
) -> None:
    """Sync a source now: new and changed items are ingested as new versions, unchanged ones
    skipped, items gone from the source withdrawn (past KBFLOW_SOURCES_MAX_WITHDRAW_RATIO of
    them, none until --confirm-withdraw). A failing item is reported and the rest syncs. Exits
    1 when an item failed or the source could not be listed."""
    with _sync_progress(not as_json and err_console.is_terminal) as listener:
        summary = source_runs.sync(settings, name, org, actor=actor, progress=listener,
                                   confirm_withdraw=confirm_withdraw)  # fmt: skip
    if as_json:
        print_json(summary)
    else:
        counts = summary.counts.to_dict()
        console.print(
            f"synced {escape(name)}: " + ", ".join(f"{k} {v}" for k, v in counts.items())
            + ("" if summary.complete else " (a cap stopped the walk: nothing withdrawn)")
        )  # fmt: skip
        for err in summary.errors[:20]:
            console.print(f"[red]failed[/red] {escape(err.key)}: {escape(err.error)}")
        if summary.withdraw_held is not None:
            err_console.print(f"[yellow]held[/yellow] {escape(summary.withdraw_held.message)}")
    if summary.counts.failed:
        raise typer.Exit(1)


@group.command("schedule")
@command
def sources_schedule(
    settings: Settings, org: MaybeOrgOpt = None, as_json: JsonOpt = False, actor: OrgAdminOpt = None
) -> None:
    """Put each source's cron on the `source-sync` deployment of the Prefect server your
    workers use (PREFECT_API_URL or `kbflow server`): one schedule a source, visible in the UI.
    Run it again after adding, changing or removing a schedule. Needs the deployment
    (`prefect deploy -n source-sync`)."""
    done = source_runs.schedule(settings, org, actor=actor)
    if as_json:
        print_json(done)
        return
    print_table(
        f"Scheduled sources ({len(done)})",
        ["source", "org", "cron", "timezone", "next run"],
        ([escape(d["source"]), d["org_id"], d["cron"], d["timezone"], str(d["next_run"])]
         for d in done),
    )  # fmt: skip
