"""Checking and restoring backups (`kbflow backup verify`, `kbflow restore`).

- **verify** re-reads every file of a backup against its manifest (bytes, sha256), then counts
  what the copies hold (documents per status, chunks, audit rows, ledger turns, points per
  org) and compares; any difference names its part, and the backup is refused.
- **restore** puts a verified backup into an EMPTY home: a home that has a registry, vectors
  or a ledger is refused before anything is written. The parts are copied into
  ``<home>/.restore.partial`` first, then moved into place; the registry is migrated to this
  kbflow's schema when it is older (a newer one is refused), and the counts are checked again.
- **restore --org ORG** (`kbflow.services.backup._restore_org`) adds one org of a backup to a home
  that has no org of that name.

What a backup says is trusted only once proven: its manifest must carry an HMAC made with the
restoring home's ``backup-key`` (or the key given with ``--key-file``); every path it names must
stay inside the backup and, restored, inside the home (no absolute path, no ``..``); and a
backup holding anything but folders and regular files (a symbolic link, a device, a pipe) is
refused. ``--org`` needs a superadmin's ``--as`` and brings only the org's own rows.

Backups are never written to: a restore copies out of them (hard links between backups stay
shared, never with a home).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from core.contracts import Report
from core.errors import ConfigError, StoreError
from core.settings import Settings, make_private_dir
from kbflow.services.backup._parts import (
    HOME_FILES,
    LEDGER_FILE,
    TURNS_SQL,
    WAREHOUSE_FILE,
    registry_counts,
)
from kbflow.services.backup.backups import (
    KEY_FILE,
    MANIFEST,
    backup_key,
    check_signature,
    make_private,
    manifest_of,
    read_key_file,
    schema_head,
    scratch,
)
from kbflow.services.backup.types import BackupManifest
from sinks.snapshot import copy_file, copy_tree, duckdb_count, files_under, sha256_file

STAGING = ".restore.partial"
PART_ROOTS = {
    "registry": {"registry"},
    "vectors": {"vectors"},
    "ledger": {"warehouse", "ledger"},
    "warehouse": {"warehouse-evals"},
    "files": {"files"},
}
"""The parts a backup may hold, and the folder each may live in."""


class VerifyReport(Report):
    """A backup that matched its manifest."""

    path: str
    created_at: str
    kbflow_version: str
    schema_version: str | None
    files: int
    bytes: int
    counts: dict[str, dict[str, Any]]


class RestoreReport(Report):
    """What a restore put into the home."""

    path: str
    home: str
    org: str | None = None
    counts: dict[str, Any]


def verify_backup(path: Path, key: bytes | None = None) -> VerifyReport:
    """Check the backup at ``path``: its manifest's signature against ``key``, its paths and
    files, then every file and count against the manifest.

    Args:
        key: The key of the home that made it (`kbflow.services.backup.backups.backup_key`); None
            refuses it (no key to check its signature with).

    Raises:
        NotFound: no folder, or no manifest (an unfinished backup).
        StoreError: no signature, another key's, or a bad one; a path outside the backup; a
            link or other non-regular file in it; a file is missing, extra, of other bytes or
            another checksum, or a count differs; the message names the part and the file.
    """
    return _verified(path, key)[0]


def verified_manifest(path: Path, key: bytes | None) -> BackupManifest:
    """The manifest of the backup at ``path``, once `verify_backup` passed."""
    return _verified(path, key)[1]


def _verified(path: Path, key: bytes | None) -> tuple[VerifyReport, BackupManifest]:
    path = path.resolve()
    manifest = manifest_of(path)
    check_signature(path, manifest, key)
    problems = _shape_problems(path, manifest)
    if problems:
        raise StoreError(
            f"the backup at {path} is refused — do not restore it: " + "; ".join(problems)
        )
    expected: set[Path] = {path / MANIFEST}
    for name, part in manifest["parts"].items():
        root = path / part["root"]
        for record in part["files"]:
            file = root / record["path"]
            expected.add(file)
            if not file.is_file():
                problems.append(f"part {name}: {record['path']} is missing")
            elif file.stat().st_size != record["bytes"]:
                problems.append(
                    f"part {name}: {record['path']} has {file.stat().st_size} bytes, the "
                    f"manifest says {record['bytes']}"
                )
            elif sha256_file(file) != record["sha256"]:
                problems.append(
                    f"part {name}: {record['path']} does not match its sha256 (damaged or "
                    "changed after the backup)"
                )
    problems += [
        f"{file.relative_to(path)} is not in the manifest"
        for file in files_under(path)
        if file not in expected
    ]
    if not problems:
        problems += _count_problems(path, manifest)
    if problems:
        raise StoreError(
            f"the backup at {path} does not match its manifest — do not restore it; use "
            "another backup (`kbflow backup list`): " + "; ".join(problems)
        )
    counts = {name: part.get("counts", {}) for name, part in manifest["parts"].items()}
    return VerifyReport(
        path=str(path),
        created_at=manifest["created_at"],
        kbflow_version=manifest["kbflow_version"],
        schema_version=manifest.get("schema_version"),
        files=sum(len(p["files"]) for p in manifest["parts"].values()),
        bytes=sum(f["bytes"] for p in manifest["parts"].values() for f in p["files"]),
        counts=counts,
    ), manifest


def safe_relative(text: object) -> PurePosixPath:
    """``text`` as a relative path that stays where it is put: not empty, not absolute, no
    ``..`` or ``.`` steps, no backslash or NUL.

    Raises:
        StoreError: it is not; the message names it.
    """
    bad = not isinstance(text, str) or not text or "\\" in text or "\x00" in text
    rel = PurePosixPath(text if isinstance(text, str) else "")
    if bad or rel.is_absolute() or any(p in ("..", ".", "") for p in str(text).split("/")):
        raise StoreError(f"the manifest names the path {text!r}, which leaves its folder")
    return rel


def _shape_problems(path: Path, manifest: BackupManifest) -> list[str]:
    """What the manifest and the folder may not hold: unknown parts, paths that leave the
    backup (or, restored, the home), and anything but folders and regular files."""
    problems: list[str] = []
    parts = manifest.get("parts")
    if not isinstance(parts, dict):
        return ["the manifest has no parts"]
    for name, part in parts.items():
        if name not in PART_ROOTS or part.get("root") not in PART_ROOTS[name]:
            problems.append(
                f"part {name!r} in folder {part.get('root')!r} is not a part kbflow writes"
            )
            continue
        for record in part.get("files", []):
            try:
                rel = safe_relative(record.get("path"))
            except StoreError as exc:
                problems.append(f"part {name}: {exc}")
                continue
            where = (path / part["root"] / rel).resolve()
            if not where.is_relative_to(path / part["root"]):
                problems.append(f"part {name}: {rel} resolves outside the backup ({where})")
            if name == "files" and (rel.parts[0] not in HOME_FILES or rel.parts[0] == KEY_FILE):
                problems.append(f"part files: {rel} is not a file of the home a backup keeps")
    for dirpath, dirnames, filenames in os.walk(path):
        for entry in dirnames + filenames:
            full = Path(dirpath) / entry
            mode = full.lstat().st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                what = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                problems.append(f"{full.relative_to(path)} is {what}: a backup holds none")
    return problems


def _copy_checked(src: Path, dst: Path, sha256: str) -> None:
    """Copy one verified file, refusing it if it changed since it was verified."""
    if src.is_symlink() or not src.is_file():
        raise StoreError(f"{src} is no longer a regular file: the backup changed while restored")
    _, sha = copy_file(src, dst)
    if sha != sha256:
        raise StoreError(f"{src} changed after it was verified: the restore is stopped")


def _count_problems(path: Path, manifest: BackupManifest) -> list[str]:
    """What the copies hold, against the counts the manifest recorded."""
    found: dict[str, dict[str, Any]] = {}
    parts: dict[str, Any] = manifest["parts"]
    if parts.get("registry", {}).get("kind") == "sqlite":
        from sinks.snapshot import sqlite_read_only

        with sqlite_read_only(path / "registry" / "registry.db") as con:
            found["registry"] = registry_counts(con)
    elif parts.get("registry", {}).get("kind") == "sql-jsonl":
        from kbflow.services.backup._registry_copy import dump_counts

        found["registry"] = dump_counts(path / "registry")
    if parts.get("ledger", {}).get("kind") == "sql-jsonl":
        from kbflow.services.backup._ledger_copy import dump_turns

        found["ledger"] = {"turns": dump_turns(path / "ledger")}
    if parts.get("ledger", {}).get("kind") == "duckdb":
        import duckdb

        duck = duckdb.connect(str(path / "warehouse" / LEDGER_FILE), read_only=True)
        try:
            found["ledger"] = {"turns": duckdb_count(duck, TURNS_SQL)}
        finally:
            duck.close()
    if parts.get("vectors", {}).get("kind") == "qdrant-edge":
        found["vectors"] = _shard_counts(path / "vectors")
    return [
        f"part {name}: the copy holds {counts}, the manifest says {parts[name]['counts']}"
        for name, counts in found.items()
        if counts != parts[name]["counts"]
    ]


def _shard_counts(shard: Path) -> dict[str, Any]:
    """Points in a backup's shard, counted on a scratch copy (opening a shard writes to it)."""
    from collections import Counter

    from sinks.qdrant_edge import QdrantEdgeStore

    with scratch("kbflow-verify-") as tmp:
        copy_tree(shard, tmp / "vectors")
        store = QdrantEdgeStore.open(tmp / "vectors", lock_timeout_s=0)
        try:
            per_org = Counter(str(h.payload.get("org_id")) for h in store.iter_payloads(["org_id"]))
        finally:
            store.close()
    return {"points": sum(per_org.values()), "points_per_org": dict(per_org)}


def restore_key(settings: Settings, key_file: Path | None) -> bytes | None:
    """The key a backup is checked with: the one in ``key_file`` when given, else the home's
    ``backup-key`` (None when it has none)."""
    return read_key_file(key_file) if key_file is not None else backup_key(settings)


def restore(
    settings: Settings,
    path: Path,
    *,
    org: str | None = None,
    actor: str | None = None,
    key_file: Path | None = None,
) -> RestoreReport:
    """Restore the backup at ``path`` into ``settings.home`` (and its configured stores), or
    only ``org`` of it into a home that has no such org.

    Args:
        actor: With ``org``: a superadmin of this home (``--as``), checked first and audited.
        key_file: The key of the home that made the backup; default this home's
            ``backup-key``. A whole restore into a home without a key installs it there.

    Raises:
        Forbidden: with ``org``, no ``actor`` or one who is not a superadmin here.
        NotFound, StoreError: the backup does not verify (`verify_backup`).
        ConfigError: the home (or the configured database or Qdrant) is not empty; or, with
            ``org``, the home has that org already, or the backup has no such org.
    """
    path = path.resolve()
    key = restore_key(settings, key_file)
    if org is not None:
        from kbflow.services.backup._restore_org import authorize_restore, restore_org

        admin = authorize_restore(settings, org, actor)
        manifest = verified_manifest(path, key)
        counts = restore_org(settings, path, org, actor=admin, manifest=manifest)
        return RestoreReport(path=str(path), home=str(settings.home), org=org, counts=counts)
    manifest = verified_manifest(path, key)
    _refuse_unless_empty(settings, manifest)
    schema = manifest.get("schema_version")
    if schema and schema > schema_head():
        raise ConfigError(
            f"the backup's registry is at schema {schema}, newer than this "
            f"kbflow's {schema_head()} — restore it with kbflow {manifest['kbflow_version']}"
        )
    home = settings.home.resolve()
    make_private_dir(home)
    staging = home / STAGING
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(mode=0o700)
    parts: dict[str, Any] = manifest["parts"]
    moves: list[tuple[Path, Path]] = []
    sqlite_file = _sqlite_file(settings)
    by_file = parts.get("registry", {}).get("kind") == "sqlite" and sqlite_file is not None
    if by_file:
        assert sqlite_file is not None
        (record,) = [f for f in parts["registry"]["files"] if f["path"] == "registry.db"]
        _copy_checked(path / "registry" / "registry.db", staging / "registry.db", record["sha256"])
        moves.append((staging / "registry.db", sqlite_file))
    if parts.get("vectors", {}).get("kind") == "qdrant-edge":
        for record in parts["vectors"]["files"]:
            rel = record["path"]
            _copy_checked(path / "vectors" / rel, staging / "vectors" / rel, record["sha256"])
        moves.append((staging / "vectors", settings.vectors_dir.resolve()))
    ledger_by_file = (
        parts.get("ledger", {}).get("kind") == "duckdb" and not settings.stores.warehouse_url
    )
    for name, file in (("ledger", LEDGER_FILE), ("warehouse", WAREHOUSE_FILE)):
        if name in parts and (name != "ledger" or ledger_by_file):
            root = path / parts[name]["root"]
            (record,) = [f for f in parts[name]["files"] if f["path"] == file]
            _copy_checked(root / file, staging / "warehouse" / file, record["sha256"])
            moves.append((staging / "warehouse" / file, home / "warehouse" / file))
    for record in parts.get("files", {}).get("files", []):
        rel = record["path"]  # checked: under one of HOME_FILES (`_shape_problems`)
        _copy_checked(path / "files" / rel, staging / "files" / rel, record["sha256"])
        moves.append((staging / "files" / rel, home / rel))
    make_private(staging)
    for src, dst in moves:  # a rename within the home's file system (a registry elsewhere: a copy)
        make_private_dir(dst.parent)
        if dst.is_dir() and not any(dst.iterdir()):
            dst.rmdir()  # an empty folder a command made: nothing to keep
        shutil.move(src, dst)
    shutil.rmtree(staging)
    if "registry" in parts and not by_file:  # row by row, into the configured database
        from kbflow.services.backup._registry_copy import load_registry, read_rows, sqlite_rows

        rows = (
            sqlite_rows(path / "registry" / "registry.db")
            if parts["registry"]["kind"] == "sqlite"
            else read_rows(path / "registry")
        )
        load_registry(settings.registry_url, rows)
    if "ledger" in parts and not ledger_by_file:  # turn by turn, into the configured ledger
        from kbflow.services.backup import _ledger_copy as ledger_copy

        ledger_copy.load(settings, ledger_copy.backup_rows(path, parts["ledger"]))
    if parts.get("vectors", {}).get("kind") == "qdrant-points":
        _load_points(settings, path / "vectors" / "points.jsonl")
    counts = _restored_counts(settings, manifest)
    if key_file is not None and key is not None and backup_key(settings) is None:
        _install_key(home / KEY_FILE, key)  # its next backups: signed like the restored ones
    if sqlite_file is not None and sqlite_file.is_file():
        os.chmod(sqlite_file, 0o600)
    return RestoreReport(path=str(path), home=str(home), counts=counts)


def _install_key(path: Path, key: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(key.hex() + "\n")


def _refuse_unless_empty(settings: Settings, manifest: BackupManifest) -> None:
    """Refuse a home (or configured stores) that holds anything a restore would replace."""
    from kbflow.services.backup._registry_copy import holds_data
    from sinks.ledger import ledger_path

    home = settings.home.resolve()
    held: list[str] = []
    sqlite_file = _sqlite_file(settings)
    if sqlite_file is not None:
        if sqlite_file.exists():
            held.append(f"a registry ({sqlite_file.name})")
    elif holds_data(settings.registry_url):
        held.append("a registry (rows in the database at KBFLOW_DATABASE_URL)")
    if settings.stores.qdrant_url:
        from sinks.connect import open_vector_store

        with open_vector_store(settings) as store:
            if store.count() > 0:
                held.append(f"points in the Qdrant at {settings.stores.qdrant_url}")
        parts: dict[str, Any] = manifest["parts"]
        if parts.get("vectors", {}).get("kind") == "qdrant-edge":
            raise ConfigError(
                "the backup holds an embedded (Qdrant Edge) store; unset KBFLOW_QDRANT_URL to "
                "restore it, then copy it to the server with `kbflow store migrate`"
            )
    elif (settings.vectors_dir / "edge_config.json").exists():
        held.append("vectors (vectors/)")
    if settings.stores.warehouse_url:
        from kbflow.services.backup._ledger_copy import holds_turns

        if holds_turns(settings):
            held.append("ledger turns (in the database at KBFLOW_WAREHOUSE_URL)")
    elif ledger_path(home).exists():
        held.append(f"a ledger (warehouse/{LEDGER_FILE})")
    if held:
        raise ConfigError(
            f"the home {home} is not empty: it has {', '.join(held)} — restore into an empty "
            "KBFLOW_HOME (nothing was changed), or add one org with --org ORG"
        )


def _sqlite_file(settings: Settings) -> Path | None:
    """The registry's SQLite file, or None when it lives in another database."""
    url = settings.registry_url
    return Path(url.removeprefix("sqlite:///")).resolve() if url.startswith("sqlite:///") else None


def _load_points(settings: Settings, lines: Path) -> None:
    """Upsert a Qdrant server backup's points into the configured store."""
    import json

    from sinks.connect import open_vector_store
    from sinks.shared_store import _point_from_wire

    with open_vector_store(settings) as store, lines.open(encoding="utf-8") as rows:
        batch = []
        for line in rows:
            batch.append(_point_from_wire(json.loads(line)))
            if len(batch) >= 256:
                store.upsert(batch)
                batch = []
        store.upsert(batch)


def _restored_counts(settings: Settings, manifest: BackupManifest) -> dict[str, Any]:
    """The restored home's counts, checked against the manifest's.

    Raises:
        StoreError: they differ (the message names the part).
    """
    from sinks.connect import open_registry, open_vector_store

    parts: dict[str, Any] = manifest["parts"]
    found: dict[str, Any] = {}
    with open_registry(settings) as registry:  # migrates an older schema to this kbflow's
        raw = registry.engine.raw_connection()
        try:
            counts = registry_counts(raw)
        finally:
            raw.close()
    counts["schema_version"] = parts.get("registry", {}).get("counts", {}).get("schema_version")
    found["registry"] = counts
    if "vectors" in parts:
        with open_vector_store(settings) as store:
            found["vectors"] = {"points": store.count()}
    wrong = [
        f"{name}: {value} restored, the backup has {parts[name]['counts']}"
        for name, value in found.items()
        if name in parts and any(parts[name]["counts"].get(k) != v for k, v in value.items())
    ]
    if wrong:
        raise StoreError(
            "the restored home does not hold what the backup does: " + "; ".join(wrong)
        )
    return found
