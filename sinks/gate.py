"""The approval gate: the ONE place that decides which chunks may reach an agent.

``build_gate(scope)`` turns a caller's scope into a small, backend-neutral predicate. Every vector
query leg carries it as a payload filter (``to_edge_filter`` / ``to_qdrant_filter``), and
``Gate.admits`` evaluates the very same conditions in Python, which the search path uses to
re-check each hit against the registry before it leaves the process (defence in depth).

No other module may build a status, org, audience or effective-date filter: a test enforces it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.models import (
    AUDIENCE_ALL,
    NEVER_SERVED_SOURCE_TAGS,
    SERVABLE_PARSE_STATUSES,
    DocStatus,
    Scope,
)

# Payload keys the gate filters on; the vector stores index every one of them.
GATED_KEYWORD_FIELDS: tuple[str, ...] = (
    "org_id",
    "status",
    "parse_status",
    "audience",
    "collection_path",
    "doc_id",
    "source_tag",
)
GATED_DATETIME_FIELDS: tuple[str, ...] = ("effective_date",)


@dataclass(frozen=True)
class AnyOf:
    """``key`` holds one of ``values`` (for list payloads: any element does)."""

    key: str
    values: tuple[str, ...]
    or_absent: bool = False


@dataclass(frozen=True)
class NoneOf:
    """``key`` is absent or holds none of ``values``."""

    key: str
    values: tuple[str, ...]
    or_absent: bool = True


@dataclass(frozen=True)
class NotAfter:
    """``key`` is an RFC 3339 date-time at or before ``limit``."""

    key: str
    limit: dt.datetime
    or_absent: bool = True


Condition = AnyOf | NoneOf | NotAfter


@dataclass(frozen=True)
class Gate:
    """A conjunction of conditions; build it with :func:`build_gate` only."""

    scope: Scope
    conditions: tuple[Condition, ...]

    def admits(self, record: Mapping[str, Any]) -> bool:
        """True if a payload-shaped record (vector payload or registry row) passes."""
        return all(_holds(c, record) for c in self.conditions)

    def describe(self) -> dict[str, Any]:
        """The conditions as JSON (for the answer ledger): what this gate admitted."""
        out: list[dict[str, Any]] = []
        for c in self.conditions:
            if isinstance(c, AnyOf):
                out.append({"key": c.key, "any_of": list(c.values), "or_absent": c.or_absent})
            elif isinstance(c, NoneOf):
                out.append({"key": c.key, "none_of": list(c.values), "or_absent": c.or_absent})
            else:
                out.append({"key": c.key, "not_after": c.limit.isoformat(),
                            "or_absent": c.or_absent})  # fmt: skip
        return {"org_id": self.scope.org_id, "conditions": out}


def build_gate(scope: Scope) -> Gate:
    """Build the retrieval predicate for ``scope``.

    A chunk passes when its org is the caller's, its document is approved (or has no status),
    it is parsed, it is effective by the end of ``scope.today`` (or has no date), its audience is
    "all", one of the caller's audiences, or absent (any audience when the scope says
    ``all_audiences``), it is not an account manager's seed input (those are never served to
    anyone), and (when the scope restricts collections) it lies in one of the allowed
    collections or their descendants.
    """
    if not scope.org_id:
        raise ValueError("A scope needs an org_id. Currently it is empty.")
    end_of_day = dt.datetime.combine(scope.today, dt.time.max, tzinfo=dt.UTC)
    conditions: list[Condition] = [
        AnyOf("org_id", (scope.org_id,)),
        AnyOf("status", (DocStatus.APPROVED.value,), or_absent=True),
        AnyOf("parse_status", SERVABLE_PARSE_STATUSES),
        NotAfter("effective_date", end_of_day),
        NoneOf("source_tag", NEVER_SERVED_SOURCE_TAGS),
    ]
    if not scope.all_audiences:
        audiences = tuple(dict.fromkeys((AUDIENCE_ALL, *scope.audiences)))
        conditions.append(AnyOf("audience", audiences, or_absent=True))
    if scope.collections is not None:
        conditions.append(AnyOf("collection_path", tuple(scope.collections)))
    return Gate(scope=scope, conditions=tuple(conditions))


def _absent(value: Any) -> bool:
    """Absent as Qdrant's is-empty condition sees it: missing, null or an empty list."""
    return value is None or value == []


def _holds(cond: Condition, record: Mapping[str, Any]) -> bool:
    value = record.get(cond.key)
    if _absent(value):
        return cond.or_absent
    if isinstance(cond, AnyOf | NoneOf):
        values = value if isinstance(value, list | tuple) else [value]
        found = any(str(v) in cond.values for v in values)
        return found if isinstance(cond, AnyOf) else not found
    when = parse_datetime(value)
    return when is not None and when <= cond.limit


def parse_datetime(value: Any) -> dt.datetime | None:
    """Read a date or RFC 3339 string as an aware UTC datetime (None if unreadable)."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, dt.date):
        return dt.datetime.combine(value, dt.time.min, tzinfo=dt.UTC)
    try:
        parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def format_datetime(value: dt.date | dt.datetime) -> str:
    """The RFC 3339 form the vector payload stores dates in."""
    when = parse_datetime(value)
    assert when is not None
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def to_edge_filter(gate: Gate) -> Any:
    """The gate as a Qdrant Edge ``Filter``."""
    import qdrant_edge as qe

    def leaf(cond: Condition) -> Any:
        if isinstance(cond, AnyOf | NoneOf):
            match = (
                qe.MatchValue(cond.values[0])
                if len(cond.values) == 1
                else qe.MatchAny(list(cond.values))
            )
            return qe.FieldCondition(key=cond.key, match=match)
        return qe.FieldCondition(
            key=cond.key, range=qe.RangeDateTime(lte=format_datetime(cond.limit))
        )

    must: list[Any] = []
    for cond in gate.conditions:
        if isinstance(cond, NoneOf):  # absent, or none of the values: must_not matches none
            must.append(qe.Filter(must_not=[leaf(cond)]))
        elif cond.or_absent:
            must.append(qe.Filter(should=[leaf(cond), qe.IsEmptyCondition(key=cond.key)]))
        else:
            must.append(leaf(cond))
    return qe.Filter(must=must)


def to_qdrant_filter(gate: Gate) -> Any:
    """The gate as a qdrant-client ``models.Filter`` (Qdrant server or local mode)."""
    from qdrant_client import models as qm

    def leaf(cond: Condition) -> Any:
        if isinstance(cond, AnyOf | NoneOf):
            match = (
                qm.MatchValue(value=cond.values[0])
                if len(cond.values) == 1
                else qm.MatchAny(any=list(cond.values))
            )
            return qm.FieldCondition(key=cond.key, match=match)
        return qm.FieldCondition(
            key=cond.key, range=qm.DatetimeRange(lte=format_datetime(cond.limit))
        )

    must: list[Any] = []
    for cond in gate.conditions:
        if isinstance(cond, NoneOf):
            must.append(qm.Filter(must_not=[leaf(cond)]))
        elif cond.or_absent:
            must.append(
                qm.Filter(
                    should=[leaf(cond), qm.IsEmptyCondition(is_empty=qm.PayloadField(key=cond.key))]
                )
            )
        else:
            must.append(leaf(cond))
    return qm.Filter(must=must)
