"""Moving and deleting collections, keeping the vector payloads the gate filters on in line.

The registry changes first, then each affected document's ``collection_path`` payload. In
between, the registry re-check on every search already applies the new path, so a chunk is never
served to an agent that may not read its new place (it can only be briefly missing).
"""

from __future__ import annotations

from sinks.registry import SYSTEM_ACTOR, CollectionRecord, SqlRegistry, collection_ancestry
from sinks.vectors import VectorStore


def move_collection(
    registry: SqlRegistry,
    store: VectorStore,
    org_id: str,
    ref: int | str,
    new_parent: int | str | None,
    *,
    actor: str = SYSTEM_ACTOR,
) -> tuple[CollectionRecord, int]:
    """Re-parent a collection (audited as ``actor``'s); returns it and how many documents'
    payloads were rewritten."""
    moved, doc_ids = registry.catalog.move_collection_rows(org_id, ref, new_parent, actor=actor)
    _repath(registry, store, doc_ids)
    return moved, len(doc_ids)


def delete_collection(
    registry: SqlRegistry,
    store: VectorStore,
    org_id: str,
    ref: int | str,
    *,
    move_to: int | str | None = None,
    delete_contents: bool = False,
    actor: str = SYSTEM_ACTOR,
) -> dict[str, int]:
    """Delete a collection (and its sub-collections), moving or deleting its documents
    (audited as ``actor``'s)."""
    moved, deleted, _target = registry.catalog.delete_collection_rows(
        org_id, ref, move_to=move_to, delete_contents=delete_contents, actor=actor
    )
    _repath(registry, store, moved)
    for doc_id in deleted:
        store.delete_document(doc_id)
    return {"moved": len(moved), "deleted": len(deleted)}


def _repath(registry: SqlRegistry, store: VectorStore, doc_ids: list[str]) -> None:
    for doc in registry.documents.get_documents(doc_ids).values():
        store.set_document_payload(
            doc.id, {"collection_path": collection_ancestry(doc.collection_path)}
        )
