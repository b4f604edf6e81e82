"""How an ingest batch writes the registry: a fixed number of transactions per batch, not two
per document (each document's row and its chunk texts), whatever the batch's size."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from sinks.registry import SqlRegistry
from tests.conftest import index_records


def _transactions(registry: SqlRegistry, run: Any) -> int:
    begun: list[object] = []

    def on_begin(conn: Any) -> None:
        begun.append(conn)

    event.listen(registry.engine, "begin", on_begin)
    try:
        run()
    finally:
        event.remove(registry.engine, "begin", on_begin)
    return len(begun)


def _records(n: int) -> list[dict[str, Any]]:
    return [
        {"key": f"note-{i}", "title": f"Note {i}", "text": f"Harbour note {i}: the ferry waits."}
        for i in range(n)
    ]


def test_a_batch_writes_the_registry_in_as_many_transactions_whatever_its_size(
    registry: SqlRegistry, edge_store: Any, embedder: Any
) -> None:
    def ingest(org: str, n: int) -> int:
        return _transactions(
            registry,
            lambda: index_records(
                _records(n), store=edge_store, registry=registry, embedder=embedder, org=org
            ),
        )

    ingest("warm", 1)  # the org and collection rows, made once
    small, large = ingest("small", 3), ingest("large", 12)
    assert small == large, (small, large)
    docs = registry.documents.current_documents("large")
    assert len(docs) == 12
    assert {d.parse_status for d in docs.values()} == {"ingested"}
    chunks = registry.chunks.document_chunks([d.id for d in docs.values()])
    assert all(len(c) == 1 for c in chunks.values())


def test_warm_up_loads_the_checks_and_the_model_the_batches_will_use(settings: Any) -> None:
    from tasks.ingest import validate
    from tasks.ingest.steps import warm_up
    from tasks.text.embed import embedder_for

    here = settings.replace(embed_batch_size=7)  # an embedder of its own
    on_dask = settings.replace(embed_batch_size=9, task_runner="dask")
    warm_up(here)
    warm_up(on_dask)
    assert validate._state["suite"] is not None
    assert embedder_for(here)._model is not None
    assert embedder_for(on_dask)._model is None  # Dask workers embed: the flow needs no model
