"""The MiniLM embedder remembers recent queries (an answer embeds its question twice)."""

from __future__ import annotations

from typing import Any

from tasks.text.embed import _RECENT_QUERIES, MiniLMEmbedder


def test_recent_queries_are_embedded_once(embedder: Any) -> None:
    fresh = MiniLMEmbedder(embedder.model_id)  # the loaded model is shared, the memo is not
    batches: list[list[str]] = []
    inner = fresh.embed_documents

    def counting(texts: Any) -> list[list[float]]:
        batches.append(list(texts))
        return inner(texts)

    fresh.embed_documents = counting  # type: ignore[method-assign]
    first = fresh.embed_query("expense deadline")
    first.append(99.0)  # a caller changing its copy must not change the memo
    again = fresh.embed_query("expense deadline")
    assert batches == [["expense deadline"]] and len(again) == 384
    assert again == inner(["expense deadline"])[0]
    for n in range(_RECENT_QUERIES):
        fresh.embed_query(f"query {n}")
    fresh.embed_query("expense deadline")  # pushed out by newer queries: embedded again
    assert batches.count(["expense deadline"]) == 2
