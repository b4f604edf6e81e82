"""The service's Prometheus metrics (served at /metrics): `Metrics`, their registry, and
`Measured`, the ASGI middleware that times and counts each request and writes its log line.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kbflow.api.gauges import LABEL_CAP, OTHER, CappedLabel, Knowledge
from kbflow.api.logs import (
    RequestFacts,
    begin_request,
    end_request,
    log_request,
    request_id_from,
)


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
