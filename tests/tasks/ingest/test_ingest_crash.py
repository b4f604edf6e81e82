"""Crash safety of a changed re-ingest: killed at any point, kbflow never serves two versions of
one source, never serves retired text, and the next run converges.

Every source is ingested as v1, then changed (v2) and re-ingested in batches with a crash
injected at one fault point (`core.faults`) between two writes. The invariant is checked at
EVERY fault point of every run, not only after the crash: the registry never has two servable
versions of a source, and a search (vector legs, gate and registry re-check, and the keyword
fallback over the registry) never returns text of a version that is not the servable one. After
the crash a clean re-run must converge: each source served as v2 only, reconcile finds nothing,
and a third run changes nothing. Right after a crash at any pass through any ``ingest.*`` point,
every search path (each mode, and the keyword fallback) serves each source in exactly one
version: never none, never both. ``tests/flows/test_ingest_kill.py`` does the same with real
``kill -9`` of the CLI.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from core import faults
from core.models import SERVABLE_PARSE_STATUSES, DocStatus, Scope, SearchMode
from sinks.qdrant_edge import QdrantEdgeStore
from sinks.registry import SqlRegistry
from tasks.ingest.discover import Source
from tasks.ingest.index import IngestTarget, index_batch, plan_ingest, repair_shadowed
from tasks.query.fallback import KeywordFallback
from tasks.query.retrieve import retrieve, search
from tasks.review.machine import reconcile
from tests.conftest import copy_home
from tests.tasks.ingest.support import MemoEmbedder

ORG = "acme"
SOURCES = 12
BATCH = 6


def _text(i: int, version: int) -> str:
    edition = "first" if version == 1 else "second"
    return (
        f"Harbour ferry timetable {i}: the {edition} edition says boarding closes "
        f"{10 + version} minutes before departure. Marker v{version}x{i}."
    )


def _sources(version: int) -> list[Source]:
    return [
        Source(
            source_key=f"test://{ORG}/ferry-{i}",
            uri=f"test://{ORG}/ferry-{i}",
            content_hash=f"ferry-{i}-v{version}",
            path=Path(f"ferry-{i}.md"),
            record=(f"Ferry timetable {i}", _text(i, version)),
        )
        for i in range(SOURCES)
    ]


def run_ingest(world: dict[str, Any], version: int) -> None:
    """What the ingest flow does, without Prefect: plan, repair, then batch after batch."""
    registry, store = world["registry"], world["store"]
    coll = registry.catalog.ensure_collection(ORG, "ferries")
    target = IngestTarget(
        org_id=ORG, collection_id=coll.id, collection_path=coll.path, status=DocStatus.APPROVED
    )
    plan = plan_ingest(_sources(version), registry, ORG)
    repair_shadowed(plan, registry, store, actor="system")
    for start in range(0, len(plan.work), BATCH):
        index_batch(
            plan.work[start : start + BATCH],
            target,
            store=store,
            registry=registry,
            embedder=world["embedder"],
            extract_file=lambda s: pytest.fail(f"no file to extract: {s}"),
        )


def servable_versions(registry: SqlRegistry) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for doc in registry.documents.list_documents(ORG):
        if doc.status in (None, DocStatus.APPROVED.value) and (
            doc.parse_status in SERVABLE_PARSE_STATUSES
        ):
            out.setdefault(doc.source_key, []).append(doc)
    return out


def check_invariant(world: dict[str, Any], *, where: str) -> None:
    """At most one servable version per source; nothing served but that version's text."""
    registry = world["registry"]
    servable = servable_versions(registry)
    doubles = {k: [d.version for d in v] for k, v in servable.items() if len(v) > 1}
    assert not doubles, f"{where}: two servable versions of {doubles}"
    allowed = {docs[0].id for docs in servable.values()}
    versions = {d.id: d.version for docs in servable.values() for d in docs}
    scope = Scope(org_id=ORG)
    for mode in (SearchMode.HYBRID, SearchMode.KEYWORD):
        hits = search(
            "harbour ferry timetable edition boarding", scope, mode=mode, top_k=50,
            store=world["store"], registry=registry, embedder=world["embedder"],
        )  # fmt: skip
        fallback = world["fallback"].search(
            "harbour ferry timetable edition boarding", world["gate"], registry=registry, top_k=50
        )
        for hit in [*hits, *fallback]:
            assert hit.doc_id in allowed, f"{where}: {mode} served a retired version {hit.doc_id}"
            version = versions[hit.doc_id]
            assert f"Marker v{version}x" in hit.text, f"{where}: text of another version"


def check_converged(world: dict[str, Any]) -> None:
    registry = world["registry"]
    servable = servable_versions(registry)
    assert len(servable) == SOURCES
    assert all(len(v) == 1 and v[0].version == 2 for v in servable.values()), servable
    report = reconcile(registry, world["store"], org_id=ORG, dry_run=True)
    assert report.duplicates == [] and report.repaired == [] and report.stale_removed == []
    for i in (0, SOURCES // 2, SOURCES - 1):
        hits = search(
            f"Marker v1x{i}", Scope(org_id=ORG), mode=SearchMode.KEYWORD, top_k=50,
            store=world["store"], registry=registry, embedder=world["embedder"],
        )  # fmt: skip
        assert all("Marker v1x" not in h.text for h in hits)


@pytest.fixture(scope="module")
def memo_embedder(embedder: Any) -> MemoEmbedder:
    return MemoEmbedder(embedder)


@pytest.fixture(scope="module")
def v1_template(tmp_path_factory: pytest.TempPathFactory, memo_embedder: MemoEmbedder) -> Path:
    """A data dir with every source ingested as v1 (copied for each scenario)."""
    home = tmp_path_factory.mktemp("v1")
    # SQLite by nature: each scenario copies this whole data dir (registry file and vectors
    # together) as its starting state, which a server database cannot be copied with.
    registry = SqlRegistry.open(f"sqlite:///{home / 'registry.db'}")
    store = QdrantEdgeStore.open(home / "vectors", lock_timeout_s=1)
    try:
        registry.people.ensure_org(ORG)
        run_ingest({"registry": registry, "store": store, "embedder": memo_embedder}, 1)
        assert len(servable_versions(registry)) == SOURCES
    finally:
        store.close()
        registry.close()
    return home


@contextmanager
def copy_of(v1_template: Path, home: Path, memo_embedder: MemoEmbedder) -> Iterator[dict]:
    """A world (registry, store, embedder, fallback) opened on a fresh copy of the v1 data."""
    copy_home(v1_template, home)
    registry = SqlRegistry.open(f"sqlite:///{home / 'registry.db'}")
    store = QdrantEdgeStore.open(home / "vectors", lock_timeout_s=1)
    from sinks.gate import build_gate

    try:
        yield {
            "registry": registry,
            "store": store,
            "embedder": memo_embedder,
            "fallback": KeywordFallback(),
            "gate": build_gate(Scope(org_id=ORG)),
        }
    finally:
        store.close()
        registry.close()


@pytest.fixture
def world(v1_template: Path, tmp_path: Path, memo_embedder: MemoEmbedder) -> Iterator[dict]:
    with copy_of(v1_template, tmp_path / "copy", memo_embedder) as opened:
        yield opened


def _crash_and_check(world: dict[str, Any], point: str, nth: int) -> list[str]:
    """Run the v2 ingest, checking the invariant at every point, crashing at (point, nth)."""
    seen: list[str] = []

    def hook(name: str, count: int) -> None:
        seen.append(f"{name}:{count}")
        check_invariant(world, where=f"{name} pass {count}")
        if name == point and count == nth:
            raise faults.InjectedCrash(f"crash at {point}:{nth}")

    with faults.armed(hook), pytest.raises(faults.InjectedCrash):
        run_ingest(world, 2)
    check_invariant(world, where=f"after the crash at {point}:{nth}")
    return seen


# 19 kill points spread over every step of the 2 batches of the changed re-ingest (and 3 more
# runs below that crash twice).
KILL_POINTS = [
    *(("ingest.after_register", n) for n in (1, 3, 5, 8, 10, 12)),
    *(("ingest.after_chunks", n) for n in (2, 4, 7, 9, 12)),
    *(("ingest.after_upsert", n) for n in (1, 2)),
    *(("ingest.after_hide", n) for n in (1, 2)),
    *(("ingest.after_publish", n) for n in (1, 2)),
    *(("ingest.after_settle", n) for n in (1, 2)),
]


@pytest.mark.parametrize(("point", "nth"), KILL_POINTS)
def test_a_crash_at_any_point_never_serves_two_versions_and_a_rerun_converges(
    world: dict[str, Any], point: str, nth: int
) -> None:
    _crash_and_check(world, point, nth)

    checked: list[str] = []

    def check_every_point(name: str, count: int) -> None:
        checked.append(name)
        check_invariant(world, where=f"re-run {name} pass {count}")

    with faults.armed(check_every_point):
        run_ingest(world, 2)
    check_converged(world)
    with faults.armed(check_every_point):
        run_ingest(world, 2)  # a third run has nothing left to do
    check_converged(world)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("ingest.after_hide", 1), ("ingest.after_chunks", 3)),
        (("ingest.after_publish", 1), ("ingest.after_hide", 1)),
        (("ingest.after_chunks", 5), ("ingest.after_publish", 2)),
    ],
)
def test_a_rerun_that_crashes_too_still_converges(
    world: dict[str, Any], first: tuple[str, int], second: tuple[str, int]
) -> None:
    _crash_and_check(world, *first)
    _crash_and_check(world, *second)
    run_ingest(world, 2)
    check_converged(world)


def test_every_kill_point_is_reached(world: dict[str, Any]) -> None:
    """The points above exist in the code path (a renamed point would make them vacuous)."""
    seen: list[str] = []
    with faults.armed(lambda name, count: seen.append(f"{name}:{count}")):
        run_ingest(world, 2)
    assert {f"{p}:{n}" for p, n in KILL_POINTS} <= set(seen)
    check_converged(world)


def test_a_double_approved_registry_from_an_older_release_is_repaired(
    world: dict[str, Any],
) -> None:
    """The state a crash of the old code left (v1 and v2 both approved and ingested): the
    re-run converges, and reconcile --dry-run reports the duplicates before repairing them."""
    registry = world["registry"]
    run_ingest(world, 2)
    # Put the old code's crash state back: v1 approved again under a servable v2.
    v1 = [d for d in registry.documents.list_documents(ORG) if d.version == 1][:5]
    assert len(v1) == 5
    with registry.session() as s, s.begin():
        from sqlalchemy import update

        from sinks.registry.schema import DocumentRow

        s.execute(
            update(DocumentRow)
            .where(DocumentRow.id.in_([d.id for d in v1]))
            .values(status=DocStatus.APPROVED.value)
        )
    for d in v1:
        world["store"].set_document_payload(d.id, {"status": DocStatus.APPROVED.value})
    assert sum(len(v) > 1 for v in servable_versions(registry).values()) == 5

    dry = reconcile(registry, world["store"], org_id=ORG, dry_run=True)
    assert sorted(d["doc_id"] for d in dry.duplicates) == sorted(d.id for d in v1)
    assert sum(len(v) > 1 for v in servable_versions(registry).values()) == 5  # dry: unchanged

    run_ingest(world, 2)  # the plain re-run repairs it (unchanged sources included)
    check_converged(world)
    assert all(registry.documents.get_document(d.id).status == "superseded" for d in v1)


# --- every instant of a changed re-ingest serves exactly one version ---------------------------

REPO = Path(__file__).resolve().parents[3]
QUERY = "harbour ferry timetable edition boarding departure"


def ingest_fault_points() -> list[str]:
    """Every ``ingest.*`` fault point in the code (so a new one is crash-tested without edits)."""
    found: set[str] = set()
    for floor in ("core", "sinks", "tasks", "flows", "kbflow"):
        for path in (REPO / floor).rglob("*.py"):
            found.update(re.findall(r'faults\.point\(\s*"(ingest\.[^"]+)"', path.read_text()))
    return sorted(found)


def served_versions(world: dict[str, Any]) -> dict[str, dict[str, set[int]]]:
    """Per search path (each search mode, and the keyword fallback), the versions of each source
    its gated results hold. ``top_k`` exceeds every chunk stored, so a vector leg returns every
    chunk its filter and the registry re-check admit."""
    registry = world["registry"]
    scope = Scope(org_id=ORG)
    versions = {d.id: (d.source_key, d.version) for d in registry.documents.list_documents(ORG)}
    results: dict[str, list[Any]] = {}
    for mode in SearchMode:
        found = retrieve(
            QUERY, scope, mode=mode, top_k=50, store=world["store"], registry=registry,
            embedder=world["embedder"], fallback=KeywordFallback(),
        )  # fmt: skip
        assert not found.degraded, found.reason
        results[mode.value] = found.hits
    fallback = retrieve(
        QUERY, scope, mode=SearchMode.HYBRID, top_k=50, store=None, registry=registry,
        embedder=world["embedder"], fallback=KeywordFallback(), store_error="test: store down",
    )  # fmt: skip
    assert fallback.degraded
    results["keyword fallback"] = fallback.hits
    out: dict[str, dict[str, set[int]]] = {}
    for path, hits in results.items():
        per_source = out.setdefault(path, {})
        for hit in hits:
            key, version = versions[hit.doc_id]
            assert f"Marker v{version}x" in hit.text, f"{path}: text of another version"
            per_source.setdefault(key, set()).add(version)
    return out


def test_the_test_crashes_at_every_ingest_fault_point() -> None:
    """The enumeration below is not vacuous (the points are found where they are named)."""
    assert {
        "ingest.after_register", "ingest.after_chunks", "ingest.after_upsert",
        "ingest.after_hide", "ingest.after_publish", "ingest.after_settle",
    } <= set(ingest_fault_points())  # fmt: skip


@pytest.mark.parametrize("point", ingest_fault_points())
def test_a_crash_at_any_point_leaves_every_source_served_in_exactly_one_version(
    v1_template: Path, tmp_path: Path, memo_embedder: MemoEmbedder, point: str
) -> None:
    """A changed re-ingest of approved sources, crashed at each pass through ``point`` in turn:
    at once (no re-run, no reconcile) every search path serves each source in exactly one
    version, the old or the new: never none (the old hidden before the new is servable) and
    never both."""
    keys = sorted(s.source_key for s in _sources(1))
    nth = 0
    while True:
        nth += 1
        with copy_of(v1_template, tmp_path / f"pass-{nth}", memo_embedder) as world:
            try:
                with faults.armed(faults.crash_at(point, nth)):
                    run_ingest(world, 2)
            except faults.InjectedCrash:
                pass
            else:
                break  # the run passed ``point`` fewer than ``nth`` times: all passes done
            served = served_versions(world)
        for path, per_source in served.items():
            wrong = {
                k: sorted(per_source.get(k, ())) for k in keys if len(per_source.get(k, ())) != 1
            }
            assert not wrong, (
                f"after a crash at {point} pass {nth}, {path} serves these sources in "
                f"none or several versions: {wrong}"
            )
    assert nth > 1, f"the ingest never passed {point}"


def test_a_finished_reingest_leaves_nothing_for_the_next_plan_to_repair(
    world: dict[str, Any],
) -> None:
    """A publish that finishes stamps its new versions after hiding the old ones, so the next
    plan finds nothing to repair (an unchanged re-run does not even open the store)."""
    run_ingest(world, 2)
    plan = plan_ingest(_sources(2), world["registry"], ORG)
    assert (plan.work, plan.shadowed, plan.unchanged) == ([], [], SOURCES)


@pytest.mark.parametrize("point", ["ingest.after_publish", "ingest.after_hide"])
def test_the_next_plan_finds_a_publish_that_stopped_after_its_commit(
    world: dict[str, Any], point: str
) -> None:
    """Stopped after the registry commit of the first batch (before or after hiding the retired
    chunks, but before the stamp): the next plan lists exactly the retired versions, and the
    repair hides their chunks in the store without retiring anything anew."""
    registry, store = world["registry"], world["store"]
    with faults.armed(faults.crash_at(point)), pytest.raises(faults.InjectedCrash):
        run_ingest(world, 2)
    plan = plan_ingest(_sources(2), registry, ORG)
    first_batch = {f"test://{ORG}/ferry-{i}" for i in range(BATCH)}
    found = {(d.source_key, d.version, d.status) for d in plan.shadowed}
    assert found == {(key, 1, DocStatus.SUPERSEDED.value) for key in first_batch}
    retired = [d.id for d in plan.shadowed]
    assert repair_shadowed(plan, registry, store, actor="system") == 0
    for doc_id in retired:
        statuses = {h.payload["status"] for h in store.inspect_document_chunks(doc_id)}
        assert statuses == {DocStatus.SUPERSEDED.value}, doc_id
    assert plan_ingest(_sources(2), registry, ORG).shadowed == []
    run_ingest(world, 2)
    check_converged(world)


def test_a_rerun_after_a_crash_counts_each_source_once(world: dict[str, Any]) -> None:
    """Sources the killed run registered but did not finish are `resumed`: the re-run's counts
    add up to what it found (the summary once read "14 found, 10 new, 0 changed, 2 unchanged")."""
    _crash_and_check(world, "ingest.after_chunks", 4)  # the first batch registered, unfinished

    plan = plan_ingest(_sources(2), world["registry"], ORG)
    assert plan.resumed > 0
    assert plan.new + plan.changed + plan.unchanged + plan.resumed == SOURCES
    from tasks.ingest.index import BatchReport, ingest_report

    report = ingest_report(plan, BatchReport(), org=ORG, collection="ferries", discovered=SOURCES,
                       seconds=0.0)  # fmt: skip
    assert report.resumed == plan.resumed
    assert report.new + report.changed + report.unchanged + report.resumed == report.discovered
