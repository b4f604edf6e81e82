"""The review state machine: the one module that moves documents between review states.

    pending_review -> approved | rejected        (approve, reject)
    pending_review -> approved, new content      (edit = replace, re-chunk, re-embed, approve)
    approved | legacy | pending -> superseded    (a newer version of the same source is approved)

Every transition is a compare-and-set in the registry (a lost race raises
:class:`~kbflow.errors.ReviewConflict` and changes nothing) and writes exactly one audit row.
Only a superadmin or the org's assigned account manager may decide; experts may inspect.

The vector payload is updated in the order that fails safe: when a document is hidden (reject,
supersede) its chunks are hidden *before* the registry commit; when it is shown (approve, edit)
they are shown *after* it. A crash between the two writes therefore never exposes an unapproved
chunk, search's registry re-check covers the window, and :func:`reconcile` repairs the drift.

The vector store is reached through a ``StoreOpener`` (a context-manager factory), so a command
holds the embedded store only for the vector step itself and concurrent reviewers race on the
registry, not on the store's lock.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kbflow.errors import ConfigError, Forbidden, KbflowError, NotFound, ReviewConflict
from kbflow.models import AuditAction, DocStatus, ExtractedDocument, ParseStatus, Role
from sinks.registry import DocRecord, OrgRecord, SqlRegistry, UserRecord
from sinks.vectors import VectorStore
from tasks.chunk import document_to_chunks, markdown_to_sections
from tasks.corpus import join_chunks
from tasks.embed import Embedder
from tasks.points import chunk_to_point

log = logging.getLogger(__name__)

StoreOpener = Callable[[], AbstractContextManager[VectorStore]]
LIVE_STATUSES = (None, DocStatus.APPROVED.value, DocStatus.PENDING_REVIEW.value)


def held(store: VectorStore) -> StoreOpener:
    """A StoreOpener for a store the caller already holds open (flows, tests)."""
    return lambda: nullcontext(store)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --- authorisation -------------------------------------------------------------------------


def may_decide(user: UserRecord, org: OrgRecord) -> bool:
    """Superadmins, and the account manager assigned to the org."""
    if user.role is Role.SUPERADMIN:
        return True
    return user.role is Role.ACCOUNT_MANAGER and org.am_user_id == user.id


def may_inspect(user: UserRecord, org: OrgRecord) -> bool:
    """Whoever may decide, and experts of the org (or agency-wide experts, with no org)."""
    if may_decide(user, org):
        return True
    return user.role is Role.EXPERT and user.org_id in (None, org.id)


def _load_actor(registry: SqlRegistry, actor_id: str) -> UserRecord:
    try:
        return registry.get_user(actor_id)
    except NotFound as exc:
        raise Forbidden(
            f"unknown user {actor_id!r}: reviewers must be registered users (`kbflow users add`)."
        ) from exc


def authorize_decision(registry: SqlRegistry, actor_id: str, org_id: str) -> UserRecord:
    """The actor, loaded from the registry, if they may decide on the org's documents.

    Raises:
        Forbidden: unknown user, or neither a superadmin nor the org's assigned AM.
    """
    user = _load_actor(registry, actor_id)
    org = registry.get_org(org_id)
    if not may_decide(user, org):
        raise Forbidden(
            f"user {user.id!r} ({user.role.value}) may not review documents of org {org.id!r}: "
            f"only a superadmin or the org's assigned account manager "
            f"({org.am_user_id or 'none assigned'}) may. Nothing was changed."
        )
    return user


def authorize_inspection(registry: SqlRegistry, actor_id: str, org_id: str) -> UserRecord:
    """The actor if they may read the org's drafts (deciders and the org's experts)."""
    user = _load_actor(registry, actor_id)
    org = registry.get_org(org_id)
    if not may_inspect(user, org):
        raise Forbidden(
            f"user {user.id!r} ({user.role.value}) may not inspect drafts of org {org.id!r}: "
            "only a superadmin, the org's assigned account manager or its experts may."
        )
    return user


# --- transitions ---------------------------------------------------------------------------


def _authorized_pending(
    registry: SqlRegistry, doc_id: str, actor_id: str, verb: str
) -> tuple[DocRecord, UserRecord]:
    """The document and the actor, once the actor may decide and the document is pending.

    Authorisation comes first, so an outsider learns nothing about the document's state.
    """
    doc = registry.get_document(doc_id)
    user = authorize_decision(registry, actor_id, doc.org_id)
    if doc.status != DocStatus.PENDING_REVIEW.value:
        why = " (a superseded document cannot be acted on)" if doc.status == "superseded" else ""
        raise ReviewConflict(
            f"cannot {verb} document {doc_id}: it is {doc.status or 'unset'}, and only "
            f"pending_review documents can be decided{why}."
        )
    return doc, user


def approve(
    doc_id: str,
    actor_id: str,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    note: str | None = None,
) -> DocRecord:
    """pending_review -> approved; the chunks are shown after the registry commit."""
    _, user = _authorized_pending(registry, doc_id, actor_id, "approve")
    now = _now()
    decided = registry.transition(
        doc_id,
        expected=DocStatus.PENDING_REVIEW,
        new=DocStatus.APPROVED,
        actor=user.id,
        action=AuditAction.APPROVED,
        changes={"approved_by": user.id, "approved_at": now},
        note=note,
    )
    with open_store() as store:
        sync_document(decided, store)  # drops any chunks of other content, then shows it
        retire_older_versions(decided, store, registry, actor=user.id)
    return decided


def reject(
    doc_id: str,
    actor_id: str,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    note: str | None = None,
) -> DocRecord:
    """pending_review -> rejected; the chunks are hidden before the registry commit."""
    _, user = _authorized_pending(registry, doc_id, actor_id, "reject")
    with open_store() as store:
        store.set_document_payload(doc_id, {"status": DocStatus.REJECTED.value})
    try:
        return registry.transition(
            doc_id,
            expected=DocStatus.PENDING_REVIEW,
            new=DocStatus.REJECTED,
            actor=user.id,
            action=AuditAction.REJECTED,
            changes={"rejected_by": user.id, "rejected_at": _now()},
            note=note,
        )
    except ReviewConflict:
        sync_payload(doc_id, registry=registry, open_store=open_store)
        raise


def edit_and_approve(
    doc_id: str,
    actor_id: str,
    content: str,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    embedder: Embedder,
    max_words: int = 180,
    overlap_words: int = 30,
    note: str | None = None,
) -> DocRecord:
    """Replace a draft's content (Markdown), re-chunk and re-embed it, then approve it.

    The new chunks are written hidden (as pending_review), the registry commit approves the
    document with the new content hash, and only then are the chunks shown.
    """
    if not content or not content.strip():
        raise ConfigError(
            f"the edited content for document {doc_id} is empty; send the full corrected text "
            "(or reject the draft instead)."
        )
    doc, user = _authorized_pending(registry, doc_id, actor_id, "edit")
    extracted = ExtractedDocument(
        title=doc.title,
        uri=doc.uri,
        sections=tuple(markdown_to_sections(content, title=doc.title)),
        source_format="md",
    )
    content_hash = hashlib.sha256(content.encode("utf-8")).hexdigest()
    # The edited chunks get their own ids (keyed by the new content) and are written hidden,
    # beside the draft's chunks; which set survives is decided by the registry commit.
    chunks = [
        replace(c, chunk_id=f"{doc_id}@{content_hash[:12]}:{c.chunk_index}")
        for c in document_to_chunks(
            doc_id, extracted, max_words=max_words, overlap_words=overlap_words
        )
    ]
    hidden = replace(doc, content_hash=content_hash, status=DocStatus.PENDING_REVIEW.value)
    vectors = embedder.embed_documents([c.embed_text for c in chunks])
    points = [chunk_to_point(c, v, hidden) for c, v in zip(chunks, vectors, strict=True)]
    registry.put_chunks(doc, content_hash, chunks)
    with open_store() as store:
        store.upsert(points)
    now = _now()
    try:
        decided = registry.transition(
            doc_id,
            expected=DocStatus.PENDING_REVIEW,
            new=DocStatus.APPROVED,
            actor=user.id,
            action=AuditAction.EDITED_APPROVED,
            changes={
                "edited_by": user.id,
                "edited_at": now,
                "approved_by": user.id,
                "approved_at": now,
                "content_hash": content_hash,
                "chunk_count": len(points),
                "parse_status": ParseStatus.INGESTED.value,
            },
            note=note,
        )
    except ReviewConflict:
        sync_payload(doc_id, registry=registry, open_store=open_store)  # drops the edit's chunks
        raise
    with open_store() as store:
        sync_document(decided, store)  # drops the draft's chunks, then shows the edited ones
        retire_older_versions(decided, store, registry, actor=user.id)
    return decided


def supersede(doc: DocRecord, store: VectorStore, registry: SqlRegistry, *, actor: str) -> bool:
    """Retire a version: hide its chunks first, then record it as superseded.

    Returns False (and leaves the registry's decision in place) if the version changed state
    meanwhile; its payload is then re-synced from the registry.
    """
    if doc.status not in LIVE_STATUSES:
        return False
    store.set_document_payload(doc.id, {"status": DocStatus.SUPERSEDED.value})
    expected = DocStatus(doc.status) if doc.status else None
    try:
        registry.transition(
            doc.id,
            expected=expected,
            new=DocStatus.SUPERSEDED,
            actor=actor,
            action=AuditAction.SUPERSEDED,
        )
    except ReviewConflict:
        sync_document(registry.get_document(doc.id), store)
        log.warning("version %s changed state during supersede; payload re-synced", doc.id)
        return False
    return True


def retire_older_versions(
    doc: DocRecord, store: VectorStore, registry: SqlRegistry, *, actor: str
) -> int:
    """Supersede every older live version of ``doc``'s source; returns how many."""
    retired = 0
    for other in registry.versions_of(doc.org_id, doc.source_key):
        if other.version < doc.version and other.status in LIVE_STATUSES:
            retired += supersede(other, store, registry, actor=actor)
    return retired


def sync_payload(doc_id: str, *, registry: SqlRegistry, open_store: StoreOpener) -> None:
    """Make a document's vectors say what the registry says now (after a lost race)."""
    current = registry.get_document(doc_id)
    with open_store() as store:
        sync_document(current, store)


def sync_document(doc: DocRecord, store: VectorStore) -> None:
    """Delete chunks of other content than the registry's, then set status and parse status.

    Stale chunks go first, so showing a document never shows text that was not approved.
    """
    store.delete_stale_chunks(doc.id, keep_content_hash=doc.content_hash)
    store.set_document_payload(doc.id, {"status": doc.status, "parse_status": doc.parse_status})


# --- decisions in bulk (CLI, Prefect review flow) ------------------------------------------

DecisionAction = Literal["approve", "reject", "edit"]


@dataclass(frozen=True)
class Decision:
    doc_id: str
    action: DecisionAction
    content: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What happened to one decision: ``applied``, or why not."""

    doc_id: str
    action: str
    result: Literal["applied", "conflict", "forbidden", "invalid", "not_found"]
    message: str = ""
    status: str | None = None

    @property
    def applied(self) -> bool:
        return self.result == "applied"


def apply_decisions(
    decisions: Sequence[Decision],
    actor_id: str,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    embedder: Callable[[], Embedder],
    max_words: int = 180,
    overlap_words: int = 30,
) -> list[Outcome]:
    """Apply each decision on its own; one that fails is reported and changes nothing."""
    outcomes: list[Outcome] = []
    for d in decisions:
        try:
            if d.action == "approve":
                doc = approve(
                    d.doc_id, actor_id, registry=registry, open_store=open_store, note=d.note
                )
            elif d.action == "reject":
                doc = reject(
                    d.doc_id, actor_id, registry=registry, open_store=open_store, note=d.note
                )
            elif d.action == "edit":
                doc = edit_and_approve(
                    d.doc_id,
                    actor_id,
                    d.content or "",
                    registry=registry,
                    open_store=open_store,
                    embedder=embedder(),
                    max_words=max_words,
                    overlap_words=overlap_words,
                    note=d.note,
                )
            else:
                raise ConfigError(f"unknown action {d.action!r}; use approve, reject or edit.")
        except ReviewConflict as exc:
            outcomes.append(Outcome(d.doc_id, d.action, "conflict", str(exc)))
        except Forbidden as exc:
            outcomes.append(Outcome(d.doc_id, d.action, "forbidden", str(exc)))
        except NotFound as exc:
            outcomes.append(Outcome(d.doc_id, d.action, "not_found", str(exc)))
        except KbflowError as exc:
            outcomes.append(Outcome(d.doc_id, d.action, "invalid", str(exc)))
        else:
            outcomes.append(Outcome(d.doc_id, d.action, "applied", status=doc.status))
    return outcomes


# --- the reviewer's inspection path (never used by search) ----------------------------------


@dataclass(frozen=True)
class DraftView:
    doc: DocRecord
    chunks: list[str]

    @property
    def text(self) -> str:
        return "\n\n".join(self.chunks)


def pending_documents(
    registry: SqlRegistry, org_id: str, synthesis_run_id: str | None = None
) -> list[DocRecord]:
    """The org's documents awaiting a review decision (of one synthesis run, if given)."""
    docs = registry.list_documents(org_id, statuses=[DocStatus.PENDING_REVIEW.value])
    if synthesis_run_id is not None:
        docs = [d for d in docs if d.synthesis_run_id == synthesis_run_id]
    return docs


def list_drafts(
    registry: SqlRegistry,
    actor_id: str,
    org_id: str,
    statuses: Sequence[DocStatus] = (DocStatus.PENDING_REVIEW, DocStatus.REJECTED),
) -> dict[str | None, list[DocRecord]]:
    """An org's drafts grouped by synthesis run, for someone allowed to inspect them."""
    authorize_inspection(registry, actor_id, org_id)
    groups: dict[str | None, list[DocRecord]] = {}
    for doc in registry.list_documents(org_id, statuses=[s.value for s in statuses]):
        groups.setdefault(doc.synthesis_run_id, []).append(doc)
    return groups


def inspect_draft(
    doc_id: str, actor_id: str, *, registry: SqlRegistry, store: VectorStore
) -> DraftView:
    """A document's full stored text, whatever its status, for an authorised reviewer."""
    doc = registry.get_document(doc_id)
    authorize_inspection(registry, actor_id, doc.org_id)
    chunks = store.inspect_document_chunks(doc_id)
    return DraftView(doc=doc, chunks=[str(c.payload.get("text", "")) for c in chunks])


def draft_markdown(doc: DocRecord, store: VectorStore, max_overlap_words: int = 64) -> str:
    """A document's current text as Markdown, rebuilt from its stored chunks (any status).

    For the review form, which shows it and prefills the ``edit`` field with it. Only chunks of
    the registry's content count (an edit that lost its race may have left others). The caller
    decides who sees it: unlike :func:`inspect_draft` nothing is authorised here.
    """
    hits = store.inspect_document_chunks(doc.id)
    current = [h for h in hits if h.payload.get("content_hash") in (None, doc.content_hash)]
    return chunks_to_markdown(
        [
            (tuple(h.payload.get("heading_path") or ()), str(h.payload.get("text", "")))
            for h in current
        ],
        max_overlap_words=max_overlap_words,
    )


def chunks_to_markdown(
    chunks: Sequence[tuple[Sequence[str], str]], max_overlap_words: int = 64
) -> str:
    """Markdown from ``(heading_path, text)`` chunks in order: a heading line for each level
    that changes (level = depth in the path), then the section's chunks joined without the
    words each repeats from the last.

    What the chunker dropped stays lost: heading levels skipped in the source, and line breaks
    inside a paragraph (a list's items run on in one line).
    """
    blocks: list[str] = []
    previous: tuple[str, ...] = ()
    group: list[str] = []

    def flush() -> None:
        text = join_chunks(group, max_overlap_words=max_overlap_words)
        if text:
            blocks.append(text)
        group.clear()

    for path, text in chunks:
        heading = tuple(path)
        if heading != previous or not group:
            flush()
            same = 0
            while same < min(len(heading), len(previous)) and heading[same] == previous[same]:
                same += 1
            if heading != previous:
                blocks.extend(
                    f"{'#' * min(level + 1, 6)} {heading[level]}"
                    for level in range(same, len(heading))
                )
            previous = heading
        group.append(text)
    flush()
    return "\n\n".join(blocks) + "\n" if blocks else ""


def draft_texts(
    docs: Sequence[DocRecord], store: VectorStore, max_overlap_words: int = 64
) -> dict[str, str]:
    """Each document's Markdown (:func:`draft_markdown`), keyed by id."""
    return {doc.id: draft_markdown(doc, store, max_overlap_words) for doc in docs}


def same_content(edited: str | None, draft: str) -> bool:
    """Whether an ``edit`` submits the draft's text unchanged (line endings and the blank
    space around it aside): such an edit is applied as an approve of the stored draft."""
    if edited is None:
        return False
    return edited.replace("\r\n", "\n").strip() == draft.replace("\r\n", "\n").strip()


def review_failure(org_id: str, reviewer: str | None, outcomes: Sequence[Outcome]) -> str | None:
    """Why a review run did not do its job, or None when it did (it then ends Completed).

    The rule: a run fails when its reviewer was refused (authorisation is per reviewer, so
    nothing was applied), or when decisions were submitted and every one was invalid (not
    pending in this run, a duplicate, an empty edit). A run with at least one applied decision,
    one where every row was left on skip, or one that lost races (someone else decided first:
    the documents are decided) completes; its report lists every row that was not applied.
    """
    refused = [o for o in outcomes if o.result == "forbidden"]
    applied = sum(o.applied for o in outcomes)
    done = f"{applied} applied" if applied else "nothing was applied"
    if refused:
        return (
            f"reviewer {reviewer!r} may not review org {org_id!r}; {done} "
            f"({len(refused)} decisions refused): {refused[0].message}"
        )
    if outcomes and all(o.result in ("invalid", "not_found") for o in outcomes):
        return (
            f"none of the {len(outcomes)} decisions by {reviewer!r} for org {org_id!r} could "
            f"be applied; {done}: {outcomes[0].message}"
        )
    return None


# --- reconciliation ------------------------------------------------------------------------


@dataclass
class ReconcileReport:
    documents: int = 0
    points: int = 0
    repaired: list[dict[str, Any]] = field(default_factory=list)
    stale_removed: list[str] = field(default_factory=list)
    orphans_removed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "points": self.points,
            "repaired": self.repaired,
            "stale_removed": self.stale_removed,
            "orphans_removed": self.orphans_removed,
        }


def reconcile(
    registry: SqlRegistry, store: VectorStore, *, org_id: str | None = None, dry_run: bool = False
) -> ReconcileReport:
    """Make the vector store agree with the registry (the source of truth).

    For every document with chunks in the store: chunks of other content than the registry's
    (an edit that lost its race or crashed) are deleted; a status or parse status that differs
    from the registry is rewritten; chunks whose document the registry does not know are
    deleted. It repairs the store only and never makes a review decision.
    """
    report = ReconcileReport()
    seen: dict[str, set[tuple[Any, Any, Any]]] = {}
    fields = ["doc_id", "org_id", "status", "parse_status", "content_hash"]
    for hit in store.iter_payloads(fields):
        if org_id is not None and hit.payload.get("org_id") != org_id:
            continue
        report.points += 1
        p = hit.payload
        seen.setdefault(str(p.get("doc_id", "")), set()).add(
            (p.get("status"), p.get("parse_status"), p.get("content_hash"))
        )
    report.documents = len(seen)
    known = registry.get_documents(seen)
    for doc_id, states in seen.items():
        doc = known.get(doc_id)
        if doc is None:
            report.orphans_removed.append(doc_id)
            if not dry_run:
                store.delete_document(doc_id)
            continue
        stale = any(h != doc.content_hash for _, _, h in states)
        current = {(s, p) for s, p, h in states if h == doc.content_hash}
        wrong = bool(current) and current != {(doc.status, doc.parse_status)}
        if stale:
            report.stale_removed.append(doc_id)
        if wrong:
            report.repaired.append(
                {
                    "doc_id": doc_id,
                    "was": sorted(f"{s}/{p}" for s, p in current),
                    "now": f"{doc.status}/{doc.parse_status}",
                }
            )
        if (stale or wrong) and not dry_run:
            sync_document(doc, store)
    return report
