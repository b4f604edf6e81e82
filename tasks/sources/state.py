"""A source's sync state outside the registry: the lock that keeps two syncs of one source
apart, the registry key an item's documents share, and taking an item's documents out of
service. No Prefect here: the HTTP routes and `kbflow sources show` read it."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.models import DocStatus
from sinks.registry import SourceRecord, SqlRegistry

IN_PLAY = (DocStatus.APPROVED.value, DocStatus.PENDING_REVIEW.value, None)
"""Statuses of a version an item gone from its source must not keep."""


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


def take_out_item(
    registry: SqlRegistry,
    source: SourceRecord,
    key: str,
    *,
    actor: str,
    note: str,
    open_store: Any,
) -> bool:
    """Take every version of one item still in service or in review out of service (an
    approved one and the draft of its change waiting for review both go), newest first, with
    `tasks.review.machine.take_out_at_source`. Returns whether any was taken out."""
    from tasks.review.machine import take_out_at_source

    versions = registry.documents.versions_of(source.org_id, source_doc_key(source.id, key))
    taken = [
        take_out_at_source(doc, actor=actor, note=note, registry=registry, open_store=open_store)
        for doc in sorted(versions, key=lambda d: -d.version)
        if doc.status in IN_PLAY
    ]
    return any(t is not None for t in taken)
