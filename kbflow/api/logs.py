"""What `kbflow serve` writes to its log about requests: never a secret a caller sent.

Tokens belong in the ``Authorization`` header, and a token sent in a URL's query string is
refused (401): but uvicorn's access log writes each request's path with its query string before
anyone looks at it, so the refused token would be kept in the log. `QueryStringDropped` keeps
the path and replaces the query string with ``?…``.
"""

from __future__ import annotations

import logging

ACCESS_LOGGER = "uvicorn.access"
_PATH_ARG = 2  # uvicorn's access record: (client, method, path with query, http version, status)


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
