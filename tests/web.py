"""httpx's calls for the tests, with one TLS context per process (`core.http.tls_context`).

httpx builds a verifying context (certifi's CA bundle, ~20 ms of CPU) for every client and every
one-shot call, even to a plain ``http://`` loopback server; the tests' polling loops and
per-request clients paid it about 4,000 times a default run. Same arguments as httpx's.
"""

from __future__ import annotations

from typing import Any

import httpx

from core.http import tls_context


def get(url: Any, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("verify", tls_context())
    return httpx.get(url, **kwargs)


def post(url: Any, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("verify", tls_context())
    return httpx.post(url, **kwargs)


def request(method: str, url: Any, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("verify", tls_context())
    return httpx.request(method, url, **kwargs)


def client(**kwargs: Any) -> httpx.Client:
    kwargs.setdefault("verify", tls_context())
    return httpx.Client(**kwargs)
