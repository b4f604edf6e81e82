"""The ``source-sync`` flow against real sources started here on loopback (`source_servers`):
a folder, an S3 API (moto's server), a website, a REST API and a SQL table (PostgreSQL in the
PostgreSQL pass). Each kind goes through the life of a source: first sync with one item that
fails (reported; the rest synced), one item changed (a new version), one deleted (withdrawn,
gone from search, its answers stale), one added, an unchanged re-sync (nothing read or
ingested), one that comes back; and a sync killed with SIGKILL midway, then run again (nothing
lost or doubled). The gate holds: a pending_review source's items are invisible until approved.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.contracts import SyncReport
from core.models import DocStatus, Role
from core.settings import Settings
from flows.source_sync import source_sync
from kbflow.services.sources import definitions as service
from sinks.registry import SqlRegistry
from tests.flows import source_servers as servers
from tests.flows.source_servers import KINDS, Kind

pytestmark = pytest.mark.integration

ORG = servers.SYNC_ORG
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
    reg.people.ensure_user(ROOT, Role.SUPERADMIN, bootstrap=True)
    reg.people.ensure_org(ORG)
    yield reg
    reg.close()


def _sync(settings: Settings, name: str) -> SyncReport:
    """Sync as a schedule does: the source-sync flow on the source's id."""
    source = service.resolve_source(settings, name, ORG)
    return source_sync(source_id=source.id)


def _tail(key: str) -> str:
    return re.split(r"[/:#]", key)[-1]


def _live(registry: SqlRegistry) -> dict[str, tuple[str, int, str | None]]:
    """Each item's newest document: (item key's tail -> (status, version, content hash))."""
    out: dict[str, tuple[str, int, str | None]] = {}
    for doc in registry.documents.list_documents(ORG):
        tail = _tail(doc.source_key)
        if tail not in out or doc.version > out[tail][1]:
            out[tail] = (doc.status or "approved", doc.version, doc.content_hash)
    return out


def _found(settings: Settings, query: str) -> set[str]:
    from kbflow.services.query.context import open_home
    from kbflow.services.query.search import search

    with open_home(settings) as ctx:
        outcome = search(ctx, query, org=ORG, actor=ROOT, top_k=10)
    docs = {d.id: d for d in _registry_docs(settings)}
    return {_tail(docs[h.doc_id].source_key) for h in outcome.result.hits if h.doc_id in docs}


def _registry_docs(settings: Settings) -> list[Any]:
    reg = SqlRegistry.open(settings.registry_url)
    try:
        return reg.documents.list_documents(ORG)
    finally:
        reg.close()


HUGE = "# Archive\n\n" + "An old line of the archive, kept for the record.\n" * 400  # > 10 kB


@pytest.fixture(params=KINDS)
def kind(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Kind]:
    yield from _kind(request.param, tmp_path, monkeypatch)


def _kind(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kind]:
    """The kind's server, up for the block, its environment (credentials, the loopback
    switch) set here too."""
    if name == "folder":
        made: Iterator[Kind] = iter([servers.folder(tmp_path)])
    elif name == "s3":
        made = servers.s3(tmp_path, monkeypatch)
    elif name == "website":
        made = servers.website()
    elif name == "rest":
        made = servers.rest(monkeypatch)
    else:
        made = servers.sql(tmp_path, monkeypatch)
    for kind in made:
        for key, value in kind.env.items():
            monkeypatch.setenv(key, value)
        yield kind


def _add(settings: Settings, kind: Kind, status: str = "approved") -> str:
    fields = service.source_fields(kind.kind, kind.config, collection="policies", status=status,
                                   max_item_bytes=10_000)  # fmt: skip
    # The kind's environment (the operator's list of its variables) is read as a sync reads it.
    service.add_source(Settings(home=settings.home), ORG, kind.name, fields, actor=ROOT)
    return kind.name


def test_a_source_syncs_changes_deletions_additions_and_returns(
    settings: Settings, registry: SqlRegistry, kind: Kind, prefect_harness: None
) -> None:
    name = _add(settings, kind)
    for key, text in (("leave.md", LEAVE), ("parking.md", PARKING), ("travel.md", TRAVEL),
                      ("huge.md", HUGE)):  # fmt: skip
        kind.put(key, text.encode())
    first = _sync(settings, name)
    assert (first["counts"]["new"], first["counts"]["failed"], first["outcome"]) == (
        3, 1, "partial"), first  # fmt: skip
    assert _tail(first["errors"][0]["key"]) == "huge.md"
    assert "max_item_bytes" in first["errors"][0]["error"]
    live = _live(registry)
    assert {k: v[:2] for k, v in live.items()} == {
        "leave.md": ("approved", 1),
        "parking.md": ("approved", 1),
        "travel.md": ("approved", 1),
    }
    assert "leave.md" in _found(settings, "how many days of paid annual leave")

    # An answer that cites the parking policy, to be flagged stale once it is gone.
    from kbflow.services.query import answers
    from kbflow.services.query.answers import _trace
    from kbflow.services.query.context import open_home

    registry.catalog.create_agent(ORG, "helper")
    with open_home(settings) as ctx:
        said = answers.answer(ctx, "helper", "Where do visitors park?")
    # Offline, "where" asks for no value a structure proves: the passage is handed over.
    assert said["status"] in ("answered", "maybe"), said
    parking_id = next(
        d.id for d in registry.documents.list_documents(ORG) if _tail(d.source_key) == "parking.md"
    )
    assert parking_id in {c["doc_id"] for c in said["citations"]}

    kind.put("leave.md", LEAVE.replace("| C | 30 |", "| C | 32 |").encode())  # changed
    kind.delete("parking.md")  # gone
    kind.put("expenses.md", EXPENSES.encode())  # added
    second = _sync(settings, name)
    assert {k: second["counts"][k] for k in ("new", "changed", "withdrawn", "failed")} == {
        "new": 1,
        "changed": 1,
        "withdrawn": 1,
        "failed": 1,
    }, second
    live = _live(registry)
    assert live["leave.md"][:2] == ("approved", 2)
    assert live["parking.md"][:2] == ("withdrawn", 1)
    assert live["expenses.md"][:2] == ("approved", 1)
    assert "parking.md" not in _found(settings, "where do visitors park")
    assert "leave.md" in _found(settings, "grade C days of leave")
    trail = registry.audit.audit_trail(ORG, parking_id)
    assert trail[-1].action == "kb.document.withdrawn"
    assert trail[-1].actor.startswith("source:") and "removed at source" in str(trail[-1].after)
    stale = {r["doc_id"]: r["stale"] for r in _trace(settings, registry, stale_only=True)}
    assert stale.get(parking_id) == "document withdrawn"

    # Unchanged: no item body is read again (the failed one is retried), nothing ingested.
    kind.delete("huge.md")
    before_reads, before_docs = kind.reads(), registry.documents.list_documents(ORG)
    third = _sync(settings, name)
    assert third["counts"]["unchanged"] == 3 and third["counts"]["listed"] == 3, third
    assert sum(third["counts"][k] for k in ("new", "changed", "withdrawn", "failed")) == 0
    assert registry.documents.list_documents(ORG) == before_docs
    if before_reads is not None:
        assert kind.reads() == before_reads, "an unchanged re-sync read item bodies again"

    # It comes back: in service again, as a new version.
    kind.put("parking.md", PARKING.encode())
    fourth = _sync(settings, name)
    assert fourth["counts"]["returned"] == 1, fourth
    assert _live(registry)["parking.md"][:2] == ("approved", 2)
    assert "parking.md" in _found(settings, "where do visitors park")
    shown = service.get_source(settings, name, ORG)
    assert shown["items"] == {"present": 4, "failed": 0, "gone": 1}  # huge.md: gone, never in
    assert not any(v in json.dumps(shown) for v in kind.env.values() if len(v) > 8)


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
    registry.people.ensure_user("am1", Role.ACCOUNT_MANAGER, org_id=ORG)
    registry.people.assign_am(ORG, "am1")
    fields = service.source_fields(
        "filesystem", {"url": str(share)}, collection="c", status="approved"
    )
    with pytest.raises(Forbidden):
        service.add_source(settings, ORG, "share", fields, actor="am1")
    assert registry.sources.list_sources(ORG) == []
    service.add_source(settings, ORG, "share", fields, actor=ROOT)
    summary = _sync(settings, "share")
    assert summary["counts"]["new"] == 1
    assert set(_live(registry)) == {"ok.md"}


@pytest.mark.parametrize(
    "kind_name",
    ["s3", *(pytest.param(k, marks=pytest.mark.slow) for k in KINDS if k != "s3")],
)
def test_a_sync_killed_midway_finishes_on_the_next_run(
    settings: Settings,
    registry: SqlRegistry,
    kind_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    prefect_harness: None,
) -> None:
    from prefect.settings import get_current_settings

    gen = _kind(kind_name, tmp_path, monkeypatch)
    kind = next(gen)
    try:
        texts = {"leave.md": LEAVE, "parking.md": PARKING, "travel.md": TRAVEL,
                 "expenses.md": EXPENSES, "security.md": SECURITY}  # fmt: skip
        for key, text in texts.items():
            kind.put(key, text.encode())
        name = _add(settings, kind)
        env = dict(os.environ) | kind.env
        env.update(
            KBFLOW_HOME=str(settings.home),
            PREFECT_API_URL=str(get_current_settings().api.url),  # the harness's server
            KBFLOW_SOURCES_BATCH_ITEMS="2",
            KBFLOW_FAULT_AT="sources.before_record:2=kill",  # 2nd step: ingested, not recorded
        )
        log = tmp_path / "killed-sync.log"
        with log.open("wb") as out:
            killed = subprocess.Popen(
                [sys.executable, "-m", "kbflow.cli", "sources", "sync", name, "--org", ORG,
                 "--as", ROOT],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            killed.wait(300)
        finally:  # what the killed sync started (its extraction worker) goes with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(killed.pid, signal.SIGKILL)
        assert killed.returncode == -9, log.read_text(errors="replace")[-3000:]
        source_id = registry.sources.find_sources(name, ORG)[0].id
        assert len(registry.sources.source_items(source_id)) == 2  # only the 1st step was recorded
        assert service.get_source(settings, name, ORG)["last_sync"]["outcome"] == "interrupted"

        summary = _sync(settings, name)
        assert summary["outcome"] == "ok", summary
        docs = registry.documents.list_documents(ORG)
        per_item: dict[str, list[int]] = {}
        for doc in docs:
            per_item.setdefault(_tail(doc.source_key), []).append(doc.version)
        assert sorted(per_item) == sorted(texts)
        assert all(v == [1] for v in per_item.values()), per_item  # nothing doubled
        assert {d.status for d in docs} == {DocStatus.APPROVED.value}
        assert service.get_source(settings, name, ORG)["items"]["present"] == 5
    finally:
        gen.close()


# --- the gate --------------------------------------------------------------------------------


def test_a_pending_review_sources_items_are_invisible_until_approved(
    settings: Settings, registry: SqlRegistry, tmp_path: Path, prefect_harness: None
) -> None:
    from kbflow.services.review import drafts as review

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
    parking = next(
        d for d in registry.documents.list_documents(ORG) if d.uri.endswith("parking.md")
    )
    review.decision(settings, "approve", parking.id, ROOT, note=None)
    assert "parking.md" in _found(settings, "where do visitors park")
    # A change waits for review; the approved version stays served meanwhile.
    (share / "parking.md").write_text(PARKING.replace("north", "south"))
    assert _sync(settings, "drafts")["counts"]["changed"] == 1
    assert _live(registry)["parking.md"][:2] == ("pending_review", 2)
    assert "parking.md" in _found(settings, "where do visitors park")
    # A draft gone from the source is rejected (never served); the approved one withdrawn.
    (share / "travel.md").unlink()
    (share / "parking.md").unlink()
    (share / "new.md").write_text(SECURITY)
    held = _sync(settings, "drafts")  # 2 of 2 gone at once: held until the AM confirms
    assert held["counts"]["withdrawn"] == 0 and held["withdraw_held"]["gone"] == 2
    assert "parking.md" in _found(settings, "where do visitors park")
    registry.sources.confirm_source_withdrawal(service.resolve_source(settings, "drafts", ORG).id,
                                       actor=ROOT)  # fmt: skip
    summary = _sync(settings, "drafts")
    assert summary["counts"]["withdrawn"] == 2 and "withdraw_held" not in summary
    live = _live(registry)
    assert live["travel.md"][0] == "rejected"
    # Both versions of the parking policy leave: the approved one and its pending change.
    parking_versions = sorted(
        (d.version, d.status)
        for d in registry.documents.list_documents(ORG)
        if d.uri.endswith("parking.md")
    )
    assert parking_versions == [(1, "withdrawn"), (2, "rejected")]
    assert _found(settings, "where do visitors park") == set()
    assert _found(settings, "badges worn inside the building") == set()  # new.md: a draft


def test_a_deletion_storm_is_held_until_the_am_confirms(
    settings: Settings, registry: SqlRegistry, tmp_path: Path, prefect_harness: None
) -> None:
    """Issue 41 #14: with 1 of 10 files left, a sync withdrew 9 approved documents at once (on
    ad21d18). Now it withdraws none, says so in its summary and `sources show`, and the next
    sync withdraws them once the org's AM confirms (audited); one file gone is withdrawn as
    before."""
    from kbflow.services.sources import sync as source_runs

    share = tmp_path / "storm"
    share.mkdir()
    for k in range(10):
        (share / f"policy-{k}.md").write_text(f"# Policy {k}\n\nRule number {k} applies.\n")
    service.add_source(settings, ORG, "storm", service.source_fields(
        "filesystem", {"url": str(share)}, collection="c", status="approved",
    ), actor=ROOT)  # fmt: skip
    assert _sync(settings, "storm")["counts"]["new"] == 10
    (share / "policy-9.md").unlink()
    assert _sync(settings, "storm")["counts"]["withdrawn"] == 1  # one at a time: as before
    for k in range(1, 9):
        (share / f"policy-{k}.md").unlink()
    held = _sync(settings, "storm")
    assert held["counts"]["withdrawn"] == 0
    assert held["withdraw_held"]["gone"] == 8 and held["withdraw_held"]["of"] == 9
    assert "--confirm-withdraw" in held["withdraw_held"]["message"]
    assert {v[0] for k, v in _live(registry).items() if k.startswith("policy-")
            and k != "policy-9.md"} == {"approved"}  # fmt: skip
    shown = service.get_source(settings, "storm", ORG)
    assert shown["last_sync"]["withdraw_held"]["gone"] == 8
    again = _sync(settings, "storm")  # not confirmed: still held
    assert again["counts"]["withdrawn"] == 0 and again["withdraw_held"]["gone"] == 8
    confirmed = source_runs.sync(settings, "storm", ORG, actor=ROOT, confirm_withdraw=True)
    assert confirmed["counts"]["withdrawn"] == 8 and "withdraw_held" not in confirmed
    live = _live(registry)
    assert [live[f"policy-{k}.md"][0] for k in range(10)] == ["approved"] + ["withdrawn"] * 9
    trail = [r.action for r in registry.audit.audit_trail(ORG)]
    assert "kb.source.withdraw_confirmed" in trail


def test_an_empty_listing_withdraws_nothing(
    settings: Settings, registry: SqlRegistry, tmp_path: Path, prefect_harness: None
) -> None:
    from core.errors import RunFailed

    share = tmp_path / "share"
    share.mkdir()
    (share / "parking.md").write_text(PARKING)
    service.add_source(settings, ORG, "share", service.source_fields(
        "filesystem", {"url": str(share)}, collection="c", status="approved",
    ), actor=ROOT)  # fmt: skip
    _sync(settings, "share")
    (share / "parking.md").unlink()  # e.g. a share not mounted: the folder is there, empty
    with pytest.raises(RunFailed, match="listed no items"):
        _sync(settings, "share")
    assert _live(registry)["parking.md"][0] == "approved"
    shown = service.get_source(settings, "share", ORG)
    assert (
        shown["last_sync"]["outcome"] == "failed"
        and "listed no items" in shown["last_sync"]["error"]
    )


def test_removing_a_source_with_withdraw_takes_out_every_version_in_play(
    settings: Settings, registry: SqlRegistry, tmp_path: Path, prefect_harness: None
) -> None:
    from kbflow.services.review import drafts as review

    share = tmp_path / "drafts"
    share.mkdir()
    (share / "parking.md").write_text(PARKING)
    service.add_source(settings, ORG, "drafts", service.source_fields(
        "filesystem", {"url": str(share)}, collection="policies", status="pending_review",
    ), actor=ROOT)  # fmt: skip
    _sync(settings, "drafts")
    (first,) = registry.documents.list_documents(ORG)
    review.decision(settings, "approve", first.id, ROOT, note=None)
    (share / "parking.md").write_text(PARKING.replace("north", "south"))
    assert _sync(settings, "drafts")["counts"]["changed"] == 1  # a draft beside the approved one

    removed = service.remove_source(settings, "drafts", ORG, actor=ROOT, withdraw=True)
    assert removed["withdrawn"] == 1
    assert sorted((d.version, d.status) for d in registry.documents.list_documents(ORG)) == [
        (1, "withdrawn"),
        (2, "rejected"),
    ]
    assert _found(settings, "where do visitors park") == set()
    assert registry.sources.list_sources(ORG) == []
