"""kbflow's errors as HTTP answers: one status per kind, the message as the body's ``detail``.

A response never carries a traceback or an internal path: an unexpected exception is logged
here and answered with a 500 that says only that, and where to look (the server's log).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from core.errors import (
    BudgetExceeded,
    ConfigError,
    EmbeddingModelMismatch,
    ExtractionError,
    Forbidden,
    JobQueueFull,
    JobRunnerUnavailable,
    KbflowError,
    LedgerError,
    NotFound,
    ReviewConflict,
    StoreBusy,
    StoreError,
    TooLarge,
    Unauthorized,
    UnsafeUrl,
    UnsupportedMediaType,
)
from kbflow.api.limits import DeadlineExceeded, RateLimited, SlowClient

log = logging.getLogger(__name__)

# Most specific first: an error is answered with the first status whose class it is.
STATUS: tuple[tuple[type[KbflowError], int], ...] = (
    (RateLimited, 429),
    (DeadlineExceeded, 503),
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (ReviewConflict, 409),
    (TooLarge, 413),
    (SlowClient, 408),
    (UnsupportedMediaType, 415),
    (BudgetExceeded, 429),
    (JobQueueFull, 429),
    (StoreBusy, 503),
    (LedgerError, 503),  # another process held the ledger too long: retry, the request is fine
    (StoreError, 503),
    (JobRunnerUnavailable, 503),
    (UnsafeUrl, 422),
    (ExtractionError, 422),
    (EmbeddingModelMismatch, 503),  # the server's setting, not the request, is wrong
    (ConfigError, 422),
)


def status_of(exc: KbflowError) -> int:
    """The HTTP status for one of kbflow's errors (400 for a kind not listed)."""
    return next((code for kind, code in STATUS if isinstance(exc, kind)), 400)


def install(app: FastAPI) -> None:
    """Answer kbflow's errors, bad bodies and the unexpected the same way on every route."""

    @app.exception_handler(KbflowError)
    async def _kbflow(request: Request, exc: KbflowError) -> JSONResponse:
        code = status_of(exc)
        headers = {"WWW-Authenticate": "Bearer"} if code == 401 else {}
        if isinstance(exc, RateLimited | DeadlineExceeded):
            headers["Retry-After"] = str(exc.retry_after_s)
        elif isinstance(exc, LedgerError | StoreBusy):
            headers["Retry-After"] = "5"
        if isinstance(exc, JobQueueFull):
            headers["Retry-After"] = str(exc.retry_after_s)
        if code in (408, 413):  # the rest of the body is not read: the connection cannot be reused
            headers["Connection"] = "close"
        return JSONResponse({"detail": str(exc)}, status_code=code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Name each field and what is wrong with it; never echo the input back (it may be huge
        # or hold secrets).
        errors = [
            {"field": ".".join(str(p) for p in e.get("loc", ())), "message": e.get("msg", "")}
            for e in exc.errors()
        ]
        return JSONResponse({"detail": "the request is not valid", "errors": errors}, 422)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse(
            {"detail": "internal error: the server's log has the details"}, status_code=500
        )
