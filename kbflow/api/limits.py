"""What keeps one caller from starving the others: a token bucket per token (429 with
Retry-After) and a cap on body size (413, checked on the bytes as they arrive, not on a header
the client may leave out). The service's metrics are `kbflow.api.metrics`'.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.errors import KbflowError, TooLarge


class SlowClient(KbflowError, TimeoutError):
    """A request's body did not arrive in time (HTTP 408): a slow or stalled client does not get
    to hold a worker."""


class RateLimited(KbflowError, RuntimeError):
    """A token made more requests than its rate allows; ``retry_after_s`` says when to retry."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(KbflowError, TimeoutError):
    """A request ran past the server's deadline (``KBFLOW_API_REQUEST_TIMEOUT_S``): answered
    503 with ``retry_after_s``; what it was doing is left to finish on its own."""

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class TokenBuckets:
    """``burst`` requests at once per key, refilled at ``per_minute``; thread-safe."""

    per_minute: int
    burst: int
    _state: dict[str, tuple[float, float]] = field(default_factory=dict)  # key -> (tokens, at)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, key: str, now: float | None = None) -> None:
        """Spend one request of ``key``'s bucket, or raise RateLimited."""
        now = time.monotonic() if now is None else now
        rate = self.per_minute / 60.0
        with self._lock:
            tokens, at = self._state.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * rate)
            if tokens < 1.0:
                wait = math.ceil((1.0 - tokens) / rate)
                self._state[key] = (tokens, now)
                raise RateLimited(
                    f"too many requests for this token: at most {self.per_minute} a minute "
                    f"(bursts of {self.burst}); retry in {wait}s",
                    retry_after_s=wait,
                )
            self._state[key] = (tokens - 1.0, now)


class BodyLimit:
    """ASGI middleware: a body over ``max_bytes`` is answered 413 before a route sees it.

    The body is read here, up to the cap, then handed on: a client that sends no
    Content-Length (chunked) is held to the same cap as one that declares a size.

    The upload routes (paths matching ``uploads``, POST) are held to ``upload_max_bytes``
    instead, and their bodies are not read here: the route streams each file to disk as it
    arrives (`kbflow.api.uploads`), so a seed bundle of twenty 25 MB files is never held in
    memory. A declared size over that cap is answered 413 at once; a body that grows past it
    raises TooLarge (413) in the route reading it.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        *,
        uploads: re.Pattern[str] | None = None,
        upload_max_bytes: int = 0,
        read_timeout_s: float = 30.0,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.uploads = uploads
        self.upload_max_bytes = upload_max_bytes
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if (
            self.uploads is not None
            and scope["method"] == "POST"
            and self.uploads.fullmatch(scope["path"])
        ):
            await self._stream(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _too_large(send, self.max_bytes, "KBFLOW_API_MAX_BODY_MB")
            return
        body = bytearray()
        deadline = time.monotonic() + self.read_timeout_s
        while True:
            try:  # the whole body within the timeout: a trickle does not hold a worker
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except TimeoutError:
                await _too_slow(send, self.read_timeout_s)
                return
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await _too_large(send, self.max_bytes, "KBFLOW_API_MAX_BODY_MB")
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An upload: counted as the route reads it, never buffered here."""
        cap = self.upload_max_bytes
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            await _too_large(send, cap, "KBFLOW_API_MAX_UPLOAD_MB")
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            try:  # an upload may take long, but may not stall
                message = await asyncio.wait_for(receive(), self.read_timeout_s)
            except TimeoutError:
                raise SlowClient(
                    f"the upload stalled: no data for {self.read_timeout_s:g}s "
                    "(KBFLOW_API_READ_TIMEOUT_S); send it again"
                ) from None
            seen += len(message.get("body", b""))
            if seen > cap:
                raise TooLarge(
                    f"the upload is larger than this service reads ({cap} bytes in all); "
                    "send fewer or smaller files, or raise KBFLOW_API_MAX_UPLOAD_MB"
                )
            return message

        await self.app(scope, counted, send)


async def _too_slow(send: Send, timeout_s: float) -> None:
    detail = (
        f"the request body did not arrive within {timeout_s:g}s (KBFLOW_API_READ_TIMEOUT_S); "
        "send it again, all at once"
    )
    await _answer(send, 408, detail)


async def _answer(send: Send, status: int, detail: str) -> None:
    """A JSON error answered by the middleware itself; the connection is closed after it."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps({"detail": detail}).encode()})


async def _too_large(send: Send, max_bytes: int, setting: str) -> None:
    detail = (
        f"the request body is larger than this service reads ({max_bytes} bytes); send less, "
        f"or raise {setting}"
    )
    await _answer(send, 413, detail)
