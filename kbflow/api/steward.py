"""The service as the embedded store's owner: it holds the shard, serves it to this machine's
other kbflow processes (`sinks.shared_store`), and lets each of its own threads in for one short
call at a time.

If another process held the shard when the service started (a CLI ingest, say), the service
starts degraded (keyword search from the registry) and takes the shard over as soon as that
process lets go, then serves it to everyone after. With a Qdrant server (``KBFLOW_QDRANT_URL``)
there is nothing to own: the server takes many writers itself.

With ``kbflow serve --workers N`` the parent process is the owner (it answers no HTTP) and each
worker process reaches the store through it, like any other local process: a worker's steward
only waits for the parent's socket when the parent has not taken the store yet.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from core.settings import Settings
from sinks.shared_store import LockedStore, SharedStoreClient, StoreOwner
from sinks.vectors import VectorStore

log = logging.getLogger(__name__)

RETAKE_EVERY_S = 1.0


class HoldsStore(Protocol):
    """What a steward keeps supplied: a store (None while there is none) and why not."""

    store: VectorStore | None
    store_error: str | None


class StoreSteward:
    """Owns (``owner=True``) or reaches (a worker) the embedded store for the service's
    lifetime (see the module docstring)."""

    def __init__(self, settings: Settings, holder: HoldsStore, *, owner: bool = True) -> None:
        self.settings = settings
        self.holder = holder
        self.owner = owner
        self.lock = threading.Lock()
        self._owner: StoreOwner | None = None
        self._taken: VectorStore | None = None  # a store taken after start: ours to close
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def embedded(self) -> bool:
        return not self.settings.stores.qdrant_url

    @property
    def sharing(self) -> bool:
        """Whether local processes reach the embedded store through this service now."""
        if self.owner:
            return self._owner is not None
        return self.embedded and self.holder.store is not None

    def start(self) -> None:
        if not self.embedded:
            return
        if self.holder.store is not None:
            if self.owner:
                self._own(self.holder.store)
            return
        self._thread = threading.Thread(
            target=self._retake, name="kbflow-store-retake", daemon=True
        )
        self._thread.start()

    def _own(self, store: VectorStore) -> None:
        self._owner = StoreOwner(self.settings.vectors_dir, store, self.lock)
        self.holder.store = LockedStore(store, self.lock)
        self.holder.store_error = None

    def _retake(self) -> None:
        from sinks.qdrant_edge import QdrantEdgeStore

        while not self._stop.wait(RETAKE_EVERY_S):
            store: VectorStore | None
            try:
                if self.owner:
                    store = QdrantEdgeStore.try_open(self.settings.vectors_dir)
                else:
                    store = SharedStoreClient.connect(self.settings.vectors_dir)
            except Exception as exc:  # a damaged shard: stay degraded, say why
                self.holder.store_error = f"{type(exc).__name__}: {exc}"
                log.warning("the vector store still cannot be opened: %s", exc)
                continue
            if store is None:
                continue
            self._taken = store
            if self.owner:
                self._own(store)
                log.info("took over the vector store at %s; serving it", self.settings.vectors_dir)
            else:
                self.holder.store = store
                self.holder.store_error = None
            return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._owner is not None:
            self._owner.close()
        if self._taken is not None:
            with self.lock:
                self._taken.close()
