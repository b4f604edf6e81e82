"""Entry-point wiring (top layer, beside cli.py): open what a command needs, close it after.

Lives on top of every layer, like the CLI. Imports no Prefect: the query path must stay fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from kbflow.models import Scope, SearchHit, SearchMode
from kbflow.settings import Settings
from sinks.registry import SqlRegistry
from sinks.vectors import VectorStore, open_vector_store
from tasks.embed import Embedder, get_embedder
from tasks.retrieve import search


@dataclass
class SearchContext:
    settings: Settings
    registry: SqlRegistry
    store: VectorStore
    embedder: Embedder

    def search(
        self, query: str, scope: Scope, *, mode: SearchMode = SearchMode.HYBRID, top_k: int = 10
    ) -> list[SearchHit]:
        return search(
            query,
            scope,
            store=self.store,
            registry=self.registry,
            embedder=self.embedder,
            mode=mode,
            top_k=top_k,
            prefetch_limit=self.settings.prefetch_limit,
            rrf_k=self.settings.rrf_k,
        )


@contextmanager
def open_registry(settings: Settings) -> Iterator[SqlRegistry]:
    registry = SqlRegistry.open(settings.registry_url)
    try:
        yield registry
    finally:
        registry.close()


def store_opener(settings: Settings) -> Callable[[], AbstractContextManager[VectorStore]]:
    """A StoreOpener for the review functions: each call opens the store and closes it after.

    Review commands pass this rather than an open store so the embedded store's lock is held
    only for their vector step, not while they check rights and race in the registry.
    """
    return lambda: open_vector_store(settings)


@contextmanager
def search_context(settings: Settings) -> Iterator[SearchContext]:
    """Registry, vector store and embedder for the duration of one command."""
    with open_registry(settings) as registry, open_vector_store(settings) as store:
        yield SearchContext(
            settings=settings,
            registry=registry,
            store=store,
            embedder=get_embedder(settings.embedding_model, settings.embed_batch_size),
        )
