"""The JSON the job services return, as typed dicts."""

from __future__ import annotations

from typing import TypedDict


class Admission(TypedDict):
    """Whether a job waits for a slot (`queue.admission`), and its place among all waiting
    jobs (1: next); None when it does not wait."""

    queued: bool
    queue_position: int | None
