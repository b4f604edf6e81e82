# Over 500 lines: the one module that moves documents between review states, each with its order.
"""The review state machine: the one module that moves documents between review states.

    pending_review -> approved | rejected        (approve, reject)
    pending_review -> approved, new content      (edit = replace, re-chunk, re-embed, approve)
    approved -> new approved version             (edit of an approved document)
    approved | legacy -> withdrawn               (withdraw: taken out of service, with a note)
    withdrawn -> new approved version            (restore: back in service, with a note; the
                                                  withdrawn version stays as it is)
    approved | legacy | pending -> superseded    (a newer version of the same source is approved,
                                                  in the same registry transaction)

Every transition is a compare-and-set in the registry (a lost race raises
:class:`~core.errors.ReviewConflict` and changes nothing) and writes exactly one audit row.
Only a superadmin or the org's assigned account manager may decide; experts may inspect.

A chunk is served only when BOTH the vector payload (the store's gate filter) and the document's
registry row (search's re-check; the keyword fallback reads the registry alone) admit it, so the
registry commit is the switch and the payload is written around it:

- a transition that only hides (reject, withdraw) hides the chunks *before* the commit: a crash
  can leave a document hidden too early, never servable in both places once it is retired;
- a first version (nothing to retire) is shown *after* the commit that approves it, and so
  is a restored version (the version it copies is withdrawn: nothing is served before it);
- a version that replaces another (approve of a v2 draft, edit of an approved document) is shown
  *before* the commit and the version it retires hidden *after* it (`_publish_decision` says
  why): every instant, crash or not, serves exactly one version of the source.

:func:`reconcile` repairs what a crash leaves between two writes.

The vector store is reached through a ``StoreOpener`` (a context-manager factory), so a command
holds the embedded store only for the vector step itself and concurrent reviewers race on the
registry, not on the store's lock.

One module on purpose: every transition and its fail-safe write order are reviewed in one place.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, field, replace
from typing import Any

from core import faults
from core.errors import ConfigError, EmbeddingModelMismatch, ReviewConflict
from core.models import (
    RETIRABLE_STATUSES,
    AuditAction,
    Chunk,
    ChunkPoint,
    DocStatus,
    ExtractedDocument,
    Location,
    ParseStatus,
    SourceRef,
    SourceTag,
)
from sinks.registry import DocRecord, SqlRegistry, UserRecord, citations_column
from sinks.vectors import VectorStore, point_id_for
from tasks.review.access import (  # noqa: F401  (re-exported: the review commands' authorisation)
    authorize_decision,
    authorize_document,
    authorize_inspection,
    may_decide,
    may_inspect,
)
from tasks.review.attribution import attribute_added_lines
from tasks.text.chunk import chunks_to_markdown, document_to_chunks, markdown_to_sections
from tasks.text.citations import render_footer, split_citation_footer
from tasks.text.embed import Embedder
from tasks.text.model_check import require_org_model
from tasks.text.points import EMBEDDING_MODEL, chunk_to_point
from tasks.text.review_note import split_review_note

log = logging.getLogger(__name__)

StoreOpener = Callable[[], AbstractContextManager[VectorStore]]
LIVE_STATUSES = RETIRABLE_STATUSES


def held(store: VectorStore) -> StoreOpener:
    """A StoreOpener for a store the caller already holds open (flows, tests)."""
    return lambda: nullcontext(store)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --- authorisation (tasks.review.access; re-exported for the review commands) ---------------


def _authorized(
    registry: SqlRegistry,
    doc_id: str,
    actor_id: str,
    verb: str,
    states: tuple[str | None, ...] = (DocStatus.PENDING_REVIEW.value,),
) -> tuple[DocRecord, UserRecord]:
    """The document and the actor, once the actor may decide and the document is in one of
    ``states``. Authorisation comes first, so an outsider learns nothing about its state."""
    user, doc = authorize_document(registry, actor_id, doc_id)
    if doc.status not in states:
        raise ReviewConflict(f"cannot {verb} document {doc_id}: it is {doc.status or 'unset'}"
                             f"{_why_not(verb, doc.status)}")  # fmt: skip
    return doc, user


def _why_not(verb: str, status: str | None) -> str:
    if verb == "restore":
        return ", and only a withdrawn document can be restored" + _RESTORE_HINTS.get(
            status or "", " (it is in service already; `kbflow review edit` corrects it)."
        )
    if status == DocStatus.SUPERSEDED.value:
        return " (a superseded document cannot be acted on; act on its newest version)."
    if verb in ("approve", "reject") and status in (DocStatus.APPROVED.value, None):
        return (
            ", and only pending_review documents can be decided. To take an approved document "
            "out of service use `kbflow review withdraw`; to correct it, `kbflow review edit` "
            "makes a new approved version."
        )
    if verb == "withdraw":
        return ", and only an approved document can be withdrawn."
    return ", and only pending_review documents can be decided."


_RESTORE_HINTS = {
    DocStatus.PENDING_REVIEW.value: (
        " (it is a draft awaiting review: decide it with `kbflow review approve` or "
        "`kbflow review reject`)."
    ),
    DocStatus.REJECTED.value: (
        " (a rejected draft was never in service: ingest or research its source again for a "
        "new draft)."
    ),
    DocStatus.SUPERSEDED.value: (
        " (a newer version of its source replaced it: act on the newest version instead)."
    ),
}


# --- transitions ---------------------------------------------------------------------------
#
# A document that becomes servable retires the older live versions of its source in the SAME
# registry transaction (`DocumentsRepository.transition_and_retire`), so the registry never has two
# servable versions. The store is written around that commit (`_publish_decision`).


def live_older_versions(registry: SqlRegistry, doc: DocRecord) -> list[DocRecord]:
    """Older versions of ``doc``'s source that its approval would retire."""
    return [
        o
        for o in registry.documents.versions_of(doc.org_id, doc.source_key)
        if o.version < doc.version and o.status in LIVE_STATUSES
    ]


def hide_versions(store: VectorStore, docs: Sequence[DocRecord]) -> None:
    """Hide these versions' chunks (before the registry commit that retires them)."""
    for old in docs:
        store.set_document_payload(old.id, {"status": DocStatus.SUPERSEDED.value})


def settle_versions(
    store: VectorStore, registry: SqlRegistry, hidden: Sequence[DocRecord], retired: Sequence[str]
) -> None:
    """After the commit: a hidden version the commit did not retire (it changed state meanwhile,
    or the commit failed) gets its payload back from the registry; a retired version that was
    not hidden beforehand (it became live meanwhile) is hidden now."""
    gone = set(retired)
    for old in hidden:
        if old.id not in gone:
            sync_document(registry.documents.get_document(old.id), store)
    for doc_id in gone - {o.id for o in hidden}:
        store.set_document_payload(doc_id, {"status": DocStatus.SUPERSEDED.value})


def _approved(points: Sequence[ChunkPoint]) -> list[ChunkPoint]:
    """An edit's points with the payload its approval gives them."""
    return [replace(p, payload=p.payload | {"status": DocStatus.APPROVED.value}) for p in points]


def _show_before_commit(
    store: VectorStore, doc: DocRecord, edited: Sequence[ChunkPoint] | None
) -> None:
    """Show the chunks of ``doc`` that its approval approves, and no others: the draft's own
    (chunks of other content, left by an edit that crashed, are deleted first), or the edit's
    (``edited``; the document's other chunks, the draft's among them, are hidden first)."""
    if edited is None:
        store.delete_stale_chunks(doc.id, keep_content_hash=doc.content_hash)
        store.set_document_payload(
            doc.id, {"status": DocStatus.APPROVED.value, "parse_status": doc.parse_status}
        )
    else:
        store.set_document_payload(doc.id, {"status": DocStatus.PENDING_REVIEW.value})
        store.upsert(_approved(edited))


def _publish_decision(
    doc: DocRecord,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    decide: Callable[[], tuple[DocRecord, list[str]]],
    edited: Sequence[ChunkPoint] | None = None,
) -> DocRecord:
    """Approve ``doc`` by the registry commit ``decide``, which also retires the older live
    versions of its source, and make the store agree. ``edited``: the points of an edit's new
    content (written hidden by `_write_hidden_edit`), when the commit approves that content.

    Why this order: a vector hit is served only if BOTH the store's payload filter and the
    registry re-check (`tasks.query.retrieve.search`: `Gate.admits` on the document's registry
    row) admit it, and the keyword fallback reads the registry alone. So the registry commit is
    the one switch, and when ``doc`` replaces an older version the store must admit both
    versions across it:

    - before the commit ``doc``'s approved chunks are shown in the store
      (`_show_before_commit`), but its registry row says ``pending_review``, so the re-check
      drops them: only the old version is served;
    - the commit approves ``doc`` and supersedes the old version, so the re-check now drops the
      old chunks: only ``doc`` is served;
    - then the old chunks are hidden in the store too, so that the store's filter (the first
      one, which also keeps them out of the candidates a query fetches) agrees again;
    - last, ``doc``'s row is written once more (the same values), which stamps it later than
      the versions it retired: the registry's record that the hide is done.

    Hiding the old chunks before the commit (or showing ``doc`` after it) would serve neither
    version in between. A crash before the commit leaves ``doc``'s chunks shown but never
    served (the re-check drops them); a crash after it leaves retired chunks in the store that
    are never served either. `reconcile` rewrites both from the registry, and for an ingested
    source the next ingest plan finds the unhidden ones (`tasks.ingest.index.unsettled_versions`)
    and hides them. If the commit fails (a lost race), ``doc``'s payload is put back to what
    the registry says.

    A first version retires nothing: it is shown only after the commit (fail safe), and the
    store is not opened before it, so reviewers of first versions race on the registry, not on
    the store's lock.
    """
    replaces = bool(live_older_versions(registry, doc))
    if replaces:
        with open_store() as store:
            _show_before_commit(store, doc, edited)
    faults.point("review.after_show")
    try:
        decided, retired = decide()
    except Exception:
        if replaces:  # the commit failed: the store follows the registry again
            sync_payload(doc.id, registry=registry, open_store=open_store)
        raise
    faults.point("review.after_commit")
    with open_store() as store:
        if replaces and edited is not None:
            # Written whole again (never hidden now): a concurrent approval of the same draft
            # deletes them as stale before its commit, and this commit won.
            store.upsert(_approved(edited))
        sync_document(decided, store)  # drops any chunks of other content, then shows it
        settle_versions(store, registry, (), retired)  # hides every version the commit retired
    faults.point("review.after_hide")
    if retired:
        _stamp_settled(registry, decided.id)
    faults.point("review.after_settle")
    return decided


def _stamp_settled(registry: SqlRegistry, doc_id: str) -> None:
    """Write a version's own values back (a no-op but for ``updated_at``): the mark that the
    versions it retired are hidden in the store (`tasks.ingest.index.unsettled_versions`)."""
    doc = registry.documents.get_document(doc_id)
    registry.documents.mark_parsed(
        doc.id, parse_status=ParseStatus(doc.parse_status), chunk_count=doc.chunk_count
    )


def approve(
    doc_id: str,
    actor_id: str,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    note: str | None = None,
) -> DocRecord:
    """pending_review -> approved, retiring older versions in the same commit; the store is
    written around it (`_publish_decision`)."""
    doc, user = _authorized(registry, doc_id, actor_id, "approve")
    _refuse_an_inline_banner(doc, open_store)
    return _publish_decision(
        doc,
        registry=registry,
        open_store=open_store,
        decide=lambda: registry.documents.transition_and_retire(
            doc_id,
            expected=DocStatus.PENDING_REVIEW,
            new=DocStatus.APPROVED,
            actor=user.id,
            action=AuditAction.APPROVED,
            changes={"approved_by": user.id, "approved_at": _now()},
            note=note,
        ),
    )


def _refuse_an_inline_banner(doc: DocRecord, open_store: StoreOpener) -> None:
    """Refuse to approve as it is a research draft whose stored text still opens with the
    offline synthesizer's note to its reviewer: drafts stored before the note was kept apart
    (migration 0015) carry it in their chunks, and approving them would serve it to agents.

    Raises:
        ConfigError: the note is in the text (nothing changed; an edit takes it off).
    """
    if doc.review_note is not None or doc.source_tag != SourceTag.AGENT_SYNTHESIS.value:
        return  # the note, if any, is kept apart: the text is clean
    with open_store() as store:
        chunks = store.inspect_document_chunks(doc.id)
    text = "\n".join(str(c.payload.get("text", "")) for c in chunks)
    if split_review_note(text)[1] is not None:  # the rule that keeps the note apart
        raise ConfigError(
            f"draft {doc.id} still carries the offline draft's note to its reviewer in its text "
            "(it was stored before kbflow kept that note apart), and approving it as it is "
            "would serve the note to agents. Nothing changed: approve it with an edit (the "
            "edit takes the note off; `kbflow review edit`, or Approve with my edits in the "
            "inbox), or run research again for a fresh draft."
        )


def reject(
    doc_id: str,
    actor_id: str,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    note: str | None = None,
) -> DocRecord:
    """pending_review -> rejected; the chunks are hidden before the registry commit."""
    _, user = _authorized(registry, doc_id, actor_id, "reject")
    with open_store() as store:
        store.set_document_payload(doc_id, {"status": DocStatus.REJECTED.value})
    faults.point("review.after_hide")
    try:
        return registry.documents.transition(
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


def withdraw(
    doc_id: str,
    actor_id: str,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    note: str,
) -> DocRecord:
    """approved (or status-less) -> withdrawn: an approved document taken out of service.

    A note saying why is required (it is kept in the audit row). The chunks are hidden before
    the registry commit, so the document disappears from search at once; answers that cited it
    are flagged by ``kbflow provenance --stale``.
    """
    if not note or not note.strip():
        raise ConfigError(
            f"withdrawing document {doc_id} needs a note saying why (--note): it is kept in the "
            "audit log for whoever asks later."
        )
    doc, user = _authorized(
        registry, doc_id, actor_id, "withdraw", states=(DocStatus.APPROVED.value, None)
    )
    with open_store() as store:
        store.set_document_payload(doc_id, {"status": DocStatus.WITHDRAWN.value})
    faults.point("review.after_hide")
    try:
        return registry.documents.transition(
            doc_id,
            expected=DocStatus(doc.status) if doc.status else None,
            new=DocStatus.WITHDRAWN,
            actor=user.id,
            action=AuditAction.WITHDRAWN,
            note=note.strip(),
        )
    except ReviewConflict:
        sync_payload(doc_id, registry=registry, open_store=open_store)
        raise


def take_out_at_source(
    doc: DocRecord,
    *,
    actor: str,
    note: str,
    registry: SqlRegistry,
    open_store: StoreOpener,
) -> DocRecord | None:
    """Take out of service a document whose item is gone from its synced source: approved (or
    status-less) -> withdrawn, a draft -> rejected; anything else is out of service already
    (None). ``actor`` names the source (``source:<id>``), never a person: nobody decided this.

    The chunks are hidden before the registry commit, as `withdraw` does, so the document leaves
    search at once; answers that cited it are flagged by ``kbflow provenance --stale``. A lost
    race (someone decided meanwhile) syncs the store to the winner and returns None.
    """
    if doc.status in (DocStatus.APPROVED.value, None):
        new, action = DocStatus.WITHDRAWN, AuditAction.WITHDRAWN
    elif doc.status == DocStatus.PENDING_REVIEW.value:
        new, action = DocStatus.REJECTED, AuditAction.REJECTED
    else:
        return None
    with open_store() as store:
        store.set_document_payload(doc.id, {"status": new.value})
    faults.point("review.after_hide")
    try:
        return registry.documents.transition(
            doc.id,
            expected=DocStatus(doc.status) if doc.status else None,
            new=new,
            actor=actor,
            action=action,
            note=note,
        )
    except ReviewConflict:
        sync_payload(doc.id, registry=registry, open_store=open_store)
        return None


def restore(
    doc_id: str,
    actor_id: str,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    note: str,
    embedder: Embedder | None = None,
) -> DocRecord:
    """withdrawn -> a new approved version of the document, with the withdrawn version's text.

    A note saying why is required (it is kept in the audit row). The withdrawn version is left
    exactly as it is (its row, its chunks, its hidden vectors), so the answers that cited it
    still cite a withdrawn document (``kbflow provenance``). The new version is numbered like
    an edit of an approved document (`edit_approved`: the source's next version) and registered
    as a hidden draft holding copies of the withdrawn version's chunks under new chunk ids,
    with its citations; their dense vectors are the stored ones when the store can read them
    back (`_stored_dense`), else ``embedder`` embeds the texts again. One registry commit
    (`DocumentsRepository.restore_version`) then approves it, checking in the same transaction
    that the document is still withdrawn and that no newer version of its source is approved or
    withdrawn: of two restores (or a restore and another decision) exactly one wins, the other
    gets ReviewConflict and its copy is deleted from the store and rejected (or was retired by
    the winner's commit already), never served.

    The copy is shown in the store *after* that commit, as a first version is
    (`_publish_decision`): no version of the source is served before it, so a crash in between
    leaves it hidden in the store (never shown early), and `reconcile` shows it.

    Raises:
        ConfigError: no note, or nothing stored to restore.
        Forbidden: ``actor_id`` may not decide for the document's org (nothing changes).
        ReviewConflict: the document is not withdrawn, a newer version of its source is in
            service or withdrawn too, or another decision came first.
    """
    if not note or not note.strip():
        raise ConfigError(
            f"restoring document {doc_id} needs a note saying why (--note): it is kept in the "
            "audit log beside the withdrawal's."
        )
    doc, user = _authorized(
        registry, doc_id, actor_id, "restore", states=(DocStatus.WITHDRAWN.value,)
    )
    _refuse_newer(doc, registry.documents.versions_of(doc.org_id, doc.source_key))
    with open_store() as store:
        chunks = _restorable_chunks(registry, store, doc)
        stored = _stored_dense(registry, store, doc, chunks)
    if stored is None:
        if embedder is None:
            raise ConfigError(
                f"the vectors of document {doc_id} cannot be read back from this store, and "
                "no embedder was given to embed its text again."
            )
        model_id = embedder.model_id
        require_org_model(registry, doc.org_id, model_id, action="restore a document of")
        dense = embedder.embed_documents([c.embed_text for c in chunks])
    else:
        model_id, dense = stored
    created = _next_version(registry, doc, user.id, doc.content_hash, citations=doc.citations)
    copies = [
        replace(c, chunk_id=f"{created.id}:{c.chunk_index}", doc_id=created.id) for c in chunks
    ]
    # Hidden until the publish: the payload says what the registry says now (pending_review,
    # parse status pending), so a crash before the commit leaves nothing for `reconcile`.
    points = [
        replace(
            p, payload=p.payload | {"status": created.status, "parse_status": created.parse_status}
        )
        for p in (
            chunk_to_point(c, v, created, model_id=model_id)
            for c, v in zip(copies, dense, strict=True)
        )
    ]
    registry.chunks.put_chunks(created, created.content_hash, copies, embedding_model=model_id)
    with open_store() as store:
        store.upsert(points)
    changes = {
        "approved_by": user.id,
        "approved_at": _now(),
        "chunk_count": len(copies),
        "parse_status": ParseStatus.INGESTED.value,
    }
    try:
        return _publish_decision(
            created,
            registry=registry,
            open_store=open_store,
            decide=lambda: registry.documents.restore_version(
                doc.id, created.id, actor=user.id, changes=changes, note=note.strip()
            ),
        )
    except ReviewConflict as exc:
        _drop_losing_copy(registry, open_store, created.id, user.id,
                          f"restore of {doc.id} not applied: {exc}")  # fmt: skip
        raise


def _next_version(
    registry: SqlRegistry,
    doc: DocRecord,
    actor: str,
    content_hash: str,
    *,
    citations: tuple[SourceRef, ...] = (),
) -> DocRecord:
    """A hidden draft registered as the source's next version of ``doc`` (same collection,
    title, uri, tags, audience and date), for an edit or a restore to publish."""
    return registry.documents.create_document(
        org_id=doc.org_id,
        collection_id=registry.catalog.ensure_collection(doc.org_id, doc.collection_path).id,
        source_key=doc.source_key,
        title=doc.title,
        uri=doc.uri,
        content_hash=content_hash,
        version=max(v.version for v in registry.documents.versions_of(doc.org_id, doc.source_key))
        + 1,
        status=DocStatus.PENDING_REVIEW,
        source_tag=doc.source_tag,
        synthesis_run_id=doc.synthesis_run_id,
        audience=doc.audience,
        effective_date=doc.effective_date,
        actor=actor,
        citations=citations,
    )


def _drop_losing_copy(
    registry: SqlRegistry, open_store: StoreOpener, copy_id: str, actor: str, note: str
) -> None:
    """The hidden copy a decision wrote before it lost its race: deleted from the store and
    rejected in the registry, so it is never served. A winner's commit may have retired it
    already (superseded): then it stays so."""
    with open_store() as store:
        store.delete_document(copy_id)
    with suppress(ReviewConflict):
        registry.documents.transition(
            copy_id,
            expected=DocStatus.PENDING_REVIEW,
            new=DocStatus.REJECTED,
            actor=actor,
            action=AuditAction.REJECTED,
            note=note,
        )


def _refuse_newer(doc: DocRecord, versions: Sequence[DocRecord]) -> None:
    """Refuse to restore ``doc`` when a newer version of its source is approved (its text would
    replace newer text) or withdrawn too (restore that one instead). `restore_version` checks
    the same again in its commit."""
    newer = [v for v in versions if v.version > doc.version]
    live = [v for v in newer if v.status in (DocStatus.APPROVED.value, None)]
    withdrawn = [v for v in newer if v.status == DocStatus.WITHDRAWN.value]
    if live:
        top = live[-1]
        raise ReviewConflict(
            f"cannot restore document {doc.id} (v{doc.version}): a newer version of its "
            f"source, {top.id} (v{top.version}), is {top.status or 'unset'} and in service, and "
            f"restoring would put older text in its place. Correct that version with `kbflow "
            f"review edit {top.id}` instead. Nothing was changed."
        )
    if withdrawn:
        top = withdrawn[-1]
        raise ReviewConflict(
            f"cannot restore document {doc.id} (v{doc.version}): a newer version of its "
            f"source, {top.id} (v{top.version}), was withdrawn too. Restore that one instead "
            f"(`kbflow review restore {top.id}`). Nothing was changed."
        )


def _restorable_chunks(registry: SqlRegistry, store: VectorStore, doc: DocRecord) -> list[Chunk]:
    """The chunks of ``doc``'s content: the registry's, or (a document stored before the
    registry kept chunk texts) its stored points' payloads."""
    chunks = registry.chunks.document_chunks([doc.id]).get(doc.id, [])
    if not chunks:
        hits = [
            h
            for h in store.inspect_document_chunks(doc.id)
            if h.payload.get("content_hash") in (None, doc.content_hash)
        ]
        chunks = [
            Chunk(
                chunk_id=str(h.payload.get("chunk_id") or f"{doc.id}:{index}"),
                doc_id=doc.id,
                chunk_index=int(h.payload.get("chunk_index", index)),
                text=str(h.payload.get("text", "")),
                heading_path=tuple(h.payload.get("heading_path") or ()),
                location=Location.from_payload(h.payload),
            )
            for index, h in enumerate(hits)
        ]
    if not chunks:
        raise ConfigError(
            f"document {doc.id} has no stored text to restore (no chunks in the registry or "
            "the vector store); ingest its source again instead."
        )
    return chunks


def _stored_dense(
    registry: SqlRegistry, store: VectorStore, doc: DocRecord, chunks: Sequence[Chunk]
) -> tuple[str, list[list[float]]] | None:
    """The stored dense vectors of ``chunks`` and the model that made them, when the store can
    read points back (``retrieve_points``: the Qdrant stores, not a client of another process's
    store), every chunk has one from one recorded model, and that model is the org's. None
    otherwise: the caller embeds the texts again. (Sparse vectors are cheap and always made
    again by the one BM25 analyser, so they match the query side.)"""
    read = getattr(store, "retrieve_points", None)
    if read is None:
        return None
    ids = [point_id_for(c.chunk_id) for c in chunks]
    found = {p.point_id: p for p in read(ids)}
    points = [found.get(i) for i in ids]
    if any(p is None or not p.dense for p in points):
        return None
    models = {p.payload.get(EMBEDDING_MODEL) for p in points if p is not None}
    model = models.pop() if len(models) == 1 else None
    if not isinstance(model, str):
        return None
    try:
        require_org_model(registry, doc.org_id, model, action="restore a document of")
    except EmbeddingModelMismatch:
        return None
    return model, [p.dense for p in points if p is not None]


def _write_hidden_edit(
    doc: DocRecord,
    content: str,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    embedder: Embedder,
    max_words: int,
    overlap_words: int,
    cited: Sequence[SourceRef] = (),
    added: SourceRef | None = None,
) -> tuple[str, list[ChunkPoint], tuple[SourceRef, ...]]:
    """Chunk, embed and store the edited Markdown as chunks of ``doc``, hidden (its payload
    says pending_review) until its publish shows them (`_publish_decision`). The chunk ids are
    keyed by the new content, so they sit beside any other content's chunks. Returns the
    content hash, the stored points and the edit's citations: its Citations footer is not
    chunked, and a source it still cites keeps the URI the version before knew (``cited``);
    ``added`` (the editor, for the lines she added without a citation) is cited too."""
    extracted, citations = split_citation_footer(
        ExtractedDocument(
            title=doc.title,
            uri=doc.uri,
            sections=tuple(markdown_to_sections(content, title=doc.title)),
            source_format="md",
        ),
        {c.cite_id: c.uri for c in cited if c.uri},
    )
    if added is not None and added.cite_id not in {c.cite_id for c in citations}:
        citations = (*citations, added)
    content_hash = hashlib.sha256(content.encode("utf-8")).hexdigest()
    chunks: list[Chunk] = [
        replace(c, chunk_id=f"{doc.id}@{content_hash[:12]}:{c.chunk_index}")
        for c in document_to_chunks(
            doc.id, extracted, max_words=max_words, overlap_words=overlap_words
        )
    ]
    hidden = replace(doc, content_hash=content_hash, status=DocStatus.PENDING_REVIEW.value)
    model_id = embedder.model_id
    require_org_model(registry, doc.org_id, model_id, action="edit a document of")
    vectors = embedder.embed_documents([c.embed_text for c in chunks])
    points = [
        chunk_to_point(c, v, hidden, model_id=model_id)
        for c, v in zip(chunks, vectors, strict=True)
    ]
    registry.chunks.put_chunks(doc, content_hash, chunks, embedding_model=model_id)
    with open_store() as store:
        store.upsert(points)
    return content_hash, points, citations


def _attributed(
    registry: SqlRegistry, doc: DocRecord, user: UserRecord, content: str
) -> tuple[str, SourceRef | None]:
    """``content`` with the lines the edit adds to ``doc`` without a citation tagged as the
    editor's, and the citation they name (`tasks.review.attribution`)."""
    chunks = registry.chunks.document_chunks([doc.id]).get(doc.id, [])
    before = chunks_to_markdown([(c.heading_path, c.text) for c in chunks])
    before += render_footer(doc.citations)
    return attribute_added_lines(before, content, user_id=user.id, on=_now().date())


def _edit_stamps(user: UserRecord, chunk_count: int) -> dict[str, Any]:
    """The columns an edit sets with its approval."""
    now = _now()
    return {
        "edited_by": user.id,
        "edited_at": now,
        "approved_by": user.id,
        "approved_at": now,
        "chunk_count": chunk_count,
        "parse_status": ParseStatus.INGESTED.value,
    }


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
    """Replace a document's content (Markdown), re-chunk and re-embed it, and approve it.

    A draft (pending_review) is edited in place: the new chunks are written hidden beside the
    draft's, and the registry commit approves the document with the new content hash (the
    chunks are shown around it as `_publish_decision` says). An approved document gets a NEW
    version with the edited content, approved in the same commit that supersedes the old one
    (`edit_approved`). Returns the approved document (for an approved one: its new version).
    A reviewer's note the edit left in (the offline draft's banner) is dropped: it is said to
    the reviewer, never served (`tasks.text.review_note`).
    """
    content, _ = split_review_note(content or "")
    if not content.strip():
        raise ConfigError(
            f"the edited content for document {doc_id} is empty; send the full corrected text "
            "(or reject the draft instead)."
        )
    doc, user = _authorized(
        registry,
        doc_id,
        actor_id,
        "edit",
        states=(DocStatus.PENDING_REVIEW.value, DocStatus.APPROVED.value, None),
    )
    content, added = _attributed(registry, doc, user, content)
    if doc.status != DocStatus.PENDING_REVIEW.value:
        return edit_approved(
            doc, user, content, registry=registry, open_store=open_store, embedder=embedder,
            max_words=max_words, overlap_words=overlap_words, note=note, added=added,
        )  # fmt: skip
    # The edited chunks are written hidden beside the draft's; which set survives is decided
    # by the registry commit.
    content_hash, points, citations = _write_hidden_edit(
        doc, content, registry=registry, open_store=open_store, embedder=embedder,
        max_words=max_words, overlap_words=overlap_words, cited=doc.citations, added=added,
    )  # fmt: skip
    try:
        return _publish_decision(
            doc,
            registry=registry,
            open_store=open_store,
            edited=points,
            decide=lambda: registry.documents.transition_and_retire(
                doc_id,
                expected=DocStatus.PENDING_REVIEW,
                new=DocStatus.APPROVED,
                actor=user.id,
                action=AuditAction.EDITED_APPROVED,
                changes=_edit_stamps(user, len(points))
                | {"content_hash": content_hash, "citations": citations_column(citations)},
                note=note,
            ),
        )
    except ReviewConflict:
        sync_payload(doc_id, registry=registry, open_store=open_store)  # drops the edit's chunks
        raise


def edit_approved(
    doc: DocRecord,
    user: UserRecord,
    content: str,
    *,
    registry: SqlRegistry,
    open_store: StoreOpener,
    embedder: Embedder,
    max_words: int = 180,
    overlap_words: int = 30,
    note: str | None = None,
    added: SourceRef | None = None,
) -> DocRecord:
    """A new approved version of an approved document, with the edited content (``added``:
    what its lines the editor added without a citation cite, `_attributed`).

    The new version is registered as a hidden draft, its chunks written hidden; one registry
    transaction then approves it and supersedes the old version (which must still be approved:
    a lost race is a conflict and the new version is rejected, never served). The new chunks
    are shown before that commit and the old ones hidden after it, so search serves the old
    version until the commit and the new one from then on (`_publish_decision`).
    """
    created = _next_version(
        registry, doc, user.id, hashlib.sha256(content.encode("utf-8")).hexdigest()
    )
    _, points, citations = _write_hidden_edit(
        created, content, registry=registry, open_store=open_store, embedder=embedder,
        max_words=max_words, overlap_words=overlap_words, cited=doc.citations, added=added,
    )  # fmt: skip
    try:
        return _publish_decision(
            created,
            registry=registry,
            open_store=open_store,
            edited=points,
            decide=lambda: registry.documents.replace_version(
                doc.id,
                created.id,
                expected_old=DocStatus(doc.status) if doc.status else None,
                actor=user.id,
                changes=_edit_stamps(user, len(points))
                | {"citations": citations_column(citations)},
                note=note,
            ),
        )
    except ReviewConflict as exc:
        _drop_losing_copy(registry, open_store, created.id, user.id,
                          f"edit of {doc.id} not applied: {exc}")  # fmt: skip
        raise


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
        registry.documents.transition(
            doc.id,
            expected=expected,
            new=DocStatus.SUPERSEDED,
            actor=actor,
            action=AuditAction.SUPERSEDED,
        )
    except ReviewConflict:
        sync_document(registry.documents.get_document(doc.id), store)
        log.warning("version %s changed state during supersede; payload re-synced", doc.id)
        return False
    return True


def retire_shadowed(
    registry: SqlRegistry,
    store: VectorStore,
    *,
    org_id: str | None = None,
    source_keys: Sequence[str] | None = None,
    actor: str = "system",
    dry_run: bool = False,
) -> list[dict[str, Any]]:
    """Repair "more than one servable version of a source": every live version below a newer
    servable one is hidden, then superseded (left behind by a crash of an older release, or
    by a write that failed half-way). Returns what was (or, with ``dry_run``, would be) done."""
    shadowed = registry.documents.shadowed_versions(org_id, source_keys)
    found = [
        {
            "doc_id": doc.id,
            "org_id": doc.org_id,
            "source_key": doc.source_key,
            "version": doc.version,
            "status": doc.status,
            "shadowed_by": newer,
        }
        for doc, newer in shadowed
    ]
    if shadowed and not dry_run:
        docs = [doc for doc, _ in shadowed]
        hide_versions(store, docs)
        retired = registry.documents.retire_versions([d.id for d in docs], actor=actor)
        settle_versions(store, registry, docs, retired)
    return found


def sync_payload(doc_id: str, *, registry: SqlRegistry, open_store: StoreOpener) -> None:
    """Make a document's vectors say what the registry says now (after a lost race)."""
    current = registry.documents.get_document(doc_id)
    with open_store() as store:
        sync_document(current, store)


def sync_document(doc: DocRecord, store: VectorStore) -> None:
    """Delete chunks of other content than the registry's, then set status and parse status.

    Stale chunks go first, so showing a document never shows text that was not approved.
    """
    store.delete_stale_chunks(doc.id, keep_content_hash=doc.content_hash)
    store.set_document_payload(doc.id, {"status": doc.status, "parse_status": doc.parse_status})


# --- reconciliation ------------------------------------------------------------------------


@dataclass
class ReconcileReport:
    documents: int = 0
    points: int = 0
    repaired: list[dict[str, Any]] = field(default_factory=list)
    stale_removed: list[str] = field(default_factory=list)
    orphans_removed: list[str] = field(default_factory=list)
    duplicates: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "points": self.points,
            "repaired": self.repaired,
            "stale_removed": self.stale_removed,
            "orphans_removed": self.orphans_removed,
            "duplicates": self.duplicates,
        }


def reconcile(
    registry: SqlRegistry, store: VectorStore, *, org_id: str | None = None, dry_run: bool = False
) -> ReconcileReport:
    """Make the registry consistent and the vector store agree with it (the source of truth).

    First, a source with more than one servable version (a crash of an older release between
    approving a new version and retiring the old) keeps only its newest: the older versions
    are hidden, then superseded (``duplicates``). Then, for every document with chunks in the
    store: chunks of other content than the registry's (an edit that lost its race or crashed)
    are deleted; a status or parse status that differs from the registry is rewritten; chunks
    whose document the registry does not know are deleted. It never makes a review decision.
    """
    report = ReconcileReport()
    report.duplicates = retire_shadowed(
        registry, store, org_id=org_id, actor="reconcile", dry_run=dry_run
    )
    seen: dict[str, set[tuple[Any, Any, Any]]] = {}
    fields = ["doc_id", "org_id", "status", "parse_status", "content_hash"]
    for hit in store.iter_payloads(fields):
        if org_id is not None and hit.payload.get("org_id") != org_id:
            continue
        report.points += 1
        payload = hit.payload
        seen.setdefault(str(payload.get("doc_id", "")), set()).add(
            (payload.get("status"), payload.get("parse_status"), payload.get("content_hash"))
        )
    report.documents = len(seen)
    known = registry.documents.get_documents(seen)
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
