"""The SQL registry on real SQLite in ``tmp_path``: schema, collections, documents, review CAS."""

from __future__ import annotations

import dataclasses
import datetime as dt
import multiprocessing as mp
import random
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from core.errors import ConfigError, Forbidden, NotFound, ReviewConflict
from core.models import AuditAction, Chunk, DocStatus, ParseStatus, Role, Scope, SourceRef
from core.settings import Settings
from sinks.gate import build_gate
from sinks.registry import NO_DESCRIPTION, DocRecord, NewDocument, SqlRegistry
from sinks.registry.base import configure_sqlite
from sinks.registry.schema import CollectionRow
from tests.conftest import blank_database_url, sqlite_only

ORG = "acme"


def add_doc(
    registry: SqlRegistry,
    *,
    collection: str = "policies",
    key: str = "a",
    status: DocStatus | None = DocStatus.APPROVED,
    version: int = 1,
    org: str = ORG,
    title: str | None = None,
) -> DocRecord:
    registry.people.ensure_org(org)
    coll = registry.catalog.ensure_collection(org, collection)
    return registry.documents.create_document(
        org_id=org,
        collection_id=coll.id,
        source_key=f"test://{key}",
        title=title or f"{key} v{version}",
        uri=f"test://{key}",
        content_hash=f"{key}-{version}",
        version=version,
        status=status,
    )


def actions(registry: SqlRegistry, doc_id: str, org: str = ORG) -> list[str]:
    return [row.action for row in registry.audit.audit_trail(org, doc_id)]


# --- connection and schema ---------------------------------------------------------------


def test_sqlite_runs_in_wal_with_busy_timeout_and_foreign_keys(registry: SqlRegistry) -> None:
    sqlite_only("WAL, busy_timeout and foreign_keys are SQLite PRAGMAs")
    with registry.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 15000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_reopening_a_migrated_registry_keeps_its_rows(settings: Settings) -> None:
    first = SqlRegistry.open(settings.registry_url)
    doc = add_doc(first)
    first.close()
    again = SqlRegistry.open(settings.registry_url)
    try:
        assert again.documents.get_document(doc.id).status == "approved"
    finally:
        again.close()


# --- collections ---------------------------------------------------------------------------


def collection_rows(registry: SqlRegistry, org: str = ORG) -> dict[str, CollectionRow]:
    with registry.session() as s:
        rows = s.query(CollectionRow).filter(CollectionRow.org_id == org).all()
    return {row.path: row for row in rows}


def test_ensure_collection_creates_ancestors_with_parent_links(registry: SqlRegistry) -> None:
    registry.people.ensure_org(ORG)
    leaf = registry.catalog.ensure_collection(ORG, "policies/hr/leave", description="Leave rules")
    rows = collection_rows(registry)
    assert set(rows) == {"default", "policies", "policies/hr", "policies/hr/leave"}
    assert rows["policies"].parent_id is None
    assert rows["policies/hr"].parent_id == rows["policies"].id
    assert rows["policies/hr/leave"].parent_id == rows["policies/hr"].id
    assert leaf.id == rows["policies/hr/leave"].id
    assert [rows[p].name for p in ("policies", "policies/hr", "policies/hr/leave")] == [
        "policies",
        "hr",
        "leave",
    ]
    # The description belongs to the collection asked for, not to the ancestors made on the way.
    assert rows["policies/hr/leave"].description == "Leave rules"
    assert rows["policies"].description == NO_DESCRIPTION  # ancestors: described later


def test_ensure_collection_is_idempotent(registry: SqlRegistry) -> None:
    registry.people.ensure_org(ORG)
    first = registry.catalog.ensure_collection(ORG, "policies/hr")
    before = {path: row.id for path, row in collection_rows(registry).items()}
    second = registry.catalog.ensure_collection(ORG, "policies/hr")
    sibling = registry.catalog.ensure_collection(ORG, "policies/it")
    after = {path: row.id for path, row in collection_rows(registry).items()}
    assert second.id == first.id
    assert {k: after[k] for k in before} == before
    assert set(after) == {"default", "policies", "policies/hr", "policies/it"}
    assert collection_rows(registry)["policies/it"].parent_id == before["policies"]
    assert sibling.path == "policies/it"


def test_ensure_collection_normalizes_the_path(registry: SqlRegistry) -> None:
    registry.people.ensure_org(ORG)
    row = registry.catalog.ensure_collection(ORG, " /policies / hr/ ")
    assert row.path == "policies/hr"
    assert registry.catalog.ensure_collection(ORG, "policies/hr").id == row.id


@pytest.mark.parametrize(
    "bad",
    ["", "   ", "/", "policies//hr", "a/ /b", "..", "a/../b", "HR", "po\u200blicies", "ｈｒ",
     "a/b c", "x" * 65],
)  # fmt: skip
def test_ensure_collection_rejects_bad_paths(registry: SqlRegistry, bad: str) -> None:
    registry.people.ensure_org(ORG)
    with pytest.raises(ConfigError, match="collection path"):
        registry.catalog.ensure_collection(ORG, bad)


def test_same_collection_path_in_two_orgs(registry: SqlRegistry) -> None:
    registry.people.ensure_org("acme")
    registry.people.ensure_org("globex")
    a = registry.catalog.ensure_collection("acme", "policies")
    b = registry.catalog.ensure_collection("globex", "policies")
    assert a.id != b.id


# --- documents -----------------------------------------------------------------------------


def test_create_document_defaults_and_audit(registry: SqlRegistry) -> None:
    doc = add_doc(registry, collection="policies/hr")
    assert doc.status == DocStatus.APPROVED.value
    assert doc.parse_status == ParseStatus.PENDING.value
    assert (doc.version, doc.chunk_count) == (1, 0)
    assert doc.collection_path == "policies/hr"
    assert doc.audience is None and doc.effective_date is None
    trail = registry.audit.audit_trail(ORG, doc.id)
    assert [(r.action, r.actor, r.before, r.after) for r in trail] == [
        ("kb.document.created", "system", None, {"status": "approved", "version": 1})
    ]


def _new(registry: SqlRegistry, key: str, collection_id: int | None = None) -> NewDocument:
    registry.people.ensure_org(ORG)
    coll_id = collection_id or registry.catalog.ensure_collection(ORG, "policies").id
    return NewDocument(
        org_id=ORG,
        collection_id=coll_id,
        source_key=f"test://{key}",
        title=key,
        uri=f"test://{key}",
        content_hash=f"{key}-1",
        actor="ingest-bot",
    )


def test_create_documents_writes_a_batch_in_order_with_audit_rows(registry: SqlRegistry) -> None:
    made = registry.documents.create_documents([_new(registry, k) for k in ("c", "a", "b")])
    assert [d.source_key for d in made] == ["test://c", "test://a", "test://b"]
    assert len({d.id for d in made}) == 3
    assert {(d.parse_status, d.status, d.version) for d in made} == {("pending", "approved", 1)}
    for doc in made:
        assert [(r.action, r.actor) for r in registry.audit.audit_trail(ORG, doc.id)] == [
            ("kb.document.created", "ingest-bot")
        ]
    assert registry.documents.create_documents([]) == []


def test_create_documents_is_one_transaction(registry: SqlRegistry) -> None:
    good = _new(registry, "a")
    bad = _new(registry, "b", collection_id=10_000)  # no such collection: a foreign key fails
    with pytest.raises(IntegrityError):
        registry.documents.create_documents([good, bad])
    assert registry.documents.current_documents(ORG) == {}  # the good one was not written either


def test_put_chunks_of_replaces_each_documents_chunks_in_one_transaction(
    registry: SqlRegistry,
) -> None:
    a, b = registry.documents.create_documents([_new(registry, "a"), _new(registry, "b")])
    a_chunks = [Chunk(f"{a.id}:0", a.id, 0, "a zero"), Chunk(f"{a.id}:1", a.id, 1, "a one")]
    registry.chunks.put_chunks_of(
        [
            (a, a.content_hash, a_chunks),
            (b, b.content_hash, [Chunk(f"{b.id}:0", b.id, 0, "b zero")]),
        ],
        embedding_model="m1",
    )
    texts = {
        d: [c.text for c in cs] for d, cs in registry.chunks.document_chunks([a.id, b.id]).items()
    }
    assert texts == {a.id: ["a zero", "a one"], b.id: ["b zero"]}
    assert registry.chunks.embedding_models(ORG) == {"m1": 3}

    registry.chunks.put_chunks_of(
        [(a, a.content_hash, [Chunk(f"{a.id}:0", a.id, 0, "a new")])], embedding_model="m1"
    )
    texts = {
        d: [c.text for c in cs] for d, cs in registry.chunks.document_chunks([a.id, b.id]).items()
    }
    assert texts == {a.id: ["a new"], b.id: ["b zero"]}

    ghost = dataclasses.replace(b, id="no-such-document")  # its chunks fail a foreign key
    with pytest.raises(IntegrityError):
        registry.chunks.put_chunks_of(
            [
                (a, a.content_hash, [Chunk(f"{a.id}:0", a.id, 0, "lost")]),
                (ghost, ghost.content_hash, [Chunk("no-such-document:0", ghost.id, 0, "x")]),
            ],
            embedding_model="m1",
        )
    assert [c.text for c in registry.chunks.document_chunks([a.id])[a.id]] == ["a new"]


def test_create_document_without_status(registry: SqlRegistry) -> None:
    doc = add_doc(registry, status=None)
    assert doc.status is None
    assert registry.audit.audit_trail(ORG, doc.id)[0].after == {"status": None, "version": 1}


def test_a_new_document_is_not_served_until_parsed(registry: SqlRegistry) -> None:
    doc = add_doc(registry)
    gate = build_gate(Scope(ORG))
    assert not gate.admits(doc.gate_record())
    registry.documents.mark_parsed(doc.id, parse_status=ParseStatus.INGESTED, chunk_count=3)
    parsed = registry.documents.get_document(doc.id)
    assert (parsed.parse_status, parsed.chunk_count) == ("ingested", 3)
    assert gate.admits(parsed.gate_record())


def test_get_document_unknown_raises(registry: SqlRegistry) -> None:
    with pytest.raises(NotFound):
        registry.documents.get_document("nope")
    assert registry.documents.get_documents([]) == {}


def test_get_documents_in_bulk(registry: SqlRegistry) -> None:
    ids = [add_doc(registry, key=f"k{i}").id for i in range(3)]
    found = registry.documents.get_documents([*ids, ids[0], "missing"])
    assert set(found) == set(ids)


# --- review transitions ----------------------------------------------------------------------


def test_transition_compare_and_set_happens_once(registry: SqlRegistry) -> None:
    doc = add_doc(registry, status=DocStatus.PENDING_REVIEW)
    decided = registry.documents.transition(
        doc.id,
        expected=DocStatus.PENDING_REVIEW,
        new=DocStatus.APPROVED,
        actor="am@agency",
        action=AuditAction.APPROVED,
    )
    assert decided.status == "approved"
    with pytest.raises(ReviewConflict, match=doc.id):
        registry.documents.transition(
            doc.id,
            expected=DocStatus.PENDING_REVIEW,
            new=DocStatus.APPROVED,
            actor="am@agency",
            action=AuditAction.APPROVED,
        )
    trail = registry.audit.audit_trail(ORG, doc.id)
    assert [r.action for r in trail] == ["kb.document.created", "kb.document.approved"]
    decision = trail[-1]
    assert (decision.actor, decision.before, decision.after) == (
        "am@agency",
        {"status": "pending_review"},
        {"status": "approved"},
    )
    assert registry.documents.get_document(doc.id).status == "approved"


def test_a_lost_race_changes_nothing(registry: SqlRegistry) -> None:
    doc = add_doc(registry, status=DocStatus.PENDING_REVIEW)
    registry.documents.transition(
        doc.id,
        expected=DocStatus.PENDING_REVIEW,
        new=DocStatus.REJECTED,
        actor="a",
        action=AuditAction.REJECTED,
    )
    with pytest.raises(ReviewConflict):
        registry.documents.transition(
            doc.id,
            expected=DocStatus.PENDING_REVIEW,
            new=DocStatus.APPROVED,
            actor="b",
            action=AuditAction.APPROVED,
        )
    assert registry.documents.get_document(doc.id).status == "rejected"
    assert actions(registry, doc.id) == ["kb.document.created", "kb.document.rejected"]


def test_transition_from_no_status(registry: SqlRegistry) -> None:
    doc = add_doc(registry, status=None)
    with pytest.raises(ReviewConflict):
        registry.documents.transition(
            doc.id,
            expected=DocStatus.APPROVED,
            new=DocStatus.SUPERSEDED,
            actor="s",
            action=AuditAction.SUPERSEDED,
        )
    done = registry.documents.transition(
        doc.id, expected=None, new=DocStatus.SUPERSEDED, actor="s", action=AuditAction.SUPERSEDED
    )
    assert done.status == "superseded"
    assert registry.audit.audit_trail(ORG, doc.id)[-1].before == {"status": None}


def test_transition_unknown_document(registry: SqlRegistry) -> None:
    with pytest.raises(NotFound):
        registry.documents.transition(
            "missing", expected=DocStatus.PENDING_REVIEW, new=DocStatus.APPROVED, actor="a",
            action=AuditAction.APPROVED,
        )  # fmt: skip


def test_transition_keeps_updated_at_after_created_at(registry: SqlRegistry) -> None:
    for i in range(20):
        doc = add_doc(registry, key=f"t{i}", status=DocStatus.PENDING_REVIEW)
        done = registry.documents.transition(
            doc.id, expected=DocStatus.PENDING_REVIEW, new=DocStatus.APPROVED, actor="a",
            action=AuditAction.APPROVED,
        )  # fmt: skip
        assert done.updated_at >= done.created_at, (done.created_at, done.updated_at)


_ACTION = {"approved": AuditAction.APPROVED, "rejected": AuditAction.REJECTED}


def _decide_all(url: str, doc_ids: list[str], decision: str, barrier: Any, results: Any) -> None:
    """Child process: its own registry on the shared file, racing the other reviewer."""
    registry = SqlRegistry.open(url)
    won: list[str] = []
    # Each reviewer walks the documents in its own fixed order, so they collide all along.
    order = sorted(doc_ids)
    random.Random(decision).shuffle(order)
    try:
        barrier.wait(timeout=120)
        for doc_id in order:
            try:
                registry.documents.transition(
                    doc_id,
                    expected=DocStatus.PENDING_REVIEW,
                    new=DocStatus(decision),
                    actor=f"reviewer-{decision}",
                    action=_ACTION[decision],
                )
            except ReviewConflict:
                continue
            won.append(doc_id)
    finally:
        registry.close()
    results.put((decision, won))


@pytest.mark.integration
def test_two_processes_race_and_each_document_is_decided_once(
    registry: SqlRegistry, settings: Settings
) -> None:
    doc_ids = [
        add_doc(registry, key=f"d{i}", status=DocStatus.PENDING_REVIEW).id for i in range(30)
    ]
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_decide_all, args=(settings.registry_url, doc_ids, decision, barrier, results)
        )
        for decision in ("approved", "rejected")
    ]
    for proc in procs:
        proc.start()
    outcomes = dict(results.get(timeout=300) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0

    approved, rejected = set(outcomes["approved"]), set(outcomes["rejected"])
    assert not approved & rejected, "a document was decided by both reviewers"
    assert approved | rejected == set(doc_ids), "a document was decided by neither reviewer"
    final = registry.documents.get_documents(doc_ids)
    for doc_id in doc_ids:
        expected = "approved" if doc_id in approved else "rejected"
        assert final[doc_id].status == expected
        decisions = [
            r
            for r in registry.audit.audit_trail(ORG, doc_id)
            if r.action != AuditAction.CREATED.value
        ]
        assert len(decisions) == 1
        assert decisions[0].after == {"status": expected}
        assert decisions[0].action == _ACTION[expected].value
        assert decisions[0].actor == f"reviewer-{expected}"


# --- the legacy status migration ---------------------------------------------------------------


def _blank_engine(path: Path) -> Any:
    """An engine on an empty database (SQLite at ``path``, or PostgreSQL in that pass)."""
    engine = create_engine(blank_database_url(path))
    if engine.dialect.name == "sqlite":
        configure_sqlite(engine)
    return engine


def _advance_id_sequence(conn: Any, table: str) -> None:
    """Rows inserted with explicit ids leave PostgreSQL's sequence behind (SQLite takes max+1);
    an app-made registry never has that gap, so close it as the app would have."""
    if conn.dialect.name == "postgresql":
        conn.execute(
            text(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                f"(SELECT max(id) FROM {table}))"
            )
        )


def test_legacy_statuses_are_mapped_forward(tmp_path: Path) -> None:
    engine = _blank_engine(tmp_path / "legacy.db")
    registry = SqlRegistry(engine)
    try:
        registry.migrate("0001")
        legacy = {
            "active": "active",
            "draft": "draft",
            "deprecated": "deprecated",
            "weird": "weird",
            "null": None,
            "approved": "approved",
            "rejected": "rejected",
            "pending": "pending_review",
        }
        now = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO orgs (id, name, created_at) VALUES ('acme', 'Acme', :now)"),
                {"now": now},
            )
            conn.execute(
                text(
                    "INSERT INTO collections (id, org_id, path, name, created_at) "
                    "VALUES (1, 'acme', 'old', 'old', :now)"
                ),
                {"now": now},
            )
            _advance_id_sequence(conn, "collections")
            for doc_id, status in legacy.items():
                conn.execute(
                    text(
                        "INSERT INTO documents (id, org_id, collection_id, source_key, title, "
                        "uri, content_hash, version, status, parse_status, chunk_count, "
                        "created_at, updated_at) VALUES (:id, 'acme', 1, :id, :id, :id, 'h', 1, "
                        ":status, 'ingested', 1, :now, :now)"
                    ),
                    {"id": doc_id, "status": status, "now": now},
                )
        registry.migrate("head")
        statuses = {doc.id: doc.status for doc in registry.documents.get_documents(legacy).values()}
        assert statuses == {
            "active": "approved",
            "draft": "pending_review",
            "deprecated": "superseded",
            "weird": "approved",
            "null": None,
            "approved": "approved",
            "rejected": "rejected",
            "pending": "pending_review",
        }
        registry.migrate("head")  # already at head: nothing changes
        again = {doc.id: doc.status for doc in registry.documents.get_documents(legacy).values()}
        assert again == statuses
    finally:
        registry.close()


# --- listing -----------------------------------------------------------------------------------


def test_list_documents_filters_by_status_and_collection_subtree(registry: SqlRegistry) -> None:
    docs = {
        "root": add_doc(registry, collection="policies", key="root"),
        "hr": add_doc(
            registry, collection="policies/hr", key="hr", status=DocStatus.PENDING_REVIEW
        ),
        "leave": add_doc(registry, collection="policies/hr/leave", key="leave"),
        "old": add_doc(registry, collection="policies-old", key="old"),
        "hb": add_doc(registry, collection="handbook", key="hb", status=DocStatus.REJECTED),
        "legacy": add_doc(registry, collection="handbook", key="legacy", status=None),
    }
    add_doc(registry, collection="policies", key="other-org", org="globex")
    ids = {v.id: k for k, v in docs.items()}

    def listed(**kwargs: Any) -> set[str]:
        return {ids[d.id] for d in registry.documents.list_documents(ORG, **kwargs)}

    assert listed() == set(docs)
    assert listed(collection="policies") == {"root", "hr", "leave"}
    assert listed(collection="policies/hr") == {"hr", "leave"}
    assert listed(collection="/policies/hr/") == {"hr", "leave"}
    assert listed(collection="policies-old") == {"old"}
    assert listed(statuses=["approved"]) == {"root", "leave", "old"}
    assert listed(statuses=["pending_review", "rejected"]) == {"hr", "hb"}
    assert listed(statuses=["approved"], collection="policies/hr") == {"leave"}
    assert listed(collection="nowhere") == set()
    assert len(registry.documents.list_documents(ORG, limit=2)) == 2


def test_list_documents_subtree_is_literal(registry: SqlRegistry) -> None:
    mine = add_doc(registry, collection="hr_policies/leave", key="mine")
    add_doc(registry, collection="hrxpolicies/leave", key="wildcard")  # '_' is LIKE's wildcard
    add_doc(registry, collection="hr_policies_old/leave", key="prefix")
    assert [d.id for d in registry.documents.list_documents(ORG, collection="hr_policies")] == [
        mine.id
    ]


def test_current_documents_returns_the_newest_version(registry: SqlRegistry) -> None:
    for version in (2, 3, 1):  # inserted out of order on purpose
        add_doc(registry, key="guide", version=version)
    add_doc(registry, key="faq", version=1)
    add_doc(registry, key="guide", version=9, org="globex")
    current = registry.documents.current_documents(ORG)
    assert set(current) == {"test://guide", "test://faq"}
    assert current["test://guide"].version == 3
    assert current["test://faq"].version == 1
    assert registry.documents.current_documents("globex")["test://guide"].version == 9
    assert registry.documents.current_documents("nobody") == {}


# --- the Default collection migration (0006) ---------------------------------------------------


def _document_rows(engine: Any) -> dict[str, tuple[Any, ...]]:
    """Every document row's columns of migration 0005, by id, read without the models."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, org_id, collection_id, source_key, title, uri, content_hash, version, "
                "status, parse_status, chunk_count, approved_by, edited_by FROM documents"
            )
        )
        return {row[0]: tuple(row) for row in rows}


def test_default_collections_are_backfilled_and_nothing_is_lost(tmp_path: Path) -> None:
    """A registry file made by the earlier migrations (up to 0005), with documents and chunks,
    upgraded to head: every org gets Default, every document keeps its row and collection, and
    the document's collection is NOT NULL."""
    from sqlalchemy.exc import IntegrityError

    engine = _blank_engine(tmp_path / "earlier.db")
    registry = SqlRegistry(engine)
    try:
        registry.migrate("0005")
        now = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
        with engine.begin() as conn:
            for org in ("acme", "globex"):
                conn.execute(
                    text("INSERT INTO orgs (id, name, created_at) VALUES (:o, :o, :now)"),
                    {"o": org, "now": now},
                )
            conn.execute(
                text(
                    "INSERT INTO collections (id, org_id, path, name, created_at) "
                    "VALUES (7, 'acme', 'handbooks', 'handbooks', :now)"
                ),
                {"now": now},
            )
            _advance_id_sequence(conn, "collections")
            for n in range(5):
                conn.execute(
                    text(
                        "INSERT INTO documents (id, org_id, collection_id, source_key, title, uri, "
                        "content_hash, version, status, parse_status, chunk_count, created_at, "
                        "updated_at) VALUES (:id, 'acme', 7, :id, :id, :id, 'h', 1, 'approved', "
                        "'ingested', 1, :now, :now)"
                    ),
                    {"id": f"doc{n}", "now": now},
                )
                conn.execute(
                    text(
                        "INSERT INTO chunks (chunk_id, doc_id, org_id, content_hash, chunk_index, "
                        "text, heading_path) VALUES (:c, :d, 'acme', 'h', 0, 'text', '[]')"
                    ),
                    {"c": f"doc{n}:0", "d": f"doc{n}"},
                )
        before = _document_rows(engine)  # raw rows: the models know columns added later

        registry.migrate("head")

        assert _document_rows(engine) == before
        assert {d.id for d in registry.documents.list_documents("acme")} == set(before)
        catalog = registry.catalog
        for org in ("acme", "globex"):
            default = catalog.get_collection(org, "default")
            assert default.name == "Default" and default.description
        handbooks = catalog.get_collection("acme", "handbooks")
        assert handbooks.id == 7 and handbooks.description  # backfilled, never empty
        assert len(registry.chunks.current_chunks("acme")) == 5
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO documents (id, org_id, collection_id, source_key, title, uri, "
                    "content_hash, version, parse_status, chunk_count, created_at, updated_at) "
                    "VALUES ('x', 'acme', NULL, 'x', 'x', 'x', 'h', 1, 'ingested', 0, :n, :n)"
                ),
                {"n": now},
            )
    finally:
        registry.close()


# --- document citations (0009) -------------------------------------------------------------------


def test_documents_gain_citations_and_older_rows_have_none(tmp_path: Path) -> None:
    """A registry made up to 0008 with a document, upgraded: the row has no citations (NULL,
    read as none); a new document keeps its citations, read back in order."""
    engine = _blank_engine(tmp_path / "before-citations.db")
    registry = SqlRegistry(engine)
    try:
        registry.migrate("0008")
        now = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO orgs (id, name, created_at) VALUES ('acme', 'Acme', :now)"),
                {"now": now},
            )
        coll = registry.catalog.ensure_collection("acme", "kb")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO documents (id, org_id, collection_id, source_key, title, uri, "
                    "content_hash, version, status, parse_status, chunk_count, created_at, "
                    "updated_at) VALUES ('old', 'acme', :c, 'old', 'Old', 'u', 'h', 1, "
                    "'approved', 'ingested', 1, :now, :now)"
                ),
                {"c": coll.id, "now": now},
            )

        registry.migrate("head")

        assert registry.documents.get_document("old").citations == ()
        assert registry.documents.get_document("old").to_dict()["citations"] == []
        refs = (
            SourceRef("doc:3f2a", "Brand brief.pdf", "upload:acme/brief.pdf"),
            SourceRef(
                "url:https://acme.example/a[1]", "Acme homepage", "https://acme.example/a[1]"
            ),
            SourceRef("search:acme tone", "Web search: acme tone"),
        )
        made = registry.documents.create_document(
            org_id="acme", collection_id=coll.id, source_key="draft", title="Draft", uri="kb://d",
            content_hash="h2", citations=refs,
        )  # fmt: skip
        assert registry.documents.get_document(made.id).citations == refs
        assert registry.documents.get_document(made.id).to_dict()["citations"][1] == {
            "tag": "[url:https://acme.example/a[1]]",
            "title": "Acme homepage",
            "uri": "https://acme.example/a[1]",
        }
    finally:
        registry.close()


# --- chunk embedding model ids (0010) ------------------------------------------------------------


def test_chunks_gain_an_embedding_model_column_that_goes_down_and_up_again(
    tmp_path: Path,
) -> None:
    """A registry made up to 0009 with a chunk, upgraded: the chunk's model is NULL (written
    before ids were recorded: compatible with any model); a new chunk keeps its model; 0010
    goes down (column and index gone, rows kept) and up again."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import inspect

    from core.models import Chunk
    from sinks.registry.base import _MIGRATIONS

    engine = _blank_engine(tmp_path / "before-model-ids.db")
    registry = SqlRegistry(engine)
    try:
        registry.migrate("0009")
        registry.people.ensure_org(ORG)
        coll = registry.catalog.ensure_collection(ORG, "policies")
        with engine.begin() as conn:  # as 0009 knew documents (later columns are not there)
            conn.execute(
                text(
                    "INSERT INTO documents (id, org_id, collection_id, source_key, title, uri, "
                    "content_hash, version, status, parse_status, chunk_count, created_at, "
                    "updated_at) VALUES ('d0009', :o, :c, 'test://a', 'a v1', 'test://a', "
                    "'a-1', 1, 'approved', 'ingested', 1, :t, :t)"
                ),
                {"o": ORG, "c": coll.id, "t": dt.datetime.now(dt.UTC)},
            )
            conn.execute(
                text(
                    "INSERT INTO chunks (chunk_id, doc_id, org_id, content_hash, chunk_index, "
                    "text, heading_path) VALUES (:c, :d, :o, :h, 0, 'old text', '[]')"
                ),
                {"c": "d0009:0", "d": "d0009", "o": ORG, "h": "a-1"},
            )

        registry.migrate("head")
        doc = registry.documents.get_document("d0009")
        assert registry.chunks.embedding_models(doc.org_id) == {None: 1}
        assert registry.chunks.embedding_model_bounds(doc.org_id) == (None, None)
        new = add_doc(registry, key="new")
        chunk = Chunk(f"{new.id}:0", new.id, 0, "new text")
        registry.chunks.put_chunks(new, new.content_hash, [chunk], embedding_model="m1")
        assert registry.chunks.embedding_models(doc.org_id) == {None: 1, "m1": 1}
        assert registry.chunks.embedding_model_bounds(doc.org_id) == ("m1", "m1")
        assert registry.chunks.relabel_org_chunks(doc.org_id, "m2") == 2
        assert registry.chunks.embedding_model_bounds(doc.org_id) == ("m2", "m2")

        cfg = Config()
        cfg.set_main_option("script_location", str(_MIGRATIONS))
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0009")
        with engine.connect() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns("chunks")}
            indexes = {i["name"] for i in inspect(conn).get_indexes("chunks")}
            count = conn.execute(text("SELECT count(*) FROM chunks")).scalar()
        assert "embedding_model" not in columns and "ix_chunks_org_model" not in indexes
        assert count == 2
        registry.migrate("head")
        assert registry.chunks.embedding_models(doc.org_id) == {None: 2}
    finally:
        registry.close()


# --- superadmins: the last one stays, the bootstrap never reopens (review finding M2) -----------


def test_the_last_superadmin_cannot_be_demoted(registry: SqlRegistry) -> None:
    registry.people.ensure_user("root", Role.SUPERADMIN)
    for role in (Role.ENGINEER, Role.ACCOUNT_MANAGER, Role.EXPERT):
        with pytest.raises(Forbidden, match="last superadmin") as refused:
            registry.people.ensure_user("root", role, actor="root")
        assert "Make another superadmin first" in str(refused.value)
    assert registry.people.get_user("root").role is Role.SUPERADMIN
    assert registry.people.count_superadmins() == 1
    saved = [
        r for r in registry.audit.audit_trail(None) if r.action == AuditAction.USER_SAVED.value
    ]
    assert len(saved) == 1  # only the creation: the refused changes wrote nothing
    registry.people.ensure_user(
        "root", Role.SUPERADMIN, name="Root", actor="root"
    )  # not a demotion
    assert registry.people.get_user("root").name == "Root"


def test_a_superadmin_may_be_demoted_while_another_remains(registry: SqlRegistry) -> None:
    registry.people.ensure_user("root", Role.SUPERADMIN)
    registry.people.ensure_user("root2", Role.SUPERADMIN, actor="root")
    assert registry.people.ensure_user("root", Role.ENGINEER, actor="root2").role is Role.ENGINEER
    assert registry.people.count_superadmins() == 1
    with pytest.raises(Forbidden, match="last superadmin"):
        registry.people.ensure_user("root2", Role.ENGINEER, actor="root2")


def test_the_bootstrap_works_once_on_a_registry_that_never_had_a_superadmin(
    registry: SqlRegistry,
) -> None:
    registry.people.ensure_user("eng", Role.ENGINEER)
    assert not registry.people.had_superadmin()
    registry.people.ensure_user("root", Role.SUPERADMIN, actor="bootstrap", bootstrap=True)
    assert registry.people.had_superadmin()
    with pytest.raises(Forbidden, match="bootstrap"):
        registry.people.ensure_user("mallory", Role.SUPERADMIN, actor="bootstrap", bootstrap=True)
    with pytest.raises(ConfigError, match="first superadmin only"):
        registry.people.ensure_user("eng2", Role.ENGINEER, bootstrap=True)
    assert {u.id for u in registry.people.list_users()} == {"eng", "root"}


def test_the_bootstrap_stays_closed_after_the_superadmin_is_removed_behind_its_back(
    registry: SqlRegistry,
) -> None:
    registry.people.ensure_user("root", Role.SUPERADMIN)
    with registry.engine.begin() as conn:  # a write that bypasses the registry's checks
        conn.execute(text("UPDATE users SET role = 'engineer' WHERE id = 'root'"))
    assert registry.people.count_superadmins() == 0
    assert registry.people.had_superadmin()  # the audit log remembers
    with pytest.raises(Forbidden, match="bootstrap"):
        registry.people.ensure_user("mallory", Role.SUPERADMIN, actor="bootstrap", bootstrap=True)
    with registry.engine.begin() as conn:
        conn.execute(text("DELETE FROM users WHERE id = 'root'"))
    with pytest.raises(Forbidden, match="bootstrap"):
        registry.people.ensure_user("mallory", Role.SUPERADMIN, actor="bootstrap", bootstrap=True)
    assert {u.id for u in registry.people.list_users()} == set()


def _demote(url: str, user_id: str, barrier: Any, results: Any) -> None:
    """Child process: demote ``user_id``, racing another process demoting the other one."""
    _claim(url, user_id, barrier, results, "demoted", Role.ENGINEER, actor=user_id)


def _bootstrap(url: str, user_id: str, barrier: Any, results: Any) -> None:
    """Child process: claim the bootstrap for ``user_id``, racing the other processes."""
    _claim(url, user_id, barrier, results, "created", Role.SUPERADMIN, actor="bootstrap",
           bootstrap=True)  # fmt: skip


def _claim(
    url: str, user_id: str, barrier: Any, results: Any, done: str, role: Role, **kw: Any
) -> None:
    """Save ``user_id`` as ``role`` once every racer is ready; put ``done`` or "refused" (or
    the error: a child that dies would leave the queue empty) on ``results``."""
    registry = SqlRegistry.open(url)
    try:
        barrier.wait(timeout=120)
        try:
            registry.people.ensure_user(user_id, role, **kw)
            results.put((user_id, done))
        except Forbidden:
            results.put((user_id, "refused"))
        except Exception as exc:
            results.put((user_id, f"error: {exc!r}"))
    finally:
        registry.close()


def _race(target: Any, url: str, user_ids: list[str]) -> dict[str, str]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(user_ids))
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, u, barrier, results)) for u in user_ids]
    for proc in procs:
        proc.start()
    outcomes = dict(results.get(timeout=300) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return outcomes


@pytest.mark.integration
def test_two_superadmins_demoting_each_other_at_once_leave_one(
    registry: SqlRegistry, settings: Settings
) -> None:
    for _ in range(3):
        registry.people.ensure_user("a", Role.SUPERADMIN)
        registry.people.ensure_user("b", Role.SUPERADMIN, actor="a")
        outcomes = _race(_demote, settings.registry_url, ["a", "b"])
        assert sorted(outcomes.values()) == ["demoted", "refused"], outcomes
        assert registry.people.count_superadmins() == 1


@pytest.mark.integration
def test_racing_bootstraps_make_one_superadmin(registry: SqlRegistry, settings: Settings) -> None:
    outcomes = _race(_bootstrap, settings.registry_url, ["r1", "r2", "r3"])
    assert sorted(outcomes.values()) == ["created", "refused", "refused"], outcomes
    assert registry.people.count_superadmins() == 1


def test_list_documents_by_source_keys_reads_only_those_sources(registry: SqlRegistry) -> None:
    registry.people.ensure_org("acme")
    coll = registry.catalog.ensure_collection("acme", "docs")
    for key in ("a", "b", "c"):
        for version in (1, 2):
            registry.documents.create_document(
                org_id="acme", collection_id=coll.id, source_key=key, title=key, uri=key,
                content_hash=f"{key}{version}", version=version, status=DocStatus.APPROVED,
            )  # fmt: skip
    picked = registry.documents.list_documents("acme", source_keys=["c", "a", "a", "zzz"])
    assert [(d.source_key, d.version) for d in picked] == [("a", 1), ("a", 2), ("c", 1), ("c", 2)]
    assert registry.documents.list_documents("acme", source_keys=[]) == []
    assert len(registry.documents.list_documents("acme")) == 6


def test_review_runs_hold_drafts_by_id_or_by_their_synthesis_run(registry: SqlRegistry) -> None:
    """A review run holds the drafts it lists; a research run, recorded before its drafts are
    stored, holds every draft of its synthesis run (migration 0016); ``since`` keeps only the
    runs recorded from then on (SQLite and PostgreSQL alike)."""
    registry.people.ensure_org("acme")
    runs = registry.review_runs
    runs.record_review_run("research-1", "acme", [], synthesis_run_id="syn-1")
    runs.record_review_run("review-1", "acme", ["d1", "d2"])
    assert runs.review_runs_holding("acme", "d1") == ["review-1"]
    assert sorted(runs.review_runs_holding("acme", "d1", synthesis_run_id="syn-1")) == [
        "research-1",
        "review-1",
    ]
    assert runs.review_runs_holding("acme", "d9", synthesis_run_id="syn-1") == ["research-1"]
    assert runs.review_runs_holding("acme", "d9", synthesis_run_id="syn-2") == []
    assert runs.review_runs_holding("other", "d1", synthesis_run_id="syn-1") == []
    now = dt.datetime.now(dt.UTC)
    assert runs.review_runs_holding("acme", "d1", since=now - dt.timedelta(minutes=5)) == [
        "review-1"
    ]
    assert runs.review_runs_holding("acme", "d1", since=now + dt.timedelta(minutes=5)) == []
    runs.record_review_run("research-1", "acme", ["d9"])  # again: keeps its synthesis run
    assert runs.review_runs_holding("acme", "d8", synthesis_run_id="syn-1") == ["research-1"]
