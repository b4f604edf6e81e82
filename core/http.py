"""One TLS context per process for kbflow's HTTP clients.

httpx builds a new verifying context (it loads certifi's CA bundle, ~20 ms of CPU) for every
client and every one-shot ``httpx.get``, even to a plain ``http://`` loopback address. Polling
loops (a server's readiness, a Prefect run's state) and per-call clients paid it again and
again: 131 s of CPU in one default test run. A context holds no connection and no host: each
client still connects anew and verifies the certificate against its own host name.
"""

from __future__ import annotations

import functools
import ssl


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context (certifi's CA bundle), built once per process; pass it
    as ``verify=`` to an httpx client or transport."""
    import httpx

    return httpx.create_ssl_context()
