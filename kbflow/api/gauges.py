"""What `/metrics` reads beyond the requests: labels held to a bounded number of values, and
the review backlog and the store's size, read from the registry and the store at scrape time
(`kbflow.api.metrics.Metrics` registers them)."""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from core.errors import KbflowError

log = logging.getLogger(__name__)

KNOWLEDGE_READ_EVERY_S = 15.0
LABEL_CAP = 100
"""Distinct values a per-org or per-agent label takes in one process before the rest are
counted under `OTHER`: a Prometheus series each, so a flood of orgs or agents cannot bloat it."""
OTHER = "_other"
"""The label value of the values past `LABEL_CAP` (ids start with a letter or digit: no clash)."""


class CappedLabel:
    """A label's values, the first ``cap`` distinct ones as themselves, any further one as
    `OTHER`; thread-safe (worker threads count too)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def label(self, value: str) -> str:
        if value in self._seen:  # a set's membership test is safe without the lock
            return value
        with self._lock:
            if value in self._seen or len(self._seen) < self.cap:
                self._seen.add(value)
                return value
        return OTHER


class Knowledge(Collector):
    """``kbflow_review_backlog_documents{org}``, ``kbflow_review_oldest_pending_seconds{org}``,
    ``kbflow_store_points{org}``, ``kbflow_store_disk_bytes`` and ``kbflow_backup_age_seconds``,
    read at scrape time (see `kbflow.api.metrics.Metrics.watch_knowledge`)."""

    def __init__(
        self,
        backlog: Callable[[], dict[str, tuple[int, dt.datetime]]],
        points: Callable[[], dict[str, int]],
        disk_bytes: Callable[[], int | None],
        backup_at: Callable[[], dt.datetime | None] = lambda: None,
    ) -> None:
        self._read = (backlog, points, disk_bytes)
        self._backup_at = backup_at
        self._lock = threading.Lock()
        self._backlog: dict[str, tuple[int, dt.datetime]] = {}
        self._points: dict[str, int] = {}
        self._bytes: int | None = None
        self._backup: dt.datetime | None = None
        self._read_at = -math.inf

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only

    def _read_again(self) -> None:
        now = time.monotonic()
        if now - self._read_at < KNOWLEDGE_READ_EVERY_S:
            return
        self._read_at = now
        backlog, points, disk_bytes = self._read
        self._backlog = backlog()
        try:
            self._points = points()
            self._bytes = disk_bytes()
        except (KbflowError, OSError) as exc:  # a busy or vanished store: the backlog still counts
            log.warning("store size not read for /metrics: %s", exc)
        try:
            self._backup = self._backup_at()
        except (KbflowError, OSError, ValueError) as exc:
            log.warning("the newest backup not read for /metrics: %s", exc)

    def collect(self) -> Iterator[Any]:
        with self._lock:
            self._read_again()
            backlog, points, size = dict(self._backlog), dict(self._points), self._bytes
            backup = self._backup
        now = dt.datetime.now(dt.UTC)
        pending = GaugeMetricFamily(
            "kbflow_review_backlog_documents",
            "Documents waiting for review (pending_review), by org.",
            labels=["org"],
        )
        oldest = GaugeMetricFamily(
            "kbflow_review_oldest_pending_seconds",
            "Age in seconds of each org's oldest document waiting for review (since it was "
            "made); orgs with none are left out.",
            labels=["org"],
        )
        for org, (count, since) in sorted(backlog.items()):
            pending.add_metric([org], count)
            since = since if since.tzinfo else since.replace(tzinfo=dt.UTC)  # SQLite drops it
            oldest.add_metric([org], max(0.0, (now - since).total_seconds()))
        stored = GaugeMetricFamily(
            "kbflow_store_points",
            "Points (chunks, every review state) in the vector store, by org: the store's exact "
            "count with the org's filter.",
            labels=["org"],
        )
        for org, count in sorted(points.items()):
            stored.add_metric([org], count)
        yield pending
        yield oldest
        yield stored
        if size is not None:
            disk = GaugeMetricFamily(
                "kbflow_store_disk_bytes",
                "Bytes on disk of the embedded vector store (Qdrant Edge, <home>/vectors), all "
                "orgs together: one shard holds every org, so no exact per-org size exists. "
                "Absent with a Qdrant server.",
            )
            disk.add_metric([], size)
            yield disk
        if backup is not None:
            age = GaugeMetricFamily(
                "kbflow_backup_age_seconds",
                "Seconds since the newest finished backup in <KBFLOW_HOME>/backups was made "
                "(`kbflow backup`, or the daily `backup` deployment); absent while there is none.",
            )
            backup = backup if backup.tzinfo else backup.replace(tzinfo=dt.UTC)
            age.add_metric([], max(0.0, (now - backup).total_seconds()))
            yield age


class Sources(Collector):
    """``kbflow_source_items{org,source,state}``, ``kbflow_source_last_sync_timestamp_seconds``,
    ``kbflow_source_last_sync_success`` and ``kbflow_source_last_sync_failed_items`` (each
    ``{org,source}``), read from the registry at scrape time, at most every
    ``KNOWLEDGE_READ_EVERY_S``.

    ``sources()`` lists the sources (each with ``org_id``, ``name``, ``id`` and ``last_sync``,
    the sync's summary), ``item_counts()`` each source id's items by state. At most `LABEL_CAP`
    sources are named per process (and orgs, as the other per-org labels); any further one is
    counted under ``org`` and ``source`` `OTHER`: its items added, its last sync the newest,
    its failed items added, and its success 0 if any of them failed."""

    STATES = ("present", "failed", "gone")

    def __init__(
        self, sources: Callable[[], list[Any]], item_counts: Callable[[], dict[str, dict[str, int]]]
    ) -> None:
        self._read = (sources, item_counts)
        self._orgs = CappedLabel(LABEL_CAP)
        self._names = CappedLabel(LABEL_CAP)
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str], dict[str, Any]] = {}
        self._read_at = -math.inf

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only

    def _read_again(self) -> None:
        now = time.monotonic()
        if now - self._read_at < KNOWLEDGE_READ_EVERY_S:
            return
        self._read_at = now
        sources, item_counts = self._read
        try:
            listed, counts = sources(), item_counts()
        except KbflowError as exc:
            log.warning("sources not read for /metrics: %s", exc)
            return
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for source in listed:
            org = self._orgs.label(source.org_id)
            name = self._names.label(f"{source.org_id}/{source.name}")
            labels = (OTHER, OTHER) if OTHER in (org, name) else (source.org_id, source.name)
            row = rows.setdefault(
                labels, {"items": dict.fromkeys(self.STATES, 0), "at": None, "ok": 1, "failed": 0}
            )
            for state in self.STATES:
                row["items"][state] += counts.get(source.id, {}).get(state, 0)
            last = source.last_sync or {}
            if last.get("outcome") == "running":  # the last one that finished, meanwhile
                last = last.get("previous") or {}
            finished = _unix_time(last.get("finished_at"))
            if finished is None:
                continue
            row["at"] = finished if row["at"] is None else max(row["at"], finished)
            row["failed"] += int((last.get("counts") or {}).get("failed", 0))
            row["ok"] = min(row["ok"], 1 if last.get("outcome") == "ok" else 0)
        self._rows = rows

    def collect(self) -> Iterator[Any]:
        with self._lock:
            self._read_again()
            rows = dict(self._rows)
        items = GaugeMetricFamily(
            "kbflow_source_items",
            "Items of each synced source by state: present (in service or review), failed (its "
            "last read or ingest failed; retried next sync), gone (no longer at the source; its "
            f"documents taken out of service). At most {LABEL_CAP} sources are named per "
            f"process; further ones are counted under org and source {OTHER!r}.",
            labels=["org", "source", "state"],
        )
        at = GaugeMetricFamily(
            "kbflow_source_last_sync_timestamp_seconds",
            "When each source's last sync finished (unix time); absent while it never finished "
            "one, and while a sync of it runs.",
            labels=["org", "source"],
        )
        success = GaugeMetricFamily(
            "kbflow_source_last_sync_success",
            "1 when each source's last finished sync was ok (every item synced), 0 when it was "
            "partial (an item failed) or failed (the source could not be listed).",
            labels=["org", "source"],
        )
        failed = GaugeMetricFamily(
            "kbflow_source_last_sync_failed_items",
            "Items that failed in each source's last finished sync.",
            labels=["org", "source"],
        )
        for (org, name), row in sorted(rows.items()):
            for state in self.STATES:
                items.add_metric([org, name, state], row["items"][state])
            if row["at"] is not None:
                at.add_metric([org, name], row["at"])
                success.add_metric([org, name], row["ok"])
                failed.add_metric([org, name], row["failed"])
        yield items
        yield at
        yield success
        yield failed


def _unix_time(value: Any) -> float | None:
    """An ISO timestamp (a sync's ``finished_at``) as unix time; None without one."""
    if not value:
        return None
    try:
        when = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()
