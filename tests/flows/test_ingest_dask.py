"""The ingest flow with the Dask task runner (a local cluster of two worker processes) stores
exactly what the default runner stores, and serves the same search results."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from core.models import Scope, SearchMode
from core.settings import Settings
from evals.demo_corpus import write_demo_corpus
from kbflow.services.query.context import open_home
from sinks.connect import open_registry
from tests.conftest import make_org

pytestmark = pytest.mark.integration

QUERIES = (
    "days of paid annual leave",
    "how long is the warranty on a frame",
    "who do I call about a data breach",
    "Stoneware firing temperature",
    "celadon glaze",
)


def _corpus(root: Path) -> list[str]:
    demo = write_demo_corpus(root / "demo")
    # The text formats (Markdown, HTML, CSV): PDF and DOCX would add Docling's start-up in each
    # worker, and extraction itself is the same code either way.
    files = [str(f) for f in demo.files if f.suffix in {".md", ".html", ".csv"}]
    records = root / "records.jsonl.gz"
    rows = [
        {"_id": f"r{i}", "title": f"Kiln note {i}", "text": text}
        for i, text in enumerate(
            [
                "Stoneware is fired at 1,240 degrees in a reduction atmosphere.",
                "Celadon glaze uses a little iron oxide and turns green in reduction.",
                "Earthenware matures around 1,060 degrees and stays porous.",
                "Bisque firing at 950 degrees leaves the pot hard but absorbent.",
                "Ash glazes run and pool where the pot is thickest.",
            ]
        )
    ]
    with gzip.open(records, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return [*files, str(records)]


def _ingest_into(home: Path, paths: list[str], monkeypatch: pytest.MonkeyPatch, **env: str) -> Any:
    from flows.ingest import ingest

    monkeypatch.setenv("KBFLOW_HOME", str(home))
    monkeypatch.setenv("KBFLOW_INGEST_BATCH_DOCS", "2")  # several batches in flight
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    make_org("larkspur")
    state = ingest(paths=paths, org="larkspur", collection="kb", return_state=True)
    return state.state_details.flow_run_id, state.result()


def _stored(home: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], dict[str, Any]]:
    monkeypatch.setenv("KBFLOW_HOME", str(home))
    settings = Settings()
    with open_registry(settings) as registry:
        docs = registry.documents.list_documents("larkspur")
        rows = sorted(
            (d.uri, d.title, d.version, d.status, d.parse_status, d.chunk_count, d.content_hash)
            for d in docs
        )
    results: dict[str, Any] = {}
    with open_home(settings) as ctx:
        for query in QUERIES:
            for mode in SearchMode:
                hits = ctx.search(query, Scope(org_id="larkspur"), mode=mode)
                # Equal scores have no order of their own (the engine breaks ties by point
                # id, and ids differ between two homes), so ties are compared as a set.
                results[f"{mode.value}:{query}"] = sorted(
                    ((round(h.score, 5), h.uri, h.text) for h in hits),
                    key=lambda hit: (-hit[0], hit[1], hit[2]),
                )
    return rows, results


def _task_runs(flow_run_id: Any) -> dict[str, list[str]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    out: dict[str, list[str]] = {}
    for run in runs:
        name = run.name.rsplit("-", 1)[0]
        out.setdefault(name, []).append(run.state.type.value if run.state else "?")
    return out


def test_dask_runner_stores_and_serves_what_the_default_runner_does(
    prefect_harness: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    paths = _corpus(tmp_path / "corpus")
    _, plain = _ingest_into(tmp_path / "plain", paths, monkeypatch)
    monkeypatch.delenv("DASK_LOGGING__DISTRIBUTED", raising=False)
    capfd.readouterr()
    run_id, dask = _ingest_into(
        tmp_path / "dask",
        paths,
        monkeypatch,
        KBFLOW_TASK_RUNNER="dask",
        KBFLOW_DASK_WORKERS="2",
    )
    assert plain["documents"] == dask["documents"] == 9
    # The cluster's start and stop say nothing at INFO (they once printed 33 lines).
    said = capfd.readouterr().err
    assert not [line for line in said.splitlines() if " - INFO - " in line], said[-3000:]
    assert plain["chunks"] == dask["chunks"] and not dask["skipped"]

    # The batches really were prepared by tasks on the cluster (5 batches of at most 2).
    runs = _task_runs(run_id)
    assert runs.get("prepare-batch") == ["COMPLETED"] * 5, runs
    assert "extract-batch" not in runs
    assert len(runs["index-batch"]) == 5

    plain_rows, plain_hits = _stored(tmp_path / "plain", monkeypatch)
    dask_rows, dask_hits = _stored(tmp_path / "dask", monkeypatch)
    assert plain_rows == dask_rows
    assert all(plain_hits.values())
    assert plain_hits == dask_hits

    # Re-running on Dask changes nothing: every source is unchanged.
    _, again = _ingest_into(
        tmp_path / "dask", paths, monkeypatch, KBFLOW_TASK_RUNNER="dask", KBFLOW_DASK_WORKERS="2"
    )
    assert (again["documents"], again["unchanged"]) == (0, 9)


class _Recording:
    """An embedder that remembers what it was asked to embed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.seen: list[str] = []

    def embed_documents(self, texts: Any) -> list[list[float]]:
        self.seen.extend(texts)
        return self.inner.embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        return self.inner.embed_query(text)


def test_a_workers_texts_are_exactly_what_the_writer_embeds(
    tmp_path: Path, registry: Any, edge_store: Any, embedder: Any
) -> None:
    """What `prepare_batch` embeds away from the flow is what `index_batch` would embed, so
    the writer embeds nothing itself (no misses) and gets the same vectors."""
    from tasks.ingest.discover import Source
    from tasks.ingest.index import IngestTarget, WorkItem, batch_texts, index_batch, prefetched
    from tasks.ingest.steps import extractors, prepare_batch
    from tasks.text.embed import PrecomputedEmbedder

    long_text = " ".join(
        f"Sentence {i} about glaze chemistry and kiln atmospheres." for i in range(90)
    )
    page = tmp_path / "notes.md"
    page.write_text("# Kilns\n\n## Firing\n\n" + long_text + "\n\n## Empty\n", encoding="utf-8")
    items = [
        WorkItem(Source(source_key="f", uri=page.as_uri(), content_hash="h", path=page)),
        WorkItem(
            Source(
                source_key="r",
                uri="test://r",
                content_hash="r",
                path=Path("r"),
                record=("Celadon", "Celadon glaze uses iron oxide."),
            )
        ),
        WorkItem(
            Source(
                source_key="bad", uri="test://bad", content_hash="b", path=tmp_path / "missing.pdf"
            )
        ),
    ]
    settings = Settings(home=tmp_path / "home")
    with extractors():
        prepared = prepare_batch(items, settings)
    assert "bad" in prepared.extracted  # its failure travels back, to be reported by the writer
    registry.people.ensure_org("acme")
    coll = registry.catalog.ensure_collection("acme", "docs")
    target = IngestTarget(org_id="acme", collection_id=coll.id, collection_path=coll.path)
    recording = _Recording(embedder)
    texts = batch_texts(items, prefetched(prepared.extracted))
    assert len(texts) > 3 and set(texts) == set(prepared.vectors)
    writer = PrecomputedEmbedder(recording, prepared.vectors, prepared.model_id)
    report = index_batch(
        items,
        target,
        store=edge_store,
        registry=registry,
        embedder=writer,
        extract_file=prefetched(prepared.extracted),
    )
    assert report.documents == 2 and [s for s, _ in report.skipped] == ["missing.pdf"]
    assert report.chunks == len(texts)
    assert writer.misses == 0 and recording.seen == []

    # A text it was not given is embedded by the real model, never answered wrongly.
    assert writer.embed_documents(["something else"]) == embedder.embed_documents(
        ["something else"]
    )
    assert writer.misses == 1
    with pytest.raises(ValueError, match="same embedding model"):
        PrecomputedEmbedder(embedder, {}, "another-model")
