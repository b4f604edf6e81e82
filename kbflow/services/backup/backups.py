"""Backups of a kbflow home (`kbflow backup`, `kbflow backup verify`, `kbflow backup list`).

A backup is a folder: one copy per part, then ``manifest.json``, written last::

    registry.db                       the registry (SQLite's online backup API)
    vectors/…                         the Qdrant Edge shard, copied by its owner under its lock
                                      (or vectors.jsonl: every point of a Qdrant server)
    warehouse/kbflow_ledger.duckdb    the answer ledger (checkpointed under its writers' lock)
    warehouse/kbflow.duckdb           the eval warehouse
    files/uploads/…, files/models/…, files/jobs/…, files/prefect-auth
    manifest.json                     versions, and per part its files (bytes, sha256) and counts

The manifest is signed (HMAC-SHA256) with the home's ``backup-key`` (made 0600 on first use,
never put into a backup): `kbflow.services.backup.restore` trusts a manifest only when it verifies
against the restoring home's key, or the key given with ``--key-file``. Backups are private:
folders 0700, files 0600, whatever the umask.

It is written into ``DIR.partial`` and renamed to ``DIR`` once the manifest is in: a backup
killed at any instant leaves no folder that looks finished (``verify`` refuses one without a
manifest), and the previous backups are never touched. A file whose source is unchanged since
the previous backup beside it (same size and mtime) is hard-linked from that backup: a second
backup of an unchanged home writes almost nothing. `kbflow.services.backup._parts` says how
each part is copied consistently (`sinks.snapshot` does the copying).

Restoring lives in `kbflow.services.backup.restore`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import Field

from core import faults
from core.contracts import Report
from core.errors import ConfigError, NotFound, StoreError
from core.settings import Settings, make_private_dir
from kbflow.services.backup._parts import (
    part_steps,
)
from kbflow.services.backup.types import BackupListed, BackupManifest
from sinks.snapshot import FileRecord

MANIFEST = "manifest.json"
FORMAT = 1
PARTIAL = ".partial"
BACKUPS_DIR = "backups"
KEY_FILE = "backup-key"
"""The home's backup signing key (hex, 0600): never backed up, never restored from a backup."""
SIGNATURE = "signature"
"""The manifest's field holding its HMAC: ``alg``, ``key_id``, ``mac``."""


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


def manifest_of(path: Path) -> BackupManifest:
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
        manifest: BackupManifest = json.loads(file.read_text(encoding="utf-8"))
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
    dest = (to or backups_dir(settings) / created.strftime("%Y%m%dT%H%M%S%fZ")).resolve()
    if dest.exists():
        raise ConfigError(f"{dest} already exists: back up into a new folder (--to DIR)")
    key = backup_key(settings, create=True)
    assert key is not None  # made just now when there was none
    previous = latest_backup(dest.parent)
    partial = dest.with_name(dest.name + PARTIAL)
    if partial.exists():  # what a killed backup left: never a finished one
        shutil.rmtree(partial)
    make_private_dir(dest.parent)
    partial.mkdir(mode=0o700)
    os.chmod(partial, 0o700)
    prev_parts: dict[str, Any] = previous[1].get("parts", {}) if previous else {}
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
    manifest[SIGNATURE] = sign(manifest, key)
    make_private(partial)
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


def list_backups(settings: Settings, folder: Path | None = None) -> list[BackupListed]:
    """The finished backups in ``folder`` (default ``<home>/backups``), oldest first: ``path``,
    ``created_at``, ``bytes``, ``documents`` and ``points``."""
    root = folder or backups_dir(settings)
    found: list[BackupListed] = []
    for path, manifest in _backups_in(root):
        parts: dict[str, Any] = manifest.get("parts", {})
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
    root = folder or backups_dir(settings)
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


def backups_dir(settings: Settings) -> Path:
    """The configured backup folder: ``KBFLOW_BACKUP_DIR``, else ``<home>/backups``."""
    return settings.stores.backup_dir or settings.home / BACKUPS_DIR


def backup_key(settings: Settings, *, create: bool = False) -> bytes | None:
    """The home's backup signing key (``<home>/backup-key``, 32 random bytes as hex), made 0600
    when ``create`` and there is none; None when there is none and not ``create``.

    Raises:
        ConfigError: the key file is a link or not a regular file, or does not hold a key.
    """
    path = settings.home.resolve() / KEY_FILE
    if create and not path.exists() and not path.is_symlink():
        make_private_dir(path.parent)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass  # another backup made it meanwhile: read theirs
        else:
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.write(secrets.token_hex(32) + "\n")
                out.flush()
                os.fsync(out.fileno())
    if not path.exists() and not path.is_symlink():
        return None
    return read_key_file(path)


def read_key_file(path: Path) -> bytes:
    """A backup key from ``path`` (hex, as `backup_key` writes it); a copy others may read is
    made private.

    Raises:
        ConfigError: the file is missing, a link, not a regular file, or holds no key.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the backup key {path}: {exc.strerror} (a link is refused) — give the "
            "`backup-key` of the home that made the backup"
        ) from exc
    with os.fdopen(fd, encoding="ascii", errors="replace") as src:
        info = os.fstat(src.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"the backup key {path} is not a regular file")
        if info.st_mode & 0o077 and info.st_uid == os.getuid():
            os.fchmod(src.fileno(), 0o600)
        text = src.read(200).strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 32:
        raise ConfigError(
            f"{path} holds no backup key (64 hex characters) — give the `backup-key` of the "
            "home that made the backup"
        )
    return key


def key_id(key: bytes) -> str:
    """A short public name of a key (it reveals nothing of it), to say which key signed what."""
    return hmac.new(key, b"kbflow backup key id", hashlib.sha256).hexdigest()[:12]


def sign(manifest: Mapping[str, Any], key: bytes) -> dict[str, str]:
    """The signature of ``manifest`` (every field but the signature) with ``key``."""
    return {"alg": "hmac-sha256", "key_id": key_id(key), "mac": _mac(manifest, key)}


def check_signature(path: Path, manifest: Mapping[str, Any], key: bytes | None) -> None:
    """Refuse a manifest that ``key`` did not sign.

    Raises:
        StoreError: no signature, no key to check it with, another key's, or a mismatch; the
            message says which and what to do.
    """
    sig = manifest.get(SIGNATURE)
    if not isinstance(sig, dict) or not isinstance(sig.get("mac"), str):
        raise StoreError(
            f"the backup at {path} has no signature: it was made by a kbflow older than "
            "signed backups, or its manifest was replaced — do not restore it (or restore it "
            "with the kbflow version that wrote it, after checking where it came from)"
        )
    if key is None:
        raise StoreError(
            f"cannot check the signature of the backup at {path}: this home has no {KEY_FILE} "
            f"(it was signed with key {sig.get('key_id')}) — give the key of the home that "
            "made it: --key-file PATH/backup-key"
        )
    if sig.get("alg") != "hmac-sha256" or sig.get("key_id") != key_id(key):
        raise StoreError(
            f"the backup at {path} was signed with another key (key {sig.get('key_id')!r}, "
            f"this key is {key_id(key)!r}) — give the key of the home that made it: "
            "--key-file PATH/backup-key"
        )
    if not hmac.compare_digest(sig["mac"], _mac(manifest, key)):
        raise StoreError(
            f"the backup at {path} has a bad signature: its manifest was changed after the "
            "backup was made — do not restore it; use another backup (`kbflow backup list`)"
        )


def _mac(manifest: Mapping[str, Any], key: bytes) -> str:
    body = {k: v for k, v in manifest.items() if k != SIGNATURE}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac.new(key, text.encode("ascii"), hashlib.sha256).hexdigest()


def make_private(root: Path) -> None:
    """Folders 0700 and files 0600 under ``root`` (and ``root``), links never followed: what a
    backup or a restore wrote is its owner's alone, whatever the umask was."""
    os.chmod(root, 0o700 if root.is_dir() else 0o600, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            if not os.path.islink(os.path.join(dirpath, name)):
                os.chmod(os.path.join(dirpath, name), 0o700)
        for name in filenames:
            if not os.path.islink(os.path.join(dirpath, name)):
                os.chmod(os.path.join(dirpath, name), 0o600)


def latest_backup(folder: Path) -> tuple[Path, BackupManifest] | None:
    """The newest finished backup in ``folder`` and its manifest, if any."""
    found = sorted(_backups_in(folder), key=lambda b: str(b[1].get("created_at")))
    return found[-1] if found else None


def _backups_in(folder: Path) -> Iterator[tuple[Path, BackupManifest]]:
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
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
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
