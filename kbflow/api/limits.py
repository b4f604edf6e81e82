"""What keeps one caller from starving the others: a token bucket per token (429 with
Retry-After), a cap on body size (413, checked on the bytes as they arrive, not on a header
the client may leave out), and Prometheus metrics of what the service did.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.errors import KbflowError, TooLarge
from kbflow.api.gauges import LABEL_CAP, OTHER, CappedLabel, Knowledge
from kbflow.api.logs import (
    RequestFacts,
    begin_request,
    end_request,
    log_request,
    request_id_from,
)


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


class Measured:
    """ASGI middleware around the whole app: each request's id (``X-Request-ID`` on every
    answer), its latency by route template, method and status, the refusals (401, 403, 413, 429)
    by status, its counts by org, agent and MCP tool (`Metrics.observe`) and, with
    ``KBFLOW_LOG_FORMAT=json``, its one JSON log line (`kbflow.api.logs.log_request`), all from
    one `RequestFacts`. A plain ASGI wrapper: Starlette's ``@app.middleware("http")`` costs a
    task and a stream per request."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        mounted: tuple[str, ...] = (),
        *,
        log_requests: bool = False,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.mounted = mounted  # paths of plain ASGI apps, timed under their path
        self.log_requests = log_requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        sent_id = dict(scope.get("headers") or []).get(b"x-request-id")
        facts = RequestFacts(request_id_from(sent_id), str(scope["method"]))
        header = (b"x-request-id", facts.request_id.encode("ascii"))

        async def observed(message: Message) -> None:
            if message["type"] == "http.response.start":
                facts.status = int(message["status"])
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        token = begin_request(scope, facts)
        try:
            await self.app(scope, receive, observed)
        finally:
            end_request(token)
            # FastAPI names the route of its own routes only; a plain ASGI app (the MCP
            # endpoint) is timed under its fixed path, so no label takes unbounded values.
            path = scope.get("path")
            fallback = path if isinstance(path, str) and path in self.mounted else "unmatched"
            facts.route = str(getattr(scope.get("route"), "path", fallback))
            facts.latency_ms = (time.perf_counter() - started) * 1000
            self.metrics.observe(facts)
            if self.log_requests:
                log_request(facts)


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


@dataclass
class Metrics:
    """The service's Prometheus metrics, on a registry of its own (served at /metrics)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.latency = Histogram(
            "kbflow_http_request_seconds",
            "Time to answer a request, by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.refused = Counter(
            "kbflow_http_refused_total",
            "Requests refused before any work: no or bad token (401), not allowed (403), "
            "rate-limited (429), too large (413).",
            ["status"],
            registry=self.registry,
        )
        self.degraded = Counter(
            "kbflow_search_degraded_total",
            "Agent searches answered by the keyword fallback (the vector store unavailable).",
            registry=self.registry,
        )
        self.outcomes = Counter(
            "kbflow_agent_outcomes_total",
            "Agent turns by what the gate and the evidence allowed: answers answered or refused "
            "(no approved chunk supports one), knowledge searches yes / maybe / no.",
            ["route", "outcome"],
            registry=self.registry,
        )
        self.orgs = CappedLabel(LABEL_CAP)
        self.agents = CappedLabel(LABEL_CAP)
        self.by_org = Counter(
            "kbflow_org_requests_total",
            "Requests by the org they were for (an agent's org, a person's, or the org the admin "
            f"path names) and status class (2xx, 4xx, 5xx). At most {LABEL_CAP} orgs are named "
            f"per process; requests of any further org are counted under org={OTHER!r}.",
            ["org", "status_class"],
            registry=self.registry,
        )
        self.by_agent = Counter(
            "kbflow_agent_requests_total",
            "Requests made with an agent's token, by agent id and status class (2xx, 4xx, 5xx). "
            f"At most {LABEL_CAP} agents are named per process; requests of any further agent "
            f"are counted under agent={OTHER!r}.",
            ["agent", "status_class"],
            registry=self.registry,
        )
        self.mcp_tools = Counter(
            "kbflow_mcp_tool_calls_total",
            "MCP tool calls (/mcp tools/call) by tool (a published tool, or 'unknown') and "
            "outcome: the gate's (answered / refused; yes / maybe / no), 'degraded' (the keyword "
            "fallback), 'error' (the tool refused: bad arguments, a collection not readable, the "
            "deadline), or 'ok'.",
            ["tool", "outcome"],
            registry=self.registry,
        )

    def observe(self, facts: RequestFacts) -> None:
        """Count one answered request (`Measured`, after the answer has gone)."""
        status = str(facts.status)
        self.latency.labels(facts.route, facts.method, status).observe(facts.latency_ms / 1000)
        if facts.status in (401, 403, 413, 429):
            self.refused.labels(status).inc()
        status_class = f"{facts.status // 100}xx"
        if facts.org:
            self.by_org.labels(self.orgs.label(facts.org), status_class).inc()
        if facts.agent:
            self.by_agent.labels(self.agents.label(facts.agent), status_class).inc()
        if facts.tool:
            outcome = facts.outcome or ("degraded" if facts.degraded else "ok")
            self.mcp_tools.labels(facts.tool, outcome).inc()

    def watch_knowledge(
        self,
        backlog: Callable[[], dict[str, tuple[int, dt.datetime]]],
        points: Callable[[], dict[str, int]],
        disk_bytes: Callable[[], int | None],
        backup_at: Callable[[], dt.datetime | None] = lambda: None,
    ) -> None:
        """Export the review backlog, the store's size and the newest backup's age, read at
        scrape time (``backup_at()``: when the newest backup was made, None without one).

        ``backlog()``: each org's pending-review documents and when the oldest was made;
        ``points()``: each org's points in the vector store (empty while there is none);
        ``disk_bytes()``: the embedded store's folder size (None with a Qdrant server). Read at
        most every ``KNOWLEDGE_READ_EVERY_S`` (`kbflow.api.gauges`): an unauthenticated scrape
        never counts a large store over and over. The oldest draft's age is worked out at each
        scrape."""
        self.registry.register(Knowledge(backlog, points, disk_bytes, backup_at))

    def watch_research(self, finished: Callable[[Any], list[Any]]) -> None:
        """Export the research budget spent by finished research jobs (they run in their own
        processes, so the registry is where their spend is known).

        ``finished(after)`` lists the research jobs that ended at or after ``after`` (None: from
        the first), oldest first. A scrape reads only the jobs that ended since the last read,
        at most every `RESEARCH_READ_EVERY_S`: the totals are kept here, so an unauthenticated
        scrape never scans the jobs table.
        """
        self.registry.register(_ResearchSpend(finished))


RESEARCH_READ_EVERY_S = 2.0


class _ResearchSpend(Collector):
    """``kbflow_research_tokens_total`` and ``kbflow_research_runs_total{status}``, as running
    totals over the research jobs that ended (each counted once)."""

    def __init__(self, finished: Callable[[Any], list[Any]]) -> None:
        self._finished = finished
        self._lock = threading.Lock()
        self._tokens = 0
        self._runs: dict[str, int] = {}
        self._last: tuple[Any, str] | None = None  # (end time, id) of the last job read
        self._read_at = -math.inf

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only

    def _read_new(self) -> None:
        now = time.monotonic()
        if now - self._read_at < RESEARCH_READ_EVERY_S:
            return
        self._read_at = now
        while batch := self._finished(self._last):
            for job in batch:
                status = getattr(job.status, "value", str(job.status))
                self._runs[status] = self._runs.get(status, 0) + 1
                self._tokens += int((job.report or {}).get("consumed_tokens") or 0)
            self._last = (batch[-1].updated_at, batch[-1].id)

    def collect(self) -> Iterator[Any]:
        with self._lock:
            self._read_new()
            spent, by_status = self._tokens, dict(self._runs)
        tokens = CounterMetricFamily(
            "kbflow_research_tokens",
            "LLM tokens spent by finished research runs (the research budget).",
        )
        runs = CounterMetricFamily(
            "kbflow_research_runs", "Finished research runs, by outcome.", labels=["status"]
        )
        tokens.add_metric([], spent)
        for status, count in sorted(by_status.items()):
            runs.add_metric([status], count)
        yield tokens
        yield runs
