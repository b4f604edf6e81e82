"""The ``source-sync`` flow: bring one synced source's documents in line with the source.

It orchestrates; the rules are `tasks.sources.sync` (the walk in steps, what each step hands
ingest and records, the withdrawals, the report). Each step's items are ingested by ingest's
Prefect tasks, as the ``ingest`` flow does: repair what a crash left, extract (cached on content
hashes, in one extraction worker for the whole sync), index. Two syncs of one source never run
at once (a lock file in the home: a second one is refused; a killed sync's lock is released by
the kernel).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Failed

from core.contracts import SyncReport
from core.errors import RunFailed
from core.settings import Settings
from sinks.connect import open_registry
from sinks.registry import SourceRecord
from tasks.ingest.index import BatchReport
from tasks.ingest.steps import extract_batch_task, extractors, index_batch_task, repair_task
from tasks.sources.base import SourceError
from tasks.sources.state import sync_lock
from tasks.sources.sync import SourceSync, Step


@flow(name="source-sync", flow_run_name="sync {source_id}")
def source_sync(source_id: str) -> SyncReport:
    """Sync one source (by id): ingest new and changed items, withdraw the ones gone from it.

    Returns the sync's report (also kept on the source: `kbflow sources show`)."""
    settings = Settings()
    with open_registry(settings) as registry:
        source = registry.sources.get_source(source_id)
    report = _run(settings, source)
    if report.outcome == "failed":
        # The run ends Failed with the reason as its message (no traceback: nothing broke in
        # kbflow); a plain call raises RunFailed holding the report.
        error = report.error or ""
        failed: Any = Failed(message=error, data=RunFailed(error, report.to_dict()))
        return failed  # typed Any: a caller never gets this state as a value
    return report


def sync_source(settings: Settings, source: SourceRecord) -> SyncReport:
    """The body of `source_sync`, callable without a flow around it (tests, the bench).

    Raises:
        SourceError: the source could not be listed (the report is kept on the source).
    """
    report = _run(settings, source)
    if report.outcome == "failed":
        raise SourceError(report.error or "")
    return report


def _run(settings: Settings, source: SourceRecord) -> SyncReport:
    log = _logger()
    with sync_lock(settings.home, source):
        sync = SourceSync(settings, source, log)
        sync.begin(_flow_run_id())
        listing_error: str | None = None
        try:
            with extractors():  # one extraction worker for the whole sync, started when needed
                for batch in sync.batches():
                    step = sync.prepare(batch)
                    sync.record(step, _ingest(step, settings, sync.actor))
            if sync.complete:
                sync.withdraw_gone()
        except SourceError as exc:
            listing_error = str(exc)
            log.error("source %s could not be listed: %s", source.name, exc)
        finally:
            sync.unstage()
        report = sync.finish(listing_error)
        _artifact(source, report)
    return report


def _ingest(step: Step, settings: Settings, actor: str) -> BatchReport:
    """One step's items through ingest's tasks: the versions a crash left in service put out of
    it, then extraction and indexing of the plan's work."""
    plan = step.plan
    if plan.shadowed:
        repair_task(plan, settings, actor)
    if not plan.work or step.target is None:
        return BatchReport()
    extracted = extract_batch_task(plan.work, settings)
    return index_batch_task(plan.work, step.target, step.cite(extracted), settings)


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


def _artifact(source: SourceRecord, report: SyncReport) -> None:
    """The sync's counts as a Markdown artifact on its flow run (the Prefect UI's Artifacts)."""
    if report.flow_run_id is None:
        return
    try:
        from prefect.artifacts import create_markdown_artifact

        rows = "\n".join(f"| {k} | {v} |" for k, v in report.counts.to_dict().items())
        errors = "\n".join(f"- `{e.key}`: {e.error}" for e in report.errors[:20])
        create_markdown_artifact(
            key=f"source-sync-{source.id}",
            markdown=(
                f"# Sync of {source.name} ({source.kind}, org {source.org_id})\n\n"
                f"Outcome: **{report.outcome}**\n\n| items | count |\n|---|---|\n{rows}\n\n"
                + (f"## Failed items\n\n{errors}\n" if errors else "")
            ),
            description=f"source {source.name}: last sync",
        )
    except Exception:  # bookkeeping never fails a sync
        pass
