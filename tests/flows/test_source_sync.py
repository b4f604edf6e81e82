"""The ``source-sync`` flow against real sources: a local folder and an S3 API (moto's server,
started here on loopback). Each goes through the life of a source: first sync, one item
changed (a new version), one deleted (withdrawn, its answers stale), one added, an unchanged
re-sync (nothing read or ingested), a sync killed with SIGKILL midway then run again (nothing
lost or doubled), and one item that fails (reported; the rest synced). The gate holds: a
pending_review source's items are invisible until approved, and an item withdrawn at source
leaves search at that sync.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.models import DocStatus, Role
from core.settings import Settings
from flows.source_sync import source_doc_key, source_sync
from kbflow.services import sources as service
from sinks.registry import SqlRegistry
from tests.conftest import free_port

pytestmark = pytest.mark.integration

ORG = "syncco"
ROOT = "root"
REPO = Path(__file__).resolve().parents[2]

LEAVE = """# Leave policy

Every employee gets 25 days of paid annual leave a year. Unused days carry over to March.

| grade | days of leave |
|---|---|
| A | 25 |
| B | 28 |
| C | 30 |
"""
PARKING = "# Parking\n\nVisitors park in the north car park by the loading bay.\n"
TRAVEL = "# Travel\n\nBook trains, not planes, for trips under 500 km.\n"
EXPENSES = (
    "# Expenses\n\nSubmit expense reports within 30 days of the purchase.\n\n"
    "- receipts are required over 20 euros\n- mileage is paid at 0.30 euros a km\n"
)
SECURITY = "# Security\n\nBadges must be worn at all times inside the building.\n"


@pytest.fixture
def registry(settings: Settings) -> Iterator[SqlRegistry]:
    reg = SqlRegistry.open(settings.registry_url)
    reg.ensure_user(ROOT, Role.SUPERADMIN, bootstrap=True)
    reg.ensure_org(ORG)
    yield reg
    reg.close()


def _sync(settings: Settings, name: str) -> dict[str, Any]:
    source = service.resolve_source(settings, name, ORG)
    return dict(source_sync(source_id=source.id))


def _live(registry: SqlRegistry) -> dict[str, tuple[str, int, str | None]]:
    """Each item's newest document: (uri tail -> (status, version, content hash))."""
    out: dict[str, tuple[str, int, str | None]] = {}
    for doc in registry.list_documents(ORG):
        tail = doc.uri.rsplit("/", 1)[-1]
        if tail not in out or doc.version > out[tail][1]:
            out[tail] = (doc.status or "approved", doc.version, doc.content_hash)
    return out


def _found(settings: Settings, query: str) -> set[str]:
    from kbflow.services.context import search_context
    from kbflow.services.search import search

    with search_context(settings) as ctx:
        outcome = search(ctx, query, org=ORG, actor=ROOT, top_k=10)
    return {h.uri.rsplit("/", 1)[-1] for h in outcome.result.hits}


def _walk_then_check(
    settings: Settings,
    registry: SqlRegistry,
    name: str,
    put: Any,
    delete: Any,
    reads: Any,
) -> None:
    """The life of a trusted (approved) source; ``put(key, bytes)``/``delete(key)`` change the
    source, ``reads()`` counts object reads so far (None: not countable)."""
    for key, text in (("leave.md", LEAVE), ("parking.md", PARKING), ("travel.md", TRAVEL)):
        put(key, text.encode())
    first = _sync(settings, name)
    assert first["counts"] | {} == first["counts"]
    assert (first["counts"]["new"], first["counts"]["failed"], first["outcome"]) == (3, 0, "ok")
    live = _live(registry)
    assert {k: v[:2] for k, v in live.items()} == {
        "leave.md": ("approved", 1),
        "parking.md": ("approved", 1),
        "travel.md": ("approved", 1),
    }
    assert "leave.md" in _found(settings, "how many days of paid annual leave")

    # An answer that cites the parking policy, to be flagged stale once it is gone.
    from kbflow.services import answers
    from kbflow.services.answers import _trace
    from kbflow.services.context import search_context

    registry.create_agent(ORG, "helper")
    with search_context(settings) as ctx:
        said = answers.answer(ctx, "helper", "Where do visitors park?")
    assert said["status"] == "answered", said
    parking_id = next(d.id for d in registry.list_documents(ORG) if d.uri.endswith("parking.md"))
    assert parking_id in {c["doc_id"] for c in said["citations"]}

    put("leave.md", LEAVE.replace("| C | 30 |", "| C | 32 |").encode())  # changed
    delete("parking.md")  # gone
    put("expenses.md", EXPENSES.encode())  # added
    second = _sync(settings, name)
    assert {k: second["counts"][k] for k in ("new", "changed", "withdrawn", "failed")} == {
        "new": 1,
        "changed": 1,
        "withdrawn": 1,
        "failed": 0,
    }, second
    live = _live(registry)
    assert live["leave.md"][:2] == ("approved", 2)
    assert live["parking.md"][:2] == ("withdrawn", 1)
    assert live["expenses.md"][:2] == ("approved", 1)
    assert "parking.md" not in _found(settings, "where do visitors park")
    trail = registry.audit_trail(ORG, parking_id)
    assert trail[-1].action == "kb.document.withdrawn"
    assert trail[-1].actor.startswith("source:") and "removed at source" in str(trail[-1].after)
    stale = {r["doc_id"]: r["stale"] for r in _trace(settings, registry, stale_only=True)}
    assert stale.get(parking_id) == "document withdrawn"

    # Unchanged: nothing is read, nothing ingested.
    before_reads, before_docs = reads(), registry.list_documents(ORG)
    third = _sync(settings, name)
    assert third["counts"]["unchanged"] == 3 and third["counts"]["listed"] == 3, third
    assert sum(third["counts"][k] for k in ("new", "changed", "withdrawn", "failed")) == 0
    assert registry.list_documents(ORG) == before_docs
    if before_reads is not None:
        assert reads() == before_reads, "an unchanged re-sync read object bodies"

    # It comes back: in service again, as a new version.
    put("parking.md", PARKING.encode())
    fourth = _sync(settings, name)
    assert fourth["counts"]["returned"] == 1, fourth
    assert _live(registry)["parking.md"][:2] == ("approved", 2)
    assert "parking.md" in _found(settings, "where do visitors park")


# --- a local folder ---------------------------------------------------------------------------


def test_a_folder_source_syncs_changes_deletions_and_returns(
    settings: Settings, registry: SqlRegistry, tmp_path: Path, prefect_harness: None
) -> None:
    share = tmp_path / "share"
    share.mkdir()
    service.add_source(settings, ORG, "share", service.source_fields(
        "filesystem", {"url": str(share)}, collection="policies", status="approved",
    ), actor=ROOT)  # fmt: skip

    def put(key: str, data: bytes) -> None:
        path = share / key
        path.write_bytes(data)
        os.utime(path, ns=(time.time_ns(), time.time_ns() + random.randint(1, 10**6)))

    _walk_then_check(settings, registry, "share", put, lambda k: (share / k).unlink(), lambda: None)


def test_a_local_folder_is_a_superadmins_and_links_are_not_followed(
    settings: Settings, registry: SqlRegistry, tmp_path: Path, prefect_harness: None
) -> None:
    from core.errors import Forbidden

    share = tmp_path / "share"
    share.mkdir()
    (share / "ok.md").write_text(PARKING)
    secret = tmp_path / "secret.md"
    secret.write_text("# Secret\n\nThe vault code is 0451.\n")
    (share / "linked.md").symlink_to(secret)
    (share / "etc").symlink_to("/etc")
    registry.ensure_user("am1", Role.ACCOUNT_MANAGER, org_id=ORG)
    registry.assign_am(ORG, "am1")
    fields = service.source_fields(
        "filesystem", {"url": str(share)}, collection="c", status="approved"
    )
    with pytest.raises(Forbidden):
        service.add_source(settings, ORG, "share", fields, actor="am1")
    assert registry.list_sources(ORG) == []
    service.add_source(settings, ORG, "share", fields, actor=ROOT)
    summary = _sync(settings, "share")
    assert summary["counts"]["new"] == 1
    assert set(_live(registry)) == {"ok.md"}


# --- S3 (moto's server) --------------------------------------------------------------------


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    pytest.importorskip("moto")
    import boto3

    port = free_port()
    log = tmp_path / "moto.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {
        "AWS_ACCESS_KEY_ID": "kbflow-test",
        "AWS_SECRET_ACCESS_KEY": "kbflow-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    try:
        client = boto3.client("s3", endpoint_url=endpoint)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket="kbdocs")
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield {"client": client, "endpoint": endpoint, "log": log}
    finally:
        proc.terminate()
        proc.wait(10)


def _object_reads(log: Path) -> int:
    """GETs of object bodies moto answered (listings are GETs of the bucket with a query)."""
    text = log.read_text(errors="replace")
    return len(re.findall(r'"GET /kbdocs/docs/[^ ?]+ HTTP', text))


def test_an_s3_source_syncs_changes_deletions_and_returns(
    settings: Settings, registry: SqlRegistry, s3: dict[str, Any], prefect_harness: None
) -> None:
    client = s3["client"]
    client.put_object(Bucket="kbdocs", Key="elsewhere/x.md", Body=SECURITY.encode())
    service.add_source(settings, ORG, "bucket", service.source_fields(
        "filesystem", {"url": "s3://kbdocs/docs", "endpoint_url": s3["endpoint"]},
        collection="policies", status="approved",
    ), actor=ROOT)  # fmt: skip
    _walk_then_check(
        settings,
        registry,
        "bucket",
        lambda k, data: client.put_object(Bucket="kbdocs", Key=f"docs/{k}", Body=data),
        lambda k: client.delete_object(Bucket="kbdocs", Key=f"docs/{k}"),
        lambda: _object_reads(s3["log"]),
    )
    assert "x.md" not in _live(registry)  # outside the source's prefix
    shown = service.get_source(settings, "bucket", ORG)
    assert shown["items"] == {"present": 4, "failed": 0, "gone": 0}
    assert "kbflow-test-secret" not in str(shown)


def test_a_sync_killed_midway_finishes_on_the_next_run_and_a_bad_item_is_reported(
    settings: Settings, registry: SqlRegistry, s3: dict[str, Any], prefect_harness: None
) -> None:
    client = s3["client"]
    texts = {"leave.md": LEAVE, "parking.md": PARKING, "travel.md": TRAVEL,
             "expenses.md": EXPENSES, "security.md": SECURITY}  # fmt: skip
    for key, text in texts.items():
        client.put_object(Bucket="kbdocs", Key=f"docs/{key}", Body=text.encode())
    client.put_object(Bucket="kbdocs", Key="docs/broken.pdf",
                      Body=random.Random(7).randbytes(4096))  # fmt: skip
    service.add_source(settings, ORG, "bucket", service.source_fields(
        "filesystem", {"url": "s3://kbdocs/docs", "endpoint_url": s3["endpoint"]},
        collection="policies", status="approved",
    ), actor=ROOT)  # fmt: skip
    from prefect.settings import get_current_settings

    env = dict(os.environ)
    env.update(
        KBFLOW_HOME=str(settings.home),
        PREFECT_API_URL=str(get_current_settings().api.url),  # the harness's server
        KBFLOW_SOURCES_BATCH_ITEMS="2",
        KBFLOW_FAULT_AT="sources.before_record:2=kill",  # the 2nd step: ingested, not recorded
    )
    log = settings.home.parent / "killed-sync.log"
    with log.open("wb") as out:
        killed = subprocess.Popen(
            [sys.executable, "-m", "kbflow.cli", "sources", "sync", "bucket", "--org", ORG,
             "--as", ROOT],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        killed.wait(300)
    finally:  # what the killed sync started (its extraction worker) goes with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(killed.pid, signal.SIGKILL)
    assert killed.returncode == -9, log.read_text(errors="replace")[-3000:]
    recorded = registry.source_items(registry.find_sources("bucket", ORG)[0].id)
    assert len(recorded) == 2  # only the first step was recorded before the kill

    summary = _sync(settings, "bucket")
    assert summary["outcome"] == "partial"
    assert summary["counts"]["failed"] == 1
    assert [e["key"] for e in summary["errors"]] == ["broken.pdf"]
    assert "broken.pdf" in summary["errors"][0]["error"]
    docs = registry.list_documents(ORG)
    per_item: dict[str, list[int]] = {}
    for doc in docs:
        per_item.setdefault(doc.source_key, []).append(doc.version)
    source_id = registry.find_sources("bucket", ORG)[0].id
    assert sorted(per_item) == sorted(source_doc_key(source_id, k) for k in texts)
    assert all(v == [1] for v in per_item.values()), per_item  # nothing doubled
    assert {d.status for d in docs} == {DocStatus.APPROVED.value}
    shown = service.get_source(settings, "bucket", ORG)
    assert shown["items"] == {"present": 5, "failed": 1, "gone": 0}
    assert shown["last_sync"]["errors"][0]["key"] == "broken.pdf"


# --- the gate --------------------------------------------------------------------------------


def test_a_pending_review_sources_items_are_invisible_until_approved(
    settings: Settings, registry: SqlRegistry, tmp_path: Path, prefect_harness: None
) -> None:
    from kbflow.services import review

    share = tmp_path / "drafts"
    share.mkdir()
    (share / "parking.md").write_text(PARKING)
    (share / "travel.md").write_text(TRAVEL)
    service.add_source(settings, ORG, "drafts", service.source_fields(
        "filesystem", {"url": str(share)}, collection="policies", status="pending_review",
    ), actor=ROOT)  # fmt: skip
    assert _sync(settings, "drafts")["counts"]["new"] == 2
    assert {v[0] for v in _live(registry).values()} == {"pending_review"}
    assert _found(settings, "where do visitors park") == set()
    parking = next(d for d in registry.list_documents(ORG) if d.uri.endswith("parking.md"))
    review.decide(settings, "approve", parking.id, ROOT, None)
    assert "parking.md" in _found(settings, "where do visitors park")
    # A draft gone from the source is rejected (never served); the approved one withdrawn.
    (share / "travel.md").unlink()
    (share / "parking.md").unlink()
    (share / "new.md").write_text(SECURITY)
    summary = _sync(settings, "drafts")
    assert summary["counts"]["withdrawn"] == 2
    live = _live(registry)
    assert (live["travel.md"][0], live["parking.md"][0]) == ("rejected", "withdrawn")
    assert _found(settings, "where do visitors park") == set()
    assert _found(settings, "badges worn inside the building") == set()  # new.md: a draft


def test_an_empty_listing_withdraws_nothing(
    settings: Settings, registry: SqlRegistry, tmp_path: Path, prefect_harness: None
) -> None:
    from tasks.sources.base import SourceError

    share = tmp_path / "share"
    share.mkdir()
    (share / "parking.md").write_text(PARKING)
    service.add_source(settings, ORG, "share", service.source_fields(
        "filesystem", {"url": str(share)}, collection="c", status="approved",
    ), actor=ROOT)  # fmt: skip
    _sync(settings, "share")
    (share / "parking.md").unlink()  # e.g. a share not mounted: the folder is there, empty
    with pytest.raises(SourceError, match="listed no items"):
        _sync(settings, "share")
    assert _live(registry)["parking.md"][0] == "approved"
    shown = service.get_source(settings, "share", ORG)
    assert (
        shown["last_sync"]["outcome"] == "failed"
        and "listed no items" in shown["last_sync"]["error"]
    )
