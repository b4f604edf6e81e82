"""One embedding model per org: vectors of two models are never compared or mixed.

Every chunk records the id of the model that made its vectors (`Embedder.model_id`, in the
point's payload and the registry's ``chunks.embedding_model``). Before a dense search or a
write into an org, `require_org_model` checks the org's recorded ids against the configured
embedder's with two index seeks (the smallest and largest id; equal to the configured one,
or none recorded, means compatible). Chunks recorded before ids were (NULL) are compatible:
nothing proves which model wrote them.
"""

from __future__ import annotations

from core.errors import EmbeddingModelMismatch
from sinks.registry import SqlRegistry


def require_org_model(
    registry: SqlRegistry, org_id: str, model_id: str, *, action: str = "search"
) -> None:
    """Raise unless every recorded embedding model of ``org_id``'s chunks is ``model_id``.

    Args:
        action: what was about to happen (``search``, ``ingest into``, ``edit a document
            of``), for the message.

    Raises:
        EmbeddingModelMismatch: some of the org's chunks were embedded by another model; the
            message names both ids, how many chunks each made, and what to do.
    """
    low, high = registry.chunks.embedding_model_bounds(org_id)
    if low is None or low == high == model_id:
        return
    found = registry.chunks.embedding_models(org_id)
    others = {m: n for m, n in found.items() if m is not None and m != model_id}
    if not others:  # changed between the two reads: it is consistent now
        return
    recorded = ", ".join(f"{m!r} ({n} chunks)" for m, n in sorted(others.items()))
    same = found.get(model_id, 0)
    mixed = f"; {same} chunks already use it (an unfinished re-embed)" if same else ""
    raise EmbeddingModelMismatch(
        f"cannot {action} org {org_id!r}: its chunks were embedded by {recorded}, but the "
        f"configured embedder is {model_id!r} (KBFLOW_EMBEDDING_MODEL, "
        f"KBFLOW_EMBEDDING_PRECISION){mixed}. Vectors of two models do not compare. Set "
        "KBFLOW_EMBEDDING_MODEL / KBFLOW_EMBEDDING_PRECISION back to the model that made the "
        f"index, or re-embed the org with the configured one: `kbflow store reembed --org "
        f"{org_id}`."
    )
