"""Backups of a kbflow home (`kbflow backup`, `kbflow backup verify`, `kbflow backup list`).

A backup is a folder: one copy per part, then ``manifest.json``, written last::

    registry.db                       the registry (SQLite's online backup API)
    vectors/…                         the Qdrant Edge shard, copied by its owner under its lock
                                      (or vectors.jsonl: every point of a Qdrant server)
    warehouse/kbflow_ledger.duckdb    the answer ledger (checkpointed under its writers' lock)
    warehouse/kbflow.duckdb           the eval warehouse
    files/uploads/…, files/models/…, files/jobs/…, files/prefect-auth
    manifest.json                     versions, and per part its files (bytes, sha256) and counts

It is written into ``DIR.partial`` and renamed to ``DIR`` once the manifest is in: a backup
killed at any instant leaves no folder that looks finished (``verify`` refuses one without a
manifest), and the previous backups are never touched. A file whose source is unchanged since
the previous backup beside it (same size and mtime) is hard-linked from that backup: a second
backup of an unchanged home writes almost nothing. `kbflow.services.backup_parts` says how
each part is copied consistently (`sinks.snapshot` does the copying).

Restoring lives in `kbflow.services.restore`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import Field

from core import faults
from core.contracts import Report
from core.errors import ConfigError, NotFound, StoreError
from core.settings import Settings
from kbflow.services.backup_parts import (
    part_steps,
)
from sinks.snapshot import FileRecord

MANIFEST = "manifest.json"
FORMAT = 1
PARTIAL = ".partial"
BACKUPS_DIR = "backups"


class PartSummary(Report):
    """One part of a backup: what it holds, its size, and its counts."""

    kind: str
    files: int
    bytes: int
    linked_bytes: int = 0
    counts: dict[str, Any] = Field(default_factory=dict)


class BackupReport(Report):
    """A finished backup."""

    path: str
    created_at: str
    seconds: float
    bytes: int
    linked_bytes: int
    previous: str | None = None
    parts: dict[str, PartSummary]


def manifest_of(path: Path) -> dict[str, Any]:
    """A backup's manifest.

    Raises:
        NotFound: ``path`` is no folder, or has no manifest (an unfinished backup).
        StoreError: the manifest is unreadable or of another format.
    """
    if not path.is_dir():
        raise NotFound(f"no backup at {path}: it is not a folder — see `kbflow backup list`")
    file = path / MANIFEST
    if not file.is_file():
        raise NotFound(
            f"{path} has no {MANIFEST}: it is not a finished backup (a backup that was stopped "
            "mid-way leaves one like it) — use another backup (`kbflow backup list`)"
        )
    try:
        manifest: dict[str, Any] = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"the manifest of {path} is unreadable: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise StoreError(
            f"{path} is a backup of format {manifest.get('format')!r}; this kbflow reads "
            f"format {FORMAT} — use the kbflow version that wrote it "
            f"({manifest.get('kbflow_version')})"
        )
    return manifest


def backup(settings: Settings, to: Path | None = None) -> BackupReport:
    """Back up ``settings.home`` (and its configured stores) into the folder ``to``.

    Args:
        to: A folder that does not exist yet; default ``<home>/backups/<UTC time>``.

    Raises:
        ConfigError: ``to`` exists already.
        NotFound: the home has no registry (nothing to back up).
        StoreBusy: the embedded store stayed held by a process that does not serve it.
    """
    started = time.perf_counter()
    created = dt.datetime.now(dt.UTC)
    dest = (to or settings.home / BACKUPS_DIR / created.strftime("%Y%m%dT%H%M%S%fZ")).resolve()
    if dest.exists():
        raise ConfigError(f"{dest} already exists: back up into a new folder (--to DIR)")
    previous = latest_backup(dest.parent)
    partial = dest.with_name(dest.name + PARTIAL)
    if partial.exists():  # what a killed backup left: never a finished one
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    prev_parts = previous[1].get("parts", {}) if previous else {}
    prev_root = previous[0] if previous else None
    parts: dict[str, dict[str, Any]] = {}
    try:
        for name, step in part_steps():
            before = prev_parts.get(name, {})
            linked = _by_path(before) if before.get("kind") else {}
            base = prev_root / before["root"] if prev_root and before.get("root") else None
            part = step(settings, partial, linked, base)
            if part is not None:
                parts[name] = part
            faults.point("backup.after_part")
    except Exception:  # a failed part: nothing half-written stays (a kill leaves DIR.partial)
        shutil.rmtree(partial, ignore_errors=True)
        raise
    manifest = {
        "format": FORMAT,
        "kbflow_version": _version(),
        "schema_version": parts.get("registry", {}).get("counts", {}).get("schema_version"),
        "schema_head": schema_head(),
        "created_at": created.isoformat(),
        "source": _source_kind(settings),
        "previous": previous[0].name if previous else None,
        "parts": parts,
    }
    _write_last(partial / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    faults.point("backup.before_rename")
    os.rename(partial, dest)
    _fsync_dir(dest.parent)
    return BackupReport(
        path=str(dest),
        created_at=manifest["created_at"],
        seconds=round(time.perf_counter() - started, 3),
        bytes=sum(f["bytes"] for p in parts.values() for f in p["files"]),
        linked_bytes=sum(f["bytes"] for p in parts.values() for f in p["files"] if f["linked"]),
        previous=manifest["previous"],
        parts={name: summary(part) for name, part in parts.items()},
    )


def summary(part: dict[str, Any]) -> PartSummary:
    """A manifest part, summed up."""
    files = part["files"]
    return PartSummary(
        kind=part["kind"],
        files=len(files),
        bytes=sum(f["bytes"] for f in files),
        linked_bytes=sum(f["bytes"] for f in files if f["linked"]),
        counts=part.get("counts", {}),
    )


def list_backups(settings: Settings, folder: Path | None = None) -> list[dict[str, Any]]:
    """The finished backups in ``folder`` (default ``<home>/backups``), oldest first: ``path``,
    ``created_at``, ``bytes``, ``documents`` and ``points``."""
    root = folder or settings.home / BACKUPS_DIR
    found = []
    for path, manifest in _backups_in(root):
        parts = manifest.get("parts", {})
        docs = parts.get("registry", {}).get("counts", {}).get("documents", {})
        found.append(
            {
                "path": str(path),
                "created_at": manifest.get("created_at"),
                "bytes": sum(f["bytes"] for p in parts.values() for f in p["files"]),
                "documents": sum(docs.values()),
                "points": parts.get("vectors", {}).get("counts", {}).get("points", 0),
            }
        )
    return sorted(found, key=lambda b: str(b["created_at"]))


def prune_backups(settings: Settings, folder: Path | None = None, *, keep: int) -> list[Path]:
    """Remove the oldest finished backups in ``folder`` (default ``<home>/backups``) beyond the
    newest ``keep``, and what stopped backups left there (``*.partial`` a day old); returns
    what it removed.

    A file hard-linked into a newer backup stays there: removing a backup never damages another.

    Raises:
        ConfigError: ``keep`` is below 1.
    """
    if keep < 1:
        raise ConfigError(f"keep must be at least 1. Currently, the keep is {keep}")
    root = folder or settings.home / BACKUPS_DIR
    found = sorted(_backups_in(root), key=lambda b: str(b[1].get("created_at")))
    doomed = [path for path, _ in found[:-keep]]
    if root.is_dir():  # a day old: stopped, never one still being written
        stale = time.time() - 86_400
        doomed += [
            p
            for p in root.glob(f"*{PARTIAL}")
            if p.is_dir() and not p.is_symlink() and p.stat().st_mtime < stale
        ]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def latest_backup(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest finished backup in ``folder`` and its manifest, if any."""
    found = sorted(_backups_in(folder), key=lambda b: str(b[1].get("created_at")))
    return found[-1] if found else None


def _backups_in(folder: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    if not folder.is_dir():
        return
    for path in sorted(folder.iterdir()):
        if path.is_dir() and not path.is_symlink() and (path / MANIFEST).is_file():
            try:
                yield path, manifest_of(path)
            except (NotFound, StoreError):
                continue


def _by_path(part: dict[str, Any]) -> dict[str, FileRecord]:
    return {f["path"]: f for f in part.get("files", [])}


def _source_kind(settings: Settings) -> dict[str, str]:
    registry = "sqlite" if settings.registry_url.startswith("sqlite") else "postgresql"
    return {
        "registry": registry,
        "vectors": "qdrant-server" if settings.stores.qdrant_url else "qdrant-edge",
        "warehouse": "database" if settings.stores.warehouse_url else "duckdb",
        "deployment": "server" if settings.stores.qdrant_url else "edge",
    }


def schema_head() -> str:
    """The registry schema revision this kbflow migrates to (Alembic's head)."""
    from alembic.script import ScriptDirectory

    from sinks.registry.base import _MIGRATIONS

    head = ScriptDirectory(str(_MIGRATIONS)).get_current_head()
    return str(head)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kbflow")
    except PackageNotFoundError:
        return "unknown"


def _write_last(path: Path, text: str) -> None:
    with path.open("w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temporary folder for the block, removed after."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
