"""The reviewer's inspection path: drafts and their full stored text, whatever their status,
for someone allowed to read them. Search never uses it (a test checks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.models import DocStatus
from sinks.registry import DocRecord, SqlRegistry
from sinks.vectors import VectorStore
from tasks.review.access import authorize_document, authorize_inspection
from tasks.review.machine import StoreOpener, held
from tasks.text.chunk import chunks_to_markdown
from tasks.text.citations import render_footer


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
    docs = registry.documents.list_documents(org_id, statuses=[DocStatus.PENDING_REVIEW.value])
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
    for doc in registry.documents.list_documents(org_id, statuses=[s.value for s in statuses]):
        groups.setdefault(doc.synthesis_run_id, []).append(doc)
    return groups


def inspect_draft(
    doc_id: str,
    actor_id: str,
    *,
    registry: SqlRegistry,
    store: VectorStore | None = None,
    open_store: StoreOpener | None = None,
) -> DraftView:
    """A document's full stored text, whatever its status, for an authorised reviewer.

    The actor is checked before the store is opened (``open_store``), so a refusal never
    waits for the store's lock.
    """
    _, doc = authorize_document(registry, actor_id, doc_id, inspect=True)
    if open_store is None:
        if store is None:
            raise ValueError("inspect_draft needs a store or a store opener")
        open_store = held(store)
    with open_store() as opened:
        chunks = opened.inspect_document_chunks(doc_id)
    return DraftView(doc=doc, chunks=[str(c.payload.get("text", "")) for c in chunks])


def draft_markdown(doc: DocRecord, store: VectorStore, max_overlap_words: int = 64) -> str:
    """A document's current text as Markdown, rebuilt from its stored chunks (any status),
    then its Citations footer (kept with the document, not chunked) when it has one.

    For the review form, which shows it and prefills the ``edit`` field with it (so an edit
    keeps the footer). Only chunks of the registry's content count (an edit that lost its race
    may have left others). The caller decides who sees it: unlike :func:`inspect_draft`
    nothing is authorised here.
    """
    hits = store.inspect_document_chunks(doc.id)
    current = [h for h in hits if h.payload.get("content_hash") in (None, doc.content_hash)]
    text = chunks_to_markdown(
        [
            (tuple(h.payload.get("heading_path") or ()), str(h.payload.get("text", "")))
            for h in current
        ],
        max_overlap_words=max_overlap_words,
    )
    footer = render_footer(doc.citations)
    return f"{text}\n{footer}" if text and footer else text or footer


def draft_texts(
    docs: Sequence[DocRecord], store: VectorStore, max_overlap_words: int = 64
) -> dict[str, str]:
    """Each document's Markdown (:func:`draft_markdown`), keyed by id."""
    return {doc.id: draft_markdown(doc, store, max_overlap_words) for doc in docs}
