"""Corpus building: chunk re-joining, homepage choice, citation ids."""

from __future__ import annotations

import datetime as dt
from typing import Any

from core.models import CorpusEntry
from sinks.registry import DocRecord
from tasks.research.corpus import build_corpus, homepage_of
from tasks.text.chunk import join_chunks


def _doc(doc_id: str, tag: str, uri: str, minute: int) -> DocRecord:
    at = dt.datetime(2026, 1, 1, 9, minute, tzinfo=dt.UTC)
    fields: dict[str, Any] = dict(
        id=doc_id, org_id="o", collection_path="am-inputs", source_key=doc_id, title=doc_id,
        uri=uri, content_hash="h", version=1, status="approved", source_tag=tag,
        synthesis_run_id=None, audience="account_manager", effective_date=None,
        parse_status="ingested", chunk_count=1, created_at=at, updated_at=at,
    )  # fmt: skip
    return DocRecord(**fields)


def test_join_chunks_drops_the_overlap() -> None:
    words = [f"w{i}" for i in range(100)]
    chunks = [" ".join(words[0:40]), " ".join(words[30:70]), " ".join(words[60:100])]
    assert join_chunks(chunks) == " ".join(words)
    assert join_chunks(["a b c", "d e"]) == "a b c d e"


def test_homepage_is_the_first_seeded_url_else_the_first_url_in_the_text() -> None:
    seeds = [
        _doc("p", "am_prompt", "am-prompt:1", 0),
        _doc("u2", "am_url", "https://second.example/", 2),
        _doc("u1", "am_url", "https://first.example/", 1),
    ]
    assert homepage_of(seeds) == "https://first.example/"
    entries = [CorpusEntry("doc:p", "p", "See https://acme.example/about, thanks.", "am_prompt")]
    assert homepage_of(seeds[:1], entries) == "https://acme.example/about"
    assert homepage_of(seeds[:1]) is None


def test_build_corpus_keeps_the_first_entry_per_citation() -> None:
    corpus = build_corpus(
        "Acme",
        [
            CorpusEntry("doc:1", "a", "first", "am_file"),
            CorpusEntry("doc:1", "a", "dup", "am_file"),
            CorpusEntry("url:https://x.example/", "x", "page", "public_homepage"),
        ],
    )
    assert [e.text for e in corpus.entries] == ["first", "page"]
