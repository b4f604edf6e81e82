"""Crash safety of the review transitions: killed at any point, search serves exactly one
version of a source that a transition replaces, and never a retired, rejected, withdrawn or
pending one.

Each scenario starts from a copy of one data dir (real Qdrant Edge and SQLite) and runs one
review transition with a crash injected (`core.faults`) at each pass through each ``review.*``
point it passes, in turn. Right after each crash (no reconcile) every search path (each search
mode, and the keyword fallback over the registry) must serve each source in exactly one version
(the old or the new, and all paths the same one); a document the registry has rejected or
withdrawn must be hidden in the store as well (hiding transitions fail safe).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core import faults
from core.models import DocStatus, Role, Scope, SearchMode
from sinks.qdrant_edge import QdrantEdgeStore
from sinks.registry import SqlRegistry
from tasks.ingest.discover import Source
from tasks.ingest.index import plan_ingest, repair_shadowed
from tasks.query.fallback import KeywordFallback
from tasks.query.retrieve import retrieve
from tasks.review import machine as review
from tests.conftest import copy_home, index_records
from tests.tasks.ingest.support import MemoEmbedder

ORG, AM = "acme", "am@agency"
REPO = Path(__file__).resolve().parents[3]
QUERY = "lighthouse lamp service interval"
GUIDE, MANUAL, BEACON, DRAFT, REJECTED = "guide", "manual", "beacon", "draft", "rejected"
# Sources served throughout, in one version; a withdrawn, a rejected and a pending document.
SERVED = (GUIDE, MANUAL, BEACON)


def _key(name: str) -> str:
    return f"test://{ORG}/{name}"


def _text(name: str, version: int) -> str:
    return (
        f"The lighthouse lamp service interval, {name} edition {version}: check the lamp every "
        f"{10 * version} days. Marker {name} v{version}."
    )


@pytest.fixture(scope="module")
def memo_embedder(embedder: Any) -> MemoEmbedder:
    return MemoEmbedder(embedder)


def _index(world: dict[str, Any], name: str, version: int, status: DocStatus) -> str:
    record = {"key": name, "title": f"Lamp {name}", "text": _text(name, version)}
    kw = {k: world[k] for k in ("store", "registry", "embedder")}
    return index_records([record], status=status, org=ORG, **kw)[0]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, memo_embedder: MemoEmbedder) -> Path:
    """guide v1 and beacon v1 approved; manual v1 approved with a v2 draft; a first-version
    draft; a rejected document; a withdrawn one (beacon is withdrawn by one scenario)."""
    home = tmp_path_factory.mktemp("review-crash")
    # SQLite by nature: each run copies the data dir (registry file and vectors together).
    with opened(home, memo_embedder) as world:
        registry = world["registry"]
        registry.people.ensure_org(ORG, am_user_id=AM)
        registry.people.ensure_user(AM, Role.ACCOUNT_MANAGER)
        for name in (GUIDE, MANUAL, BEACON, "withdrawn"):
            _index(world, name, 1, DocStatus.APPROVED)
        _index(world, MANUAL, 2, DocStatus.PENDING_REVIEW)
        _index(world, DRAFT, 1, DocStatus.PENDING_REVIEW)
        rejected = _index(world, REJECTED, 1, DocStatus.PENDING_REVIEW)
        opener = review.held(world["store"])
        review.reject(rejected, AM, registry=registry, open_store=opener)
        withdrawn = registry.documents.versions_of(ORG, _key("withdrawn"))[0].id
        review.withdraw(withdrawn, AM, registry=registry, open_store=opener, note="outdated")
    return home


@contextmanager
def opened(home: Path, embedder: MemoEmbedder) -> Iterator[dict[str, Any]]:
    registry = SqlRegistry.open(f"sqlite:///{home / 'registry.db'}")
    store = QdrantEdgeStore.open(home / "vectors", lock_timeout_s=1)
    try:
        yield {"registry": registry, "store": store, "embedder": embedder}
    finally:
        store.close()
        registry.close()


def _doc_id(registry: SqlRegistry, name: str, version: int) -> str:
    return next(
        d.id for d in registry.documents.versions_of(ORG, _key(name)) if d.version == version
    )


@dataclass(frozen=True)
class Scenario:
    """One review transition: ``run`` applies it; ``target`` is the source it acts on and
    ``versions`` the versions of it that may be served (old, new); a hiding transition's
    target may be served in none (hidden before its commit), and so may one that is shown only
    after its commit (a restore: the store's filter holds it back until the store is written)."""

    run: Callable[[dict[str, Any]], Any]
    target: str
    versions: tuple[int, ...]
    hides: bool = False
    shows_after_commit: bool = False  # nothing of the target served before: shown after it


def _edit(name: str, version: int, new: int) -> Callable[[dict[str, Any]], Any]:
    def run(world: dict[str, Any]) -> Any:
        registry = world["registry"]
        return review.edit_and_approve(
            _doc_id(registry, name, version), AM, f"# Lamp {name}\n\n{_text(name, new)}\n",
            registry=registry, open_store=review.held(world["store"]),
            embedder=world["embedder"],
        )  # fmt: skip

    return run


def _act(verb: Callable[..., Any], name: str, version: int, **kw: Any) -> Callable[..., Any]:
    def run(world: dict[str, Any]) -> Any:
        registry = world["registry"]
        doc_id = _doc_id(registry, name, version)
        return verb(doc_id, AM, registry=registry, open_store=review.held(world["store"]), **kw)

    return run


SCENARIOS = {
    # (a) an edit of an approved document: a new version that supersedes it
    "edit-approved": Scenario(_edit(GUIDE, 1, 2), GUIDE, (1, 2)),
    # (b) approving a v2 draft over the approved v1 of its source
    "approve-v2-draft": Scenario(_act(review.approve, MANUAL, 2), MANUAL, (1, 2)),
    # a v2 draft edited in place and approved: its edited text replaces v1 (marked v3)
    "edit-v2-draft": Scenario(_edit(MANUAL, 2, 3), MANUAL, (1, 3)),
    # a withdrawn document restored: a new version with its text (marked v1), shown after
    # the commit, as a first version is
    "restore": Scenario(
        _act(review.restore, "withdrawn", 1, note="back in service"),
        "withdrawn",
        (1,),
        shows_after_commit=True,
    ),
    # hiding transitions: hidden before the commit, never served once retired
    "withdraw": Scenario(
        _act(review.withdraw, BEACON, 1, note="out of date"), BEACON, (1,), hides=True
    ),
    "reject-draft": Scenario(_act(review.reject, DRAFT, 1), DRAFT, (), hides=True),
}


def review_fault_points() -> set[str]:
    """Every ``review.*`` fault point in the review code."""
    found: set[str] = set()
    for path in (REPO / "tasks" / "review").rglob("*.py"):
        found.update(re.findall(r'faults\.point\(\s*"(review\.[^"]+)"', path.read_text()))
    return found


def passes_of(run: Callable[[dict[str, Any]], Any], world: dict[str, Any]) -> list[tuple[str, int]]:
    """The fault points a clean run passes, in order, with their pass numbers."""
    seen: list[tuple[str, int]] = []
    with faults.armed(lambda name, count: seen.append((name, count))):
        run(world)
    return [(name, count) for name, count in seen if name.startswith("review.")]


def served(world: dict[str, Any]) -> dict[str, dict[str, set[int]]]:
    """Per search path (each mode, and the keyword fallback), the versions of each source its
    results hold. ``top_k`` exceeds every chunk stored, so each path returns all it admits."""
    registry = world["registry"]
    docs = {d.id: d for d in registry.documents.list_documents(ORG)}
    scope = Scope(org_id=ORG)
    results: dict[str, list[Any]] = {}
    for mode in SearchMode:
        found = retrieve(
            QUERY, scope, mode=mode, top_k=50, store=world["store"], registry=registry,
            embedder=world["embedder"], fallback=KeywordFallback(),
        )  # fmt: skip
        assert not found.degraded, found.reason
        results[mode.value] = found.hits
    fallback = retrieve(
        QUERY, scope, top_k=50, store=None, registry=registry, embedder=world["embedder"],
        fallback=KeywordFallback(), store_error="test: store down",
    )  # fmt: skip
    assert fallback.degraded
    results["keyword fallback"] = fallback.hits
    out: dict[str, dict[str, set[int]]] = {}
    for path, hits in results.items():
        per_source = out.setdefault(path, {})
        for hit in hits:
            doc = docs[hit.doc_id]
            name = doc.source_key.rsplit("/", 1)[-1]
            assert doc.status == DocStatus.APPROVED.value, f"{path} served a {doc.status} {name}"
            match = re.search(rf"Marker {name} v(\d+)", hit.text)
            assert match, f"{path}: {hit.text!r} is not {name}'s text"
            per_source.setdefault(name, set()).add(int(match.group(1)))
    return out


def check(world: dict[str, Any], scenario: Scenario, where: str) -> None:
    """Every path serves each source in exactly one version, all paths the same one (the
    scenario's target in one of its ``versions``; a hiding scenario's target perhaps in none),
    and nothing of a rejected, withdrawn or pending document; the store hides every document the
    registry rejected or withdrew."""
    found = served(world)
    for name in (*SERVED, DRAFT, REJECTED, "withdrawn"):
        allowed = scenario.versions if name == scenario.target else (1,) * (name in SERVED)
        absent_ok = not allowed or (
            (scenario.hides or scenario.shows_after_commit) and name == scenario.target
        )
        per_path = {path: sorted(per_source.get(name, ())) for path, per_source in found.items()}
        fine = [[v] for v in allowed] + [[]] * absent_ok
        wrong = {path: versions for path, versions in per_path.items() if versions not in fine}
        assert not wrong, (
            f"{where}: these paths serve {name} in none, several or other versions than one of "
            f"{list(allowed)}: {wrong}"
        )
        if not absent_ok:  # the registry decides which version: every path serves that one
            assert len({tuple(v) for v in per_path.values()}) == 1, f"{where}: {per_path}"
    registry, store = world["registry"], world["store"]
    for doc in registry.documents.list_documents(ORG):
        if doc.status in (DocStatus.REJECTED.value, DocStatus.WITHDRAWN.value):
            shown = [
                h.point_id
                for h in store.inspect_document_chunks(doc.id)
                if h.payload.get("status") in (None, DocStatus.APPROVED.value)
            ]
            assert not shown, f"{where}: {doc.status} {doc.source_key} is shown in the store"


@contextmanager
def copy_of(template: Path, home: Path, embedder: MemoEmbedder) -> Iterator[dict[str, Any]]:
    copy_home(template, home)
    with opened(home, embedder) as world:
        yield world


@pytest.fixture(scope="module")
def clean_passes(
    template: Path, tmp_path_factory: pytest.TempPathFactory, memo_embedder: MemoEmbedder
) -> dict[str, list[tuple[str, int]]]:
    """Each scenario run once without a crash: the fault points it passes (checked: it ends
    with the target served in its new version only, or not at all for a hiding one)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for name, scenario in SCENARIOS.items():
        with copy_of(template, tmp_path_factory.mktemp(name) / "home", memo_embedder) as world:
            out[name] = passes_of(scenario.run, world)
            check(world, scenario, f"after a clean {name}")
            last = [[scenario.versions[-1]]] if scenario.versions and not scenario.hides else [[]]
            for path, per_source in served(world).items():
                assert [sorted(per_source.get(scenario.target, ()))] == last, (name, path)
    return out


def test_every_review_fault_point_is_crash_tested(
    clean_passes: dict[str, list[tuple[str, int]]],
) -> None:
    """The scenarios pass every ``review.*`` point in the code (so a new point is crash-tested
    without edits here), and each replacing scenario passes several."""
    passed = {point for passes in clean_passes.values() for point, _ in passes}
    assert review_fault_points() <= passed, review_fault_points() - passed
    assert all(len(clean_passes[name]) > 1 for name in ("edit-approved", "approve-v2-draft"))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_crash_at_any_review_point_serves_each_source_in_exactly_one_version(
    template: Path,
    tmp_path: Path,
    memo_embedder: MemoEmbedder,
    clean_passes: dict[str, list[tuple[str, int]]],
    name: str,
) -> None:
    """Crashed at each pass through each point the transition passes, in turn: at once (no
    reconcile) every search path serves each source in exactly one version, the old or the
    new, never none and never both, and never a rejected, withdrawn or pending document."""
    scenario = SCENARIOS[name]
    for point, nth in clean_passes[name]:
        with copy_of(template, tmp_path / f"{point}-{nth}", memo_embedder) as world:
            with faults.armed(faults.crash_at(point, nth)), pytest.raises(faults.InjectedCrash):
                scenario.run(world)
            check(world, scenario, f"after a crash at {point} pass {nth} ({name})")


@pytest.mark.parametrize("point", ["review.after_commit", "review.after_hide", None])
@pytest.mark.parametrize("name", ["approve-v2-draft", "edit-approved"])
def test_the_next_ingest_plan_hides_what_a_crashed_publish_left_shown(
    template: Path, tmp_path: Path, memo_embedder: MemoEmbedder, name: str, point: str | None
) -> None:
    """Stopped after the registry commit (before or after hiding the retired version, but before
    the stamp), the next ingest plan of the source lists the retired version and its repair
    hides it in the store; a publish that finished leaves nothing to repair."""
    scenario = SCENARIOS[name]
    with copy_of(template, tmp_path / "copy", memo_embedder) as world:
        registry, store = world["registry"], world["store"]
        if point is None:
            scenario.run(world)
        else:
            with faults.armed(faults.crash_at(point)), pytest.raises(faults.InjectedCrash):
                scenario.run(world)
        key = _key(scenario.target)
        newest = registry.documents.versions_of(ORG, key)[-1]
        source = Source(
            source_key=key, uri=key, content_hash=newest.content_hash,
            path=Path(scenario.target), record=("", ""),
        )  # fmt: skip
        plan = plan_ingest([source], registry, ORG)
        old = _doc_id(registry, scenario.target, 1)
        assert [d.id for d in plan.shadowed] == ([] if point is None else [old])
        assert repair_shadowed(plan, registry, store, actor="system") == 0
        statuses = {h.payload["status"] for h in store.inspect_document_chunks(old)}
        assert statuses == {DocStatus.SUPERSEDED.value}
        assert plan_ingest([source], registry, ORG).shadowed == []
        report = review.reconcile(registry, store, org_id=ORG, dry_run=True)
        assert (report.repaired, report.duplicates, report.stale_removed) == ([], [], [])
        check(world, scenario, f"after the repair ({point})")
