"""How well a retrieved chunk supports a question: the signal "no chunk, no answer" gates on.

The fused retrieval score ranks chunks within one query but means nothing across queries (it is
min-max normalised per query), so refusal needs a signal on a fixed scale.
"""

from __future__ import annotations

from collections.abc import Sequence

from tasks.embed import Embedder


def support_scores(
    query_vector: Sequence[float], texts: Sequence[str], embedder: Embedder
) -> list[float]:
    """The support of each text for the query: cosine of the MiniLM embeddings (unit vectors).

    Args:
        query_vector: the query's embedding (unit length).
        texts: the chunk texts, in rank order.
        embedder: the embedder the query vector came from.
    """
    if not texts:
        return []
    vectors = embedder.embed_documents(list(texts))
    return [float(sum(a * b for a, b in zip(query_vector, v, strict=True))) for v in vectors]
