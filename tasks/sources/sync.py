"""The sync of one source: its rules, run by the ``source-sync`` flow (`flows.source_sync`).

One walk of the source (`tasks.sources`), in steps of ``sources_batch_items`` items
(`SourceSync.batches`). Each step hands the new and changed items to ingest as sources
(`SourceSync.prepare`): in memory when ingest reads their format from memory (a rendered record,
a page, any Markdown, HTML, CSV or plain text), else staged as a file for the parser that reads
it (PDF, Office, images, audio, video). Ingest stores them exactly as ``kbflow ingest`` does
(the flow runs its tasks: same extraction, chunking, checks and publish; the source's
collection, status and audience), then what was seen of each item is recorded
(`SourceSync.record`, `SourcesRepository.record_items`). An item is recorded only after its ingest,
so a sync killed midway resumes where it stopped: the next sync reads the unrecorded items
again and the ingest's content hash finds the ones already stored (nothing is doubled).

Once the walk is complete (no listing error, no cap hit), the items recorded before and not
seen now are gone from the source (`SourceSync.withdraw_gone`): their documents are taken out
of service (`tasks.review.machine.take_out_at_source`: approved -> withdrawn, a draft ->
rejected), audited as "removed at source" with the source as the actor; answers that cited them
are flagged stale by ``kbflow provenance --stale``. An item that comes back is ingested again as
a new version (approved for a trusted source, pending_review otherwise).

A failing item (unreadable, too big, failed extraction) is recorded as failed with its reason
and tried again next sync; the rest syncs. The sync ends in a `core.contracts.SyncReport`, also
kept on the source (`kbflow sources show`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import logging
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from core import faults, progress
from core.contracts import ItemFailure, SyncCounts, SyncReport, WithdrawHeld
from core.errors import ExtractionError
from core.models import DocStatus
from core.settings import Settings
from sinks.connect import open_registry, open_vector_store
from sinks.registry import ItemState, SourceRecord, SqlRegistry
from tasks.ingest.discover import Source
from tasks.ingest.extract import reads_in_memory
from tasks.ingest.index import BatchReport, Extracted, IngestPlan, IngestTarget, plan_ingest
from tasks.sources import kind_module
from tasks.sources.base import Item, Limits, Prior, SourceError
from tasks.sources.guard import check_before_sync
from tasks.sources.state import source_doc_key, take_out_item

MAX_ERRORS_KEPT = 50
"""Failed items listed in a sync's report (all are counted; each is kept on its item)."""

Log: TypeAlias = "logging.Logger | logging.LoggerAdapter[Any]"


def item_record(
    key: str,
    uri: str,
    state: str,
    *,
    version: str | None = None,
    content_hash: str | None = None,
    meta: Mapping[str, Any] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """What the registry keeps of one item after a sync (`SourcesRepository.record_items`): present
    (its version, content hash and the connector's ``meta``), failed (its reason; the hash of
    what was last synced kept) or gone. The one place a sync builds an item's state."""
    return {
        "key": key,
        "uri": uri,
        "version": version,
        "content_hash": content_hash,
        "meta": dict(meta or {}),
        "state": state,
        "error": error,
    }


@dataclass
class Step:
    """One step of the walk: the states of the items ingest does not take (unchanged, failed)
    and the items it takes, as sources by source key, planned against the registry."""

    records: list[dict[str, Any]] = field(default_factory=list)
    items: dict[str, tuple[Item, Source]] = field(default_factory=dict)
    plan: IngestPlan = field(default_factory=IngestPlan)
    target: IngestTarget | None = None  # where the items go: set when there are any

    def cite(self, extracted: Extracted) -> Extracted:
        """The extracted documents citing their items (``s3://…``, ``https://…``), not the
        staged copies ingest read."""
        return {
            key: doc
            if isinstance(doc, ExtractionError)
            else dataclasses.replace(doc, uri=self.items[key][1].uri)
            for key, doc in extracted.items()
        }


class SourceSync:
    """One sync of one source: `begin`, then for each step of `batches` `prepare` it, ingest
    its plan (the flow runs ingest's tasks) and `record` it; `withdraw_gone` once `complete`;
    `unstage`; `finish` with the report. No Prefect here."""

    def __init__(self, settings: Settings, source: SourceRecord, log: Log) -> None:
        self.settings = settings
        self.source = source
        self.log = log
        self.actor = f"source:{source.id}"
        self.counts = dict.fromkeys(SyncCounts.model_fields, 0)
        self.errors: list[ItemFailure] = []
        self.states: dict[str, ItemState] = {}
        self.seen: set[str] = set()
        self.complete = False  # the walk saw the whole source
        self.held: WithdrawHeld | None = None
        self.staging = Path(settings.home) / "sources" / source.id / "staged"
        self._confirmed: dict[str, str] | None = None
        self._started = dt.datetime.now(dt.UTC)
        self._clock = time.perf_counter()
        self._flow_run_id: str | None = None

    def begin(self, flow_run_id: str | None = None) -> None:
        """Say on the source that this sync runs, and read what earlier syncs recorded of its
        items. While it runs, the last sync that finished stays readable (`sources show`,
        /metrics) under "previous"; a confirmation to withdraw past the deletion-storm bound is
        taken for this sync only."""
        self._started = dt.datetime.now(dt.UTC)
        self._clock = time.perf_counter()
        self._flow_run_id = flow_run_id
        running = {
            "started_at": self._started.isoformat(),
            "outcome": "running",
            "flow_run_id": flow_run_id,
        }
        with open_registry(self.settings) as registry:
            before = dict(registry.sources.get_source(self.source.id).last_sync or {})
            self._confirmed = before.pop("withdraw_confirmed", None)
            if before.get("outcome") == "running":  # a killed sync's: keep what it kept
                before = dict(before.get("previous") or {})
            registry.sources.set_last_sync(self.source.id, running | {"previous": before or None})
            self.states = registry.sources.source_items(self.source.id)

    # --- the walk ----------------------------------------------------------------------------

    def batches(self) -> Iterator[list[Item]]:
        """The source's items in steps of ``sources_batch_items`` (a listing that repeats an
        item: the first one counts), cut early so that no two items to read in one step share a
        name. `complete` says afterwards whether the walk saw the whole source.

        Raises:
            SourceError: the source could not be listed.
        """
        source = self.source
        limits = Limits(
            include=tuple(source.include),
            exclude=tuple(source.exclude),
            max_items=source.max_items,
            max_item_bytes=source.max_item_bytes,
        )
        check_before_sync(self.settings, source.org_id, source.config)  # the operator's env list
        conn = kind_module(source.kind).connector(source.config, limits, settings=self.settings)
        # Gone and failed items get no prior: they are read again (and a returning item is
        # ingested again even when its version token did not change).
        prior = {
            key: Prior(st.version, st.content_hash, st.meta)
            for key, st in self.states.items()
            if st.state == "present"
        }
        batch: list[Item] = []
        names: set[str] = set()
        size = self.settings.sources.sources_batch_items
        for item in conn.items(prior):
            if item.key in self.seen:
                continue
            self.seen.add(item.key)
            self.counts["listed"] += 1
            name = _safe_name(item.name)
            if batch and ((item.data is not None and name in names) or len(batch) >= size):
                yield batch
                batch, names = [], set()
            batch.append(item)
            if item.data is not None:
                names.add(name)
            progress.advance("sync", 1)
        if batch:
            yield batch
        self.complete = bool(conn.complete)

    def prepare(self, batch: list[Item]) -> Step:
        """One step as ingest takes it: each new or changed item as a source (an item back at
        its source to be ingested again even with the content its last version had), planned
        against the registry; the unchanged and failed ones as states to record."""
        step = Step()
        back: set[str] = set()  # items back at the source
        for item in batch:
            before = self.states.get(item.key)
            if item.error is not None:
                self._fail(step, item, item.error)
                continue
            if item.unchanged or item.data is None:
                self.counts["unchanged"] += 1
                if before is not None and dict(item.meta) != before.meta:
                    step.records.append(_present(item, before.content_hash))
                continue
            digest = hashlib.sha256(item.data).hexdigest()
            if before is not None and before.state == "present" and before.content_hash == digest:
                self.counts["unchanged"] += 1  # touched, same bytes: only its version moved
                step.records.append(_present(item, digest))
                continue
            src = self._source(item, digest)
            step.items[src.source_key] = (item, src)
            if before is not None and before.state == "gone":
                back.add(src.source_key)
        if not step.items:
            return step
        source = self.source
        sources = [src for _, src in step.items.values()]
        with open_registry(self.settings) as registry:
            coll = registry.catalog.ensure_collection(source.org_id, source.collection)
            step.plan = plan_ingest(sources, registry, source.org_id, by_key=True, again=back)
        step.target = IngestTarget(
            org_id=source.org_id,
            collection_id=coll.id,
            collection_path=coll.path,
            status=DocStatus(source.status),
            audience=source.audience,
            source_tag=f"source:{source.name}"[:64],
            actor=self.actor,
        )
        return step

    def record(self, step: Step, report: BatchReport) -> None:
        """Count what ingest made of the step's items (``report``: its batch report) and record
        every item's state in one transaction; then drop the step's staged files."""
        failed = dict(report.skipped)  # by source name: no two in a step share one
        work = {w.source.source_key: w for w in step.plan.work}
        for key, (item, src) in step.items.items():
            before = self.states.get(item.key)
            if key in work and src.name in failed:
                self._fail(step, item, failed[src.name])
                continue
            if key not in work:
                self.counts["unchanged"] += 1  # the registry had this content (a resumed sync)
            elif before is not None and before.state == "gone":
                self.counts["returned"] += 1
            elif work[key].previous is None:
                self.counts["new"] += 1
            else:
                self.counts["changed"] += 1
            step.records.append(_present(item, src.content_hash))
        faults.point("sources.before_record")
        if step.records:  # an unchanged step has nothing to record: no registry opened for it
            with open_registry(self.settings) as registry:
                registry.sources.record_items(self.source.id, step.records)
        for _, src in step.items.values():
            if src.data is None:
                with contextlib.suppress(OSError):
                    shutil.rmtree(src.path.parent)

    def _source(self, item: Item, digest: str) -> Source:
        """The item as a source of ingest: its bytes in memory when ingest reads them from
        memory, else staged as a file (one folder an item, so names never collide)."""
        assert item.data is not None
        name = _safe_name(item.name)
        key = source_doc_key(self.source.id, item.key)
        if reads_in_memory(name, item.data):
            return Source(source_key=key, uri=item.uri, content_hash=digest, path=Path(name),
                          data=item.data)  # fmt: skip
        folder = self.staging / hashlib.sha256(item.key.encode()).hexdigest()[:24]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_bytes(item.data)
        return Source(source_key=key, uri=item.uri, content_hash=digest, path=path)

    def _fail(self, step: Step, item: Item, reason: str) -> None:
        self.counts["failed"] += 1
        self.errors.append(ItemFailure(key=item.key, error=reason))
        self.log.warning("source %s: %s failed: %s", self.source.name, item.key, reason)
        before = self.states.get(item.key)
        step.records.append(
            item_record(item.key, item.uri, "failed", error=reason,
                        content_hash=before.content_hash if before is not None else None)
        )  # fmt: skip

    def unstage(self) -> None:
        """Remove what the sync staged (a killed sync's too)."""
        shutil.rmtree(self.staging, ignore_errors=True)

    # --- items gone from the source ----------------------------------------------------------

    def withdraw_gone(self) -> None:
        """Take the documents of the items gone from the source out of service (after a
        complete walk only), unless the listing is empty or too many are gone at once.

        Raises:
            SourceError: the source listed no items but had some: nothing is withdrawn.
        """
        states = self.states
        gone = [k for k, st in states.items() if st.state != "gone" and k not in self.seen]
        if not gone:
            return
        if not self.seen:
            # An empty listing of a source that had items is far likelier a mistyped prefix, a
            # swapped bucket or a folder not mounted than a source emptied: withdraw nothing.
            raise SourceError(
                f"source {self.source.name!r} listed no items, and {len(gone)} were synced "
                "before: nothing was withdrawn. Check its url and credentials; to take its "
                "documents out of service, `kbflow sources remove NAME --withdraw`."
            )
        live = sum(1 for st in states.values() if st.state != "gone")
        bound = self.settings.sources.sources_max_withdraw_ratio
        if len(gone) >= 2 and len(gone) > bound * live and self._confirmed is None:
            # A deletion storm (1 of 10 files left, say) is far likelier a mistake at the
            # source than a decision: nothing is withdrawn until the AM confirms.
            self.held = WithdrawHeld(
                gone=len(gone),
                of=live,
                max_ratio=bound,
                message=f"{len(gone)} of the {live} items synced before are gone from "
                f"source {self.source.name!r} (more than {bound:.0%}): none was withdrawn. If "
                "they really were removed, run `kbflow sources sync "
                f"{self.source.name} --confirm-withdraw` as its AM or a superadmin.",
            )
            self.log.warning("source %s: %s", self.source.name, self.held.message)
            return
        note = f"removed at source: source {self.source.name!r} no longer has this item"
        with open_registry(self.settings) as registry:
            for key in gone:
                if self._take_out(registry, key, note):
                    self.counts["withdrawn"] += 1
                st = states[key]
                registry.sources.record_items(
                    self.source.id, [item_record(key, st.uri, "gone", content_hash=st.content_hash)]
                )

    def _take_out(self, registry: SqlRegistry, key: str, note: str) -> bool:
        def opener() -> Any:
            return open_vector_store(self.settings)

        return take_out_item(registry, self.source, key, actor=self.actor, note=note,
                             open_store=opener)  # fmt: skip

    # --- the report ----------------------------------------------------------------------------

    def finish(self, listing_error: str | None = None) -> SyncReport:
        """The sync's report (``listing_error``: why the source could not be listed), kept on
        the source as its last sync."""
        if not self.complete and listing_error is None:
            self.log.warning(
                "source %s: a cap stopped the walk (max_items %d); nothing is withdrawn until a "
                "sync sees the whole source",
                self.source.name,
                self.source.max_items,
            )
        outcome: Literal["ok", "partial", "failed"]
        if listing_error:
            outcome = "failed"
        elif self.counts["failed"]:
            outcome = "partial"
        else:
            outcome = "ok"
        report = SyncReport(
            started_at=self._started.isoformat(),
            outcome=outcome,
            flow_run_id=self._flow_run_id,
            finished_at=dt.datetime.now(dt.UTC).isoformat(),
            seconds=round(time.perf_counter() - self._clock, 3),
            complete=self.complete,
            counts=SyncCounts(**self.counts),
            errors=self.errors[:MAX_ERRORS_KEPT],
            error=listing_error,
        )
        if self.held is not None:  # set only then: a report without it leaves it out
            report.withdraw_held = self.held
        with open_registry(self.settings) as registry:
            registry.sources.set_last_sync(self.source.id, report.to_dict())
        self.log.info(
            "source %s synced: %s",
            self.source.name,
            ", ".join(f"{k} {v}" for k, v in self.counts.items()),
        )
        return report


def _present(item: Item, digest: str | None) -> dict[str, Any]:
    return item_record(item.key, item.uri, "present", version=item.version, content_hash=digest,
                       meta=item.meta)  # fmt: skip


def _safe_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "._- " else "_" for c in name).strip(" .")
    return (cleaned or "item")[-120:]
