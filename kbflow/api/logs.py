"""What `kbflow serve` writes to its log about requests: never a secret a caller sent.

Tokens belong in the ``Authorization`` header, and a token sent in a URL's query string is
refused (401): but uvicorn's access log writes each request's path with its query string before
anyone looks at it, so the refused token would be kept in the log. `QueryStringDropped` keeps
the path and replaces the query string with ``?…``.

With ``KBFLOW_LOG_FORMAT=json`` the service writes one JSON object per line instead
(`json_log_config`): one line per request (`log_request`) in place of uvicorn's access line,
and every other record (warnings, uvicorn's own lines) as JSON too. A request's line is built
from its `RequestFacts`, the one record of who asked (agent or user, org), what (route template,
MCP tool) and how it ended (status, latency, the gate's outcome) that the metrics read as well
(`kbflow.api.metrics.Measured`). Facts are ids, names and numbers only: a request line never holds
a token, a path's query string, a query's or question's text, or a document's text.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import logging.config
import re
import uuid
from collections.abc import MutableMapping
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, TypedDict

ACCESS_LOGGER = "uvicorn.access"
REQUEST_LOGGER = "kbflow.access"
"""The logger of the JSON request lines (json mode only)."""
SERVE_LOGGER = "kbflow.serve"
"""The logger of `kbflow serve`'s own lines (its banner) in json mode."""

_PATH_ARG = 2  # uvicorn's access record: (client, method, path with query, http version, status)

REQUEST_ID_HEADER = "X-Request-ID"
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
SCOPE_KEY = "kbflow.request"
"""Where `Measured` leaves a request's `RequestFacts` in its ASGI scope."""


LogConfig = dict[str, Any]
"""A ``logging.config.dictConfig`` schema: free-form by design (handlers and formatters name
their own keys), and uvicorn's ``log_config`` takes it as a ``dict[str, Any]``."""


class UvicornLogging(TypedDict, total=False):
    """The keyword arguments of ``uvicorn.Config`` that set its logging."""

    log_config: LogConfig
    access_log: bool


class RequestFields(TypedDict):
    """A request line's fields (`RequestFacts.fields`)."""

    request_id: str
    method: str
    route: str
    status: int
    latency_ms: float
    agent: str | None
    user: str | None
    org: str | None
    tool: str | None
    outcome: str | None
    degraded: bool


class QueryStringDropped(logging.Filter):
    """Drops the query string from uvicorn's access log lines (the record, not the request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) <= _PATH_ARG:
            return True
        full = args[_PATH_ARG]
        if isinstance(full, str):
            path, sep, _ = full.partition("?")
            if sep:
                record.args = (*args[:_PATH_ARG], f"{path}?…", *args[_PATH_ARG + 1 :])
        return True


def drop_query_strings() -> None:
    """Install `QueryStringDropped` on uvicorn's access logger (once per process)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, QueryStringDropped) for f in logger.filters):
        logger.addFilter(QueryStringDropped())


def request_id_from(sent: bytes | None) -> str:
    """The id a request goes by: the client's ``X-Request-ID`` when it is safe to echo and log
    (1–64 of ``A-Z a-z 0-9 . _ -``: no newline, quote or space that could forge a log line or a
    header), else a new uuid4 hex."""
    if sent is not None:
        text = sent.decode("latin-1")
        if _SAFE_REQUEST_ID.fullmatch(text):
            return text
    return uuid.uuid4().hex


@dataclass
class RequestFacts:
    """One request as its log line and its metrics see it.

    `Measured` makes it when the request arrives; the token check names the caller and its org
    (`kbflow.api.auth`), the MCP endpoint the tool (`kbflow.api.mcp`), the agent routes and tools
    the gate's outcome (`kbflow.api.auth.Service.count_outcome`); `Measured` fills in the route,
    status and latency when the answer has gone, then hands it to the metrics and the log.
    """

    request_id: str
    method: str
    route: str = "unmatched"
    status: int = 500  # if the app fails before it answers
    latency_ms: float = 0.0
    agent: str | None = None
    user: str | None = None
    org: str | None = None
    tool: str | None = None  # an MCP tool call: a published tool's name, or "unknown"
    outcome: str | None = None  # answered / refused; yes / maybe / no; an MCP tool's "error"
    degraded: bool = False  # answered by the keyword fallback (the vector store unavailable)

    def fields(self) -> RequestFields:
        """The request line's fields (every key present, None as null)."""
        return {
            "request_id": self.request_id,
            "method": self.method,
            "route": self.route,
            "status": self.status,
            "latency_ms": round(self.latency_ms, 2),
            "agent": self.agent,
            "user": self.user,
            "org": self.org,
            "tool": self.tool,
            "outcome": self.outcome,
            "degraded": self.degraded,
        }


_CURRENT: ContextVar[RequestFacts | None] = ContextVar("kbflow_request", default=None)


def begin_request(
    scope: MutableMapping[str, Any], facts: RequestFacts
) -> Token[RequestFacts | None]:
    """Make ``facts`` the current request's (in its scope, and for code deeper in the call that
    has no scope: `current_request`); returns the token `end_request` takes."""
    scope[SCOPE_KEY] = facts
    return _CURRENT.set(facts)


def end_request(token: Token[RequestFacts | None]) -> None:
    _CURRENT.reset(token)


def request_facts(scope: MutableMapping[str, Any]) -> RequestFacts | None:
    """The facts of the request ``scope`` belongs to (None outside `Measured`, e.g. a test app)."""
    facts = scope.get(SCOPE_KEY)
    return facts if isinstance(facts, RequestFacts) else None


def current_request() -> RequestFacts | None:
    """The facts of the request this code runs for (worker threads included), if any."""
    return _CURRENT.get()


def log_request(facts: RequestFacts) -> None:
    """The request's one JSON line (json mode: `Measured` calls it once the answer has gone)."""
    level = logging.ERROR if facts.status >= 500 else logging.INFO
    logging.getLogger(REQUEST_LOGGER).log(
        level,
        "%s %s %d",
        facts.method,
        facts.route,
        facts.status,
        extra={"kbflow_request": facts.fields()},
    )


class JsonFormatter(logging.Formatter):
    """A record as one JSON object on one line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``; a request line adds its `RequestFacts`, any other record written during a
    request its ``request_id``; an exception its traceback as ``exc`` (one string: no line of
    the log is ever anything but JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        facts = getattr(record, "kbflow_request", None)
        if isinstance(facts, dict):
            out.update(facts)
        elif (current := current_request()) is not None:
            out["request_id"] = current.request_id
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.stack_info:
            out["exc"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def json_log_config() -> LogConfig:
    """The logging config (``logging.config.dictConfig``) of `kbflow serve` in json mode, given
    to uvicorn (which applies it in each ``--workers`` process too): every record as a JSON line
    on stdout; uvicorn's access line replaced by `log_request`'s. Levels as in text mode: kbflow
    and the libraries at WARNING, uvicorn's own lines and the request lines at INFO."""
    json_handler = {
        "class": "logging.StreamHandler",
        "formatter": "json",
        "stream": "ext://sys.stdout",
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"json": json_handler},
        "loggers": {
            "uvicorn": {"handlers": ["json"], "level": "INFO", "propagate": False},
            "uvicorn.error": {"level": "INFO"},
            ACCESS_LOGGER: {"handlers": [], "level": "WARNING", "propagate": False},
            REQUEST_LOGGER: {"handlers": ["json"], "level": "INFO", "propagate": False},
            SERVE_LOGGER: {"handlers": ["json"], "level": "INFO", "propagate": False},
        },
        "root": {"handlers": ["json"], "level": "WARNING"},
    }


def uvicorn_logging(log_format: str) -> UvicornLogging:
    """The keyword arguments that give uvicorn ``log_format``'s logging: none for text (its own
    config, unchanged), the JSON config and no access line for json."""
    if log_format != "json":
        return {}
    return {"log_config": json_log_config(), "access_log": False}


def writing_json() -> logging.Logger:
    """Apply `json_log_config` now (before uvicorn does, so nothing `kbflow serve` says first is
    plain text); the logger of its own lines."""
    logging.config.dictConfig(json_log_config())
    return logging.getLogger(SERVE_LOGGER)
