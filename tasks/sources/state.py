"""A source's sync state outside the registry: the lock that keeps two syncs of one source
apart, and the registry key an item's documents share. No Prefect here: the HTTP routes and
`kbflow sources show` read it."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from core.errors import ConfigError
from sinks.registry import SourceRecord


def source_doc_key(source_id: str, key: str) -> str:
    """The registry ``source_key`` of an item's documents: its versions share it."""
    return f"source:{source_id}:{key}"


def sync_lock_path(home: Path, source_id: str) -> Path:
    return Path(home) / "sources" / source_id / "sync.lock"


class SyncRunning(ConfigError):
    """A sync of the source runs already (its lock is held): a second one is refused."""


@contextlib.contextmanager
def sync_lock(home: Path, source: SourceRecord) -> Iterator[None]:
    """Hold the source's sync lock for the block, or refuse at once (another sync runs)."""
    path = sync_lock_path(home, source.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SyncRunning(
                f"a sync of source {source.name!r} (org {source.org_id}) is running already; "
                "wait for it to finish (`kbflow sources show` says when it did)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)


def sync_running(home: Path, source_id: str) -> bool:
    """Whether a process holds the source's sync lock now."""
    path = sync_lock_path(home, source_id)
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
