"""Synced sources and their per-item state (docs/SOURCES.md).

A source's row says where its knowledge lives (``kind`` and ``config``: never a secret, which
comes from the environment) and how it enters (collection, status, audience, patterns, caps,
schedule). ``source_items`` holds what the last sync saw of each item; the sync records an item
only after its ingest, in the same order, so a sync killed midway resumes without doubling.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from core.contracts import SourceDict
from core.errors import ConfigError, NotFound
from core.models import AuditAction
from sinks.registry.audit import admin_audit
from sinks.registry.base import Repository
from sinks.registry.schema import SourceItemRow, SourceRow, aware, utcnow

SOURCE_FIELDS = (
    "kind",
    "config",
    "collection",
    "status",
    "audience",
    "include",
    "exclude",
    "max_items",
    "max_item_bytes",
    "schedule",
    "timezone",
)
"""The fields `update_source` may change (``kind`` only together with ``config``)."""


@dataclass(frozen=True)
class SourceRecord:
    id: str
    org_id: str
    name: str
    kind: str
    config: dict[str, Any]
    collection: str
    status: str
    audience: str | None
    include: list[str]
    exclude: list[str]
    max_items: int
    max_item_bytes: int
    schedule: str | None
    timezone: str | None
    created_by: str
    created_at: dt.datetime
    updated_at: dt.datetime
    last_sync: dict[str, Any] | None

    def to_dict(self) -> SourceDict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["created_at"] = self.created_at.isoformat()
        out["updated_at"] = self.updated_at.isoformat()
        return cast("SourceDict", out)


@dataclass(frozen=True)
class ItemState:
    key: str
    uri: str
    version: str | None
    content_hash: str | None
    meta: dict[str, Any]
    state: str  # present | gone | failed
    error: str | None
    seen_at: dt.datetime


def item_id(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _record(row: SourceRow) -> SourceRecord:
    return SourceRecord(
        id=row.id,
        org_id=row.org_id,
        name=row.name,
        kind=row.kind,
        config=dict(row.config),
        collection=row.collection,
        status=row.status,
        audience=row.audience,
        include=list(row.include),
        exclude=list(row.exclude),
        max_items=row.max_items,
        max_item_bytes=row.max_item_bytes,
        schedule=row.schedule,
        timezone=row.timezone,
        created_by=row.created_by,
        created_at=aware(row.created_at),
        updated_at=aware(row.updated_at),
        last_sync=dict(row.last_sync) if row.last_sync else None,
    )


def _public(record: SourceRecord) -> dict[str, Any]:
    """A source as the audit log keeps it (its config holds no secret by construction)."""
    dropped = ("created_at", "updated_at", "last_sync")
    return {key: value for key, value in record.to_dict().items() if key not in dropped}


class SourcesRepository(Repository):
    """Sources: their rows, the audit of their changes, and their items' sync state."""

    def create_source(
        self, org_id: str, name: str, fields: Mapping[str, Any], *, actor: str
    ) -> SourceRecord:
        unknown = set(fields) - set(SOURCE_FIELDS)
        if unknown:
            raise ConfigError(f"unknown source fields: {', '.join(sorted(unknown))}")
        source_id = uuid.uuid4().hex[:12]
        now = utcnow()
        try:
            with self.session() as s, s.begin():
                row = SourceRow(
                    id=source_id,
                    org_id=org_id,
                    name=name,
                    created_by=actor,
                    created_at=now,
                    updated_at=now,
                    **dict(fields),
                )
                s.add(row)
                s.flush()
                s.add(admin_audit(actor, AuditAction.SOURCE_ADDED, org_id, None,
                                  _public(_record(row))))  # fmt: skip
        except IntegrityError as exc:
            raise ConfigError(
                f"org {org_id!r} already has a source named {name!r}: pick another name, or "
                f"change that one with `kbflow sources update {name} --org {org_id}`"
            ) from exc
        return self.get_source(source_id)

    def get_source(self, source_id: str) -> SourceRecord:
        with self.session() as s:
            row = s.get(SourceRow, source_id)
            if row is None:
                raise NotFound(f"no source {source_id!r} — `kbflow sources list` shows them.")
            return _record(row)

    def find_sources(self, ref: str, org_id: str | None = None) -> list[SourceRecord]:
        """Sources whose id or (in ``org_id``, if given) name is ``ref``."""
        with self.session() as s:
            by_name = select(SourceRow).where(SourceRow.name == ref)
            if org_id is not None:
                by_name = by_name.where(SourceRow.org_id == org_id)
            rows = {row.id: row for row in s.scalars(by_name)}
            row = s.get(SourceRow, ref)
            if row is not None and (org_id is None or row.org_id == org_id):
                rows[row.id] = row
            return [_record(r) for r in rows.values()]

    def list_sources(self, org_id: str | None = None) -> list[SourceRecord]:
        query = select(SourceRow).order_by(SourceRow.org_id, SourceRow.name)
        if org_id is not None:
            query = query.where(SourceRow.org_id == org_id)
        with self.session() as s:
            return [_record(row) for row in s.scalars(query)]

    def update_source(
        self, source_id: str, changes: Mapping[str, Any], *, actor: str
    ) -> SourceRecord:
        unknown = set(changes) - set(SOURCE_FIELDS)
        if unknown:
            raise ConfigError(f"unknown source fields: {', '.join(sorted(unknown))}")
        before = self.get_source(source_id)
        with self.session() as s, s.begin():
            s.execute(
                update(SourceRow)
                .where(SourceRow.id == source_id)
                .values(**dict(changes), updated_at=utcnow())
            )
            after = _record(s.get_one(SourceRow, source_id))
            s.add(admin_audit(actor, AuditAction.SOURCE_UPDATED, before.org_id, _public(before),
                              _public(after)))  # fmt: skip
        return self.get_source(source_id)

    def delete_source(self, source_id: str, *, actor: str) -> SourceRecord:
        """Delete a source and its items' state (its documents stay as they are)."""
        before = self.get_source(source_id)
        with self.session() as s, s.begin():
            s.execute(delete(SourceItemRow).where(SourceItemRow.source_id == source_id))
            s.execute(delete(SourceRow).where(SourceRow.id == source_id))
            s.add(admin_audit(actor, AuditAction.SOURCE_REMOVED, before.org_id, _public(before),
                              None))  # fmt: skip
        return before

    def set_last_sync(self, source_id: str, summary: Mapping[str, Any]) -> None:
        """Record a sync's summary (no audit row: the sync's own changes are audited)."""
        with self.session() as s, s.begin():
            s.execute(
                update(SourceRow).where(SourceRow.id == source_id).values(last_sync=dict(summary))
            )

    def confirm_source_withdrawal(self, source_id: str, *, actor: str) -> None:
        """Let the next sync of a source withdraw more of its items than the deletion-storm
        bound allows (kept on its last sync, used once; audited)."""
        source = self.get_source(source_id)
        confirmed = {"by": actor, "at": utcnow().isoformat()}
        with self.session() as s, s.begin():
            s.execute(
                update(SourceRow)
                .where(SourceRow.id == source_id)
                .values(last_sync={**(source.last_sync or {}), "withdraw_confirmed": confirmed})
            )
            s.add(admin_audit(actor, AuditAction.SOURCE_WITHDRAW_CONFIRMED, source.org_id,
                              None, {"source": source.name, **confirmed}))  # fmt: skip

    def source_items(self, source_id: str) -> dict[str, ItemState]:
        query = select(SourceItemRow).where(SourceItemRow.source_id == source_id)
        with self.session() as s:
            return {
                row.key: ItemState(
                    key=row.key,
                    uri=row.uri,
                    version=row.version,
                    content_hash=row.content_hash,
                    meta=dict(row.meta or {}),
                    state=row.state,
                    error=row.error,
                    seen_at=aware(row.seen_at),
                )
                for row in s.scalars(query)
            }

    def item_counts(self) -> dict[str, dict[str, int]]:
        """Per source id, how many items are in each state (for /metrics)."""
        out: dict[str, dict[str, int]] = {}
        with self.session() as s:
            for source_id, state in s.execute(select(SourceItemRow.source_id, SourceItemRow.state)):
                counts = out.setdefault(source_id, {})
                counts[state] = counts.get(state, 0) + 1
        return out

    def record_items(self, source_id: str, items: Iterable[Mapping[str, Any]]) -> None:
        """Upsert items' state in one transaction. Each mapping: key, uri, version,
        content_hash, meta, state, error (all but key optional)."""
        rows = list(items)
        if not rows:
            return
        now = utcnow()
        with self.session() as s, s.begin():
            for item in rows:
                ident = item_id(str(item["key"]))
                row = s.get(SourceItemRow, (source_id, ident))
                values = {
                    "key": str(item["key"]),
                    "uri": str(item.get("uri") or (row.uri if row else item["key"])),
                    "version": item.get("version"),
                    "content_hash": item.get("content_hash", row.content_hash if row else None),
                    "meta": dict(item.get("meta") or {}),
                    "state": str(item.get("state") or "present"),
                    "error": item.get("error"),
                    "seen_at": now,
                }
                if row is None:
                    s.add(SourceItemRow(source_id=source_id, item_id=ident, **values))
                else:
                    for name, value in values.items():
                        setattr(row, name, value)
