"""One TLS context per process: kbflow's HTTP clients reuse it instead of loading the CA
bundle again for every client and every poll (`core.http`)."""

from __future__ import annotations

import ssl
from typing import Any

import httpx
import pytest

from core.http import tls_context
from kbflow.services.orchestration.prefect_api import RetryingTransport


def test_prefect_api_transports_share_the_one_context(monkeypatch: pytest.MonkeyPatch) -> None:
    tls_context()  # built once before we count
    built: list[Any] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    transports = [RetryingTransport() for _ in range(5)]
    with httpx.Client(verify=tls_context()):  # what the polling loops now do
        pass
    assert built == []  # none loaded the CA bundle again
    pools = {id(t._inner._pool._ssl_context) for t in transports}
    assert pools == {id(tls_context())}
    assert tls_context().verify_mode is ssl.CERT_REQUIRED  # still verifying
