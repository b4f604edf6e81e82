"""Which faults are worth a retry: one rule for every Prefect task that retries.

Transient: the embedded store is busy (another process holds it), a model call failed in a way
its provider says may pass (a 429, a 529 "overloaded", a 5xx, a timeout, a lost connection), a
fetch timed out, lost its connection or got a 429/5xx. Everything else is permanent and fails at
once: a 400, a bad key, an SSRF block, a budget overrun, invalid input, a validation failure.

A task that retries takes :data:`TASK_RETRIES` (``@task(..., **TASK_RETRIES)``); Prefect then
calls :func:`retry_transient` with ``(task, task_run, state)`` after a failed attempt, and it
reads the attempt's exception from the state. Plain code can ask :func:`is_transient`. Nothing
here imports Prefect.
"""

from __future__ import annotations

from typing import Any

from core.errors import LlmError, StoreBusy

# Delays between attempts (seconds): a busy store or an overloaded model needs a moment.
RETRY_DELAYS_S = [2.0, 5.0]
RETRIES = len(RETRY_DELAYS_S)


def is_transient(exc: BaseException | None) -> bool:
    """Whether trying again later may succeed."""
    if exc is None:
        return False
    if isinstance(exc, StoreBusy):
        return True
    if isinstance(exc, LlmError):
        return exc.transient
    transient = getattr(exc, "transient", None)  # FetchError, and any error that says so
    if isinstance(transient, bool):
        return transient
    return False


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's ``retry_condition_fn``: retry the attempt only if its fault is transient."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception as error:  # the result could not be read: judge what was raised
        exc = error
    return is_transient(exc if isinstance(exc, BaseException) else None)


# The retry keywords of every Prefect task that retries: ``@task(..., **TASK_RETRIES)``.
TASK_RETRIES: dict[str, Any] = {
    "retries": RETRIES,
    "retry_delay_seconds": RETRY_DELAYS_S,
    "retry_condition_fn": retry_transient,
}
