"""A batch of bad inputs: each file fails with a clear reason, the good ones of the same batch
are stored, the process lives on and nothing stored earlier changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.models import Scope, SearchMode
from core.settings import Settings
from kbflow.services.query.context import open_home
from sinks.connect import open_registry
from tests.bad_inputs import (
    OVERSIZE_CAP_MB,
    assert_no_leftover_workers,
    write_bad_corpus,
    write_renamed_pdf,
)
from tests.conftest import make_org

pytestmark = pytest.mark.integration


def _ingest(paths: list[str]) -> dict[str, Any]:
    from flows.ingest import ingest

    make_org("acme")
    return ingest(paths=paths, org="acme", collection="kb")


def _snapshot(settings: Settings, doc_ids: set[str] | None = None) -> tuple[Any, ...]:
    """Registry rows of org acme's documents (all, or these), and their stored chunks."""
    with open_registry(settings) as registry:
        docs = sorted(
            (d.id, d.status, d.parse_status, d.content_hash, d.chunk_count, d.version)
            for d in registry.documents.list_documents("acme")
            if doc_ids is None or d.id in doc_ids
        )
    wanted = {d[0] for d in docs}
    with open_home(settings) as ctx:
        hits = ctx.search("escalation policy refunds", Scope(org_id="acme"), top_k=50)
    return docs, {h.chunk_id: h.text for h in hits if h.doc_id in wanted}


def test_bad_inputs_fail_alone_and_change_nothing_stored(
    prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KBFLOW_MAX_FILE_MB", str(OVERSIZE_CAP_MB))
    monkeypatch.setenv("KBFLOW_MAX_SKIP_RATIO", "1.0")
    monkeypatch.setenv("KBFLOW_EXTRACT_TIMEOUT_S", "120")
    settings = Settings()

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "policy.md").write_text(
        "# Escalation policy\n\nRefunds over 500 euros go to the finance lead within a day.\n"
    )
    assert _ingest([str(earlier)])["documents"] == 1
    before = _snapshot(settings)
    assert before[1], "the earlier document must be searchable"

    batch = tmp_path / "batch"
    expected = write_bad_corpus(batch)
    (batch / "good.md").write_text("# Onboarding\n\nNew clients get a kickoff call in week one.\n")
    (batch / "good.html").write_text(
        "<html><body><h1>Holidays</h1><p>The office closes on 24 December.</p></body></html>"
    )
    write_renamed_pdf(batch)

    report = _ingest([str(batch)])

    reasons = {item["source"]: item["reason"] for item in report["skipped"]}
    assert set(reasons) == set(expected)
    for name, fragment in expected.items():
        assert fragment in reasons[name], (name, reasons[name])
        assert name in reasons[name] or name.split(".")[0] in reasons[name], reasons[name]
    assert report["documents"] == 3  # good.md, good.html and the PDF named .docx
    notes = {item["source"]: item["note"] for item in report["notes"]}
    assert "named .docx but its content is pdf" in notes["quarterly-review.docx"]

    assert _snapshot(settings, {d[0] for d in before[0]}) == before
    assert_no_leftover_workers()
    with open_home(settings) as ctx:
        hits = ctx.search("renewals grew in autumn", Scope(org_id="acme"), mode=SearchMode.HYBRID)
    assert hits and hits[0].uri.endswith("quarterly-review.docx")
    assert hits[0].location is not None and hits[0].location.page == 1
