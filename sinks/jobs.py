"""``JobStore``: the background-jobs part of the registry under its former names.

The registry itself (:class:`sinks.registry.SqlRegistry`) is the one way to reach job rows;
this adapter keeps the app's older call sites working while they move over.
"""

from __future__ import annotations

from typing import Any

from sinks.registry import JobRecord, SqlRegistry

__all__ = ["JobRecord", "JobStore"]

_RENAMED = {
    "create": "create_job",
    "update_runner": "update_job_runner",
    "finish": "finish_job",
    "get": "get_job",
    "list": "list_jobs",
}


class JobStore:
    """The registry's job methods, under their former names."""

    def __init__(self, registry: SqlRegistry) -> None:
        self.registry = registry

    def __getattr__(self, name: str) -> Any:
        return getattr(self.registry, _RENAMED.get(name, name))
