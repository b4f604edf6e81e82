"""Fixtures the store tests share: SciFact abstracts as points, for the congruence queries on
Qdrant Edge, qdrant-client ``:memory:`` and a live Qdrant server."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from core.models import DocStatus
from tasks.text.points import chunk_to_point
from tests.conftest import datasets_dir

N_DOCS = 400


def _corpus() -> list[dict[str, str]]:
    path = datasets_dir("scifact", "corpus.jsonl.gz")
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            rows.append(json.loads(line))
            if len(rows) == N_DOCS:
                break
    return rows


@pytest.fixture(scope="module")
def points(embedder: Any) -> list[Any]:
    """SciFact abstracts as points; every 4th is pending_review, every 7th of another org."""
    from core.models import Chunk
    from sinks.registry import DocRecord

    rows = _corpus()
    vectors = embedder.embed_documents([f"{r['title']}\n{r['text']}" for r in rows])
    out = []
    for i, (row, vec) in enumerate(zip(rows, vectors, strict=True)):
        org = "other" if i % 7 == 0 else "sci"
        status = DocStatus.PENDING_REVIEW.value if i % 4 == 0 else DocStatus.APPROVED.value
        doc = DocRecord(
            id=f"doc{row['_id']}",
            org_id=org,
            collection_path="scifact",
            source_key=row["_id"],
            title=row["title"],
            uri=f"scifact#{row['_id']}",
            content_hash="h",
            version=1,
            status=status,
            source_tag=None,
            synthesis_run_id=None,
            audience=None,
            effective_date=None,
            parse_status="ingested",
            chunk_count=1,
            created_at=None,
            updated_at=None,  # type: ignore[arg-type]
        )
        chunk = Chunk(f"{doc.id}:0", doc.id, 0, row["text"], (row["title"],))
        out.append(chunk_to_point(chunk, vec, doc, model_id=embedder.model_id))
    return out
