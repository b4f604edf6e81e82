"""Entry-point wiring (the app floor, beside the CLI and the services): open what a command needs,
close it after.

Lives on top of every layer, like the CLI. Imports no Prefect: the query path must stay fast.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field

from core.errors import StoreError
from core.models import RetrievalResult, Scope, SearchHit, SearchMode
from core.settings import Settings
from sinks.connect import open_registry, open_vector_store
from sinks.registry import SqlRegistry
from sinks.vectors import VectorStore
from tasks.query.bounds import CheckedQuery
from tasks.query.rerank import Reranker, reranker_from_settings
from tasks.query.retrieve import RetrievalConfig, retrieve, search
from tasks.text.embed import Embedder, embedder_for

log = logging.getLogger(__name__)


@dataclass
class OpenHome:
    """A home opened for one command or one server: its settings, registry, vector store and
    embedder. Searches, asks and answers read through it, and inbox decisions write through
    it (it was called ``SearchContext``, which said less than it holds). ``store`` is None
    when the vector store could not be opened; then `retrieve` serves the keyword fallback and
    `search` raises."""

    settings: Settings
    registry: SqlRegistry
    store: VectorStore | None
    embedder: Embedder
    store_error: str | None = None
    _reranker: Reranker | None = field(default=None, repr=False)
    _reranker_built: bool = field(default=False, repr=False)

    @property
    def vector_store(self) -> VectorStore:
        """The open store; raises when it could not be opened."""
        if self.store is None:
            raise StoreError(self.store_error or "the vector store is not available")
        return self.store

    def search(
        self,
        query: str | CheckedQuery,
        scope: Scope,
        *,
        mode: SearchMode = SearchMode.HYBRID,
        top_k: int = 10,
    ) -> list[SearchHit]:
        return search(
            query,
            scope,
            store=self.vector_store,
            registry=self.registry,
            embedder=self.embedder,
            mode=mode,
            top_k=top_k,
            config=RetrievalConfig.from_settings(self.settings),
        )

    def retrieve(
        self,
        query: str | CheckedQuery,
        scope: Scope,
        *,
        mode: SearchMode = SearchMode.HYBRID,
        top_k: int = 10,
    ) -> RetrievalResult:
        """Gated retrieval with the degraded/paused contract (see `tasks.retrieve.retrieve`)."""
        return retrieve(
            query,
            scope,
            store=self.store,
            registry=self.registry,
            embedder=self.embedder,
            mode=mode,
            top_k=top_k,
            config=RetrievalConfig.from_settings(self.settings),
            reranker=self.reranker() if mode is SearchMode.HYBRID_RERANK else None,
            paused=self.settings.retrieval.retrieval_paused,
            store_error=self.store_error,
        )

    def reranker(self) -> Reranker | None:
        if not self._reranker_built:
            self._reranker = reranker_from_settings(self.settings)
            self._reranker_built = True
        return self._reranker


def store_opener(settings: Settings) -> Callable[[], AbstractContextManager[VectorStore]]:
    """A StoreOpener for the review functions: each call opens the store and closes it after.

    Review commands pass this rather than an open store so the embedded store's lock is held
    only for their vector step, not while they check rights and race in the registry.
    """
    return lambda: open_vector_store(settings)


@contextmanager
def open_home(
    settings: Settings, *, degrade: bool = False, share: bool = True, own: bool = True
) -> Iterator[OpenHome]:
    """The home opened (registry, vector store and embedder) for the duration of one command.

    With ``degrade``, a vector store that cannot be opened (busy, down, corrupt) does not fail
    the command: the context has no store, and `OpenHome.retrieve` falls back.
    ``share=False`` opens the embedded store only as its owner (``kbflow serve``), never
    through another process that owns it, and ``own=False`` only through its owner
    (`sinks.connect.open_vector_store`).
    """
    with open_registry(settings) as registry, ExitStack() as stack:
        store: VectorStore | None = None
        error: str | None = None
        try:
            store = stack.enter_context(open_vector_store(settings, share=share, own=own))
        except Exception as exc:
            if not degrade:
                raise
            error = f"{type(exc).__name__}: {exc}"
            log.warning("vector store unavailable, retrieval will degrade: %s", error)
        yield OpenHome(
            settings=settings,
            registry=registry,
            store=store,
            embedder=embedder_for(settings),
            store_error=error,
        )
