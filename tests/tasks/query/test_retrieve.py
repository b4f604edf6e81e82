"""The gate on every search mode, against the real Edge store, SQLite and MiniLM."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from core.errors import ConfigError
from core.models import AuditAction, DocStatus, Scope, SearchMode
from tasks.query.retrieve import search
from tests.conftest import index_records
from tests.tasks.conftest import TOPIC, _doc


def _search(ctx: dict[str, Any], scope: Scope, mode: SearchMode) -> set[str]:
    hits = search(TOPIC, scope, mode=mode, top_k=50, **ctx)
    return {h.doc_id for h in hits}


@pytest.mark.parametrize("mode", list(SearchMode))
def test_only_servable_documents_are_found_in_every_mode(
    world: dict[str, str], edge_store: Any, registry: Any, embedder: Any, mode: SearchMode
) -> None:
    ctx = {"store": edge_store, "registry": registry, "embedder": embedder}
    found = _search(ctx, Scope(org_id="acme"), mode)
    assert found == {world["approved"], world["legacy"], world["effective"]}


@pytest.mark.parametrize("mode", list(SearchMode))
def test_audience_and_org_scopes(
    world: dict[str, str], edge_store: Any, registry: Any, embedder: Any, mode: SearchMode
) -> None:
    ctx = {"store": edge_store, "registry": registry, "embedder": embedder}
    internal = _search(ctx, Scope(org_id="acme", audiences=("internal",)), mode)
    assert world["internal"] in internal
    assert _search(ctx, Scope(org_id="globex"), mode) == {world["other_org"]}


def test_future_document_appears_on_its_effective_day(
    world: dict[str, str], edge_store: Any, registry: Any, embedder: Any
) -> None:
    ctx = {"store": edge_store, "registry": registry, "embedder": embedder}
    later = Scope(org_id="acme", today=dt.date.today() + dt.timedelta(days=1))
    assert world["future"] in _search(ctx, later, SearchMode.HYBRID)


def test_registry_recheck_drops_a_hit_the_store_still_shows(
    world: dict[str, str], edge_store: Any, registry: Any, embedder: Any
) -> None:
    # Drift: the registry rejects a document but its vector payload still says approved.
    registry.documents.transition(
        world["approved"],
        expected=DocStatus.APPROVED,
        new=DocStatus.REJECTED,
        actor="test",
        action=AuditAction.REJECTED,
    )
    ctx = {"store": edge_store, "registry": registry, "embedder": embedder}
    assert world["approved"] not in _search(ctx, Scope(org_id="acme"), SearchMode.HYBRID)
    assert any(
        h.payload.get("status") == "approved"
        for h in edge_store.inspect_document_chunks(world["approved"])
    )


def test_collection_scope(edge_store: Any, registry: Any, embedder: Any) -> None:
    kw = {"store": edge_store, "registry": registry, "embedder": embedder}
    hr = index_records([_doc("hr")], collection="policies/hr", **kw)[0]
    hb = index_records([_doc("hb")], collection="handbook", **kw)[0]
    ctx = kw
    assert _search(ctx, Scope(org_id="acme", collections=("policies",)), SearchMode.HYBRID) == {hr}
    assert _search(ctx, Scope(org_id="acme"), SearchMode.HYBRID) == {hr, hb}


def test_hits_carry_what_an_agent_needs(
    world: dict[str, str], edge_store: Any, registry: Any, embedder: Any
) -> None:
    hits = search(
        "turbine maintenance hours",
        Scope(org_id="acme"),
        store=edge_store,
        registry=registry,
        embedder=embedder,
        top_k=2,
    )
    assert len(hits) == 2
    top = hits[0].to_dict()
    assert top["doc_id"] and top["chunk_id"].startswith(top["doc_id"] + ":")
    assert top["uri"].startswith("test://acme/")
    assert "400 hours" in top["text"]
    assert top["heading_path"] and TOPIC in top["heading_path"][0]
    assert hits[0].score >= hits[1].score


def test_bad_arguments_raise_clear_errors(edge_store: Any, registry: Any, embedder: Any) -> None:
    ctx = {"store": edge_store, "registry": registry, "embedder": embedder}
    with pytest.raises(ConfigError, match="top_k must be greater than 0"):
        search("x", Scope(org_id="acme"), top_k=0, **ctx)
    with pytest.raises(ConfigError, match="empty"):
        search("   ", Scope(org_id="acme"), **ctx)
