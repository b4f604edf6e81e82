"""Corpus building: chunk re-joining, homepage choice, citation ids."""

from __future__ import annotations

import datetime as dt
from typing import Any

from core.models import CorpusEntry, StoredHit
from sinks.registry import DocRecord
from tasks.research.corpus import build_corpus, homepage_of, seed_entries
from tasks.text.chunk import join_chunks
from tasks.text.sentences import MarkdownTable, split_tables


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


class _Chunks:
    """A store that holds one document's chunk payloads (the inspection path only)."""

    def __init__(self, payloads: list[dict[str, Any]]) -> None:
        self.payloads = payloads

    def inspect_document_chunks(self, doc_id: str) -> list[StoredHit]:
        return [StoredHit(f"{doc_id}:{i}", 0.0, p) for i, p in enumerate(self.payloads)]


def test_a_seed_reads_as_markdown_and_its_tables_never_run_together() -> None:
    """Two sheets' tables: joined as one run of words, the second's leading "|" read as the
    first's trailing "|" repeated (an overlap) and the header row ran into the last row."""
    doc = _doc("s1", "am_file", "upload:o/book.xlsx", 0)
    store = _Chunks(
        [
            {
                "heading_path": ["Sales"],
                "text": "| q | n |\n|---|---|\n| Q1 | 3 |",
                "chunk_index": 0,
            },
            {"heading_path": ["Staff"], "text": "| name | role |\n|---|---|\n| Ada | Mechanic |"},
        ]
    )
    [entry] = seed_entries([doc], store)  # type: ignore[arg-type]
    assert entry.text == (
        "# Sales\n\n| q | n |\n|---|---|\n| Q1 | 3 |\n\n"
        "# Staff\n\n| name | role |\n|---|---|\n| Ada | Mechanic |\n"
    )
    assert [p.header for p in split_tables(entry.text) if isinstance(p, MarkdownTable)] == [
        ("q", "n"),
        ("name", "role"),
    ]
    assert (entry.cite_id, entry.uri) == ("doc:s1", "upload:o/book.xlsx")


def test_one_quote_per_fact_across_overlapping_pieces_and_seeds() -> None:
    from core.models import ResearchCorpus
    from tasks.research.extractive_corpus import corpus_sentences

    full = "Dana Reyes leads the support desk and answers escalations within one working day."
    again = f"As agreed, {full[0].lower()}{full[1:]}"  # the fact inside a longer sentence
    cut = "and answers escalations within one working day."  # a piece cut at a chunk's edge
    row = "| Name | Role |\n| - | - |\n| Dana Reyes | Support lead, answers escalations |\n"
    corpus = ResearchCorpus(
        "Acme",
        (
            CorpusEntry(
                "doc:a", "Team", f"{full}\n\nThe desk opens at 8 in the morning.", "am_file"
            ),
            CorpusEntry("doc:b", "Notes", f"{cut}\n\n{again}", "am_file"),
            CorpusEntry("doc:c", "Sheet", row, "am_file"),
        ),
    )
    texts = [s.text for s in corpus_sentences(corpus, 100)]
    assert sum("answers escalations within one working day" in t for t in texts) == 1, texts
    assert any(t.startswith("As agreed") for t in texts)  # the longest telling is the one kept
    assert "The desk opens at 8 in the morning." in texts
    assert any("Support lead" in t for t in texts)  # a table row is a fact of its own
