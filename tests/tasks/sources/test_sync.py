"""The sync's rules (`tasks.sources.sync`) without Prefect: what a step hands ingest (a text in
memory, a file a parser opens staged), and what it records of each item."""

from __future__ import annotations

import logging
from pathlib import Path

from core.models import Role
from core.settings import Settings
from kbflow.services.sources.definitions import source_fields
from sinks.registry import SqlRegistry
from tasks.ingest.index import BatchReport
from tasks.sources.state import source_doc_key
from tasks.sources.sync import SourceSync, item_record

ORG = "syncco"
PDF = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n%%EOF\n"


def _sync(settings: Settings, registry: SqlRegistry, folder: Path) -> SourceSync:
    registry.people.ensure_user("root", Role.SUPERADMIN, bootstrap=True)
    registry.people.ensure_org(ORG)
    fields = source_fields("filesystem", {"url": str(folder)}, collection="c", status="approved")
    source = registry.sources.create_source(ORG, "share", fields, actor="root")
    sync = SourceSync(settings, source, logging.getLogger("test"))
    sync.begin()
    return sync


def test_a_text_goes_to_ingest_in_memory_and_a_pdf_is_staged(
    settings: Settings, registry: SqlRegistry, tmp_path: Path
) -> None:
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "leave.md").write_text("# Leave\n\n25 days a year.\n")
    (folder / "scan.pdf").write_bytes(PDF)
    sync = _sync(settings, registry, folder)
    (batch,) = list(sync.batches())
    step = sync.prepare(batch)
    by_name = {item.name: (item, src) for item, src in step.items.values()}
    (leave, text), (_, pdf) = by_name["leave.md"], by_name["scan.pdf"]
    assert (text.path, text.data) == (Path("leave.md"), b"# Leave\n\n25 days a year.\n")
    assert (text.uri, text.source_key) == (leave.uri, source_doc_key(sync.source.id, leave.key))
    assert pdf.data is None and pdf.path.read_bytes() == PDF
    assert pdf.path.is_relative_to(sync.staging)
    assert {w.source.source_key for w in step.plan.work} == set(step.items)  # both new
    assert step.target is not None and step.target.actor == f"source:{sync.source.id}"

    sync.record(step, BatchReport(skipped=[("scan.pdf", "not a real PDF")]))
    assert not pdf.path.exists()  # a staged file goes once its step is recorded
    states = registry.sources.source_items(sync.source.id)
    assert sorted(st.state for st in states.values()) == ["failed", "present"]
    assert (sync.counts["new"], sync.counts["failed"]) == (1, 1)
    report = sync.finish()
    assert report.outcome == "partial" and report.errors[0].error == "not a real PDF"
    assert registry.sources.get_source(sync.source.id).last_sync == report.to_dict()


def test_an_items_state_has_one_shape() -> None:
    keys = {"key", "uri", "version", "content_hash", "meta", "state", "error"}
    assert set(item_record("k", "u", "present", version="v", content_hash="h")) == keys
    assert item_record("k", "u", "gone")["meta"] == {}
