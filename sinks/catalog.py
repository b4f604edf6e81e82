"""``Catalog``: the collections-and-agents part of the registry under its former names.

The registry itself (:class:`sinks.registry.SqlRegistry`) is the one way to reach collections
and agents; this adapter keeps the app's older call sites working while they move over.
"""

from __future__ import annotations

from typing import Any

from sinks.registry import AgentRecord, CollectionRecord, SqlRegistry

__all__ = ["AgentRecord", "Catalog", "CollectionRecord"]

_RENAMED = {
    "describe": "describe_collection",
    "subtree": "collection_subtree",
    "documents_in": "documents_in_collections",
    "move": "move_collection_rows",
    "delete": "delete_collection_rows",
}


class Catalog:
    """The registry's collection and agent methods, under their former names."""

    def __init__(self, registry: SqlRegistry) -> None:
        self.registry = registry

    def __getattr__(self, name: str) -> Any:
        return getattr(self.registry, _RENAMED.get(name, name))
