"""The research corpus: the AM's seed inputs (and public context) as citable entries."""

from __future__ import annotations

import re
from collections.abc import Sequence

from core.models import CorpusEntry, ResearchCorpus
from sinks.registry import DocRecord
from sinks.vectors import VectorStore
from tasks.text.boilerplate import strip_boilerplate
from tasks.text.chunk import chunks_to_markdown

MAX_ENTRY_CHARS = 60_000  # one seed's text (a long PDF handbook: ~25 pages)
MAX_SEED_CHARS = 240_000  # all seeds together (~60k tokens, well inside the default budget)


def seed_entries(seeds: Sequence[DocRecord], store: VectorStore) -> list[CorpusEntry]:
    """One entry per seed document, cited as ``doc:<id>``, text read from its stored chunks.

    Reads through the store's inspection path (seeds are not served to agents). The text is the
    document's Markdown rebuilt from its chunks: headings, lists and tables included, each
    section's chunks joined on their own (so a table never runs into the next sheet's), less
    its page furniture (`strip_boilerplate`: running headers and footers, contents lines, page
    numbers). Texts are bounded by `fair_shares`: a long handbook is read whole when the
    bundle has room.
    """
    texts = []
    for doc in seeds:
        chunks = store.inspect_document_chunks(doc.id)
        text = chunks_to_markdown(
            [
                (tuple(c.payload.get("heading_path") or ()), str(c.payload.get("text", "")))
                for c in chunks
                if c.payload.get("content_hash") in (None, doc.content_hash)
            ]
        )
        texts.append(strip_boilerplate(text))  # page furniture is no fact of the client's
    shares = fair_shares([len(t) for t in texts], MAX_ENTRY_CHARS, MAX_SEED_CHARS)
    return [
        CorpusEntry(
            cite_id=f"doc:{doc.id}",
            title=doc.title,
            text=text[:share],
            source=doc.source_tag or "am_file",
            uri=doc.uri,
        )
        for doc, text, share in zip(seeds, texts, shares, strict=True)
    ]


def fair_shares(sizes: Sequence[int], per_item: int, total: int) -> list[int]:
    """How many characters of each text to keep: all of it up to ``per_item``, and when the
    texts together pass ``total``, an equal share of what is left for each text that needs
    more (short texts are kept whole; only the longest are cut)."""
    wanted = [min(size, per_item) for size in sizes]
    if sum(wanted) <= total:
        return wanted
    shares = [0] * len(sizes)
    left = total
    order = sorted(range(len(sizes)), key=lambda i: wanted[i])
    for n, i in enumerate(order):
        shares[i] = min(wanted[i], left // (len(order) - n))
        left -= shares[i]
    return shares


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
