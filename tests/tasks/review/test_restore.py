"""Restore: a withdrawn document back in service as a new approved version (issue 31).

On real components (Qdrant Edge, SQLite or PostgreSQL, MiniLM): search serves the restored
text again while the withdrawn version stays withdrawn; the audit row names the actor and the
note; the answers that cited the withdrawn version keep their provenance; only a superadmin or
the org's assigned AM may restore, only a withdrawn document with no newer approved (or
withdrawn) version; of two racing restores exactly one wins; and a crash between the registry
commit and the store's publish is repaired by `reconcile`.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from core import faults
from core.errors import ConfigError, Forbidden, ReviewConflict
from core.models import AuditAction, DocStatus, Role, Scope, SearchMode
from core.settings import Settings
from sinks.registry import DocRecord, SqlRegistry
from sinks.shared_store import LockedStore
from sinks.vectors import point_id_for
from tasks.query.fallback import KeywordFallback
from tasks.query.retrieve import retrieve, search
from tasks.review import machine as review
from tests.conftest import index_records

ORG, OTHER = "acme", "globex"
AM, OTHER_AM, ADMIN, EXPERT, ENGINEER = "am@agency", "am2@agency", "root", "ex@acme", "eng"
QUERY = "osprey winch lubrication interval"


def _text(key: str) -> str:
    return f"The osprey winch needs lubrication every 250 hours. Marker {key}."


@pytest.fixture
def people(registry: SqlRegistry) -> None:
    registry.people.ensure_org(ORG, am_user_id=AM)
    registry.people.ensure_org(OTHER, am_user_id=OTHER_AM)
    registry.people.ensure_user(AM, Role.ACCOUNT_MANAGER)
    registry.people.ensure_user(OTHER_AM, Role.ACCOUNT_MANAGER)
    registry.people.ensure_user(ADMIN, Role.SUPERADMIN)
    registry.people.ensure_user(EXPERT, Role.EXPERT, org_id=ORG)
    registry.people.ensure_user(ENGINEER, Role.ENGINEER, org_id=ORG)


@pytest.fixture
def ctx(edge_store: Any, registry: SqlRegistry, embedder: Any, people: None) -> dict[str, Any]:
    return {"store": edge_store, "registry": registry, "embedder": embedder}


def _index(
    ctx: dict[str, Any], key: str, *, status: DocStatus = DocStatus.APPROVED, text: str = ""
) -> str:
    record = {"key": key, "title": f"Winch notes {key}", "text": text or _text(key)}
    return index_records([record], status=status, org=ORG, **ctx)[0]


def _withdrawn(ctx: dict[str, Any], key: str = "w") -> str:
    doc_id = _index(ctx, key)
    review.withdraw(
        doc_id, AM, registry=ctx["registry"], open_store=review.held(ctx["store"]),
        note="out of date",
    )  # fmt: skip
    return doc_id


def _restore(ctx: dict[str, Any], doc_id: str, actor: str = AM, **kw: Any) -> DocRecord:
    kw.setdefault("note", "the recall was cancelled")
    kw.setdefault("open_store", review.held(ctx["store"]))
    return review.restore(doc_id, actor, registry=ctx["registry"], **kw)


def _served(ctx: dict[str, Any]) -> dict[str, list[str]]:
    """Per search path (every mode, and the keyword fallback over the registry alone), the doc
    ids of the winch documents it serves (``top_k`` exceeds every chunk stored)."""
    scope = Scope(org_id=ORG)
    kw = {"store": ctx["store"], "registry": ctx["registry"], "embedder": ctx["embedder"]}
    out = {
        mode.value: sorted(h.doc_id for h in search(QUERY, scope, mode=mode, top_k=50, **kw))
        for mode in SearchMode
    }
    fallback = retrieve(
        QUERY, scope, top_k=50, store=None, registry=ctx["registry"], embedder=ctx["embedder"],
        fallback=KeywordFallback(), store_error="test: store down",
    )  # fmt: skip
    out["keyword fallback"] = sorted(h.doc_id for h in fallback.hits)
    return out


def _everywhere(*doc_ids: str) -> dict[str, list[str]]:
    paths = [m.value for m in SearchMode] + ["keyword fallback"]
    return {path: sorted(doc_ids) for path in paths}


def _dense(ctx: dict[str, Any], doc_id: str) -> list[list[float]]:
    """A document's stored dense vectors, in chunk order."""
    chunks = ctx["registry"].chunks.document_chunks([doc_id])[doc_id]
    found = {
        p.point_id: p.dense
        for p in ctx["store"].retrieve_points([point_id_for(c.chunk_id) for c in chunks])
    }
    return [found[point_id_for(c.chunk_id)] for c in chunks]


def _state(ctx: dict[str, Any]) -> tuple[Any, ...]:
    """Everything a refused restore must leave as it was: the documents, the audit log and
    every stored payload."""
    registry, store = ctx["registry"], ctx["store"]
    docs = registry.documents.list_documents(ORG)
    payloads = {d.id: [h.payload for h in store.inspect_document_chunks(d.id)] for d in docs}
    return (
        [(d.id, d.version, d.status, d.updated_at) for d in docs],
        [(r.action, r.doc_id, r.after) for r in registry.audit.audit_trail(ORG, None, last=1000)],
        payloads,
    )


# --- the restore ---------------------------------------------------------------------------


def test_restore_serves_the_text_again_as_a_new_version_and_leaves_the_withdrawn_one(
    ctx: dict[str, Any],
) -> None:
    registry, store = ctx["registry"], ctx["store"]
    control = _index(ctx, "control")
    old_id = _withdrawn(ctx)
    assert _served(ctx) == _everywhere(control)
    old = registry.documents.get_document(old_id)
    old_chunks = registry.chunks.document_chunks([old_id])[old_id]
    old_trail = [(r.action, r.after) for r in registry.audit.audit_trail(ORG, old_id)]

    # No embedder: the withdrawn version's stored vectors are copied, not embedded again.
    new = _restore(ctx, old_id, embedder=None)

    assert new.id != old_id and (new.version, new.status) == (2, "approved")
    assert (new.source_key, new.content_hash, new.title) == (
        old.source_key, old.content_hash, old.title,
    )  # fmt: skip
    assert new.approved_by == AM and new.parse_status == "ingested"
    assert new.chunk_count == len(old_chunks) == old.chunk_count
    new_id = new.id
    assert registry.documents.get_document(new_id).status == "approved"
    assert _served(ctx) == _everywhere(control, new_id)
    hit = search(QUERY, Scope(org_id=ORG), mode=SearchMode.KEYWORD, top_k=50, **ctx)
    assert any(h.doc_id == new_id and "Marker w." in h.text for h in hit)

    # The copy: the same texts under new chunk ids, the same dense vectors.
    new_chunks = registry.chunks.document_chunks([new_id])[new_id]
    assert [c.text for c in new_chunks] == [c.text for c in old_chunks]
    assert {c.chunk_id for c in new_chunks}.isdisjoint(c.chunk_id for c in old_chunks)
    assert _dense(ctx, new_id) == _dense(ctx, old_id)
    assert {h.payload["status"] for h in store.inspect_document_chunks(new_id)} == {"approved"}

    # The withdrawn version is left exactly as it was.
    assert registry.documents.get_document(old_id) == old
    assert registry.chunks.document_chunks([old_id])[old_id] == old_chunks
    assert {h.payload["status"] for h in store.inspect_document_chunks(old_id)} == {"withdrawn"}
    assert [(r.action, r.after) for r in registry.audit.audit_trail(ORG, old_id)] == old_trail

    # One audit row for the restore, on the new version: who, why, and from what.
    trail = registry.audit.audit_trail(ORG, new_id)
    assert [r.action for r in trail] == [AuditAction.CREATED, AuditAction.RESTORED]
    assert trail[-1].actor == AM and trail[-1].before == {"status": "pending_review"}
    assert trail[-1].after is not None
    assert trail[-1].after["note"] == "the recall was cancelled"
    assert trail[-1].after["restored_from"] == old_id
    assert trail[-1].after["approved_by"] == AM

    report = review.reconcile(registry, store, org_id=ORG, dry_run=True)
    assert (report.repaired, report.stale_removed, report.duplicates) == ([], [], [])


def test_a_superadmin_restores_and_the_citations_come_along(ctx: dict[str, Any]) -> None:
    record = {
        "key": "cited", "title": "Winch notes cited", "markdown": True,
        "text": f"# Winch\n\n{_text('cited')} [doc:s1]\n\n## Citations\n- [doc:s1] Service log\n",
    }  # fmt: skip
    [doc_id] = index_records([record], org=ORG, cite_uris={"s1": "https://acme.example/log"}, **ctx)
    review.withdraw(
        doc_id, ADMIN, registry=ctx["registry"], open_store=review.held(ctx["store"]), note="x"
    )
    old = ctx["registry"].documents.get_document(doc_id)
    assert old.citations
    new = _restore(ctx, doc_id, ADMIN, embedder=ctx["embedder"])
    assert new.citations == old.citations and new.approved_by == ADMIN
    assert _served(ctx) == _everywhere(new.id)


def test_a_store_that_cannot_read_vectors_back_gets_them_embedded_again(
    ctx: dict[str, Any],
) -> None:
    """A store without ``retrieve_points`` (here the owner's locked wrapper) still restores:
    the texts are embedded again; with no embedder it refuses before writing anything."""
    old_id = _withdrawn(ctx)
    wrapped = LockedStore(ctx["store"], threading.Lock())
    before = _state(ctx)
    with pytest.raises(ConfigError, match="cannot be read back"):
        _restore(ctx, old_id, open_store=review.held(wrapped), embedder=None)
    assert _state(ctx) == before
    new = _restore(ctx, old_id, open_store=review.held(wrapped), embedder=ctx["embedder"])
    assert _served(ctx) == _everywhere(new.id)
    for a, b in zip(_dense(ctx, old_id), _dense(ctx, new.id), strict=True):
        assert sum(x * y for x, y in zip(a, b, strict=True)) > 0.999  # the same model and text


def test_answers_that_cited_the_withdrawn_version_keep_their_provenance(
    settings: Settings, ctx: dict[str, Any]
) -> None:
    from kbflow.services.query import answers
    from kbflow.services.query.answers import _trace
    from kbflow.services.query.context import OpenHome
    from tests.tasks.answer.handbook import index_handbook

    registry = ctx["registry"]
    docs = index_handbook(registry, ctx["store"], ctx["embedder"])
    registry.catalog.create_agent(ORG, "helper")
    search_ctx = OpenHome(
        settings=settings, registry=registry, store=ctx["store"], embedder=ctx["embedder"]
    )
    question = "How many days do employees have to submit expense reports?"
    before = answers.answer(search_ctx, "helper", question)
    assert before["status"] == "answered"
    expenses = docs["expenses"]
    assert expenses in {c["doc_id"] for c in before["citations"]}
    review.withdraw(
        expenses, AM, registry=registry, open_store=review.held(ctx["store"]), note="wrong"
    )
    withdrawn = _trace(settings, registry, doc_id=expenses)
    assert [(r["turn_id"], r["doc_status"], r["stale"]) for r in withdrawn] == [
        (before["turn_id"], "withdrawn", "document withdrawn")
    ]
    stale = _trace(settings, registry, stale_only=True)

    new = _restore(ctx, expenses, embedder=None)

    assert _trace(settings, registry, doc_id=expenses) == withdrawn  # unchanged
    assert _trace(settings, registry, stale_only=True) == stale
    after = answers.answer(search_ctx, "helper", question)
    assert after["status"] == "answered"
    cited = {c["doc_id"] for c in after["citations"]}
    assert new.id in cited and expenses not in cited
    assert [r["stale"] for r in _trace(settings, registry, doc_id=new.id)] == [None]


# --- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("actor", "why"),
    [
        (OTHER_AM, "may not review documents"),
        (EXPERT, "may not review documents"),
        (ENGINEER, "may not review documents"),
        ("nobody", "unknown user"),
    ],
    ids=["other-org-am", "expert", "engineer", "unknown"],
)
def test_only_a_superadmin_or_the_org_s_am_may_restore_and_a_refusal_changes_nothing(
    ctx: dict[str, Any], actor: str, why: str
) -> None:
    old_id = _withdrawn(ctx)
    before = _state(ctx)
    with pytest.raises(Forbidden, match=why):
        _restore(ctx, old_id, actor, embedder=ctx["embedder"])
    assert _state(ctx) == before
    assert _served(ctx) == _everywhere()


def test_a_note_is_required(ctx: dict[str, Any]) -> None:
    old_id = _withdrawn(ctx)
    before = _state(ctx)
    for note in ("", "   "):
        with pytest.raises(ConfigError, match="needs a note"):
            _restore(ctx, old_id, note=note, embedder=None)
    assert _state(ctx) == before


@pytest.mark.parametrize(
    ("status", "says"),
    [
        ("pending_review", "it is pending_review, and only a withdrawn document can be "
         "restored (it is a draft awaiting review: decide it with `kbflow review approve`"),
        ("approved", "it is approved, and only a withdrawn document can be restored (it is in "
         "service already; `kbflow review edit` corrects it)"),
        ("rejected", "it is rejected, and only a withdrawn document can be restored (a "
         "rejected draft was never in service"),
        ("superseded", "it is superseded, and only a withdrawn document can be restored (a "
         "newer version of its source replaced it"),
    ],
)  # fmt: skip
def test_only_a_withdrawn_document_can_be_restored(
    ctx: dict[str, Any], status: str, says: str
) -> None:
    opener = review.held(ctx["store"])
    registry = ctx["registry"]
    initial = DocStatus.APPROVED if status in ("approved", "superseded") else None
    doc_id = _index(ctx, "d", status=initial or DocStatus.PENDING_REVIEW)
    if status == "rejected":
        review.reject(doc_id, AM, registry=registry, open_store=opener)
    elif status == "superseded":
        review.supersede(registry.documents.get_document(doc_id), ctx["store"], registry, actor=AM)
    assert registry.documents.get_document(doc_id).status == status
    before = _state(ctx)
    with pytest.raises(ReviewConflict) as refused:
        _restore(ctx, doc_id, embedder=ctx["embedder"])
    assert f"cannot restore document {doc_id}: {says}" in str(refused.value)
    assert _state(ctx) == before


def test_a_newer_approved_or_withdrawn_version_refuses_the_restore(ctx: dict[str, Any]) -> None:
    registry = ctx["registry"]
    v1 = _withdrawn(ctx)
    v2 = _index(ctx, "w", text=_text("w") + " Revised.")  # a newer ingest of the source
    docs = registry.documents
    assert (docs.get_document(v2).version, docs.get_document(v1).status) == (2, "withdrawn")
    before = _state(ctx)
    with pytest.raises(ReviewConflict, match=rf"newer version of its source, {v2} \(v2\), is "
                       r"approved and in service.*kbflow review edit"):  # fmt: skip
        _restore(ctx, v1, embedder=None)
    assert _state(ctx) == before

    review.withdraw(v2, AM, registry=registry, open_store=review.held(ctx["store"]), note="no")
    before = _state(ctx)
    with pytest.raises(ReviewConflict, match=rf"{v2} \(v2\), was withdrawn too.*restore {v2}"):
        _restore(ctx, v1, embedder=None)
    assert _state(ctx) == before
    v3 = _restore(ctx, v2, embedder=None)  # the newest withdrawn version can be
    assert (v3.version, _served(ctx)) == (3, _everywhere(v3.id))


def test_a_restored_version_is_withdrawn_and_restored_again(ctx: dict[str, Any]) -> None:
    registry, opener = ctx["registry"], review.held(ctx["store"])
    v1 = _withdrawn(ctx)
    v2 = _restore(ctx, v1, embedder=None)
    with pytest.raises(ReviewConflict, match=r"it is withdrawn|newer version"):
        _restore(ctx, v1, embedder=None)  # v1 stays withdrawn, but v2 is in service
    review.withdraw(v2.id, AM, registry=registry, open_store=opener, note="again")
    assert _served(ctx) == _everywhere()
    v3 = _restore(ctx, v2.id, embedder=None)
    assert [d.status for d in registry.documents.versions_of(ORG, v3.source_key)] == [
        "withdrawn", "withdrawn", "approved",
    ]  # fmt: skip
    assert _served(ctx) == _everywhere(v3.id)


# --- races ---------------------------------------------------------------------------------


def _run_before_commit(action: Any) -> Any:
    """A fault hook that runs ``action`` once, when the first restore reaches the point just
    before its registry commit (`review.after_show`): another decision that lands first."""
    done: list[Any] = []

    def hook(name: str, _count: int) -> None:
        if name == "review.after_show" and not done:
            done.append(None)
            done.append(action())

    hook.done = done  # type: ignore[attr-defined]
    return hook


def test_two_racing_restores_one_wins_the_other_is_a_conflict(ctx: dict[str, Any]) -> None:
    registry = ctx["registry"]
    old_id = _withdrawn(ctx)
    hook = _run_before_commit(lambda: _restore(ctx, old_id, ADMIN, embedder=None))
    with faults.armed(hook), pytest.raises(ReviewConflict, match="can no longer be restored"):
        _restore(ctx, old_id, AM, embedder=None)
    winner: DocRecord = hook.done[1]
    assert winner.status == "approved" and winner.approved_by == ADMIN
    versions = registry.documents.versions_of(ORG, winner.source_key)
    # The loser's copy (v2, a hidden draft when the winner committed) was retired by the
    # winner's commit (superseded), its chunks deleted: never served.
    [loser] = [d for d in versions if d.id not in (old_id, winner.id)]
    assert [(d.id, d.version, d.status) for d in versions] == [
        (old_id, 1, "withdrawn"), (loser.id, 2, "superseded"), (winner.id, 3, "approved"),
    ]  # fmt: skip
    assert ctx["store"].inspect_document_chunks(loser.id) == []
    assert [r.action for r in registry.audit.audit_trail(ORG, loser.id)] == [
        AuditAction.CREATED, AuditAction.SUPERSEDED,
    ]  # fmt: skip
    restored = [
        r for d in versions for r in registry.audit.audit_trail(ORG, d.id)
        if r.action == AuditAction.RESTORED
    ]  # fmt: skip
    assert [(r.doc_id, r.actor) for r in restored] == [(winner.id, ADMIN)]
    assert _served(ctx) == _everywhere(winner.id)
    assert review.reconcile(registry, ctx["store"], org_id=ORG, dry_run=True).repaired == []


def test_a_restore_loses_to_the_approval_of_a_newer_draft(ctx: dict[str, Any]) -> None:
    registry, opener = ctx["registry"], review.held(ctx["store"])
    v1 = _index(ctx, "w")
    v2 = _index(ctx, "w", status=DocStatus.PENDING_REVIEW, text=_text("w") + " Draft two.")
    review.withdraw(v1, AM, registry=registry, open_store=opener, note="recalled")
    hook = _run_before_commit(lambda: review.approve(v2, ADMIN, registry=registry,
                                                     open_store=opener))  # fmt: skip
    with faults.armed(hook), pytest.raises(ReviewConflict, match=rf"v2 \({v2}\) of its source"):
        _restore(ctx, v1, AM, embedder=None)
    key = registry.documents.get_document(v1).source_key
    assert [d.status for d in registry.documents.versions_of(ORG, key)] == [
        "withdrawn", "approved", "rejected",
    ]  # fmt: skip
    assert _served(ctx) == _everywhere(v2)


def test_a_restore_that_wins_supersedes_a_newer_draft_whose_approval_then_conflicts(
    ctx: dict[str, Any],
) -> None:
    registry, opener = ctx["registry"], review.held(ctx["store"])
    v1 = _index(ctx, "w")
    v2 = _index(ctx, "w", status=DocStatus.PENDING_REVIEW, text=_text("w") + " Draft two.")
    review.withdraw(v1, AM, registry=registry, open_store=opener, note="recalled")
    v3 = _restore(ctx, v1, embedder=None)
    assert registry.documents.get_document(v2).status == "superseded"
    with pytest.raises(ReviewConflict, match="superseded"):
        review.approve(v2, ADMIN, registry=registry, open_store=opener)
    assert _served(ctx) == _everywhere(v3.id)


def _restorer(home: str, actor: str, doc_ids: list[str], barrier: Any, out: Any) -> None:
    from sinks.connect import open_vector_store

    settings = Settings(home=Path(home), store_lock_timeout_s=120)
    registry = SqlRegistry.open(settings.registry_url)
    won, lost = [], []
    order = list(doc_ids)
    random.Random(actor).shuffle(order)
    try:
        barrier.wait(timeout=120)
        for doc_id in order:
            try:
                review.restore(
                    doc_id, actor, registry=registry, note=f"{actor} restores",
                    open_store=lambda: open_vector_store(settings),
                )  # fmt: skip
            except ReviewConflict:
                lost.append(doc_id)
            else:
                won.append(doc_id)
    finally:
        registry.close()
    out.put((actor, won, lost))


@pytest.mark.integration
def test_two_processes_race_to_restore_the_same_documents(
    settings: Settings, ctx: dict[str, Any]
) -> None:
    """Two reviewers in two processes (as two CLI commands: each opens the store for each
    vector step) restore the same withdrawn documents: each is restored exactly once."""
    registry = ctx["registry"]
    doc_ids = [_withdrawn(ctx, f"w{i}") for i in range(12)]
    ctx["store"].close()  # the reviewers open it themselves

    spawn = mp.get_context("spawn")
    barrier, out = spawn.Barrier(2), spawn.Queue()
    procs = [
        spawn.Process(target=_restorer, args=(str(settings.home), who, doc_ids, barrier, out))
        for who in (AM, ADMIN)
    ]
    for proc in procs:
        proc.start()
    results = {
        who: (set(won), set(lost)) for who, won, lost in (out.get(timeout=600) for _ in procs)
    }
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    (am_won, am_lost), (admin_won, admin_lost) = results[AM], results[ADMIN]
    assert not am_won & admin_won and am_won | admin_won == set(doc_ids)
    assert am_lost == admin_won and admin_lost == am_won  # every loser got the conflict

    for doc_id in doc_ids:
        versions = registry.documents.versions_of(
            ORG, registry.documents.get_document(doc_id).source_key
        )
        statuses = sorted(d.status or "" for d in versions)
        assert statuses.count("approved") == 1 and statuses.count("withdrawn") == 1
        [winner] = [d for d in versions if d.status == "approved"]
        assert winner.approved_by == (AM if doc_id in am_won else ADMIN)

    from sinks.qdrant_edge import QdrantEdgeStore

    store = QdrantEdgeStore.open(settings.vectors_dir)
    try:
        assert review.reconcile(registry, store, dry_run=True).repaired == []
        approved = {d.id for d in registry.documents.list_documents(ORG, statuses=["approved"])}
        hits = search(
            QUERY, Scope(org_id=ORG), mode=SearchMode.KEYWORD, top_k=100, store=store,
            registry=registry, embedder=ctx["embedder"],
        )  # fmt: skip
        assert {h.doc_id for h in hits} == approved and len(approved) == len(doc_ids)
    finally:
        store.close()


# --- crashes -------------------------------------------------------------------------------


def test_a_crash_between_the_commit_and_the_publish_is_repaired_by_reconcile(
    ctx: dict[str, Any],
) -> None:
    registry, store = ctx["registry"], ctx["store"]
    old_id = _withdrawn(ctx)
    with (
        faults.armed(faults.crash_at("review.after_commit")),
        pytest.raises(faults.InjectedCrash),
    ):
        _restore(ctx, old_id, embedder=None)
    key = registry.documents.get_document(old_id).source_key
    [new] = [d for d in registry.documents.versions_of(ORG, key) if d.id != old_id]
    assert new.status == "approved"  # the registry committed ...
    assert {h.payload["status"] for h in store.inspect_document_chunks(new.id)} == {
        "pending_review"  # ... the store still hides it: never shown before the commit
    }
    served = _served(ctx)
    assert all(served[m.value] == [] for m in SearchMode)  # the store's filter holds it back

    report = review.reconcile(registry, store, org_id=ORG)
    assert report.repaired == [
        {"doc_id": new.id, "was": ["pending_review/pending"], "now": "approved/ingested"}
    ]
    assert _served(ctx) == _everywhere(new.id)
    assert {h.payload["status"] for h in store.inspect_document_chunks(old_id)} == {"withdrawn"}
    assert review.reconcile(registry, store, org_id=ORG, dry_run=True).repaired == []


def test_a_crash_before_the_commit_serves_nothing_and_a_second_restore_completes(
    ctx: dict[str, Any],
) -> None:
    registry, store = ctx["registry"], ctx["store"]
    old_id = _withdrawn(ctx)
    with (
        faults.armed(faults.crash_at("review.after_show")),
        pytest.raises(faults.InjectedCrash),
    ):
        _restore(ctx, old_id, embedder=None)
    assert _served(ctx) == _everywhere()
    assert review.reconcile(registry, store, org_id=ORG, dry_run=True).repaired == []
    new = _restore(ctx, old_id, embedder=None)  # the stray hidden copy is superseded
    assert new.version == 3
    statuses = [d.status for d in registry.documents.versions_of(ORG, new.source_key)]
    assert statuses == ["withdrawn", "superseded", "approved"]
    assert _served(ctx) == _everywhere(new.id)
