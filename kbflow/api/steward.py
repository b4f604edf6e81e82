"""The service as the embedded store's owner: it holds the shard, serves it to this machine's
other kbflow processes (`sinks.shared_store`), and lets each of its own threads in for one short
call at a time.

If another process held the shard when the service started (a CLI ingest, say), the service
starts degraded (keyword search from the registry) and takes the shard over as soon as that
process lets go, then serves it to everyone after. With a Qdrant server (``KBFLOW_QDRANT_URL``)
there is nothing to own: the server takes many writers itself.
"""

from __future__ import annotations

import logging
import threading

from core.settings import Settings
from kbflow.wiring import SearchContext
from sinks.shared_store import LockedStore, StoreOwner
from sinks.vectors import VectorStore

log = logging.getLogger(__name__)

RETAKE_EVERY_S = 1.0


class StoreSteward:
    """Owns the embedded store for the service's lifetime (see the module docstring)."""

    def __init__(self, settings: Settings, ctx: SearchContext) -> None:
        self.settings = settings
        self.ctx = ctx
        self.lock = threading.Lock()
        self._owner: StoreOwner | None = None
        self._taken: VectorStore | None = None  # a store taken over after start: ours to close
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def embedded(self) -> bool:
        return not self.settings.qdrant_url

    @property
    def sharing(self) -> bool:
        """Whether local processes can reach the store through this service now."""
        return self._owner is not None

    def start(self) -> None:
        if not self.embedded:
            return
        if self.ctx.store is not None:
            self._own(self.ctx.store)
            return
        self._thread = threading.Thread(
            target=self._retake, name="kbflow-store-retake", daemon=True
        )
        self._thread.start()

    def _own(self, store: VectorStore) -> None:
        self._owner = StoreOwner(self.settings.vectors_dir, store, self.lock)
        self.ctx.store = LockedStore(store, self.lock)
        self.ctx.store_error = None

    def _retake(self) -> None:
        from sinks.qdrant_edge import QdrantEdgeStore

        while not self._stop.wait(RETAKE_EVERY_S):
            try:
                store = QdrantEdgeStore.try_open(self.settings.vectors_dir)
            except Exception as exc:  # a damaged shard: stay degraded, say why
                self.ctx.store_error = f"{type(exc).__name__}: {exc}"
                log.warning("the vector store still cannot be opened: %s", exc)
                continue
            if store is not None:
                self._taken = store
                self._own(store)
                log.info("took over the vector store at %s; serving it", self.settings.vectors_dir)
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
