"""The retrieval contract: paused, degraded (keyword fallback, gated), reranked, or genuine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from core.models import Scope, SearchMode
from core.settings import Settings
from sinks.gate import build_gate
from tasks.query.fallback import FALLBACK_SCORE, KeywordFallback
from tasks.query.rerank import RerankFailed
from tasks.query.retrieve import RetrievalConfig, retrieve, search
from tests.tasks.conftest import TOPIC


class BrokenStore:
    """A vector engine that is down: every query fails the way a dead server does."""

    def query(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("connection refused by qdrant at 127.0.0.1:6333")


class ReverseReranker:
    """Scores later texts higher: a visible reordering."""

    name = "reverse"

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        return [float(i) for i in range(len(texts))]


class FailingReranker:
    name = "failing"

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        raise RerankFailed("failing reranker: HTTP 503 from the rerank service")


def _servable(world: dict[str, str]) -> set[str]:
    return {world["approved"], world["legacy"], world["effective"]}


def test_a_genuine_result_is_neither_paused_nor_degraded(
    world: dict[str, str], edge_store: Any, registry: Any, embedder: Any
) -> None:
    ctx = {"store": edge_store, "registry": registry, "embedder": embedder}
    found = retrieve(TOPIC, Scope("acme"), top_k=50, **ctx)
    assert {h.doc_id for h in found.hits} == _servable(world)
    assert not found.paused and not found.degraded and found.kb_context_provided

    empty = retrieve(TOPIC, Scope("nobody-here"), top_k=5, **ctx)
    assert empty.hits == [] and empty.kb_context_provided  # a real "nothing matches"


def test_paused_retrieval_searches_nothing(registry: Any, embedder: Any) -> None:
    result = retrieve(
        TOPIC, Scope("acme"), store=BrokenStore(), registry=registry, embedder=embedder,
        paused=True,
    )  # fmt: skip
    assert result.paused and result.hits == [] and not result.kb_context_provided
    assert "KBFLOW_RETRIEVAL_PAUSED" in (result.reason or "")
    assert result.to_dict()["kb_context_provided"] is False


@pytest.mark.parametrize("store_down", ["raises", "unopened"])
def test_a_failed_vector_engine_degrades_to_the_gated_keyword_fallback(
    world: dict[str, str], registry: Any, embedder: Any, store_down: str
) -> None:
    store = BrokenStore() if store_down == "raises" else None
    result = retrieve(
        TOPIC, Scope("acme"), store=store, registry=registry, embedder=embedder, top_k=50,
        fallback=KeywordFallback(), store_error="StoreBusy: another process holds the store",
    )  # fmt: skip
    assert result.degraded and not result.kb_context_provided
    assert "keyword fallback" in (result.reason or "")
    # Gated exactly like the vector path: drafts, rejected, superseded, other orgs, future and
    # other-audience documents never come back.
    assert {h.doc_id for h in result.hits} == _servable(world)
    assert all(FALLBACK_SCORE in h.scores and h.text for h in result.hits)

    internal = retrieve(
        TOPIC, Scope("acme", audiences=("internal",)), store=store, registry=registry,
        embedder=embedder, top_k=50, fallback=KeywordFallback(),
    )  # fmt: skip
    assert {h.doc_id for h in internal.hits} == _servable(world) | {world["internal"]}


def test_an_unopened_store_is_described_once_in_the_reason(
    world: dict[str, str], registry: Any, embedder: Any
) -> None:
    # open_home passes the failure as "<type>: <message>"; the reason quotes it once.
    result = retrieve(
        TOPIC, Scope("acme"), store=None, registry=registry, embedder=embedder, top_k=5,
        fallback=KeywordFallback(), store_error="StoreBusy: the vector store at /v is busy",
    )  # fmt: skip
    assert result.degraded
    assert result.reason == (
        "vector store could not be opened (StoreBusy: the vector store at /v is busy); "
        "keyword fallback"
    )
    unexplained = retrieve(
        TOPIC, Scope("acme"), store=None, registry=registry, embedder=embedder, top_k=5,
        fallback=KeywordFallback(),
    )  # fmt: skip
    assert unexplained.reason == (
        "vector store could not be opened (no vector store was opened); keyword fallback"
    )


def test_the_fallback_follows_registry_changes(
    world: dict[str, str], registry: Any, edge_store: Any, embedder: Any
) -> None:
    from tasks.review.machine import supersede

    fallback = KeywordFallback()
    gate = build_gate(Scope("acme"))
    before = {h.doc_id for h in fallback.search(TOPIC, gate, registry=registry, top_k=50)}
    supersede(
        registry.documents.get_document(world["approved"]), edge_store, registry, actor="test"
    )
    after = {h.doc_id for h in fallback.search(TOPIC, gate, registry=registry, top_k=50)}
    assert before - after == {world["approved"]}


def test_rerank_reorders_gated_candidates_and_falls_back_on_failure(
    world: dict[str, str], edge_store: Any, registry: Any, embedder: Any
) -> None:
    ctx = {"store": edge_store, "registry": registry, "embedder": embedder}
    fused = search(TOPIC, Scope("acme"), mode=SearchMode.HYBRID, top_k=3, **ctx)

    reranked = retrieve(
        TOPIC, Scope("acme"), mode=SearchMode.HYBRID_RERANK, top_k=3,
        reranker=ReverseReranker(), config=RetrievalConfig(rerank_candidates=3), **ctx,
    )  # fmt: skip
    assert reranked.reranked and reranked.kb_context_provided
    assert [h.chunk_id for h in reranked.hits] == [h.chunk_id for h in reversed(fused)]
    assert all("rerank" in h.scores and "hybrid" in h.scores for h in reranked.hits)

    failed = retrieve(
        TOPIC, Scope("acme"), mode=SearchMode.HYBRID_RERANK, top_k=3,
        reranker=FailingReranker(), config=RetrievalConfig(rerank_candidates=3), **ctx,
    )  # fmt: skip
    assert not failed.reranked and failed.kb_context_provided
    assert [h.chunk_id for h in failed.hits] == [h.chunk_id for h in fused]
    assert "HTTP 503" in (failed.reason or "") and "hybrid order returned" in (failed.reason or "")


def test_weighted_fusion_is_gated_and_mixes_both_legs(
    world: dict[str, str], edge_store: Any, registry: Any, embedder: Any
) -> None:
    ctx = {"store": edge_store, "registry": registry, "embedder": embedder}
    for weight in (0.0, 0.3, 1.0):
        config = RetrievalConfig(fusion="weighted", dense_weight=weight)
        hits = search(TOPIC, Scope("acme"), top_k=50, config=config, **ctx)
        assert {h.doc_id for h in hits} == _servable(world)
        assert all(0.0 <= h.score <= 1.0 for h in hits)


def test_the_search_command_degrades_when_the_store_is_held_elsewhere(
    world: dict[str, str], edge_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real outage of the embedded engine: another owner holds Qdrant Edge's lock, so the
    command cannot open it, and answers from the gated registry fallback, saying so."""
    import json

    from typer.testing import CliRunner

    from core.models import Role
    from kbflow.cli import app
    from sinks.registry import SqlRegistry

    monkeypatch.setenv("KBFLOW_STORE_LOCK_TIMEOUT_S", "0.2")
    registry = SqlRegistry.open(Settings().registry_url)
    registry.people.ensure_user("eng", Role.ENGINEER)
    registry.close()
    search = ["search", TOPIC, "--org", "acme", "--as", "eng", "--json"]
    result = CliRunner().invoke(app, [*search, "-k", "50"])

    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["degraded"] is True and data["kb_context_provided"] is False
    assert "busy" in data["reason"].lower()
    assert {h["doc_id"] for h in data["hits"]} == _servable(world)

    monkeypatch.setenv("KBFLOW_RETRIEVAL_PAUSED", "true")
    paused = json.loads(CliRunner().invoke(app, search).stdout)
    assert paused["paused"] is True and paused["hits"] == []
