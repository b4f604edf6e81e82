# Over 500 lines: plan, index and supersede are one write protocol; its order is its safety.
"""Plan and index documents: the unit of work behind the ingest flow.

``plan_ingest`` compares discovered sources with the registry by content hash (unchanged sources
cost nothing); ``index_batch`` extracts, chunks, embeds, checks and stores one batch of
documents. Ordering keeps exactly one version of a source served at every instant: a new
version's registry row says ``parse_status=pending`` (not served) until one registry
transaction makes it servable and retires the older version, whose chunks are hidden in the
vector store only after that commit (`_publish` says why).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core import faults
from core.contracts import IngestReport, JobRef, PathNote, PathReason
from core.errors import ExtractionError
from core.models import (
    SERVABLE_PARSE_STATUSES,
    Chunk,
    ChunkPoint,
    DocStatus,
    ExtractedDocument,
    ParseStatus,
    SourceRef,
)
from sinks.registry import DocRecord, NewDocument, SqlRegistry
from sinks.vectors import VectorStore
from tasks.ingest.discover import Source, record_to_document
from tasks.ingest.validate import check_chunk_points
from tasks.review.machine import retire_shadowed, settle_versions
from tasks.text.chunk import document_to_chunks
from tasks.text.citations import split_citation_footer
from tasks.text.embed import Embedder
from tasks.text.model_check import require_org_model
from tasks.text.points import chunk_to_point

log = logging.getLogger(__name__)

_LIVE = (None, DocStatus.APPROVED)


@dataclass(frozen=True)
class IngestTarget:
    """Where documents go and the review metadata they get."""

    org_id: str
    collection_id: int
    collection_path: str
    status: DocStatus | None = DocStatus.APPROVED
    audience: str | None = None
    effective_date: dt.date | None = None
    source_tag: str | None = None
    synthesis_run_id: str | None = None
    actor: str = "system"


@dataclass(frozen=True)
class WorkItem:
    """A source to index, and the registry's current version of it (if any)."""

    source: Source
    previous: DocRecord | None = None
    resume: bool = False  # same content, but its last ingest did not finish: redo it in place


@dataclass
class IngestPlan:
    work: list[WorkItem] = field(default_factory=list)
    unchanged: int = 0
    # Older versions a re-run puts out of service, so that it converges: versions still live
    # below a servable newer one (left by a crash of an older release), and retired versions
    # whose chunks a publish that stopped between its commit and its hide left visible in the
    # store (`unsettled_versions`).
    shadowed: list[DocRecord] = field(default_factory=list)

    @property
    def new(self) -> int:
        return sum(1 for w in self.work if w.previous is None)

    @property
    def changed(self) -> int:
        return sum(1 for w in self.work if w.previous is not None and not w.resume)

    @property
    def resumed(self) -> int:
        """Same content as registered, but its last ingest did not finish: redone in place."""
        return sum(1 for w in self.work if w.previous is not None and w.resume)


@dataclass
class BatchReport:
    documents: int = 0
    chunks: int = 0
    superseded: int = 0
    embed_seconds: float = 0.0
    doc_ids: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (source name, reason)
    empty: list[tuple[str, str]] = field(default_factory=list)  # read fine, nothing to index
    notes: list[tuple[str, str]] = field(default_factory=list)  # stored, with a caveat

    def merge(self, other: BatchReport) -> None:
        self.documents += other.documents
        self.chunks += other.chunks
        self.superseded += other.superseded
        self.embed_seconds += other.embed_seconds
        self.doc_ids.extend(other.doc_ids)
        self.skipped.extend(other.skipped)
        self.empty.extend(other.empty)
        self.notes.extend(other.notes)


def plan_ingest(
    sources: Sequence[Source],
    registry: SqlRegistry,
    org_id: str,
    *,
    by_key: bool = False,
    again: Collection[str] = (),
) -> IngestPlan:
    """Split sources into work (new, changed, unfinished) and unchanged, by content hash, and
    find the older versions a crash left in service (``shadowed``).

    The org's documents are read in one query; ``by_key``: only those of ``sources`` (a sync's
    step of a few hundred items in an org of many thousands). ``again``: the keys of sources
    to ingest as a new version even when the registry has their content (a synced item back
    at its source, its last version taken out of service)."""
    versions: dict[str, list[DocRecord]] = {}
    keys_read = [s.source_key for s in sources] if by_key else None
    for doc in registry.documents.list_documents(org_id, source_keys=keys_read):  # every version
        versions.setdefault(doc.source_key, []).append(doc)
    current = {key: max(docs, key=lambda d: d.version) for key, docs in versions.items()}
    plan = IngestPlan()
    for source in sources:
        prev = current.get(source.source_key)
        if prev is None:
            plan.work.append(WorkItem(source))
        elif prev.content_hash != source.content_hash:
            plan.work.append(WorkItem(source, previous=prev))
        elif prev.parse_status not in SERVABLE_PARSE_STATUSES:
            plan.work.append(WorkItem(source, previous=prev, resume=True))
        elif source.source_key in again:
            plan.work.append(WorkItem(source, previous=prev))
        else:
            plan.unchanged += 1
    keys = [s.source_key for s in sources]
    plan.shadowed = [doc for doc, _ in registry.documents.shadowed_versions(org_id, keys)]
    for key in dict.fromkeys(keys):
        plan.shadowed.extend(unsettled_versions(versions.get(key, [])))
    return plan


def unsettled_versions(versions: Sequence[DocRecord]) -> list[DocRecord]:
    """Retired versions of one source (``versions``: all of them) whose chunks may still be
    visible in the vector store: a publish stopped between its registry commit and its hide.

    The registry tells: a publish that finishes writes the version it made servable once more
    after hiding the retired chunks (`_publish`), so that version's ``updated_at`` is later
    than that of every version it retired, while the commit itself stamps the retired versions
    last. A retired version stamped at or after the newest servable version was not hidden.
    (Its chunks are never served meanwhile: the registry re-check drops them.)
    """
    servable = [
        d for d in versions if d.status in _LIVE and d.parse_status in SERVABLE_PARSE_STATUSES
    ]
    if not servable:
        return []
    newest = max(servable, key=lambda d: d.version)
    return [
        d
        for d in versions
        if d.version < newest.version
        and d.status == DocStatus.SUPERSEDED.value
        and d.updated_at >= newest.updated_at
    ]


def repair_shadowed(
    plan: IngestPlan, registry: SqlRegistry, store: VectorStore, *, actor: str
) -> int:
    """Put the plan's shadowed versions out of service; returns how many the registry retired.

    Live ones are hidden, then superseded (`retire_shadowed`); retired ones whose chunks are
    still visible are hidden. Then each source's servable version is stamped, as a finished
    publish does, so the next plan finds nothing left to repair.
    """
    if not plan.shadowed:
        return 0
    org_id = plan.shadowed[0].org_id
    live = sorted({d.source_key for d in plan.shadowed if d.status != DocStatus.SUPERSEDED})
    done = []
    if live:
        done = retire_shadowed(registry, store, org_id=org_id, source_keys=live, actor=actor)
    unsettled = [d.id for d in plan.shadowed if d.status == DocStatus.SUPERSEDED]
    settle_versions(store, registry, (), unsettled)  # hides them
    for key in sorted({d.source_key for d in plan.shadowed}):
        _stamp_settled(registry.documents.versions_of(org_id, key), registry)
    plan.shadowed = []
    return len(done)


def _stamp_settled(versions: Sequence[DocRecord], registry: SqlRegistry) -> None:
    """Write the newest servable version's own values back (a no-op but for ``updated_at``):
    the mark that its source's retired versions are hidden (`unsettled_versions`)."""
    servable = [
        d for d in versions if d.status in _LIVE and d.parse_status in SERVABLE_PARSE_STATUSES
    ]
    if servable:
        newest = max(servable, key=lambda d: d.version)
        registry.documents.mark_parsed(
            newest.id, parse_status=ParseStatus(newest.parse_status),
            chunk_count=newest.chunk_count,
        )  # fmt: skip


Extracted = dict[str, ExtractedDocument | ExtractionError]


def extract_batch(
    items: Sequence[WorkItem], extract_file: Callable[[Source], ExtractedDocument]
) -> Extracted:
    """Extract the files of a batch up front (corpus records need no extraction), so the
    vector store is held only while writing. Failures are kept, keyed by source, and reported
    by `index_batch`."""
    out: Extracted = {}
    for item in items:
        if item.source.record is not None:
            continue
        try:
            out[item.source.source_key] = extract_file(item.source)
        except ExtractionError as exc:
            out[item.source.source_key] = exc
    return out


def prefetched(extracted: Extracted) -> Callable[[Source], ExtractedDocument]:
    """An ``extract_file`` for `index_batch` that returns (or raises) what `extract_batch` got."""

    def lookup(source: Source) -> ExtractedDocument:
        found = extracted[source.source_key]
        if isinstance(found, ExtractionError):
            raise found
        return found

    return lookup


def index_batch(
    items: Sequence[WorkItem],
    target: IngestTarget,
    *,
    store: VectorStore,
    registry: SqlRegistry,
    embedder: Embedder,
    extract_file: Callable[[Source], ExtractedDocument],
    max_words: int = 180,
    overlap_words: int = 30,
    cite_uris: Mapping[str, str] | None = None,
) -> BatchReport:
    """Extract, chunk, embed, check and store one batch of documents.

    A document that fails (unreadable file, failed data check) is skipped with its reason in
    the report; the rest of the batch is stored. A document's Citations footer is not chunked:
    its entries are kept with the document (``cite_uris``: the URIs of the cited ids, as the
    research corpus knows them).

    Raises:
        EmbeddingModelMismatch: the org's chunks were embedded by another model than
            ``embedder``'s (checked before anything is written: an org never mixes models).
    """
    require_org_model(registry, target.org_id, embedder.model_id, action="ingest into")
    report = BatchReport()
    read: list[tuple[WorkItem, ExtractedDocument, tuple[SourceRef, ...]]] = []
    for item in items:
        try:
            extracted, citations = _read(item, extract_file, cite_uris)
        except ExtractionError as exc:
            report.skipped.append((item.source.name, str(exc)))
            log.warning("skipped %s: %s", item.source.name, exc)
            continue
        report.notes.extend((item.source.name, note) for note in extraction_notes(extracted))
        if _status_of(extracted, target) != target.status:
            reason = extracted.meta["review_reason"]
            report.notes.append((item.source.name, f"held for review (pending_review): {reason}"))
        read.append((item, extracted, citations))
    docs: list[tuple[WorkItem, DocRecord, list[Chunk]]] = []
    for (item, extracted, _), doc in zip(read, _register(read, target, registry), strict=True):
        if not extracted.sections and extracted.meta.get("empty_reason"):
            # Read fine, nothing to say (a silent recording): recorded, so a re-run skips it;
            # it still retires what the source used to say.
            report.superseded += _publish(
                [(item, doc)], {doc.id: 0}, target, store=store, registry=registry
            )
            report.empty.append((item.source.name, str(extracted.meta["empty_reason"])))
            continue
        chunks = document_to_chunks(
            doc.id, extracted, max_words=max_words, overlap_words=overlap_words
        )
        if not chunks:
            registry.documents.mark_parsed(doc.id, parse_status=ParseStatus.FAILED, chunk_count=0)
            report.skipped.append((item.source.name, "no text to index after extraction"))
            continue
        docs.append((item, doc, chunks))
    if not docs:
        return report

    all_chunks = [c for _, _, chunks in docs for c in chunks]
    chunks_of = {doc.id: chunks for _, doc, chunks in docs}
    started = time.perf_counter()
    vectors = embedder.embed_documents([c.embed_text for c in all_chunks])
    report.embed_seconds = time.perf_counter() - started
    model_id = embedder.model_id
    by_doc: dict[str, list[ChunkPoint]] = {}
    records = {doc.id: doc for _, doc, _ in docs}
    for chunk, vector in zip(all_chunks, vectors, strict=True):
        by_doc.setdefault(chunk.doc_id, []).append(
            chunk_to_point(chunk, vector, records[chunk.doc_id], model_id=model_id)
        )

    check = check_chunk_points([p for pts in by_doc.values() for p in pts])
    bad_docs = {cid.rsplit(":", 1)[0] for ids in check.failures.values() for cid in ids if cid}
    stored: list[tuple[WorkItem, DocRecord]] = []
    for item, doc, _ in docs:
        if doc.id in bad_docs:
            reasons = ", ".join(k for k, ids in check.failures.items() if _mentions(ids, doc.id))
            registry.documents.mark_parsed(doc.id, parse_status=ParseStatus.FAILED, chunk_count=0)
            report.skipped.append((item.source.name, f"failed data checks: {reasons}"))
            continue
        if item.resume:
            store.delete_document(doc.id)  # a half-written earlier attempt
        stored.append((item, doc))
    # The batch's chunk texts in one transaction (the documents stay pending until published).
    registry.chunks.put_chunks_of(
        [(doc, doc.content_hash, chunks_of[doc.id]) for _, doc in stored], embedding_model=model_id
    )
    for _ in stored:
        faults.point("ingest.after_chunks")
    # One upsert (and one flush) per batch; documents become servable only when published.
    store.upsert([p for _, doc in stored for p in by_doc[doc.id]])
    faults.point("ingest.after_upsert")
    report.superseded += _publish(
        stored, {doc.id: len(by_doc[doc.id]) for _, doc in stored}, target,
        store=store, registry=registry,
    )  # fmt: skip
    for _, doc in stored:
        report.documents += 1
        report.chunks += len(by_doc[doc.id])
        report.doc_ids.append(doc.id)
    return report


def _read(
    item: WorkItem,
    extract_file: Callable[[Source], ExtractedDocument],
    cite_uris: Mapping[str, str] | None = None,
) -> tuple[ExtractedDocument, tuple[SourceRef, ...]]:
    """The source's document without its Citations footer, and the footer's entries."""
    source = item.source
    extracted = record_to_document(source) if source.record is not None else extract_file(source)
    return split_citation_footer(extracted, cite_uris)


def batch_texts(
    items: Sequence[WorkItem],
    extract_file: Callable[[Source], ExtractedDocument],
    *,
    max_words: int = 180,
    overlap_words: int = 30,
) -> list[str]:
    """The texts `index_batch` will embed for ``items``, in its order.

    Chunking depends only on the extracted text and the word caps (not on the registry ids
    the chunks get), so a worker that never opens the registry or the store (a Dask worker)
    can embed a batch before the flow writes it.
    """
    texts: list[str] = []
    for item in items:
        try:
            extracted, _ = _read(item, extract_file)
        except ExtractionError:
            continue  # index_batch reports it
        chunks = document_to_chunks(
            "pending", extracted, max_words=max_words, overlap_words=overlap_words
        )
        texts.extend(c.embed_text for c in chunks)
    return texts


def _publish(
    stored: Sequence[tuple[WorkItem, DocRecord]],
    chunk_counts: dict[str, int],
    target: IngestTarget,
    *,
    store: VectorStore,
    registry: SqlRegistry,
) -> int:
    """Make stored documents servable; returns how many older versions they retired.

    One registry transaction makes the new versions servable and retires the older live
    versions of their sources; the store is written around it so that every instant, crash or
    not, serves exactly one version of a source (the old or the new) on every search path.

    Why this order: a vector hit is served only if BOTH the store's payload filter and the
    registry re-check (`tasks.query.retrieve.search`: `Gate.admits` on the document's registry
    row) admit it, and the keyword fallback reads the registry alone. So the registry commit is
    the one switch, and the store must admit both versions across it:

    - before the commit the new chunks are already in the store with their final payload
      (`index_batch` upserted them), but their registry row says ``parse_status=pending``, so
      the re-check drops them: only the old version is served;
    - after the commit the old version is ``superseded`` in the registry, so the re-check drops
      its chunks: only the new version is served;
    - then the old chunks are hidden in the store too, so that the store's filter (the first
      one, which also keeps them out of the candidates a query fetches) agrees again;
    - last, the new versions are written once more (the same values), which stamps them later
      than the versions they retired: the registry's record that the hide is done.

    Hiding the old chunks before the commit would serve neither version until it. A crash
    after the commit but before the stamp leaves retired chunks in the store that are never
    served (the re-check drops them); the next plan finds them (`unsettled_versions`) and
    `repair_shadowed` hides them, as `kbflow reconcile` would.
    """
    # Per document: one held for review (`_status_of`) leaves its live older version served.
    retiring = [doc.id for item, doc in stored if item.previous is not None and doc.status in _LIVE]
    retired = registry.documents.publish(chunk_counts, retire_older=retiring, actor=target.actor)
    faults.point("ingest.after_publish")
    settle_versions(store, registry, (), retired)  # hides every version the commit retired
    faults.point("ingest.after_hide")
    if retired:
        registry.documents.publish({d: chunk_counts[d] for d in retiring}, actor=target.actor)
    faults.point("ingest.after_settle")
    return len(retired)


def extraction_notes(doc: ExtractedDocument) -> list[str]:
    """Caveats worth telling the user about a document that was read."""
    notes: list[str] = []
    meta = doc.meta
    if meta.get("declared_format"):
        notes.append(
            f"named .{meta['declared_format']} but its content is {doc.source_format}; "
            f"read as {doc.source_format}"
        )
    if meta.get("ocr_pages"):
        notes.append(f"OCR ({meta.get('ocr_engine')}) on page(s) {_pages(meta['ocr_pages'])}")
    if meta.get("pages_without_text"):
        notes.append(f"no text found on page(s) {_pages(meta['pages_without_text'])}")
    return notes


def _pages(pages: list[int]) -> str:
    shown = ", ".join(str(p) for p in pages[:10])
    return shown + (f" and {len(pages) - 10} more" if len(pages) > 10 else "")


def _mentions(chunk_ids: list[Any], doc_id: str) -> bool:
    return any(str(c).startswith(doc_id + ":") for c in chunk_ids)


def _register(
    read: Sequence[tuple[WorkItem, ExtractedDocument, tuple[SourceRef, ...]]],
    target: IngestTarget,
    registry: SqlRegistry,
) -> list[DocRecord]:
    """Each read document's registry record, in order: a resumed one's earlier (pending) row,
    else a new pending version, all of the batch's created in one transaction."""
    new = [
        NewDocument(
            org_id=target.org_id,
            collection_id=target.collection_id,
            source_key=item.source.source_key,
            title=extracted.title,
            uri=extracted.uri,
            content_hash=item.source.content_hash,
            version=(item.previous.version + 1) if item.previous else 1,
            status=_status_of(extracted, target),
            source_tag=target.source_tag,
            synthesis_run_id=target.synthesis_run_id,
            audience=target.audience,
            effective_date=target.effective_date,
            actor=target.actor,
            citations=citations,
            review_note=item.source.review_note,
        )
        for item, extracted, citations in read
        if not _resumed(item)
    ]
    created = iter(registry.documents.create_documents(new))
    out: list[DocRecord] = []
    for item, _, _ in read:
        previous = item.previous
        if _resumed(item) and previous is not None:
            out.append(previous)
        else:
            out.append(next(created))
            faults.point("ingest.after_register")
    return out


def _status_of(extracted: ExtractedDocument, target: IngestTarget) -> DocStatus | None:
    """The status a document enters with: the target's, except that a document extraction
    asks to have reviewed (``meta["review_reason"]``, e.g. a low-confidence transcript) is
    never served unreviewed: ``pending_review`` where the target would serve it at once."""
    if target.status in _LIVE and extracted.meta.get("review_reason"):
        return DocStatus.PENDING_REVIEW
    return target.status


def _resumed(item: WorkItem) -> bool:
    return item.resume and item.previous is not None


def ingest_report(
    plan: IngestPlan,
    total: BatchReport,
    *,
    org: str,
    collection: str,
    discovered: int,
    seconds: float,
    jobs: Sequence[JobRef] = (),
) -> IngestReport:
    """What an ingest run did, from its plan and its batches' totals (``jobs``: the background
    jobs long files were handed to)."""
    return IngestReport(
        org=org,
        collection=collection,
        discovered=discovered,
        new=plan.new,
        changed=plan.changed,
        unchanged=plan.unchanged,
        resumed=plan.resumed,
        documents=total.documents,
        chunks=total.chunks,
        superseded=total.superseded,
        skipped=[PathReason(source=s, reason=r) for s, r in total.skipped],
        seconds=round(seconds, 3),
        embed_seconds=round(total.embed_seconds, 3),
        empty=[PathReason(source=s, reason=r) for s, r in total.empty],
        notes=[PathNote(source=s, note=n) for s, n in total.notes],
        jobs=list(jobs),
    )
