"""kbflow.services.query.context: what a command's search context does when the vector store is
held."""

from __future__ import annotations

from core.models import Scope
from core.settings import Settings
from kbflow.services.query.context import open_home
from sinks.qdrant_edge import QdrantEdgeStore
from sinks.registry import SqlRegistry


def test_a_held_store_degrades_with_its_reason_told_once(
    settings: Settings, registry: SqlRegistry
) -> None:
    registry.people.ensure_org("acme")
    holder = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)
    try:
        quick = settings.replace(store_lock_timeout_s=0.2)
        with open_home(quick, degrade=True) as ctx:
            result = ctx.retrieve("leave policy", Scope("acme"), top_k=3)
    finally:
        holder.close()

    assert result.degraded and result.hits == []
    reason = result.reason or ""
    assert reason.startswith("vector store could not be opened (StoreBusy: the vector store at ")
    assert reason.count("StoreBusy") == 1
    assert "is busy" in reason and reason.endswith("; keyword fallback")
