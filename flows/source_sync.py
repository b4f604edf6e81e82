"""The ``source-sync`` flow: bring one synced source's documents in line with the source.

One walk of the source (`tasks.sources`), in steps of ``sources_batch_items`` items. Each step
stages the new and changed items as files, ingests them exactly as ``kbflow ingest`` does (same
extraction, chunking, checks and publish; the source's collection, status and audience), then
records what it saw of each item (`SqlRegistry.record_items`). An item is recorded only after
its ingest, so a sync killed midway resumes where it stopped: the next sync reads the
unrecorded items again and the ingest's content hash finds the ones already stored (nothing is
doubled).

Once the walk is complete (no listing error, no cap hit), the items recorded before and not
seen now are gone from the source: their documents are taken out of service
(`tasks.review.machine.take_out_at_source`: approved -> withdrawn, a draft -> rejected),
audited as "removed at source" with the source as the actor; answers that cited them are
flagged stale by ``kbflow provenance --stale``. An item that comes back is ingested again as a
new version (approved for a trusted source, pending_review otherwise).

A failing item (unreadable, too big, failed extraction) is recorded as failed with its reason
and tried again next sync; the rest syncs. Two syncs of one source never run at once (a lock
file in the home: a second one is refused; a killed sync's lock is released by the kernel).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import shutil
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Failed

from core import faults, progress
from core.errors import RunFailed
from core.models import DocStatus
from core.settings import Settings
from sinks.connect import open_registry, open_vector_store
from sinks.registry import DocRecord, ItemState, SourceRecord, SqlRegistry
from tasks.ingest.discover import Source
from tasks.ingest.index import BatchReport, IngestTarget, WorkItem, plan_ingest
from tasks.ingest.steps import extract_batch_task, extractors, index_batch_task, repair_task
from tasks.sources import kind_module
from tasks.sources.base import Item, Limits, Prior, SourceError
from tasks.sources.guard import check_before_sync
from tasks.sources.state import source_doc_key, sync_lock, take_out_item

MAX_ERRORS_KEPT = 50
"""Failed items listed in a sync's summary (all are counted; each is kept on its item)."""


@flow(name="source-sync", flow_run_name="sync {source_id}")
def source_sync(source_id: str) -> dict[str, Any]:
    """Sync one source (by id): ingest new and changed items, withdraw the ones gone from it.

    Returns the sync's summary (also kept on the source: `kbflow sources show`)."""
    settings = Settings()
    with open_registry(settings) as registry:
        source = registry.get_source(source_id)
    summary = _run(settings, source)
    if summary["outcome"] == "failed":
        # The run ends Failed with the reason as its message (no traceback: nothing broke in
        # kbflow); a plain call raises RunFailed holding the summary.
        failed: Any = Failed(message=summary["error"], data=RunFailed(summary["error"], summary))
        return failed  # typed Any: a caller never gets this state as a value
    return summary


def sync_source(settings: Settings, source: SourceRecord) -> dict[str, Any]:
    """The body of `source_sync`, callable without a flow around it (tests, the bench).

    Raises:
        SourceError: the source could not be listed (the summary is kept on the source).
    """
    summary = _run(settings, source)
    if summary["outcome"] == "failed":
        raise SourceError(summary["error"])
    return summary


def _run(settings: Settings, source: SourceRecord) -> dict[str, Any]:
    with sync_lock(settings.home, source):
        return _Sync(settings, source, _logger()).run()


class _Sync:
    def __init__(self, settings: Settings, source: SourceRecord, logger: Any) -> None:
        self.settings = settings
        self.source = source
        self.log = logger
        self.actor = f"source:{source.id}"
        self.counts = {
            "listed": 0,
            "new": 0,
            "changed": 0,
            "unchanged": 0,
            "returned": 0,
            "withdrawn": 0,
            "failed": 0,
        }
        self.errors: list[dict[str, str]] = []
        self.confirmed: dict[str, str] | None = None
        self.held: dict[str, Any] | None = None
        self.staging = Path(settings.home) / "sources" / source.id / "staged"

    def run(self) -> dict[str, Any]:
        started = dt.datetime.now(dt.UTC)
        clock = time.perf_counter()
        summary: dict[str, Any] = {
            "started_at": started.isoformat(),
            "outcome": "running",
            "flow_run_id": _flow_run_id(),
        }
        with open_registry(self.settings) as registry:
            before = dict(registry.get_source(self.source.id).last_sync or {})
            # A confirmation to withdraw past the deletion-storm bound: used by this sync only.
            self.confirmed = before.pop("withdraw_confirmed", None)
            if before.get("outcome") == "running":  # a killed sync's: keep what it kept
                before = dict(before.get("previous") or {})
            # While it runs, the last sync that finished stays readable (`sources show`,
            # /metrics): under "previous", dropped when this one finishes.
            registry.set_last_sync(self.source.id, summary | {"previous": before or None})
            states = registry.source_items(self.source.id)
        complete = False
        listing_error: str | None = None
        try:
            with extractors():  # one extraction worker for the whole sync, started when needed
                complete = self._walk(states)
            if complete:
                self._withdraw_gone(states)
        except SourceError as exc:
            listing_error = str(exc)
            self.log.error("source %s could not be listed: %s", self.source.name, exc)
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)
        if not complete and listing_error is None:
            self.log.warning(
                "source %s: a cap stopped the walk (max_items %d); nothing is withdrawn until a "
                "sync sees the whole source",
                self.source.name,
                self.source.max_items,
            )
        if listing_error:
            outcome = "failed"
        elif self.counts["failed"]:
            outcome = "partial"
        else:
            outcome = "ok"
        summary |= {
            "finished_at": dt.datetime.now(dt.UTC).isoformat(),
            "seconds": round(time.perf_counter() - clock, 3),
            "outcome": outcome,
            "complete": complete,
            "counts": dict(self.counts),
            "errors": self.errors[:MAX_ERRORS_KEPT],
            "error": listing_error,
        }
        if self.held is not None:
            summary["withdraw_held"] = self.held
        with open_registry(self.settings) as registry:
            registry.set_last_sync(self.source.id, summary)
        _artifact(self.source, summary)
        self.log.info(
            "source %s synced: %s",
            self.source.name,
            ", ".join(f"{k} {v}" for k, v in self.counts.items()),
        )
        return summary

    # --- the walk ------------------------------------------------------------------------

    def _walk(self, states: dict[str, ItemState]) -> bool:
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
            for key, st in states.items()
            if st.state == "present"
        }
        self.seen: set[str] = set()
        batch: list[Item] = []
        names: set[str] = set()
        size = self.settings.sources.sources_batch_items
        for item in conn.items(prior):
            if item.key in self.seen:
                continue  # a listing that repeats an item: the first one counts
            self.seen.add(item.key)
            self.counts["listed"] += 1
            name = _safe_name(item.name)
            if (item.data is not None and name in names) or len(batch) >= size:
                self._step(batch, states)
                batch, names = [], set()
            batch.append(item)
            if item.data is not None:
                names.add(name)
            progress.advance("sync", 1)
        self._step(batch, states)
        return bool(conn.complete)

    def _step(self, batch: list[Item], states: dict[str, ItemState]) -> None:
        """Stage, ingest and record one step's items."""
        if not batch:
            return
        records: list[dict[str, Any]] = []
        staged: dict[str, tuple[Item, Source, str]] = {}  # source_key -> (item, source, hash)
        for item in batch:
            before = states.get(item.key)
            if item.error is not None:
                self._fail(records, item, item.error)
                continue
            if item.unchanged or item.data is None:
                self.counts["unchanged"] += 1
                if before is not None and dict(item.meta) != before.meta:
                    records.append(_state(item, before.content_hash, "present"))
                continue
            digest = hashlib.sha256(item.data).hexdigest()
            if before is not None and before.state == "present" and before.content_hash == digest:
                self.counts["unchanged"] += 1  # touched, same bytes: only its version moved
                records.append(_state(item, digest, "present"))
                continue
            path = self._stage(item)
            src = Source(
                source_key=source_doc_key(self.source.id, item.key),
                uri=item.uri,
                content_hash=digest,
                path=path,
            )
            staged[src.source_key] = (item, src, digest)
        if staged:
            records.extend(self._ingest(staged, states))
        faults.point("sources.before_record")
        if records:  # an unchanged step has nothing to record: no registry opened for it
            with open_registry(self.settings) as registry:
                registry.record_items(self.source.id, records)
        for _, src, _ in staged.values():
            with contextlib.suppress(OSError):
                shutil.rmtree(src.path.parent)

    def _ingest(
        self, staged: dict[str, tuple[Item, Source, str]], states: dict[str, ItemState]
    ) -> list[dict[str, Any]]:
        """Plan and ingest the staged items; their states to record."""
        source = self.source
        sources = [src for _, src, _ in staged.values()]
        with open_registry(self.settings) as registry:
            coll = registry.ensure_collection(source.org_id, source.collection)
            plan = plan_ingest(sources, registry, source.org_id, by_key=True)
            planned = {w.source.source_key for w in plan.work}
            for key, (item, src, _) in staged.items():
                before = states.get(item.key)
                if key in planned or before is None or before.state != "gone":
                    continue
                # Back at the source with the content it had: a new version, in service again
                # (or for review again, as its source says), since its last one was taken out.
                newest = _newest(registry, source.org_id, key)
                plan.work.append(WorkItem(src, previous=newest))
                plan.unchanged -= 1
        target = IngestTarget(
            org_id=source.org_id,
            collection_id=coll.id,
            collection_path=coll.path,
            status=DocStatus(source.status),
            audience=source.audience,
            source_tag=f"source:{source.name}"[:64],
            actor=self.actor,
        )
        if plan.shadowed:
            repair_task(plan, self.settings, self.actor)
        report = BatchReport()
        if plan.work:
            extracted = extract_batch_task(plan.work, self.settings)
            for key, doc in list(extracted.items()):  # cite the item, not the staged file
                if not isinstance(doc, Exception):
                    extracted[key] = dataclasses.replace(doc, uri=staged[key][1].uri)
            report = index_batch_task(plan.work, target, extracted, self.settings)
        failed = {name: reason for name, reason in report.skipped}
        records: list[dict[str, Any]] = []
        work = {w.source.source_key: w for w in plan.work}
        for key, (item, src, digest) in staged.items():
            before = states.get(item.key)
            if src.name in failed and key in work:
                self._fail(records, item, failed[src.name])
                continue
            if key in work:
                if before is not None and before.state == "gone":
                    self.counts["returned"] += 1
                elif work[key].previous is None:
                    self.counts["new"] += 1
                else:
                    self.counts["changed"] += 1
            else:
                self.counts["unchanged"] += 1  # the registry had this content (a resumed sync)
            records.append(_state(item, digest, "present"))
        return records

    def _stage(self, item: Item) -> Path:
        assert item.data is not None
        ident = hashlib.sha256(item.key.encode()).hexdigest()[:24]
        folder = self.staging / ident
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / _safe_name(item.name)
        path.write_bytes(item.data)
        return path

    def _fail(self, records: list[dict[str, Any]], item: Item, reason: str) -> None:
        self.counts["failed"] += 1
        self.errors.append({"key": item.key, "error": reason})
        self.log.warning("source %s: %s failed: %s", self.source.name, item.key, reason)
        records.append(
            {"key": item.key, "uri": item.uri, "version": None, "meta": {}, "state": "failed",
             "error": reason}
        )  # fmt: skip

    # --- items gone from the source ----------------------------------------------------------

    def _withdraw_gone(self, states: dict[str, ItemState]) -> None:
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
        if len(gone) >= 2 and len(gone) > bound * live and self.confirmed is None:
            # A deletion storm (1 of 10 files left, say) is far likelier a mistake at the
            # source than a decision: nothing is withdrawn until the AM confirms.
            self.held = {
                "gone": len(gone),
                "of": live,
                "max_ratio": bound,
                "message": f"{len(gone)} of the {live} items synced before are gone from "
                f"source {self.source.name!r} (more than {bound:.0%}): none was withdrawn. If "
                "they really were removed, run `kbflow sources sync "
                f"{self.source.name} --confirm-withdraw` as its AM or a superadmin.",
            }
            self.log.warning("source %s: %s", self.source.name, self.held["message"])
            return
        note = f"removed at source: source {self.source.name!r} no longer has this item"
        with open_registry(self.settings) as registry:

            def opener() -> Any:
                return open_vector_store(self.settings)

            for key in gone:
                if take_out_item(registry, self.source, key, actor=self.actor, note=note,
                                 open_store=opener):  # fmt: skip
                    self.counts["withdrawn"] += 1
                st = states[key]
                registry.record_items(
                    self.source.id,
                    [{"key": key, "uri": st.uri, "version": None, "content_hash": st.content_hash,
                      "meta": {}, "state": "gone", "error": None}],
                )  # fmt: skip


def _newest(registry: SqlRegistry, org_id: str, source_key: str) -> DocRecord | None:
    versions = registry.versions_of(org_id, source_key)
    return max(versions, key=lambda d: d.version) if versions else None


def _state(item: Item, digest: str | None, state: str) -> dict[str, Any]:
    return {
        "key": item.key,
        "uri": item.uri,
        "version": item.version,
        "content_hash": digest,
        "meta": dict(item.meta),
        "state": state,
        "error": None,
    }


def _safe_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "._- " else "_" for c in name).strip(" .")
    return (cleaned or "item")[-120:]


def _logger() -> Any:
    try:
        return get_run_logger()
    except Exception:  # called outside a flow run
        import logging

        return logging.getLogger("kbflow.sources")


def _flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run

        return str(flow_run.id) if flow_run.id else None
    except Exception:
        return None


def _artifact(source: SourceRecord, summary: dict[str, Any]) -> None:
    """The sync's counts as a Markdown artifact on its flow run (the Prefect UI's Artifacts)."""
    if summary.get("flow_run_id") is None:
        return
    try:
        from prefect.artifacts import create_markdown_artifact

        rows = "\n".join(f"| {k} | {v} |" for k, v in summary["counts"].items())
        errors = "\n".join(f"- `{e['key']}`: {e['error']}" for e in summary["errors"][:20])
        create_markdown_artifact(
            key=f"source-sync-{source.id}",
            markdown=(
                f"# Sync of {source.name} ({source.kind}, org {source.org_id})\n\n"
                f"Outcome: **{summary['outcome']}**\n\n| items | count |\n|---|---|\n{rows}\n\n"
                + (f"## Failed items\n\n{errors}\n" if errors else "")
            ),
            description=f"source {source.name}: last sync",
        )
    except Exception:  # bookkeeping never fails a sync
        pass
