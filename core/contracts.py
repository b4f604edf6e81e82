"""Typed contracts between the floors: what a caller asks for, and the reports that come back.

Each is a pydantic model, so one definition serves as the CLI's arguments, a flow's parameters
(Prefect renders them as the run form), a job row's stored parameters and the ``--json`` output
(`Report.to_dict`).

A report also reads like that JSON: ``report["documents"]``, ``"review" in report`` and
``report.get("review")`` give what the JSON holds under that key.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator

from core import ids
from core.errors import IngestFailed
from core.models import DocStatus


class Report(BaseModel):
    """A report (or a part of one): typed fields, and read access by key like the JSON it
    dumps to."""

    model_config = ConfigDict(extra="forbid")

    def __getitem__(self, key: str) -> Any:
        if key not in type(self).model_fields:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return (
            isinstance(key, str)
            and key in type(self).model_fields
            and (getattr(self, key) is not None or key in self.model_fields_set)
        )

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in type(self).model_fields else default

    def to_dict(self) -> dict[str, Any]:
        """The JSON the commands print: every field given when the report was made (a field
        left at its default because its producer never reports it stays out)."""
        return self.model_dump(mode="json", exclude_unset=True)


# --- ingest ----------------------------------------------------------------------------------


class IngestRequest(BaseModel):
    """Where an ingest puts its documents and the review metadata they get (everything but
    the paths): the CLI's options, the ``ingest`` flow's parameters, a job row's parameters."""

    model_config = ConfigDict(extra="forbid")

    org: str = Field(description="Organisation id (a short slug); it must exist.")
    collection: str = Field("default", description="Collection path, e.g. 'policies/hr'.")
    status: DocStatus | None = Field(
        DocStatus.APPROVED, description="Review status of new documents (None: legacy, unset)."
    )
    audience: str | None = Field(None, description="Audience of the documents (None: everyone).")
    effective_date: dt.date | None = Field(None, description="Hidden from agents before this day.")
    source_tag: str | None = Field(None, description="Free tag recorded on each document.")

    @field_validator("audience")
    @classmethod
    def _audience(cls, value: str | None) -> str | None:
        """The one audience rule (:func:`core.ids.audience`, as HTTP uploads check it): a bad
        one is refused here, before anything is stored, on every path (CLI, flow, job)."""
        return None if value is None else ids.audience(value)

    def job_params(self) -> dict[str, Any]:
        """As JSON, for the job row (what `kbflow jobs status` shows)."""
        return self.model_dump(mode="json")

    def flow_params(self) -> dict[str, Any]:
        """As the ``ingest`` flow's keyword arguments (its parameters are these fields, so a
        deployment's run form and ``-p org=...`` keep working)."""
        return dict(self)


class PathReason(Report):
    """A source that was skipped (or read but empty), and why."""

    source: str
    reason: str


class PathNote(Report):
    """A source stored with a caveat (OCR used, a link not followed, …)."""

    source: str
    note: str


class JobRef(Report):
    """A background job an ingest handed long files to."""

    id: str
    status: str
    files: int


class IngestReport(Report):
    """What an ingest did."""

    org: str
    collection: str
    discovered: int
    new: int
    changed: int
    unchanged: int
    documents: int
    resumed: int = 0
    """Files whose last ingest did not finish (a killed run): redone in place, neither new nor
    changed; found = new + changed + unchanged + resumed (+ files discovery skipped)."""
    chunks: int
    superseded: int
    skipped: list[PathReason]
    seconds: float
    embed_seconds: float
    empty: list[PathReason] = Field(default_factory=list)
    notes: list[PathNote] = Field(default_factory=list)
    jobs: list[JobRef] = Field(default_factory=list)

    def raise_if_too_many_skipped(self, max_ratio: float) -> None:
        """Fail the run when more than ``max_ratio`` of the attempted documents were skipped.

        Unchanged documents count as fine: one newly unreadable file among a hundred unchanged
        ones does not fail a re-run.

        Raises:
            IngestFailed: too many were skipped; the message names the first three and why.
        """
        attempted = self.documents + len(self.empty) + len(self.skipped) + self.unchanged
        if attempted and len(self.skipped) / attempted > max_ratio:
            names = "; ".join(f"{s.source} ({s.reason})" for s in self.skipped[:3])
            raise IngestFailed(
                f"{len(self.skipped)} of {attempted} documents could not be ingested "
                f"(more than {max_ratio:.0%}), e.g. {names}. The {self.documents} that worked "
                "are stored; see each reason in the report, fix the files and re-run "
                "(unchanged documents are skipped)."
            )


# --- review ----------------------------------------------------------------------------------


class DecisionOutcome(Report):
    """What happened to one decision of a review."""

    doc_id: str
    action: str
    result: Literal["applied", "conflict", "forbidden", "invalid", "not_found"]
    message: str = ""
    status: str | None = None


class ReviewReport(Report):
    """What a review run did with the decisions it was given."""

    org: str
    reviewer: str | None
    pending: int
    applied: int
    skipped: int
    failed: int
    skipped_ids: list[str]
    outcomes: list[DecisionOutcome]


# --- research --------------------------------------------------------------------------------


class DraftOut(Report):
    filename: str
    title: str
    content: str


class BudgetSpent(Report):
    """What a research run spent of its caps, and which one stopped it (if any)."""

    fetches: int = 0
    max_fetches: int = 0
    tokens: int = 0
    max_tokens: int = 0
    exceeded: Literal["fetches", "tokens"] | None = None


class ResearchReport(Report):
    """What a research run did: its drafts (or the budget that stopped it) and its review."""

    synthesis_run_id: str | None
    budget_exceeded: bool
    documents: list[DraftOut] = Field(default_factory=list)
    consumed_tokens: int = 0
    doc_ids: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    synthesizer: str = ""
    superseded_drafts: int = 0
    budget: BudgetSpent = Field(default_factory=BudgetSpent)
    budget_stop: str | None = None
    review: ReviewReport | None = None
    review_failed: str | None = None


# --- sources ---------------------------------------------------------------------------------


class SourceSettings(TypedDict):
    """What a source is set to sync, and how: the fields ``kbflow sources add`` checks."""

    kind: str
    config: dict[str, Any]
    collection: str
    status: str
    audience: str | None
    include: list[str]
    exclude: list[str]
    max_items: int
    max_item_bytes: int
    schedule: str | None
    timezone: str | None


class SourceDict(SourceSettings):
    """A source as JSON (`SourceRecord.to_dict`): its settings, who made it and when, and its
    last sync as kept on it (times as ISO 8601 text)."""

    id: str
    org_id: str
    name: str
    created_by: str
    created_at: str
    updated_at: str
    last_sync: dict[str, Any] | None


class SyncCounts(Report):
    """What one sync of a source did with its items (listed: every item the walk saw once)."""

    listed: int
    new: int
    changed: int
    unchanged: int
    returned: int
    withdrawn: int
    failed: int


class ItemFailure(Report):
    """An item that failed to sync and why (the item is tried again next sync)."""

    key: str
    error: str


class WithdrawHeld(Report):
    """The withdrawals a sync held back: more of the source's items gone at once than the
    bound (``KBFLOW_SOURCES_MAX_WITHDRAW_RATIO``) allows, until its AM confirms."""

    gone: int
    of: int
    max_ratio: float
    message: str


class SyncReport(Report):
    """What one sync of a source did (`kbflow sources sync --json`, a source-sync job's
    result); kept on the source as its last sync (`kbflow sources show`)."""

    started_at: str
    outcome: Literal["ok", "partial", "failed"]
    flow_run_id: str | None
    finished_at: str
    seconds: float
    complete: bool  # the walk saw the whole source (no listing error, no cap hit)
    counts: SyncCounts
    errors: list[ItemFailure]  # the first ones (all are counted)
    error: str | None  # why the source could not be listed
    withdraw_held: WithdrawHeld | None = None  # set (and in the JSON) only when held
