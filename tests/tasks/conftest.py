"""Fixtures shared by the retrieval tests: one topic, documents that differ in what the gate
checks."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from core.models import DocStatus
from tasks.review.machine import supersede
from tests.conftest import index_records

TOPIC = "Heron turbine maintenance interval"


def _doc(key: str) -> dict[str, str]:
    return {
        "key": key,
        "title": f"{TOPIC} ({key})",
        "text": f"The heron turbine needs maintenance every 400 hours. Record {key}.",
    }


@pytest.fixture
def world(edge_store: Any, registry: Any, embedder: Any) -> dict[str, str]:
    """Documents that share one topic but differ in everything the gate checks."""
    kw = {"store": edge_store, "registry": registry, "embedder": embedder}
    ids: dict[str, str] = {}
    ids["approved"] = index_records([_doc("approved")], **kw)[0]
    ids["legacy"] = index_records([_doc("legacy")], status=None, **kw)[0]
    for status in (DocStatus.PENDING_REVIEW, DocStatus.REJECTED):
        ids[status.value] = index_records([_doc(status.value)], status=status, **kw)[0]
    old = index_records([_doc("old-version")], **kw)[0]
    supersede(registry.documents.get_document(old), edge_store, registry, actor="test")
    ids["superseded"] = old
    ids["other_org"] = index_records([_doc("other-org")], org="globex", **kw)[0]
    tomorrow = dt.date.today() + dt.timedelta(days=1)
    ids["future"] = index_records([_doc("future")], effective_date=tomorrow, **kw)[0]
    ids["effective"] = index_records([_doc("effective")], effective_date=dt.date.today(), **kw)[0]
    ids["internal"] = index_records([_doc("internal")], audience="internal", **kw)[0]
    return ids
