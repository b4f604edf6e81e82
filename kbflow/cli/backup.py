"""``kbflow backup`` (+ ``verify``, ``list``) and ``kbflow restore``: a home's registry, vectors,
ledger, warehouse and files, copied consistently with a manifest, checked, and put back
(`kbflow.services.backup.backups`, `kbflow.services.backup.restore`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from core.settings import Settings
from kbflow.cli.common import JsonOpt, MaybeOrgOpt, command, counted, print_json, print_table
from kbflow.render import console
from kbflow.services.backup import backups
from kbflow.services.backup import restore as restores

commands = typer.Typer()

group = typer.Typer(
    name="backup",
    help="Back up this home: `kbflow backup [--to DIR]`; then `backup verify DIR`, "
    "`backup list`, and `kbflow restore DIR`.",
    invoke_without_command=True,
    no_args_is_help=False,
)

BackupDirArg = Annotated[
    Path, typer.Argument(help="A backup folder (see `kbflow backup list`).", show_default=False)
]
RestoreActorOpt = Annotated[
    str | None,
    typer.Option("--as", help="Your user id: a superadmin of this home (needed with --org)."),
]
KeyFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--key-file",
        help="The backup-key of the home that made the backup (default: this home's "
        "<KBFLOW_HOME>/backup-key). Needed for a backup from another home or machine.",
    ),
]


@group.callback()
@command
def backup_home(
    ctx: typer.Context,
    settings: Settings,
    to: Annotated[
        Path | None,
        typer.Option(
            "--to",
            help="The backup's folder (must not exist). Default: <KBFLOW_HOME>/backups/<UTC "
            "time>. Files unchanged since the newest backup beside it are hard-linked from it.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Back up the registry, the vectors, the ledger, the eval warehouse, uploads, models and
    keys into one folder with a manifest, while `kbflow serve` and flows keep writing.

    The folder appears only once it is whole (it is written as DIR.partial, then renamed); a
    stopped backup leaves the earlier ones as they were.
    """
    if ctx.invoked_subcommand is not None:
        return
    report = backups.backup(settings, to)
    if as_json:
        print_json(report)
        return
    console.print(
        f"backed up {escape(str(settings.home))} to [bold]{escape(report.path)}[/bold] in "
        f"{report.seconds:.1f}s: {_size(report.bytes)}"
        + (f" ({_size(report.linked_bytes)} linked from the previous backup)"
           if report.linked_bytes else "")
    )  # fmt: skip
    print_table(
        "parts",
        ("part", "kind", "files", "bytes", "linked", "counts"),
        (
            (name, part.kind, str(part.files), _size(part.bytes), _size(part.linked_bytes),
             escape(_counts(part.counts)))
            for name, part in report.parts.items()
        ),
    )  # fmt: skip


@group.command("verify")
@command
def backup_verify(
    settings: Settings, path: BackupDirArg, key_file: KeyFileOpt = None, as_json: JsonOpt = False
) -> None:
    """Check a backup without restoring it: its manifest's signature (this home's backup-key,
    or --key-file), every file's bytes and sha256, and the counts its copies hold, against its
    manifest. Exits 1 naming what differs: a missing or bad signature, a part, a link, or no
    manifest (an unfinished backup)."""
    report = restores.verify_backup(path, restores.restore_key(settings, key_file))
    if as_json:
        print_json(report)
        return
    console.print(
        f"[green]ok[/green]: {escape(report.path)} ({counted(report.files, 'file')}, "
        f"{_size(report.bytes)}, made {report.created_at} by kbflow {report.kbflow_version}, "
        f"schema {report.schema_version}) matches its manifest"
    )


@group.command("list")
@command
def backup_list(
    settings: Settings,
    folder: Annotated[
        Path | None,
        typer.Option("--in", help="Where to look (default <KBFLOW_HOME>/backups)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """The finished backups in a folder, oldest first (unfinished ones are not listed)."""
    found = backups.list_backups(settings, folder)
    if as_json:
        print_json(found)
        return
    print_table(
        f"backups ({len(found)})",
        ("path", "created", "bytes", "documents", "points"),
        (
            (escape(b["path"]), str(b["created_at"]), _size(b["bytes"]), str(b["documents"]),
             str(b["points"]))
            for b in found
        ),
    )  # fmt: skip


@commands.command("restore")
@command
def restore(
    settings: Settings,
    path: BackupDirArg,
    org: MaybeOrgOpt = None,
    actor: RestoreActorOpt = None,
    key_file: KeyFileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Restore a backup (verified first, its signature too) into an EMPTY home, or with --org
    one org of it into a home that has no such org (--as a superadmin of this home). A home
    that is not empty is refused, and nothing is changed.
    """
    report = restores.restore(settings, path, org=org, actor=actor, key_file=key_file)
    if as_json:
        print_json(report)
        return
    what = f"org [bold]{escape(org)}[/bold] of " if org else ""
    console.print(
        f"restored {what}{escape(report.path)} into {escape(report.home)}: "
        f"{escape(_counts(report.counts))}"
    )


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _counts(counts: dict[str, object]) -> str:
    """A part's counts on one short line (the per-org ones are in ``--json``)."""
    shown = []
    for key, value in counts.items():
        if key in ("points_per_org", "documents_per_org", "schema_version"):
            continue
        if isinstance(value, dict):
            value = " ".join(f"{k}={v}" for k, v in value.items())
        shown.append(f"{key}: {value}")
    return ", ".join(shown)
