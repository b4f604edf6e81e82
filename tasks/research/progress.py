"""How far a research run has got, for whoever follows it (the research page of the inbox).

A run reports each stage as it enters it: ``reading`` (the seed inputs), ``fetching`` (public
pages, ``done`` of ``total`` planned), ``synthesising`` (writing the four drafts) and ``saving``
(storing them for review, with the tokens spent so far). A background job's run records them on
its job
(`sinks.registry.JobsRepository.note_progress`); a run with no job reports nowhere.

Progress is a courtesy: a report that cannot be stored is logged and never fails the run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sinks.registry import SqlRegistry

log = logging.getLogger(__name__)

STAGES = ("reading", "fetching", "synthesising", "saving")

Progress = Callable[..., None]
"""``progress(stage, done=None, total=None, tokens=None)``: the run has entered ``stage`` (one
of `STAGES`); ``done`` of ``total`` counts its steps where it has them; ``tokens`` is what it
has spent of its token budget, where it knows."""


def silent(
    stage: str, done: int | None = None, total: int | None = None, tokens: int | None = None
) -> None:
    """Progress reported nowhere (a run with no job)."""


def job_progress(registry: SqlRegistry, job_id: str | None) -> Progress:
    """Progress recorded on the registry job ``job_id`` (`silent` without one)."""
    if job_id is None:
        return silent

    def report(
        stage: str, done: int | None = None, total: int | None = None, tokens: int | None = None
    ) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown research stage {stage!r}; one of {', '.join(STAGES)}")
        entry: dict[str, object] = {"stage": stage}
        if done is not None and total is not None:
            entry |= {"done": done, "total": total}
        if tokens is not None:
            entry["tokens"] = tokens
        try:
            registry.jobs.note_progress(job_id, entry)
            log.info("research job %s: progress %s", job_id, json.dumps(entry))
        except Exception:  # the run goes on: only its page shows less
            log.warning("research job %s: could not record progress %s", job_id, entry,
                        exc_info=True)  # fmt: skip

    return report
