"""The research corpus: the AM's seed inputs (and public context) as citable entries."""

from __future__ import annotations

import re
from collections.abc import Sequence

from core.models import CorpusEntry, ResearchCorpus
from sinks.registry import DocRecord
from sinks.vectors import VectorStore
from tasks.text.chunk import chunks_to_markdown

MAX_ENTRY_CHARS = 12_000


def seed_entries(seeds: Sequence[DocRecord], store: VectorStore) -> list[CorpusEntry]:
    """One entry per seed document, cited as ``doc:<id>``, text read from its stored chunks.

    Reads through the store's inspection path (seeds are not served to agents). The text is the
    document's Markdown rebuilt from its chunks: headings, lists and tables included, each
    section's chunks joined on their own (so a table never runs into the next sheet's).
    """
    entries = []
    for doc in seeds:
        chunks = store.inspect_document_chunks(doc.id)
        text = chunks_to_markdown(
            [
                (tuple(c.payload.get("heading_path") or ()), str(c.payload.get("text", "")))
                for c in chunks
                if c.payload.get("content_hash") in (None, doc.content_hash)
            ]
        )
        entries.append(
            CorpusEntry(
                cite_id=f"doc:{doc.id}",
                title=doc.title,
                text=text[:MAX_ENTRY_CHARS],
                source=doc.source_tag or "am_file",
                uri=doc.uri,
            )
        )
    return entries


_URL = re.compile(r"https?://[^\s<>()\[\]\"']+")


def homepage_of(seeds: Sequence[DocRecord], entries: Sequence[CorpusEntry] = ()) -> str | None:
    """The client's homepage: the first http(s) URL the AM seeded, else the first URL that
    appears in the text of any input (in seeding order)."""
    ordered = sorted(seeds, key=lambda d: d.created_at)
    for doc in ordered:
        if doc.source_tag == "am_url" and doc.uri.startswith(("http://", "https://")):
            return doc.uri
    for entry in entries:
        match = _URL.search(entry.text)
        if match:
            return match.group(0).rstrip(".,;:")
    return None


def build_corpus(client_name: str, entries: Sequence[CorpusEntry]) -> ResearchCorpus:
    """The corpus, with duplicate citation ids dropped (first wins)."""
    seen: dict[str, CorpusEntry] = {}
    for entry in entries:
        seen.setdefault(entry.cite_id, entry)
    return ResearchCorpus(client_name=client_name, entries=tuple(seen.values()))
