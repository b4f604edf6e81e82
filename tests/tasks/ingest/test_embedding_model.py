"""The embedding model id on every chunk: recorded by ingest, checked by search and ingest,
fixed by `kbflow store reembed`. Real Qdrant Edge store and SQLite registry under tmp_path;
the "other model" is the int8 form of the packaged MiniLM (its own model id)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from core.errors import ConfigError, EmbeddingModelMismatch
from core.models import ChunkPoint, DocStatus, Scope, SearchMode, SparseVec
from core.settings import PACKAGED_MINILM, Settings
from kbflow.cli import app
from kbflow.services.catalog import stores
from sinks.gate import build_gate
from sinks.qdrant_edge import QdrantEdgeStore
from sinks.registry import SqlRegistry
from sinks.registry.schema import ChunkRow
from tasks.query.retrieve import retrieve
from tasks.text.embed import embedder_for, resolve_model
from tests.conftest import index_records

RECORDS = [
    {"key": "leave", "title": "Leave policy", "text": "Staff get 25 days of paid leave a year."},
    {"key": "expenses", "title": "Expenses", "text": "Claim expenses within 30 days of purchase."},
    {"key": "travel", "title": "Travel", "text": "Book trains for trips under four hours."},
]
DRAFT = [{"key": "draft", "title": "Draft", "text": "Remote work is allowed two days a week."}]


def int8_settings(settings: Settings) -> Settings:
    return settings.replace(embedding_precision="int8")


def _open(settings: Settings) -> QdrantEdgeStore:
    return QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)


def _registry_models(registry: SqlRegistry, org: str = "acme") -> dict[str | None, int]:
    return registry.chunks.embedding_models(org)


def _payloads(store: Any) -> dict[str, dict[str, Any]]:
    return {
        h.point_id: h.payload
        for h in store.iter_payloads(["org_id", "doc_id", "status", "embedding_model"])
    }


@pytest.fixture
def indexed(settings: Settings, registry: SqlRegistry, embedder: Any) -> dict[str, list[str]]:
    """acme: three approved documents and one pending draft, embedded by fp32 MiniLM."""
    store = _open(settings)
    try:
        kw = {"store": store, "registry": registry, "embedder": embedder}
        docs = {
            "approved": index_records(RECORDS, **kw),
            "draft": index_records(DRAFT, status=DocStatus.PENDING_REVIEW, **kw),
        }
    finally:
        store.close()
    return docs


def test_ingest_records_the_model_id_in_every_point_and_registry_row(
    settings: Settings, registry: SqlRegistry, embedder: Any, indexed: dict[str, list[str]]
) -> None:
    assert embedder.model_id == PACKAGED_MINILM
    store = _open(settings)
    try:
        payloads = _payloads(store)
    finally:
        store.close()
    assert len(payloads) == 4
    assert {p["embedding_model"] for p in payloads.values()} == {PACKAGED_MINILM}
    with registry.session() as s:
        rows = s.query(ChunkRow).all()
    assert len(rows) == 4 and {r.embedding_model for r in rows} == {PACKAGED_MINILM}
    assert registry.chunks.embedding_model_bounds("acme") == (PACKAGED_MINILM, PACKAGED_MINILM)
    assert registry.chunks.embedding_model_bounds("nobody") == (None, None)


def test_search_with_another_model_is_refused_naming_both_ids(
    settings: Settings, registry: SqlRegistry, embedder: Any, indexed: dict[str, list[str]]
) -> None:
    other = embedder_for(int8_settings(settings))
    assert other.model_id != PACKAGED_MINILM  # the int8 graph has an id of its own
    store = _open(settings)
    try:
        scope = Scope(org_id="acme")
        found = retrieve(
            "paid leave days", scope, store=store, registry=registry, embedder=embedder
        )
        assert found.hits and not found.degraded
        for mode in (SearchMode.HYBRID, SearchMode.DENSE):
            with pytest.raises(EmbeddingModelMismatch) as refused:
                retrieve("paid leave days", scope, store=store, registry=registry,
                         embedder=other, mode=mode)  # fmt: skip
            message = str(refused.value)
            assert PACKAGED_MINILM in message and other.model_id in message
            assert "kbflow store reembed --org acme" in message
            assert "KBFLOW_EMBEDDING_MODEL" in message
        # The keyword leg compares no vectors: it still answers.
        keyword = retrieve("paid leave", scope, store=store, registry=registry,
                           embedder=other, mode=SearchMode.KEYWORD)  # fmt: skip
        assert keyword.hits
        # Another org (no chunks yet) is not affected.
        empty = retrieve("leave", Scope(org_id="globex"), store=store, registry=registry,
                         embedder=other)  # fmt: skip
        assert empty.hits == []
    finally:
        store.close()


def test_ingest_with_another_model_is_refused_before_writing(
    settings: Settings, registry: SqlRegistry, indexed: dict[str, list[str]]
) -> None:
    other = embedder_for(int8_settings(settings))
    documents = len(registry.documents.current_documents("acme"))
    store = _open(settings)
    try:
        with pytest.raises(EmbeddingModelMismatch, match="cannot ingest into org 'acme'"):
            index_records(
                [{"key": "new", "title": "New", "text": "A new rule."}],
                store=store,
                registry=registry,
                embedder=other,
            )
        assert len(_payloads(store)) == 4
    finally:
        store.close()
    assert len(registry.documents.current_documents("acme")) == documents
    assert _registry_models(registry) == {PACKAGED_MINILM: 4}


def test_reembed_fixes_the_org_keeps_statuses_and_is_idempotent(
    settings: Settings, registry: SqlRegistry, indexed: dict[str, list[str]]
) -> None:
    quantised = int8_settings(settings)
    other = embedder_for(quantised)
    store = _open(settings)
    try:
        before = _payloads(store)
    finally:
        store.close()

    dry = stores.reembed(quantised, org="acme", dry_run=True)
    assert dry.reembedded == 4 and dry.orgs[0].before == {PACKAGED_MINILM: 4}
    assert _registry_models(registry) == {PACKAGED_MINILM: 4}  # a dry run changes nothing

    done = stores.reembed(quantised, org="acme", batch=3)
    assert done.model == other.model_id and done.reembedded == 4
    assert done.orgs[0].registry_rows == 4
    assert _registry_models(registry) == {other.model_id: 4}

    store = _open(settings)
    try:
        after = _payloads(store)
        assert set(after) == set(before)
        for point_id, payload in after.items():
            assert payload["embedding_model"] == other.model_id
            assert {k: v for k, v in payload.items() if k != "embedding_model"} == {
                k: v for k, v in before[point_id].items() if k != "embedding_model"
            }  # status (pending_review included) and every other field untouched
        scope = Scope(org_id="acme")
        found = retrieve("paid leave days", scope, store=store, registry=registry, embedder=other)
        assert found.hits[0].title == "Leave policy"
        assert indexed["draft"][0] not in {h.doc_id for h in found.hits}  # still gated
        with pytest.raises(EmbeddingModelMismatch):  # and fp32 is now the other model
            retrieve("leave", scope, store=store, registry=registry,
                     embedder=embedder_for(settings))  # fmt: skip
    finally:
        store.close()

    again = stores.reembed(quantised, org="acme")
    assert again.reembedded == 0 and again.orgs[0].registry_rows == 0


def test_a_killed_reembed_leaves_each_chunk_old_or_new_and_a_rerun_finishes(
    settings: Settings, registry: SqlRegistry, indexed: dict[str, list[str]]
) -> None:
    from tasks.ingest.reembed import reembed

    quantised = int8_settings(settings)
    other = embedder_for(quantised)

    class DiesOnSecondBatch:
        dim = other.dim
        model_id = other.model_id
        calls = 0

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            self.calls += 1
            if self.calls == 2:
                raise KeyboardInterrupt  # the run is killed mid-way
            return other.embed_documents(texts)

        def embed_query(self, text: str) -> list[float]:
            return other.embed_query(text)

    store = _open(settings)
    try:
        with pytest.raises(KeyboardInterrupt):
            reembed(store, registry, DiesOnSecondBatch(), org_id="acme", batch=2)
        payloads = _payloads(store)
        new = {p["doc_id"] for p in payloads.values() if p["embedding_model"] == other.model_id}
        assert len(new) == 2
        # Each chunk is consistent: the registry says what its point holds.
        with registry.session() as s:
            rows = {r.doc_id: r.embedding_model for r in s.query(ChunkRow).all()}
        for payload in payloads.values():
            assert rows[payload["doc_id"]] == payload["embedding_model"]
        with pytest.raises(EmbeddingModelMismatch, match="an unfinished re-embed"):
            retrieve("leave", Scope(org_id="acme"), store=store, registry=registry,
                     embedder=other)  # fmt: skip
    finally:
        store.close()

    finished = stores.reembed(quantised, org="acme")
    assert finished.reembedded == 2
    assert _registry_models(registry) == {other.model_id: 4}


def test_store_reembed_cli_json_and_table(
    settings: Settings, registry: SqlRegistry, indexed: dict[str, list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    runner = CliRunner()
    monkeypatch.setenv("KBFLOW_EMBEDDING_PRECISION", "int8")
    dry = runner.invoke(app, ["store", "reembed", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    report = json.loads(dry.output)
    assert report["dry_run"] is True and report["reembedded"] == 4
    assert report["orgs"][0]["org"] == "acme"

    table = runner.invoke(app, ["store", "reembed", "--org", "acme"])
    assert table.exit_code == 0, table.output
    assert "re-embedded 4 chunks" in table.output
    assert registry.chunks.embedding_models("acme") == {embedder_for(Settings()).model_id: 4}


def test_promoted_resolves_to_the_promoted_folder_or_says_what_is_missing(
    settings: Settings,
) -> None:
    from tasks.text.finetune import MANIFEST, FinetunedModel, promote

    models = settings.models_dir
    with pytest.raises(ConfigError, match="no model is promoted"):
        resolve_model("promoted", models)
    with pytest.raises(ConfigError, match="no model is promoted"):
        embedder_for(settings.replace(embedding_model="promoted"))
    assert resolve_model(PACKAGED_MINILM, models) == PACKAGED_MINILM  # others pass through

    folder = models / "minilm-ft-aaaaaaaaaaaa"
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text(json.dumps({"model_id": "minilm-ft-aaaaaaaaaaaa"}))
    promote(models, FinetunedModel("minilm-ft-aaaaaaaaaaaa", folder, {}), {"reason": "won"})
    assert resolve_model("promoted", models) == str(folder)
    chosen = embedder_for(settings.replace(embedding_model="promoted"))
    assert chosen.model == str(folder)

    (models / "promoted.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable promotion record"):
        resolve_model("promoted", models)
    promote(models, FinetunedModel("minilm-ft-aaaaaaaaaaaa", Path("/nowhere/gone"), {}), {})
    with pytest.raises(ConfigError, match="folder is missing"):
        resolve_model("promoted", models)


@pytest.mark.parametrize("backend", ["edge", "server"])
def test_set_vectors_keeps_a_status_changed_meanwhile_and_recreates_nothing(
    backend: str, settings: Settings, embedder: Any
) -> None:
    """What reembed writes: vectors and the model id only. A review decision between its read
    and its write stays; a point deleted meanwhile is not re-created."""
    from sinks.qdrant_server import QdrantServerStore

    store: Any = (
        _open(settings)
        if backend == "edge"
        else QdrantServerStore.connect(":memory:", collection="c")
    )
    registry = SqlRegistry.open(settings.registry_url)
    try:
        docs = index_records(RECORDS[:2], store=store, registry=registry, embedder=embedder)
        read = {h.point_id: h.payload for h in store.iter_payloads(["doc_id", "text"])}
        store.set_document_payload(docs[0], {"status": "withdrawn"})  # a decision meanwhile
        store.delete_document(docs[1])  # and a deletion
        other = [0.0] * 383 + [1.0]
        store.set_vectors(
            [ChunkPoint(pid, other, SparseVec([1], [1.0]), {}) for pid in read],
            {"embedding_model": "m2"},
        )
        fields = ["doc_id", "status", "embedding_model"]
        after = {h.point_id: h.payload for h in store.iter_payloads(fields)}
        assert len(after) == 1
        (payload,) = after.values()
        assert payload == {"doc_id": docs[0], "status": "withdrawn", "embedding_model": "m2"}
        # The new vector is the one searched (served again to see it through the gate).
        store.set_document_payload(docs[0], {"status": "approved"})
        hits = store.query(build_gate(Scope(org_id="acme")), dense=other, sparse=None, limit=1)
        assert hits and hits[0].score == pytest.approx(1.0, abs=1e-5)
    finally:
        store.close()
        registry.close()


def test_a_point_written_by_the_old_model_during_a_reembed_gets_another_pass(
    settings: Settings, registry: SqlRegistry, embedder: Any, indexed: dict[str, list[str]]
) -> None:
    """On a store nothing locks (a Qdrant server), an ingest that passed its check before the
    re-embed began can write an old-model point during it: the re-embed scans again, embeds
    that point too, and only then records the new model on the org's registry rows."""
    from tasks.ingest.reembed import reembed

    other = embedder_for(int8_settings(settings))
    store = _open(settings)

    class IngestMeanwhile:
        dim, model_id, calls = other.dim, other.model_id, 0

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            self.calls += 1
            if self.calls == 1:  # another process's ingest, still with the old model
                index_records([{"key": "late", "title": "Late", "text": "Parking is free."}],
                              store=store, registry=registry, embedder=embedder)  # fmt: skip
            return other.embed_documents(texts)

        def embed_query(self, text: str) -> list[float]:
            return other.embed_query(text)

    try:
        report = reembed(store, registry, IngestMeanwhile(), org_id="acme")
        assert report.reembedded == 5  # the four, then the late one in a second pass
        assert {p["embedding_model"] for p in _payloads(store).values()} == {other.model_id}
    finally:
        store.close()
    assert registry.chunks.embedding_models("acme") == {other.model_id: 5}
