"""Consistent copies of kbflow's stores, file by file, for `kbflow backup` and `kbflow restore`.

Each copy is taken while nothing can write what is copied:

- **the registry** (SQLite) through SQLite's online backup API (`sqlite_backup`): a
  transaction-consistent copy while other processes keep writing;
- **the embedded vector store** (a Qdrant Edge shard) under the shard's owner lock, after the
  owner's last flush (`copy_edge_shard`): by this process when it owns the shard, else by the
  process that does (``kbflow serve``) through `sinks.shared_store`'s ``snapshot`` call;
- **a DuckDB file** (the answer ledger, the eval warehouse) opened read-write — which DuckDB
  allows one process at a time, so no writer can be in it —, checkpointed and copied
  (`duckdb_copy`); for the ledger, under its writers' lock too, so its writers queue instead of
  failing (`sinks.ledger`).

Every file is copied with its holes kept (an Edge shard's files are sparse: ~200 MB apparent,
a few MB on disk) and hashed (sha256) as it is read. A file whose source size and mtime equal
the ones the previous backup recorded is hard-linked from that backup instead of copied, which
makes a second backup of an unchanged home cheap.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from core.errors import StoreError

BLOCK = 1 << 20
HOLE = 1 << 16
"""Runs of zeros this long (and aligned) are left as holes in a copy."""
_ZEROS = bytes(HOLE)

FileRecord = dict[str, Any]
"""One copied file: ``path`` (relative, POSIX), ``bytes``, ``sha256``, ``linked`` (hard-linked
from the previous backup), and ``source`` (``bytes``, ``mtime_ns`` of the file copied)."""


def sha256_file(path: Path) -> str:
    """The sha256 of ``path``'s bytes (holes read as zeros)."""
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while block := src.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def copy_file(src: Path, dst: Path) -> tuple[int, str]:
    """Copy ``src`` to ``dst`` (a new file), keeping runs of zeros as holes; returns the bytes
    copied and their sha256."""
    digest = hashlib.sha256()
    size = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as fin, dst.open("xb") as fout:
        while block := fin.read(BLOCK):
            digest.update(block)
            size += len(block)
            view = memoryview(block)
            for at in range(0, len(block), HOLE):
                piece = view[at : at + HOLE]
                if len(piece) == HOLE and piece == _ZEROS:
                    fout.seek(HOLE, os.SEEK_CUR)
                else:
                    fout.write(piece)
        fout.truncate(size)
        fout.flush()
        os.fsync(fout.fileno())
    return size, digest.hexdigest()


def record_file(path: Path, root: Path, *, source: Path | None = None) -> FileRecord:
    """The record of a file already in place at ``path`` (under ``root``)."""
    stat = (source or path).stat()
    return {
        "path": path.relative_to(root).as_posix(),
        "bytes": path.stat().st_size,
        "sha256": sha256_file(path),
        "linked": False,
        "source": {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns},
    }


def files_under(root: Path) -> Iterator[Path]:
    """Regular files under ``root`` (or ``root`` itself), sorted; links are never followed."""
    if root.is_symlink():
        return
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                yield path


def copy_tree(
    src: Path,
    dst: Path,
    *,
    base: Path | None = None,
    previous: Mapping[str, FileRecord] | None = None,
    previous_root: Path | None = None,
) -> list[FileRecord]:
    """Copy the files under ``src`` (a folder or one file) to the same places under ``dst``.

    Args:
        src: What to copy.
        dst: Where ``base`` lands (``dst / src.relative_to(base)`` for each file).
        base: The folder records' paths are relative to (default ``src``).
        previous: The previous backup's records by path: an unchanged source file (same size
            and mtime as recorded there, or else the same sha256) is hard-linked from
            ``previous_root`` instead.
        previous_root: The previous backup's folder that ``previous`` paths are under.

    Returns:
        One record per file, in path order.
    """
    base = base or src
    records: list[FileRecord] = []
    for path in files_under(src):
        rel = path.relative_to(base).as_posix()
        target = dst / rel
        stat = path.stat()
        source = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        before = (previous or {}).get(rel)
        linked_from = previous_root / rel if previous_root is not None else None
        if (
            before is not None
            and linked_from is not None
            and linked_from.is_file()
            and linked_from.stat().st_size == before["bytes"] == stat.st_size
            # unchanged by size and mtime; else by content (opening a shard touches files
            # without changing them): a read, but no write
            and (before.get("source") == source or sha256_file(path) == before["sha256"])
        ):
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(linked_from, target)
            records.append({**before, "path": rel, "linked": True, "source": source})
            continue
        size, sha = copy_file(path, target)
        records.append(
            {"path": rel, "bytes": size, "sha256": sha, "linked": False, "source": source}
        )
    return records


# --- the registry ------------------------------------------------------------------------------


def sqlite_backup(src: Path, dst: Path) -> None:
    """A transaction-consistent copy of the SQLite database ``src`` at ``dst`` (one file, in
    rollback-journal mode so that it needs no ``-wal``), while other processes write."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=30)
    try:
        target = sqlite3.connect(dst)
        try:
            source.backup(target, pages=4096)
            target.execute("PRAGMA journal_mode=DELETE")
            target.commit()
        finally:
            target.close()
    finally:
        source.close()


@contextmanager
def sqlite_read_only(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection that can neither write ``path`` nor leave a ``-wal`` or ``-shm`` beside it
    (a backup's copy stays byte for byte what its manifest says)."""
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        yield con
    finally:
        con.close()


# --- DuckDB files ------------------------------------------------------------------------------


@contextmanager
def held_exclusively(lock_path: Path, wait_s: float) -> Iterator[None]:
    """Hold ``lock_path`` (flock, exclusive) for the block, waiting up to ``wait_s`` for it:
    the ledger's writers' lock (`sinks.ledger.one_writer`), so no turn is written meanwhile.

    Raises:
        StoreError: another process held it for longer than ``wait_s``.
    """
    from sinks.ledger import one_writer

    with ExitStack() as held:
        try:
            held.enter_context(one_writer(lock_path, wait_s))
        except BlockingIOError as exc:
            raise StoreError(
                f"{lock_path} stayed locked for {wait_s:g} s (a long write in progress) — "
                "retry when it finishes"
            ) from exc
        yield


def duckdb_copy(src: Path, dst: Path, *, wait_s: float, count_sql: str | None = None) -> int:
    """Checkpoint the DuckDB file ``src`` and copy it to ``dst`` while this process holds it
    read-write (DuckDB's own file lock: no other process can write it meanwhile).

    Args:
        wait_s: How long to retry while another process has the file open.
        count_sql: A query whose single number is returned (0 without one, or when it fails
            because a table is missing).

    Raises:
        StoreError: the file stayed held by another process for ``wait_s``.
    """
    import duckdb

    from sinks.warehouse import is_lock_error, retry_while_locked

    try:
        con = retry_while_locked(lambda: duckdb.connect(str(src)), wait_s=wait_s)
    except duckdb.Error as exc:
        if is_lock_error(exc):
            raise StoreError(
                f"could not back up {src}: another process kept it open for {wait_s:g} s "
                "(DuckDB allows one writer per file) — retry when it finishes"
            ) from exc
        raise StoreError(f"could not open {src} to back it up: {exc}") from exc
    try:
        con.execute("CHECKPOINT")
        count = duckdb_count(con, count_sql)
        copy_file(src, dst)
    finally:
        con.close()
    return count


def duckdb_count(con: Any, sql: str | None) -> int:
    """``sql``'s single number on ``con``; 0 without a query or when its table is missing."""
    import duckdb

    if sql is None:
        return 0
    try:
        row = con.execute(sql).fetchone()
    except duckdb.CatalogException:
        return 0
    return int(row[0]) if row else 0


# --- the embedded vector store -----------------------------------------------------------------


def copy_edge_shard(
    store: Any,
    dst: Path,
    *,
    previous: Mapping[str, FileRecord] | None = None,
    previous_root: Path | None = None,
) -> dict[str, Any]:
    """Copy an open, owned Qdrant Edge shard (`sinks.qdrant_edge.QdrantEdgeStore`) to ``dst``.

    The caller holds the shard (its lock, and in ``kbflow serve`` the owner's store lock): every
    write to it flushes before it returns, so the files are at rest and whole while they are
    copied. Returns ``files`` (`copy_tree`'s records), ``points`` and ``points_per_org``.
    """
    path = Path(store.path)
    if dst.exists():
        raise StoreError(f"{dst} already exists: a snapshot goes into a new folder")
    per_org: Counter[str] = Counter(
        str(hit.payload.get("org_id")) for hit in store.iter_payloads(["org_id"])
    )
    files = copy_tree(path, dst, previous=previous, previous_root=previous_root)
    return {"files": files, "points": sum(per_org.values()), "points_per_org": dict(per_org)}
