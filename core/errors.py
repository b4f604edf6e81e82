"""One exception hierarchy for kbflow.

Every error says what failed, the offending value and what to do about it. Each class mixes in
the closest built-in so callers that only know the standard library still catch it sensibly.
"""

from __future__ import annotations

from typing import Any


class KbflowError(Exception):
    """Base class for every error kbflow raises on purpose."""


class ConfigError(KbflowError, ValueError):
    """A setting or argument is invalid."""


class EmbeddingModelMismatch(ConfigError):
    """An org's chunks were embedded by another model than the configured one: searching or
    adding to them would compare vectors of two models. The message names both ids and how
    to bring them together (the setting back, or ``kbflow store reembed``)."""


class ExtractionError(KbflowError, ValueError):
    """A source file could not be turned into text."""


class UnsupportedFormat(ExtractionError):
    """The file's format is not one kbflow can extract (yet)."""


class IngestFailed(KbflowError, RuntimeError):
    """Too many documents of an ingest run failed; the ones that worked are stored."""


class StoreBusy(KbflowError, TimeoutError):
    """Another process holds the embedded vector store."""


class StoreError(KbflowError, RuntimeError):
    """The vector store failed or is inconsistent."""


class NotFound(KbflowError, LookupError):
    """An org, collection, document or user does not exist."""


class ReviewConflict(KbflowError, RuntimeError):
    """A state transition lost a race: the document was no longer in the expected state (409)."""


class Forbidden(KbflowError, PermissionError):
    """The actor may not perform this action."""


class Unauthorized(KbflowError, PermissionError):
    """A bearer token did not establish who is calling (malformed, unknown, expired, revoked,
    or its user or agent is gone); the message says which (HTTP 401, where ``Forbidden`` is
    403: a known caller who may not do this)."""


class TooLarge(KbflowError, ValueError):
    """A request carries more than kbflow reads: a file past its size cap, or too many files
    (HTTP 413); the message names the cap and the setting that raises it."""


class UnsupportedMediaType(KbflowError, ValueError):
    """An upload's declared type is not one kbflow ingests, or its name or bytes say it is
    something else (HTTP 415); the message lists the accepted types."""


class BudgetExceeded(KbflowError, RuntimeError):
    """A fetch or token budget was exhausted."""


class UnsafeUrl(KbflowError, ValueError):
    """A URL points somewhere kbflow refuses to fetch (private address, bad scheme...)."""


class SynthesisInvalid(KbflowError, ValueError):
    """Draft KB documents break the synthesis contract (count, names, footer or citations)."""


class SynthesisFailed(KbflowError, RuntimeError):
    """A synthesizer could not produce valid drafts (API error, or invalid output after repair);
    ``transient`` says whether trying again later may help (the model was overloaded, say)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class LlmError(KbflowError, RuntimeError):
    """A model call failed; ``transient`` says whether retrying later may help, ``attempts``
    how many requests were made."""

    def __init__(
        self, message: str, *, transient: bool = False, auth: bool = False, attempts: int = 1
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.auth = auth
        self.attempts = attempts


class LlmReplyInvalid(KbflowError, ValueError):
    """A model's reply broke its JSON contract (the message says how)."""


class LedgerError(KbflowError, RuntimeError):
    """The answer ledger could not be written or read (e.g. another process holds it)."""


class ReviewTimeout(KbflowError, RuntimeError):
    """Nobody answered a paused review in time; every draft stays pending_review.

    Not a ``TimeoutError``: Prefect's engine reads one raised by a flow as the flow's own
    timeout ("Flow run failed due to timeout", logged without its type)."""


class JobRunnerUnavailable(KbflowError, RuntimeError):
    """Background jobs cannot be started: the ``prefect`` job runner has no Prefect server
    (PREFECT_API_URL), the server has no job deployment, or it does not answer."""


class JobQueueFull(KbflowError, RuntimeError):
    """An org has as many background jobs waiting to start as it may (HTTP 429, with
    ``retry_after_s``); the message names the limit and its setting. Nothing was recorded."""

    def __init__(self, message: str, retry_after_s: int = 60) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RunFailed(KbflowError, RuntimeError):
    """A flow run ended Failed without doing its job (a refused reviewer, a research budget).

    ``report`` is the report the run would have returned, saying what it did and did not do.
    The flow returns a Failed state whose data is this error, so a plain call raises it and the
    caller still reads the report.
    """

    def __init__(self, message: str, report: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.report: dict[str, Any] = dict(report or {})

    def __reduce__(self) -> tuple[Any, ...]:  # keep the report through pickling (results)
        return (type(self), (str(self), self.report))
