"""The review state machine on real components: transitions, authorisation, audit, the
fail-safe vector ordering under injected crashes, reconcile, and the inspection path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core import faults
from core.errors import ConfigError, Forbidden, ReviewConflict
from core.models import AuditAction, DocStatus, Role, Scope, SearchMode, SourceRef
from sinks.registry import SqlRegistry
from tasks.query.retrieve import search
from tasks.review import decisions, inspection
from tasks.review import machine as review
from tests.conftest import index_records, registry_url

ORG, OTHER = "acme", "globex"
AM, OTHER_AM, ADMIN, EXPERT, ENGINEER = "am@agency", "am2@agency", "root", "ex@acme", "eng"
TEXT = "The heron turbine needs maintenance every 400 hours."


@pytest.fixture
def people(registry: SqlRegistry) -> None:
    registry.people.ensure_org(ORG, am_user_id=AM)
    registry.people.ensure_org(OTHER, am_user_id=OTHER_AM)
    registry.people.ensure_user(AM, Role.ACCOUNT_MANAGER)
    registry.people.ensure_user(OTHER_AM, Role.ACCOUNT_MANAGER)
    registry.people.ensure_user(ADMIN, Role.SUPERADMIN)
    registry.people.ensure_user(EXPERT, Role.EXPERT, org_id=ORG)
    registry.people.ensure_user(ENGINEER, Role.ENGINEER)


@pytest.fixture
def ctx(edge_store: Any, registry: SqlRegistry, embedder: Any, people: None) -> dict[str, Any]:
    return {"store": edge_store, "registry": registry, "embedder": embedder}


def _index(ctx: dict[str, Any], key: str, *, status: DocStatus | None, org: str = ORG) -> str:
    doc = {"key": key, "title": f"Turbine notes {key}", "text": f"{TEXT} Note {key}."}
    return index_records([doc], status=status, org=org, **ctx)[0]


def _visible(ctx: dict[str, Any], org: str = ORG) -> dict[SearchMode, set[str]]:
    return {
        mode: {
            h.doc_id
            for h in search("heron turbine maintenance hours", Scope(org_id=org), mode=mode, **ctx)
        }
        for mode in SearchMode
    }


def _actions(registry: SqlRegistry, doc_id: str, org: str = ORG) -> list[str]:
    return [r.action for r in registry.audit.audit_trail(org, doc_id)]


@pytest.mark.parametrize("hidden", ["pending_review", "rejected", "superseded", "other_org"])
@pytest.mark.parametrize("mode", list(SearchMode))
def test_each_hidden_case_is_invisible_in_each_mode(
    ctx: dict[str, Any], hidden: str, mode: SearchMode
) -> None:
    control = _index(ctx, "control", status=DocStatus.APPROVED)
    if hidden == "other_org":
        target = _index(ctx, "target", status=DocStatus.APPROVED, org=OTHER)
    else:
        target = _index(ctx, "target", status=DocStatus.PENDING_REVIEW)
        opener = review.held(ctx["store"])
        if hidden == "rejected":
            review.reject(target, AM, registry=ctx["registry"], open_store=opener)
        elif hidden == "superseded":
            review.approve(target, AM, registry=ctx["registry"], open_store=opener)
            review.supersede(
                ctx["registry"].documents.get_document(target),
                ctx["store"],
                ctx["registry"],
                actor=AM,
            )
    assert ctx["registry"].documents.get_document(target).status == (
        "approved" if hidden == "other_org" else hidden
    )
    found = _visible(ctx)[mode]
    assert control in found
    assert target not in found


def test_approve_shows_and_stamps_and_audits(ctx: dict[str, Any]) -> None:
    doc_id = _index(ctx, "d", status=DocStatus.PENDING_REVIEW)
    assert all(doc_id not in ids for ids in _visible(ctx).values())
    done = review.approve(
        doc_id, AM, registry=ctx["registry"], open_store=review.held(ctx["store"]), note="ok"
    )
    assert (done.status, done.approved_by) == ("approved", AM) and done.approved_at is not None
    assert all(doc_id in ids for ids in _visible(ctx).values())
    trail = ctx["registry"].audit.audit_trail(ORG, doc_id)
    assert [r.action for r in trail] == [AuditAction.CREATED, AuditAction.APPROVED]
    assert trail[-1].actor == AM
    assert trail[-1].before == {"status": "pending_review"}
    assert trail[-1].after == {"status": "approved", "approved_by": AM, "note": "ok"}


def test_lost_race_and_superseded_documents_conflict(ctx: dict[str, Any]) -> None:
    opener = review.held(ctx["store"])
    doc_id = _index(ctx, "d", status=DocStatus.PENDING_REVIEW)
    review.reject(doc_id, ADMIN, registry=ctx["registry"], open_store=opener)
    with pytest.raises(ReviewConflict, match="only pending_review documents"):
        review.approve(doc_id, AM, registry=ctx["registry"], open_store=opener)
    assert _actions(ctx["registry"], doc_id) == [AuditAction.CREATED, AuditAction.REJECTED]

    old = _index(ctx, "old", status=DocStatus.APPROVED)
    review.supersede(
        ctx["registry"].documents.get_document(old), ctx["store"], ctx["registry"], actor=AM
    )
    with pytest.raises(ReviewConflict, match="superseded document cannot be acted on"):
        review.reject(old, AM, registry=ctx["registry"], open_store=opener)


@pytest.mark.parametrize(
    "actor", [OTHER_AM, EXPERT, ENGINEER, "nobody"], ids=["other-am", "expert", "engineer", "x"]
)
def test_unauthorised_actors_are_refused_and_nothing_changes(
    ctx: dict[str, Any], actor: str
) -> None:
    opener = review.held(ctx["store"])
    doc_id = _index(ctx, "d", status=DocStatus.PENDING_REVIEW)
    before = _actions(ctx["registry"], doc_id)
    payloads = [h.payload["status"] for h in ctx["store"].inspect_document_chunks(doc_id)]
    for attempt in (
        lambda: review.approve(doc_id, actor, registry=ctx["registry"], open_store=opener),
        lambda: review.reject(doc_id, actor, registry=ctx["registry"], open_store=opener),
        lambda: review.edit_and_approve(
            doc_id,
            actor,
            "# New\n\nnew text",
            registry=ctx["registry"],
            open_store=opener,
            embedder=ctx["embedder"],
        ),
    ):
        with pytest.raises(Forbidden, match=r"may not review|unknown user"):
            attempt()
    assert ctx["registry"].documents.get_document(doc_id).status == "pending_review"
    assert _actions(ctx["registry"], doc_id) == before
    assert [h.payload["status"] for h in ctx["store"].inspect_document_chunks(doc_id)] == payloads


def test_edit_replaces_content_then_approves(ctx: dict[str, Any]) -> None:
    doc_id = _index(ctx, "d", status=DocStatus.PENDING_REVIEW)
    with pytest.raises(ConfigError, match="empty"):
        review.edit_and_approve(
            doc_id,
            AM,
            "  ",
            registry=ctx["registry"],
            open_store=review.held(ctx["store"]),
            embedder=ctx["embedder"],
        )
    done = review.edit_and_approve(
        doc_id,
        AM,
        "# Service\n\n## Interval\n\nThe heron turbine maintenance interval is 250 hours.",
        registry=ctx["registry"],
        open_store=review.held(ctx["store"]),
        embedder=ctx["embedder"],
    )
    assert (done.status, done.edited_by, done.approved_by) == ("approved", AM, AM)
    hits = search("heron turbine maintenance hours", Scope(org_id=ORG), **ctx)
    texts = [h.text for h in hits if h.doc_id == doc_id]
    assert texts and all("250 hours" in t and "400" not in t for t in texts)
    assert next(h.heading_path for h in hits if h.doc_id == doc_id) == ["Service", "Interval"]
    assert _actions(ctx["registry"], doc_id)[-1] == AuditAction.EDITED_APPROVED


def test_approving_a_new_version_supersedes_the_old_one(ctx: dict[str, Any]) -> None:
    registry = ctx["registry"]
    old = _index(ctx, "same", status=DocStatus.APPROVED)
    # A second version of the same source arrives as a draft: the old one stays visible.
    new = index_records(
        [{"key": "same", "title": "Turbine notes v2", "text": f"{TEXT} Revised."}],
        status=DocStatus.PENDING_REVIEW,
        **ctx,
    )[0]
    assert registry.documents.get_document(new).version == 2
    assert old in _visible(ctx)[SearchMode.HYBRID]
    review.approve(new, AM, registry=registry, open_store=review.held(ctx["store"]))
    assert registry.documents.get_document(old).status == "superseded"
    for ids in _visible(ctx).values():
        assert new in ids and old not in ids
    assert _actions(registry, old)[-1] == AuditAction.SUPERSEDED


class Boom(RuntimeError):
    pass


def test_crash_before_the_commit_leaves_nothing_unapproved_visible_and_the_old_version_served(
    ctx: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry, store = ctx["registry"], ctx["store"]
    approved = _index(ctx, "approved", status=DocStatus.APPROVED)
    newer = index_records(
        [{"key": "approved", "title": "v2", "text": f"{TEXT} v2."}],
        status=DocStatus.PENDING_REVIEW,
        **ctx,
    )[0]
    pending = _index(ctx, "pending", status=DocStatus.PENDING_REVIEW)

    def crash(*_a: Any, **_k: Any) -> Any:
        raise Boom("injected: process died before the registry commit")

    # reject: the payload is hidden, then the registry commit "crashes".
    monkeypatch.setattr(registry.documents, "transition", crash)
    with pytest.raises(Boom):
        review.reject(pending, AM, registry=registry, open_store=review.held(store))
    monkeypatch.undo()
    # approve of v2: the process dies after showing v2's chunks, before the registry commit.
    with faults.armed(faults.crash_at("review.after_show")), pytest.raises(faults.InjectedCrash):
        review.approve(newer, AM, registry=registry, open_store=review.held(store))

    for ids in _visible(ctx).values():
        assert pending not in ids and newer not in ids  # nothing unapproved, nothing early
        assert approved in ids  # v1 is served until the commit retires it: never none
    assert registry.documents.get_document(pending).status == "pending_review"
    assert registry.documents.get_document(newer).status == "pending_review"  # the commit never ran
    assert registry.documents.get_document(approved).status == "approved"

    report = review.reconcile(registry, store, org_id=ORG)
    assert {r["doc_id"] for r in report.repaired} == {pending, newer}
    assert report.duplicates == []
    assert review.reconcile(registry, store, org_id=ORG).repaired == []
    # The reconciler repaired payloads from the registry; it makes no review decision.
    assert approved in _visible(ctx)[SearchMode.HYBRID]
    assert not {pending, newer} & set(_visible(ctx)[SearchMode.HYBRID])


def test_crash_after_the_approval_commit_never_serves_two_versions(ctx: dict[str, Any]) -> None:
    registry, store = ctx["registry"], ctx["store"]
    old = _index(ctx, "same", status=DocStatus.APPROVED)
    new = index_records(
        [{"key": "same", "title": "v2", "text": f"{TEXT} v2."}],
        status=DocStatus.PENDING_REVIEW,
        **ctx,
    )[0]
    # The commit approves v2 and supersedes v1 in ONE transaction; the process dies before
    # v1's chunks are hidden in the store (v2's were shown before the commit).
    with faults.armed(faults.crash_at("review.after_commit")), pytest.raises(faults.InjectedCrash):
        review.approve(new, AM, registry=registry, open_store=review.held(store))
    assert registry.documents.get_document(new).status == "approved"
    assert registry.documents.get_document(old).status == "superseded"
    for ids in _visible(ctx).values():
        assert new in ids and old not in ids  # the registry re-check drops v1's chunks
    report = review.reconcile(registry, store, org_id=ORG)
    assert {r["doc_id"] for r in report.repaired} == {old}
    for ids in _visible(ctx).values():
        assert new in ids and old not in ids


def test_reconcile_removes_orphans_and_respects_dry_run(
    ctx: dict[str, Any], tmp_path: Path
) -> None:
    registry, store = ctx["registry"], ctx["store"]
    doc_id = _index(ctx, "d", status=DocStatus.APPROVED)
    store.set_document_payload(doc_id, {"status": "rejected"})  # drift: hidden by mistake
    # A second registry (another database on PostgreSQL) that the store's orphan came from.
    other = SqlRegistry.open(registry_url(tmp_path / "other.db", name="other"))
    try:
        orphan = index_records(
            [{"key": "o", "title": "o", "text": TEXT}], store=store, registry=other,
            embedder=ctx["embedder"],
        )[0]  # fmt: skip
    finally:
        other.close()
    dry = review.reconcile(registry, store, dry_run=True)
    assert [r["doc_id"] for r in dry.repaired] == [doc_id] and dry.orphans_removed == [orphan]
    assert store.inspect_document_chunks(orphan)
    done = review.reconcile(registry, store)
    assert done.orphans_removed == [orphan] and not store.inspect_document_chunks(orphan)
    assert doc_id in _visible(ctx)[SearchMode.HYBRID]


def test_inspection_path_is_authorised(ctx: dict[str, Any]) -> None:
    registry, store = ctx["registry"], ctx["store"]
    doc_id = _index(ctx, "d", status=DocStatus.PENDING_REVIEW)
    for reader in (AM, ADMIN, EXPERT):
        view = inspection.inspect_draft(doc_id, reader, registry=registry, store=store)
        assert "400 hours" in view.text
        groups = inspection.list_drafts(registry, reader, ORG)
        assert [d.id for docs in groups.values() for d in docs] == [doc_id]
    for outsider in (OTHER_AM, ENGINEER):
        with pytest.raises(Forbidden, match="may not inspect"):
            inspection.inspect_draft(doc_id, outsider, registry=registry, store=store)
        with pytest.raises(Forbidden):
            inspection.list_drafts(registry, outsider, ORG)


def test_apply_decisions_reports_each_outcome(ctx: dict[str, Any]) -> None:
    registry = ctx["registry"]
    a, b, c = (_index(ctx, k, status=DocStatus.PENDING_REVIEW) for k in "abc")
    outcomes = decisions.apply_decisions(
        [
            decisions.Decision(a, "approve"),
            decisions.Decision(b, "edit", content=""),
            decisions.Decision(c, "reject", note="wrong"),
            decisions.Decision(a, "reject"),
            decisions.Decision("missing", "approve"),
        ],
        AM,
        registry=registry,
        open_store=review.held(ctx["store"]),
        embedder=lambda: ctx["embedder"],
    )
    assert [o.result for o in outcomes] == [
        "applied",
        "invalid",
        "applied",
        "conflict",
        "forbidden",  # an unknown document is refused as another org's is: nothing said of it
    ]
    assert [registry.documents.get_document(x).status for x in (a, b, c)] == [
        "approved",
        "pending_review",
        "rejected",
    ]
    forbidden = decisions.apply_decisions(
        [decisions.Decision(b, "approve")],
        ENGINEER,
        registry=registry,
        open_store=review.held(ctx["store"]),
        embedder=lambda: ctx["embedder"],
    )
    assert forbidden[0].result == "forbidden"
    assert registry.documents.get_document(b).status == "pending_review"


def test_an_edit_that_loses_its_race_never_serves_its_text(
    ctx: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry, store = ctx["registry"], ctx["store"]
    doc_id = _index(ctx, "d", status=DocStatus.PENDING_REVIEW)
    real_commit = registry.documents.transition_and_retire

    def approved_first(*args: Any, **kwargs: Any) -> Any:
        # Another reviewer approves the original draft just before the edit commits.
        monkeypatch.setattr(registry.documents, "transition_and_retire", real_commit)
        review.approve(doc_id, ADMIN, registry=registry, open_store=review.held(store))
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(registry.documents, "transition_and_retire", approved_first)
    with pytest.raises(ReviewConflict):
        review.edit_and_approve(
            doc_id,
            AM,
            "The heron turbine maintenance interval is 999 hours (unapproved edit).",
            registry=registry,
            open_store=review.held(store),
            embedder=ctx["embedder"],
        )
    texts = [h.payload["text"] for h in store.inspect_document_chunks(doc_id)]
    assert texts and all("999" not in t and "400 hours" in t for t in texts)
    assert all(doc_id in ids for ids in _visible(ctx).values())
    assert review.reconcile(registry, store).to_dict()["stale_removed"] == []


def test_a_crashed_edit_leaves_hidden_chunks_that_reconcile_removes(
    ctx: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry, store = ctx["registry"], ctx["store"]
    doc_id = _index(ctx, "d", status=DocStatus.PENDING_REVIEW)

    # The process dies after writing the edit's (hidden) chunks, before the registry commit.
    with faults.armed(faults.crash_at("review.after_show")), pytest.raises(faults.InjectedCrash):
        review.edit_and_approve(
            doc_id,
            AM,
            "Edited: 999 hours.",
            registry=registry,
            open_store=review.held(store),
            embedder=ctx["embedder"],
        )
    assert all(doc_id not in ids for ids in _visible(ctx).values())
    assert review.reconcile(registry, store, dry_run=True).stale_removed == [doc_id]
    # Approving the original (without a reconcile first) must not show the edit's text.
    review.approve(doc_id, AM, registry=registry, open_store=review.held(store))
    texts = [h.payload["text"] for h in store.inspect_document_chunks(doc_id)]
    assert texts and all("999" not in t for t in texts)
    assert all(doc_id in ids for ids in _visible(ctx).values())


# --- the review form's view of a draft --------------------------------------------------------

LONG = " ".join(f"w{i}" for i in range(1, 401)) + "."
GUIDE = f"# Kiln guide\n\nIntro paragraph.\n\n## Firing\n\n{LONG}\n\n## Glazes\n\nShort.\n"


def test_draft_markdown_rebuilds_headings_and_joins_overlapping_chunks(
    ctx: dict[str, Any],
) -> None:
    registry, store = ctx["registry"], ctx["store"]
    doc_id = _index(ctx, "d", status=DocStatus.PENDING_REVIEW)
    review.edit_and_approve(
        doc_id, AM, GUIDE, registry=registry, open_store=review.held(store),
        embedder=ctx["embedder"], max_words=180, overlap_words=30,
    )  # fmt: skip
    doc = registry.documents.get_document(doc_id)
    assert doc.chunk_count > 3  # the long section spans several chunks that overlap
    assert inspection.draft_markdown(doc, store) == GUIDE


CITED = (
    "# Contacts\n\n## People\n\n- Ana Diaz, CEO [doc:seed7]\n- Bo Berg, sales [doc:seed7]\n\n"
    "| name | role |\n|---|---|\n| Ana Diaz | CEO |\n| Bo Berg | Sales |\n\n"
    "---\n## Citations\n- [doc:seed7] Team sheet.xlsx\n"
)


def test_the_form_shows_lists_tables_and_the_footer_and_an_edit_keeps_the_sources(
    ctx: dict[str, Any],
) -> None:
    registry, store = ctx["registry"], ctx["store"]
    [doc_id] = index_records(
        [{"key": "c", "title": "Contacts", "text": CITED, "markdown": True}],
        status=DocStatus.PENDING_REVIEW, cite_uris={"doc:seed7": "upload:acme/team.xlsx"},
        **ctx,
    )  # fmt: skip
    doc = registry.documents.get_document(doc_id)
    assert doc.citations == (SourceRef("doc:seed7", "Team sheet.xlsx", "upload:acme/team.xlsx"),)
    shown = inspection.draft_markdown(doc, store)
    assert shown == CITED  # lines, the table and the footer (from the registry) all come back
    assert decisions.same_content(shown, CITED)

    # The reviewer edits a line and keeps the footer: the source keeps its URI.
    edited = shown.replace("Bo Berg, sales", "Bo Berg, head of sales")
    review.edit_and_approve(doc_id, AM, edited, registry=registry, open_store=review.held(store),
                            embedder=ctx["embedder"])  # fmt: skip
    doc = registry.documents.get_document(doc_id)
    assert doc.citations == (SourceRef("doc:seed7", "Team sheet.xlsx", "upload:acme/team.xlsx"),)
    texts = [h.payload["text"] for h in store.inspect_document_chunks(doc_id)
             if h.payload["content_hash"] == doc.content_hash]  # fmt: skip
    assert texts and not [t for t in texts if "Citations" in t or "Team sheet" in t]
    assert inspection.draft_markdown(doc, store) == edited

    # An edit of the approved document without the footer: the new version cites nothing.
    bare = edited.split("\n---\n")[0].rstrip() + "\n"
    opener = review.held(store)
    newer = review.edit_and_approve(
        doc_id, AM, bare, registry=registry, open_store=opener, embedder=ctx["embedder"]
    )
    assert newer.id != doc_id and newer.citations == ()
    assert inspection.draft_markdown(newer, store) == bare


def test_draft_markdown_ignores_chunks_of_other_content(
    ctx: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crashed edit leaves hidden chunks of its own content: the form shows the draft."""
    registry, store = ctx["registry"], ctx["store"]
    doc_id = _index(ctx, "d", status=DocStatus.PENDING_REVIEW)

    with faults.armed(faults.crash_at("review.after_show")), pytest.raises(faults.InjectedCrash):
        review.edit_and_approve(
            doc_id, AM, "Edited: 999 hours.", registry=registry,
            open_store=review.held(store), embedder=ctx["embedder"],
        )  # fmt: skip
    doc = registry.documents.get_document(doc_id)
    assert len({h.payload["content_hash"] for h in store.inspect_document_chunks(doc_id)}) == 2
    assert inspection.draft_texts([doc], store) == {
        doc_id: f"# Turbine notes d\n\n{TEXT} Note d.\n"
    }


def test_chunks_to_markdown_writes_a_heading_for_each_level_that_changes() -> None:
    chunks = [
        (("Guide",), "intro one two"),
        (("Guide", "Setup"), "alpha beta gamma"),
        (("Guide", "Setup"), "beta gamma delta"),  # repeats two words of the last chunk
        (("Guide", "Use"), "go"),
        (("Annex",), "end"),
        ((), "loose text"),
    ]
    assert inspection.chunks_to_markdown(chunks) == (
        "# Guide\n\nintro one two\n\n## Setup\n\nalpha beta gamma delta\n\n## Use\n\ngo\n\n"
        "# Annex\n\nend\n\nloose text\n"
    )
    assert inspection.chunks_to_markdown([]) == ""


def test_same_content_ignores_line_endings_and_outer_blank_space_only() -> None:
    draft = "# T\n\nLine one.\n"
    assert decisions.same_content("# T\r\n\r\nLine one.\r\n", draft)
    assert decisions.same_content("\n# T\n\nLine one.   \n\n", draft)
    assert not decisions.same_content("# T\n\nLine one!\n", draft)
    assert not decisions.same_content("# T\nLine one.\n", draft)  # a changed line break counts
    assert not decisions.same_content(None, draft)


def test_review_failure_only_for_a_refused_reviewer_or_only_invalid_rows() -> None:
    def o(result: Any, message: str = "") -> decisions.Outcome:
        return decisions.Outcome("d", "approve", result, message)

    refused = decisions.review_failure(
        ORG, "mallory", [o("forbidden", "user 'mallory' may not."), o("forbidden")]
    )
    assert refused is not None
    assert refused.startswith("reviewer 'mallory' may not review org 'acme'; nothing was applied")
    assert "user 'mallory' may not." in refused
    invalid = decisions.review_failure(ORG, AM, [o("invalid", "not pending"), o("not_found")])
    assert invalid is not None and "nothing was applied: not pending" in invalid
    # A lost race among applied rows, lost races only, or nothing decided: the run completes.
    assert decisions.review_failure(ORG, AM, [o("applied"), o("conflict"), o("invalid")]) is None
    assert decisions.review_failure(ORG, AM, [o("conflict")]) is None
    assert decisions.review_failure(ORG, AM, []) is None
