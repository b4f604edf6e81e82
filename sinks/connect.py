"""How to open the configured stores: the registry and the vector store, each a context manager
that closes (and, for the embedded store, flushes and unlocks) what it opened.

The one way every floor above reaches them: ``with open_registry(settings) as registry`` and
``with open_vector_store(settings) as store``.

The embedded store has one owner process at a time (`sinks.qdrant_edge`). When another process
owns it and serves it (``kbflow serve``: `sinks.shared_store`), a command gets a client of that
owner instead of waiting for the lock; if the owner stops mid-command, the next call reopens the
store (as its owner, or through a new one) and runs again — every store call is idempotent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from core.settings import Settings
from sinks.registry import SqlRegistry
from sinks.vectors import DelegatingStore, VectorStore

_POLL_S = 0.1


@contextmanager
def open_registry(settings: Settings) -> Iterator[SqlRegistry]:
    """The registry at ``settings.registry_url``, migrated, for the block; disposed after."""
    registry = SqlRegistry.open(settings.registry_url)
    try:
        yield registry
    finally:
        registry.close()


@contextmanager
def open_vector_store(
    settings: Settings, *, share: bool = True, own: bool = True
) -> Iterator[VectorStore]:
    """Open the configured store for the duration of a command, then flush and close it:
    a Qdrant server by ``KBFLOW_QDRANT_URL``, else the embedded Qdrant Edge shard — owned by
    this process, or (with ``share``, the default) reached through the process that owns it.
    ``share=False`` is for the owner itself (``kbflow serve``); ``own=False`` for a process
    that must never own it (a worker of ``kbflow serve --workers``, whose parent owns it)."""
    store: VectorStore
    if settings.stores.qdrant_url:
        from sinks.qdrant_server import QdrantServerStore

        key = (
            settings.stores.qdrant_api_key.get_secret_value()
            if settings.stores.qdrant_api_key
            else None
        )
        store = QdrantServerStore.connect(
            settings.stores.qdrant_url, collection=settings.stores.qdrant_collection, api_key=key
        )
    elif not own:
        store = connect_embedded(settings)
    elif share:
        store = open_embedded(settings)
    else:
        from sinks.qdrant_edge import QdrantEdgeStore

        store = QdrantEdgeStore.open(
            settings.vectors_dir, lock_timeout_s=settings.stores.store_lock_timeout_s
        )
    try:
        yield store
    finally:
        store.close()


def open_embedded(settings: Settings) -> VectorStore:
    """The embedded shard: owned when no process holds it, else through its serving owner.

    Waits up to ``KBFLOW_STORE_LOCK_TIMEOUT_S`` for either; then raises
    :class:`~core.errors.StoreBusy` naming the process that holds it (one that does not serve
    it: another command, not ``kbflow serve``).
    """
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.shared_store import SharedStoreClient

    path = settings.vectors_dir
    deadline = time.monotonic() + settings.stores.store_lock_timeout_s
    while True:
        owned = QdrantEdgeStore.try_open(path)
        if owned is not None:
            return owned
        client = SharedStoreClient.connect(path)
        if client is not None:
            return _FailoverStore(client, lambda: open_embedded(settings))
        if time.monotonic() >= deadline:  # raises StoreBusy naming the holder, or opens
            return QdrantEdgeStore.open(path, lock_timeout_s=0)
        time.sleep(_POLL_S)


def connect_embedded(settings: Settings) -> VectorStore:
    """The embedded shard through the process that owns and serves it, never owned here.

    Raises:
        StoreError: no process serves it within ``KBFLOW_STORE_LOCK_TIMEOUT_S``.
    """
    from core.errors import StoreError
    from sinks.shared_store import SharedStoreClient

    deadline = time.monotonic() + settings.stores.store_lock_timeout_s
    while True:
        client = SharedStoreClient.connect(settings.vectors_dir)
        if client is not None:
            return client
        if time.monotonic() >= deadline:
            raise StoreError(
                f"no kbflow process serves the vector store at {settings.vectors_dir} (the "
                "kbflow serve that owns it has not taken it yet, or has stopped)"
            )
        time.sleep(_POLL_S)


class _FailoverStore(DelegatingStore):
    """A client of the store's owner that, when the owner goes away, reopens the store and runs
    the call again (safe: every store call is idempotent)."""

    def __init__(self, store: VectorStore, reopen: Callable[[], VectorStore]) -> None:
        self.inner = store
        self._reopen = reopen

    def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        from sinks.shared_store import OwnerGone

        try:
            return getattr(self.inner, name)(*args, **kwargs)
        except OwnerGone:
            if name == "close":
                return None
            self.inner.close()
            self.inner = self._reopen()
            return getattr(self.inner, name)(*args, **kwargs)
