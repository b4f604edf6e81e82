"""The ingest flow under Prefect's test harness, on real files, Edge and SQLite."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from core.errors import IngestFailed
from core.models import DocStatus, Scope, SearchMode
from core.settings import Settings
from evals.demo_corpus import write_demo_corpus
from kbflow.services.query.context import open_home
from sinks.connect import open_registry
from tests.conftest import make_org

pytestmark = pytest.mark.integration


@pytest.fixture
def corpus(tmp_path: Path) -> Any:
    return write_demo_corpus(tmp_path / "corpus")


def _ingest(paths: list[str], **kw: Any) -> dict[str, Any]:
    from flows.ingest import ingest

    org = kw.pop("org", "larkspur")
    make_org(org)
    return ingest(paths=paths, org=org, collection="kb", **kw)


def test_ingest_is_idempotent_and_versions_changes(
    prefect_harness: None, corpus: Any, tmp_path: Path
) -> None:
    folder = str(corpus.files[0].parent)
    first = _ingest([folder])
    assert first["documents"] == len(corpus.files) and not first["skipped"]
    assert first["chunks"] >= len(corpus.files)

    again = _ingest([folder])
    assert again["documents"] == 0 and again["chunks"] == 0
    assert again["unchanged"] == len(corpus.files)

    handbook = corpus.files[0].parent / "handbook.md"
    handbook.write_text(
        handbook.read_text().replace("27 days of paid annual leave", "31 days of paid annual leave")
    )
    changed = _ingest([folder])
    assert (changed["changed"], changed["documents"], changed["superseded"]) == (1, 1, 1)

    settings = Settings()
    with open_registry(settings) as registry:
        versions = [
            d for d in registry.documents.list_documents("larkspur") if d.title.endswith("Handbook")
        ]
    assert sorted((d.version, d.status) for d in versions) == [
        (1, DocStatus.SUPERSEDED.value),
        (2, DocStatus.APPROVED.value),
    ]
    with open_home(settings) as ctx:
        for mode in SearchMode:
            hits = ctx.search("days of paid annual leave", Scope(org_id="larkspur"), mode=mode)
            handbook_hits = [h for h in hits if h.uri.endswith("handbook.md")]
            assert handbook_hits, mode
            assert {h.doc_id for h in handbook_hits} == {
                next(d.id for d in versions if d.version == 2)
            }
            assert not any("27 days" in h.text for h in hits)


def test_pending_ingest_is_hidden_and_jsonl_corpus(prefect_harness: None, tmp_path: Path) -> None:
    path = tmp_path / "mini.jsonl.gz"
    rows = [
        {"_id": "a1", "title": "Kiln firing", "text": "Stoneware is fired at 1,240 degrees."},
        {"_id": "a2", "title": "Glaze recipes", "text": "Celadon glaze uses iron oxide."},
    ]
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    report = _ingest([str(path)], org="pottery")
    assert report["documents"] == 2
    drafts = tmp_path / "drafts"
    drafts.mkdir()
    (drafts / "secret.md").write_text("# Kiln firing\n\nThe new kiln fires at 1,300 degrees.\n")
    assert _ingest([str(drafts)], org="pottery", status=DocStatus.PENDING_REVIEW)["documents"] == 1

    with open_home(Settings()) as ctx:
        for mode in SearchMode:
            hits = ctx.search("kiln firing degrees", Scope(org_id="pottery"), mode=mode)
            assert hits and all("1,300" not in h.text for h in hits), mode
            assert hits[0].uri.endswith("#a1")


def test_bad_files_are_skipped_with_reasons_and_too_many_fail_the_run(
    prefect_harness: None, corpus: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "mixed"
    folder.mkdir()
    shutil.copy(corpus.files[0], folder / "good.md")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    report = _ingest([str(folder)])
    assert report["documents"] == 1
    assert [s["source"] for s in report["skipped"]] == ["broken.pdf"]
    assert "broken.pdf" in report["skipped"][0]["reason"]

    bad_only = tmp_path / "bad"
    bad_only.mkdir()
    (bad_only / "a.pdf").write_bytes(b"garbage")
    (bad_only / "b.docx").write_bytes(b"garbage")
    with pytest.raises(IngestFailed, match="2 of 2 documents could not be ingested"):
        _ingest([str(bad_only)])
    with open_registry(Settings()) as registry:  # what worked before is intact
        assert any(
            d.title for d in registry.documents.list_documents("larkspur") if d.status == "approved"
        )
