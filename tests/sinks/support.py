"""Helpers the store tests share: the congruence queries, and the payload indexes the gate needs
as qdrant-client reports them."""

from __future__ import annotations

from typing import Any

from sinks.gate import GATED_DATETIME_FIELDS, GATED_KEYWORD_FIELDS

QUERIES = [
    "vitamin D deficiency and bone density",
    "gene expression in cancer cells",
    "antibiotic resistance in bacteria",
    "effect of exercise on cardiovascular health",
    "stem cell differentiation",
    "immune response to viral infection",
]


# The indexes the gate needs: the org key as Qdrant's tenant index, every other gated keyword,
# and a datetime index on the effective dates.
EXPECTED = {
    **{name: ("keyword", name == "org_id") for name in GATED_KEYWORD_FIELDS},
    **{name: ("datetime", False) for name in GATED_DATETIME_FIELDS},
}


def _client_schema(schema: Any) -> tuple[str, bool]:
    """A qdrant-client field schema as (kind, is_tenant)."""
    from qdrant_client import models as qm

    if isinstance(schema, qm.KeywordIndexParams):
        return str(qm.PayloadSchemaType.KEYWORD.value), bool(schema.is_tenant)
    return str(qm.PayloadSchemaType(schema).value), False
