"""The audit log: one row per transition and per administrative change (or refusal)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import select

from core.models import (
    AuditAction,
    DocStatus,
)
from sinks.registry.base import Repository
from sinks.registry.schema import (
    AuditRow,
)


class AuditRepository(Repository):
    """The audit log: one row per transition and per administrative change (or refusal)."""

    def audit_trail(
        self, org_id: str | None, doc_id: str | None = None, *, last: int | None = None
    ) -> list[AuditRow]:
        """An org's audit rows (of one document, if given), oldest first; ``last`` keeps the
        most recent N. ``org_id=None``: the agency-wide rows (users and roles of no org)."""
        with self.session() as s:
            stmt = select(AuditRow).where(
                AuditRow.org_id == org_id if org_id is not None else AuditRow.org_id.is_(None)
            )
            if doc_id:
                stmt = stmt.where(AuditRow.doc_id == doc_id)
            if last is not None:
                recent = stmt.order_by(AuditRow.id.desc()).limit(last)
                return list(reversed(list(s.scalars(recent))))
            return list(s.scalars(stmt.order_by(AuditRow.id)))


def admin_audit(
    actor: str,
    action: AuditAction,
    org_id: str | None,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> AuditRow:
    return AuditRow(actor=actor, action=action.value, org_id=org_id, before=before, after=after)


def audit_after(new: DocStatus, changes: dict[str, Any] | None, note: str | None) -> dict[str, Any]:
    after: dict[str, Any] = {"status": new.value}
    for key, value in (changes or {}).items():
        if key.endswith("_at"):
            continue  # the audit row has its own time
        after[key] = value.isoformat() if isinstance(value, dt.date) else value
    if note:
        after["note"] = note
    return after


def audit_dict(row: AuditRow) -> dict[str, Any]:
    """An audit row as JSON."""
    return {
        "id": row.id,
        "at": row.at.isoformat() if row.at else None,
        "actor": row.actor,
        "action": row.action,
        "org_id": row.org_id,
        "doc_id": row.doc_id,
        "synthesis_run_id": row.synthesis_run_id,
        "source_tag": row.source_tag,
        "before": row.before,
        "after": row.after,
    }
