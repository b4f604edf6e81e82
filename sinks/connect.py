"""How to open the configured stores: the registry and the vector store, each a context manager
that closes (and, for the embedded store, flushes and unlocks) what it opened.

The one way every floor above reaches them: ``with open_registry(settings) as registry`` and
``with open_vector_store(settings) as store``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from core.settings import Settings
from sinks.registry import SqlRegistry
from sinks.vectors import VectorStore


@contextmanager
def open_registry(settings: Settings) -> Iterator[SqlRegistry]:
    """The registry at ``settings.registry_url``, migrated, for the block; disposed after."""
    registry = SqlRegistry.open(settings.registry_url)
    try:
        yield registry
    finally:
        registry.close()


@contextmanager
def open_vector_store(settings: Settings) -> Iterator[VectorStore]:
    """Open the configured store for the duration of a command, then flush and close it:
    a Qdrant server by ``KBFLOW_QDRANT_URL``, else the embedded Qdrant Edge shard."""
    store: VectorStore
    if settings.qdrant_url:
        from sinks.qdrant_server import QdrantServerStore

        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        store = QdrantServerStore.connect(
            settings.qdrant_url, collection=settings.qdrant_collection, api_key=key
        )
    else:
        from sinks.qdrant_edge import QdrantEdgeStore

        store = QdrantEdgeStore.open(
            settings.vectors_dir, lock_timeout_s=settings.store_lock_timeout_s
        )
    try:
        yield store
    finally:
        store.close()
