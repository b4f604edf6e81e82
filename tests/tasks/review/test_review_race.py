"""Two reviewers in two processes race to decide the same 200 drafts through the state machine.

Each process has its own registry connection and opens the shared embedded store only for each
vector step (waiting for its lock), exactly as two CLI reviewers would. Every document must end
with exactly one decision, every loser must get ReviewConflict, the audit log must hold one row
per transition, and the vector payloads must agree with the registry afterwards.
"""

from __future__ import annotations

import multiprocessing as mp
import random
from pathlib import Path
from typing import Any

import pytest

from core.errors import ReviewConflict
from core.models import AuditAction, DocStatus, Role, Scope, SearchMode
from core.settings import Settings
from sinks.registry import SqlRegistry
from tasks.review import machine as review
from tests.conftest import index_records

N_DOCS = 200
ORG, AM, ADMIN = "acme", "am@agency", "root"


def _reviewer(home: str, actor: str, verb: str, doc_ids: list[str], barrier: Any, out: Any) -> None:
    from sinks.connect import open_vector_store

    settings = Settings(home=Path(home), store_lock_timeout_s=120)
    registry = SqlRegistry.open(settings.registry_url)
    won, lost = [], []
    order = list(doc_ids)
    random.Random(verb).shuffle(order)
    act = review.approve if verb == "approve" else review.reject
    try:
        barrier.wait(timeout=120)
        for doc_id in order:
            try:
                act(
                    doc_id, actor, registry=registry, open_store=lambda: open_vector_store(settings)
                )
            except ReviewConflict:
                lost.append(doc_id)
            else:
                won.append(doc_id)
    finally:
        registry.close()
    out.put((verb, won, lost))


@pytest.mark.integration
def test_two_reviewers_race_on_200_documents(
    settings: Settings, registry: SqlRegistry, edge_store: Any, embedder: Any
) -> None:
    registry.people.ensure_org(ORG, am_user_id=AM)
    registry.people.ensure_user(AM, Role.ACCOUNT_MANAGER)
    registry.people.ensure_user(ADMIN, Role.SUPERADMIN)
    records = [
        {"key": f"d{i}", "title": f"Draft {i}", "text": f"Heron turbine note number {i}."}
        for i in range(N_DOCS)
    ]
    doc_ids = index_records(
        records, status=DocStatus.PENDING_REVIEW, store=edge_store, registry=registry,
        embedder=embedder,
    )  # fmt: skip
    edge_store.close()  # the reviewers open it themselves

    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_reviewer, args=(str(settings.home), who, verb, doc_ids, barrier, out))
        for who, verb in ((AM, "approve"), (ADMIN, "reject"))
    ]
    for proc in procs:
        proc.start()
    results = {
        verb: (set(won), set(lost)) for verb, won, lost in (out.get(timeout=600) for _ in procs)
    }
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0

    approved, approve_lost = results["approve"]
    rejected, reject_lost = results["reject"]
    assert not approved & rejected
    assert approved | rejected == set(doc_ids)
    assert approve_lost == rejected and reject_lost == approved  # every loser got the conflict

    final = registry.documents.get_documents(doc_ids)
    for doc_id in doc_ids:
        want = "approved" if doc_id in approved else "rejected"
        assert final[doc_id].status == want
        rows = [
            r for r in registry.audit.audit_trail(ORG, doc_id) if r.action != AuditAction.CREATED
        ]
        assert len(rows) == 1
        assert rows[0].action == (
            AuditAction.APPROVED if want == "approved" else AuditAction.REJECTED
        )

    from sinks.qdrant_edge import QdrantEdgeStore
    from tasks.query.retrieve import search

    store = QdrantEdgeStore.open(settings.vectors_dir)
    try:
        assert review.reconcile(registry, store, dry_run=True).repaired == []
        hits = search(
            "heron turbine note", Scope(org_id=ORG), mode=SearchMode.KEYWORD, top_k=N_DOCS,
            store=store, registry=registry, embedder=embedder,
        )  # fmt: skip
        assert {h.doc_id for h in hits} == approved
    finally:
        store.close()
