"""acme's handbook (expense, travel and security policies) indexed for the answer tests, and the
check every answer a test produces goes through: its citations are served, approved chunks."""

from __future__ import annotations

from typing import Any

from core.models import DocStatus, Scope, Turn
from sinks.registry import SqlRegistry
from tests.conftest import index_records

EXPENSES = (
    "Employees must submit expense reports within 30 days of the purchase. Receipts are "
    "required for any expense over 25 euros. Questions go to finance.team@acme-corp.com or "
    "+44 20 7946 0958."
)
TRAVEL = (
    "Flights are booked through the travel portal at least 14 days ahead. Economy class is "
    "standard for flights under six hours."
)
SECURITY = (
    "Every laptop must use full-disk encryption. Report a lost or stolen device to the IT "
    "service desk within one hour."
)
HANDBOOK = Scope("acme", collections=("handbook",))


def index_handbook(registry: SqlRegistry, store: Any, embedder: Any) -> dict[str, str]:
    """The approved expense, travel and security policies in acme's ``handbook`` collection;
    returns their doc ids by key."""
    kw = {"store": store, "registry": registry, "embedder": embedder, "collection": "handbook"}
    return {
        key: index_records([{"key": key, "title": title, "text": text}], **kw)[0]
        for key, title, text in [
            ("expenses", "Expense policy", EXPENSES),
            ("travel", "Travel policy", TRAVEL),
            ("security", "Device security", SECURITY),
        ]
    }


def assert_citations_served(registry: SqlRegistry, citations: list[dict[str, Any]]) -> None:
    """Every citation names a chunk of its document's current content, and that document is
    approved, in the handbook, for this org (checked on the registry, not on the answer)."""
    for c in citations:
        doc = registry.documents.get_document(c["doc_id"])
        chunk_ids = {ch.chunk_id for ch in registry.chunks.document_chunks([doc.id])[doc.id]}
        assert c["chunk_id"] in chunk_ids, c
        assert doc.status == DocStatus.APPROVED and doc.org_id == "acme", c
        assert doc.collection_path == "handbook" and c["uri"] == doc.uri, c


def checked(registry: SqlRegistry, turn: Turn) -> None:
    checked_output(registry, turn.output)


def checked_output(registry: SqlRegistry, out: dict[str, Any]) -> dict[str, Any]:
    """Every answer a test produces has its citations checked, claims' citations included."""
    assert_citations_served(registry, out["citations"])
    for claim in out.get("claims", []):
        assert claim["citations"], claim
        assert_citations_served(registry, claim["citations"])
    if out.get("status") == "answered" or out.get("answer_status") in ("yes", "maybe"):
        assert out["citations"], out
    return out
