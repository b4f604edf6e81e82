"""The JSON the research services return, as typed dicts.

Types only: the values are the plain dicts the CLI prints and the HTTP service answers.
"""

from __future__ import annotations

from typing import TypedDict


class SkippedInput(TypedDict):
    """A seed input that was not stored, and why."""

    source: str
    reason: str


class SeedResult(TypedDict):
    """What a seed bundle stored (`seeds.seed`): the new inputs, their ids and what was
    skipped."""

    org: str
    stored: int
    doc_ids: list[str]
    skipped: list[SkippedInput]
