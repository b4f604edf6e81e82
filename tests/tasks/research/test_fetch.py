"""Tests for tasks.research.fetch: the SSRF guard and the bounded, pinned GET.

Nothing leaves the process: every test injects a fake resolver and ``httpx.MockTransport``, and
the autouse ``_no_network`` fixture in tests/conftest.py refuses outside connections anyway.
"""

from __future__ import annotations

import datetime as dt
import http.server
import re
import socket
import ssl
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from core.errors import ConfigError, KbflowError, UnsafeUrl
from tasks.research import fetch
from tasks.research.fetch import FetchError, FetchResult, check_url, safe_get

PUBLIC_V4 = "93.184.215.14"
OTHER_V4 = "8.8.8.8"
PUBLIC_V6 = "2606:2800:21f:cb07:6820:80da:af6b:8b2c"


def no_resolving(host: str, port: int) -> list[str]:
    raise AssertionError(f"{host}:{port} should have been refused before any DNS lookup")


def answers(*addresses: str) -> Callable[[str, int], list[str]]:
    """A resolver that gives every name the same answers."""
    return lambda host, port: list(addresses)


class Recorder:
    """A MockTransport handler that records each request and answers from a script."""

    def __init__(self, *responses: httpx.Response | Exception) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        reply = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(reply, Exception):
            raise reply
        return reply

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


def redirect(location: str, status: int = 302) -> httpx.Response:
    return httpx.Response(status, headers={"Location": location})


def page(text: str = "hello", content_type: str = "text/html; charset=utf-8") -> httpx.Response:
    return httpx.Response(200, text=text, headers={"Content-Type": content_type})


# (url, what the refusal must mention, resolver answers or None when no lookup may happen)
HOSTILE: list[tuple[str, str, tuple[str, ...] | None]] = [
    # Cloud metadata, in every spelling.
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata endpoint", None),
    ("http://2852039166/", "cloud metadata endpoint", None),
    ("http://0251.0376.0251.0376/", "cloud metadata endpoint", None),
    ("http://0xA9FEA9FE/", "cloud metadata endpoint", None),
    ("http://0xa9.0xfe.0xa9.0xfe/", "cloud metadata endpoint", None),
    ("http://169.254.43518/", "cloud metadata endpoint", None),
    (
        "http://[::ffff:169.254.169.254]/",
        "IPv4-mapped IPv6 address embedding 169.254.169.254",
        None,
    ),
    ("http://[::ffff:a9fe:a9fe]/", "IPv4-mapped IPv6 address embedding 169.254.169.254", None),
    ("http://[64:ff9b::169.254.169.254]/", "NAT64 address embedding 169.254.169.254", None),
    ("http://[64:ff9b::a9fe:a9fe]/", "NAT64 address embedding 169.254.169.254", None),
    ("http://[64:ff9b:1::a9fe:a9fe]/", "local-use NAT64", None),
    ("http://[2002:a9fe:a9fe::1]/", "6to4 address embedding 169.254.169.254", None),
    ("http://[fd00:ec2::254]/", "cloud metadata endpoint", None),
    ("http://100.100.100.200/latest/meta-data/", "cloud metadata endpoint (Alibaba", None),
    ("http://169.254.170.2/v2/credentials", "cloud metadata endpoint (AWS ECS", None),
    ("http://192.0.0.192/", "cloud metadata endpoint (Oracle", None),
    ("http://metadata.google.internal/computeMetadata/v1/", "blocked host name", None),
    ("http://metadata/", "blocked host name", None),
    ("http://instance-data/latest/", "blocked host name", None),
    # Private, shared and other special IPv4 ranges.
    ("http://10.0.0.1/", "private address (RFC 1918)", None),
    ("http://172.16.5.4/", "private address (RFC 1918)", None),
    ("http://172.31.255.255/", "private address (RFC 1918)", None),
    ("http://192.168.1.1/admin", "private address (RFC 1918)", None),
    ("http://100.64.0.1/", "CGNAT", None),
    ("http://100.127.255.254/", "CGNAT", None),
    ("http://224.0.0.251/", "multicast", None),
    ("http://255.255.255.255/", "broadcast", None),
    ("http://240.0.0.1/", "reserved", None),
    ("http://198.18.0.1/", "benchmarking", None),
    ("http://192.0.2.10/", "documentation", None),
    ("http://[2002:c0a8:101::1]/", "6to4 address embedding 192.168.1.1, a private", None),
    # Loopback and "this host" in names and numbers.
    ("http://localhost/", "blocked host name", None),
    ("http://LOCALHOST./", "blocked host name", None),
    ("http://api.localhost:8080/", "blocked host name", None),
    ("http://127.0.0.1/", "loopback", None),
    ("http://127.1/", "loopback", None),
    ("http://0x7f.1/", "loopback", None),
    ("http://017700000001/", "loopback", None),
    ("http://2130706433/", "loopback", None),
    ("http://127.0.0.1./", "loopback", None),
    ("http://0/", "unspecified", None),
    ("http://0.0.0.0:8000/", "unspecified", None),
    ("http://[::1]/", "loopback", None),
    ("http://[::]/", "unspecified", None),
    (
        "http://[::ffff:127.0.0.1]/",
        "IPv4-mapped IPv6 address embedding 127.0.0.1, a loopback",
        None,
    ),
    ("http://[::127.0.0.1]/", "IPv4-compatible", None),
    # Other IPv6 special ranges.
    ("http://[fe80::1%25eth0]/", "zone id; the address is a link-local", None),
    ("http://[fe80::1]/", "link-local", None),
    ("http://[fd12:3456:789a::1]/", "unique local address", None),
    ("http://[fec0::1]/", "site-local", None),
    ("http://[ff02::1]/", "multicast", None),
    ("http://[2001:db8::1]/", "documentation", None),
    ("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "Teredo", None),
    ("http://[100::1]/", "discard-only", None),
    # Internal names.
    ("http://printer.local/", "blocked host name", None),
    ("http://db.internal/", "blocked host name", None),
    ("http://router.home.arpa/", "blocked host name", None),
    ("http://intranet/", "single-label name", None),
    # Schemes other than http(s).
    ("file:///etc/passwd", "scheme 'file' is not allowed", None),
    ("ftp://example.com/pub/", "scheme 'ftp' is not allowed", None),
    ("gopher://example.com:70/_GET", "scheme 'gopher' is not allowed", None),
    ("data:text/html,<script>alert(1)</script>", "scheme 'data' is not allowed", None),
    ("javascript:alert(1)", "scheme 'javascript' is not allowed", None),
    ("dict://127.0.0.1:11211/stats", "scheme 'dict' is not allowed", None),
    ("//example.com/no-scheme", "scheme '(none)' is not allowed", None),
    # Credentials and parser confusion.
    ("http://user:pass@example.com/", "credentials", None),
    ("http://example.com@169.254.169.254/", "credentials", None),
    ("http://@example.com/", "credentials", None),
    ("http://example.com\\@127.0.0.1/", "backslashes", None),
    ("http://127。0。0。1/", "parsers disagree", None),
    # Empty and garbage hosts.
    ("", "empty", None),
    ("http://", "no host", None),
    ("http:///etc/passwd", "no host", None),
    ("http://example.com:99999/", "port 99999 is out of range", None),
    ("http://%31%32%37.0.0.1/", "characters not allowed", None),
    ("http://1.2.3.4.5/", "ambiguous numeric host", None),
    ("http://09.1/", "ambiguous numeric host", None),
    ("http://09.1.1.1/", "cannot be parsed", None),
    ("http://exa mple.com/", "whitespace", None),
    ("http://[::1/", "cannot be parsed", None),
    ("http://localhost../", "empty label", None),
    ("http://" + "a" * 64 + ".example.com/", "not a valid DNS name", None),
    # Public-looking names whose answers are not public.
    ("http://innocent.example.com/", "resolves to 10.0.0.5, which is a private", ("10.0.0.5",)),
    (
        "http://mixed.example.com/",
        "resolves to 192.168.0.10, which is a private",
        (PUBLIC_V4, "192.168.0.10"),
    ),
    ("http://six.example.com/", "resolves to ::1, which is a loopback", ("::1",)),
    ("http://meta.example.com/", "cloud metadata endpoint", ("169.254.169.254",)),
    ("http://ll.example.com/", "link-local", ("fe80::1%eth0",)),
    ("http://mapped.example.com/", "IPv4-mapped", ("::ffff:10.0.0.1",)),
    ("http://garbage.example.com/", "not an IP address", ("not-an-ip",)),
]


@pytest.mark.parametrize(
    ("url", "rule", "resolved"), HOSTILE, ids=[c[0] or "<empty>" for c in HOSTILE]
)
def test_hostile_urls_are_refused_with_the_rule_they_break(
    url: str, rule: str, resolved: tuple[str, ...] | None
) -> None:
    resolver = answers(*resolved) if resolved is not None else no_resolving
    with pytest.raises(UnsafeUrl) as caught:
        check_url(url, resolver=resolver)
    message = str(caught.value)
    assert rule.lower() in message.lower()
    assert repr(url) in message  # names the URL
    assert "publicly routable" in message  # and says what to do


def test_hostile_table_is_large_enough() -> None:
    assert len(HOSTILE) >= 40


@pytest.mark.parametrize(
    ("url", "resolved", "expected"),
    [
        ("https://example.com/a?b=1", (PUBLIC_V4, PUBLIC_V6), [PUBLIC_V4, PUBLIC_V6]),
        ("http://8.8.8.8/", None, [OTHER_V4]),
        ("http://134744072/", None, [OTHER_V4]),  # 8.8.8.8 in decimal
        ("http://[2606:4700:4700::1111]/", None, ["2606:4700:4700::1111"]),
        ("http://[64:ff9b::808:808]/", None, ["64:ff9b::808:808"]),  # NAT64 of 8.8.8.8
        ("https://EXAMPLE.com./", (PUBLIC_V4,), [PUBLIC_V4]),
    ],
)
def test_public_urls_pass(url: str, resolved: tuple[str, ...] | None, expected: list[str]) -> None:
    resolver = answers(*resolved) if resolved is not None else no_resolving
    assert [str(a) for a in check_url(url, resolver=resolver)] == expected


def test_resolver_gets_the_ascii_name_and_port() -> None:
    calls: list[tuple[str, int]] = []

    def resolver(host: str, port: int) -> list[str]:
        calls.append((host, port))
        return [PUBLIC_V4]

    check_url("https://bücher.example:8443/", resolver=resolver)
    check_url("https://example.com./", resolver=resolver)
    assert calls == [("xn--bcher-kva.example", 8443), ("example.com", 443)]


def test_a_failed_lookup_is_a_fetch_error_not_an_unsafe_url() -> None:
    def offline(host: str, port: int) -> list[str]:
        raise socket.gaierror(-3, "Temporary failure in name resolution")

    with pytest.raises(FetchError, match="offline or unreachable") as caught:
        check_url("https://example.com/", resolver=offline)
    assert isinstance(caught.value.__cause__, socket.gaierror)


def test_public_url_is_sent_to_the_checked_address_with_the_original_host() -> None:
    handler = Recorder(page("hello world"))
    result = safe_get(
        "https://example.com/docs?q=1",
        resolver=answers(PUBLIC_V4),
        transport=handler.transport,
    )

    assert result == FetchResult(
        url="https://example.com/docs?q=1",
        final_url="https://example.com/docs?q=1",
        status_code=200,
        content_type="text/html; charset=utf-8",
        text="hello world",
        bytes_read=11,
        truncated=False,
        redirects=[],
    )
    (request,) = handler.requests
    assert request.url.host == PUBLIC_V4  # connected to the pinned IP
    assert request.url.scheme == "https"
    assert request.url.raw_path == b"/docs?q=1"
    assert request.headers["host"] == "example.com"  # the server still sees its name
    assert request.extensions["sni_hostname"] == "example.com"  # and TLS checks the name
    assert request.headers["user-agent"] == fetch.DEFAULT_USER_AGENT
    assert request.headers["accept-encoding"] == "identity"


def test_ipv6_answer_and_explicit_port_are_pinned_too() -> None:
    handler = Recorder(page())
    safe_get("https://example.com:8443/", resolver=answers(PUBLIC_V6), transport=handler.transport)
    (request,) = handler.requests
    assert request.url.host == PUBLIC_V6
    assert request.url.port == 8443
    assert request.headers["host"] == "example.com:8443"


def test_ip_literal_url_sends_no_sni_name() -> None:
    handler = Recorder(page())
    safe_get("https://8.8.8.8/", resolver=no_resolving, transport=handler.transport)
    (request,) = handler.requests
    assert request.url.host == OTHER_V4
    assert request.headers["host"] == OTHER_V4
    assert "sni_hostname" not in request.extensions


def test_dns_rebinding_cannot_swap_the_address_after_the_check() -> None:
    calls: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return [PUBLIC_V4] if len(calls) == 1 else ["127.0.0.1"]

    handler = Recorder(page("public"))
    result = safe_get("http://rebind.example.com/", resolver=rebinding, transport=handler.transport)

    assert result.text == "public"
    assert calls == ["rebind.example.com"]  # resolved once; the connection reuses that answer
    assert [r.url.host for r in handler.requests] == [PUBLIC_V4]
    assert handler.requests[0].headers["host"] == "rebind.example.com"


def test_dns_rebinding_between_redirect_hops_is_caught() -> None:
    calls: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return [PUBLIC_V4] if len(calls) == 1 else ["127.0.0.1"]

    handler = Recorder(redirect("/again"))
    with pytest.raises(UnsafeUrl, match=r"redirect 1 .*resolves to 127\.0\.0\.1.*loopback"):
        safe_get("http://rebind.example.com/", resolver=rebinding, transport=handler.transport)
    assert [r.url.host for r in handler.requests] == [PUBLIC_V4]


def test_redirects_are_followed_and_every_hop_is_pinned() -> None:
    resolved: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        resolved.append(host)
        return [PUBLIC_V4] if host == "example.com" else [OTHER_V4]

    handler = Recorder(
        redirect("/moved", 301),
        redirect("https://www.example.org/final", 308),
        page("arrived"),
    )
    result = safe_get("http://example.com/start", resolver=resolver, transport=handler.transport)

    assert result.text == "arrived"
    assert result.final_url == "https://www.example.org/final"
    assert result.redirects == ["http://example.com/moved", "https://www.example.org/final"]
    assert resolved == ["example.com", "example.com", "www.example.org"]
    assert [(r.url.host, r.headers["host"]) for r in handler.requests] == [
        (PUBLIC_V4, "example.com"),
        (PUBLIC_V4, "example.com"),
        (OTHER_V4, "www.example.org"),
    ]


@pytest.mark.parametrize(
    ("location", "rule"),
    [
        ("http://169.254.169.254/latest/meta-data/iam/", "cloud metadata endpoint"),
        ("http://[::ffff:10.0.0.1]/", "IPv4-mapped"),
        ("http://localhost:6379/", "blocked host name"),
        ("file:///etc/passwd", "scheme 'file'"),
        ("http://internal-looking.example.net/", "resolves to 10.1.2.3"),
    ],
)
def test_redirect_to_an_internal_target_is_refused_at_that_hop(location: str, rule: str) -> None:
    def resolver(host: str, port: int) -> list[str]:
        return ["10.1.2.3"] if host == "internal-looking.example.net" else [PUBLIC_V4]

    handler = Recorder(redirect(location))
    with pytest.raises(UnsafeUrl) as caught:
        safe_get("https://example.com/go", resolver=resolver, transport=handler.transport)
    message = str(caught.value)
    assert "redirect 1 from 'https://example.com/go'" in message
    assert location in message
    assert rule in message
    assert len(handler.requests) == 1  # the internal target was never contacted


def test_redirect_loop_stops_at_max_redirects() -> None:
    handler = Recorder(redirect("/loop"))
    with pytest.raises(FetchError, match=r"redirected more than 3 times.*redirect loop"):
        safe_get(
            "http://example.com/loop",
            max_redirects=3,
            resolver=answers(PUBLIC_V4),
            transport=handler.transport,
        )
    assert len(handler.requests) == 4  # the first request plus three followed redirects


def test_zero_max_redirects_refuses_the_first_redirect() -> None:
    handler = Recorder(redirect("/elsewhere"))
    with pytest.raises(FetchError, match="more than 0 times"):
        safe_get(
            "http://example.com/",
            max_redirects=0,
            resolver=answers(PUBLIC_V4),
            transport=handler.transport,
        )


def test_unsafe_start_url_sends_nothing() -> None:
    handler = Recorder(page())
    with pytest.raises(UnsafeUrl, match="private"):
        safe_get("http://10.0.0.1/", resolver=no_resolving, transport=handler.transport)
    assert handler.requests == []


def test_body_over_the_cap_is_truncated() -> None:
    handler = Recorder(page("x" * 10_000, "text/plain"))
    result = safe_get(
        "http://example.com/big",
        max_bytes=1_000,
        resolver=answers(PUBLIC_V4),
        transport=handler.transport,
    )
    assert (result.truncated, result.bytes_read, result.text) == (True, 1_000, "x" * 1_000)


def test_body_of_exactly_the_cap_is_not_truncated() -> None:
    handler = Recorder(page("y" * 500, "text/plain"))
    result = safe_get(
        "http://example.com/",
        max_bytes=500,
        resolver=answers(PUBLIC_V4),
        transport=handler.transport,
    )
    assert (result.truncated, result.bytes_read) == (False, 500)


def test_an_endless_body_is_read_only_up_to_the_cap() -> None:
    pulled: list[int] = []

    def endless() -> Iterator[bytes]:
        while True:
            pulled.append(1)
            yield b"z" * 4096

    handler = Recorder(
        httpx.Response(200, content=endless(), headers={"Content-Type": "text/plain"})
    )
    result = safe_get(
        "http://example.com/stream",
        max_bytes=10_000,
        resolver=answers(PUBLIC_V4),
        transport=handler.transport,
    )
    assert result.truncated and result.bytes_read == 10_000
    assert len(pulled) == 3  # 4096 + 4096 + part of the third chunk, then it stopped


def test_a_cut_inside_a_multibyte_character_drops_the_fragment() -> None:
    handler = Recorder(page("é" * 10, "text/plain; charset=utf-8"))  # 2 bytes each
    result = safe_get(
        "http://example.com/",
        max_bytes=5,
        resolver=answers(PUBLIC_V4),
        transport=handler.transport,
    )
    assert result.text == "éé" and result.truncated


def test_declared_charset_is_used() -> None:
    body = "café".encode("latin-1")
    response = httpx.Response(
        200, content=body, headers={"Content-Type": "text/plain; charset=latin-1"}
    )
    handler = Recorder(response)
    result = safe_get(
        "http://example.com/", resolver=answers(PUBLIC_V4), transport=handler.transport
    )
    assert result.text == "café"


@pytest.mark.parametrize(("status", "advice"), [(404, "check the URL"), (503, "try again later")])
def test_non_2xx_raises_fetch_error_with_the_status(status: int, advice: str) -> None:
    handler = Recorder(redirect("/gone"), httpx.Response(status))
    with pytest.raises(FetchError) as caught:
        safe_get("http://example.com/", resolver=answers(PUBLIC_V4), transport=handler.transport)
    error = caught.value
    assert error.status_code == status
    assert error.url == "http://example.com/gone"
    assert f"after 1 redirect(s) answered {status}" in str(error)
    assert advice in str(error)
    assert isinstance(error, KbflowError) and isinstance(error, RuntimeError)


def test_connect_error_is_reported_as_offline_or_unreachable() -> None:
    handler = Recorder(httpx.ConnectError("[Errno 101] Network is unreachable"))
    with pytest.raises(FetchError, match="offline or unreachable") as caught:
        safe_get("http://example.com/", resolver=answers(PUBLIC_V4), transport=handler.transport)
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    assert caught.value.status_code is None


def test_connect_error_falls_back_to_the_next_checked_address() -> None:
    handler = Recorder(httpx.ConnectError("no route (IPv6)"), page("via v4"))
    result = safe_get(
        "http://example.com/",
        resolver=answers(PUBLIC_V6, PUBLIC_V4),
        transport=handler.transport,
    )
    assert result.text == "via v4"
    assert [r.url.host for r in handler.requests] == [PUBLIC_V6, PUBLIC_V4]


def test_read_timeout_is_a_fetch_error() -> None:
    handler = Recorder(httpx.ReadTimeout("timed out"))
    with pytest.raises(FetchError, match=re.escape("took longer than 2.5s")):
        safe_get(
            "http://example.com/",
            timeout_s=2.5,
            resolver=answers(PUBLIC_V4),
            transport=handler.transport,
        )


def test_the_deadline_covers_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(fetch, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    def slow() -> Iterator[bytes]:
        while True:
            clock[0] += 1.0  # each chunk takes a (fake) second
            yield b"drip"

    handler = Recorder(httpx.Response(200, content=slow()))
    with pytest.raises(FetchError, match=re.escape("took longer than 3.0s")):
        safe_get(
            "http://example.com/",
            timeout_s=3.0,
            resolver=answers(PUBLIC_V4),
            transport=handler.transport,
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_bytes": 0}, "max_bytes must be greater than 0"),
        ({"timeout_s": 0}, "timeout_s must be greater than 0"),
        ({"max_redirects": -1}, "max_redirects must be >= 0"),
    ],
)
def test_bad_limits_are_config_errors(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        safe_get("http://example.com/", resolver=no_resolving, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, ssl.SSLContext, list[str]]]:
    """An HTTPS server on 127.0.0.1 with a certificate for ``kbflow.test`` only.

    Yields its port, a client context that trusts it, and the SNI names it was sent.
    """
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kbflow.test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("kbflow.test")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    (tmp_path / "cert.pem").write_bytes(cert_pem)
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    sni_seen: list[str] = []

    def record_sni(sock: ssl.SSLObject, sni: str | None, ctx: ssl.SSLContext) -> None:
        sni_seen.append(sni or "")

    server_ctx.sni_callback = record_sni

    class EchoHost(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f"host={self.headers['Host']} path={self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EchoHost)
    server.socket = server_ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client_ctx = ssl.create_default_context(cadata=cert_pem.decode())
    try:
        yield server.server_address[1], client_ctx, sni_seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def allow_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the guard pass 127.0.0.1 so a real socket can stand in for a public server."""
    real = fetch._blocked_reason
    monkeypatch.setattr(fetch, "_blocked_reason", lambda a: None if a.is_loopback else real(a))


@pytest.mark.integration
@pytest.mark.usefixtures("allow_loopback")
def test_pinning_works_over_real_tls(tls_server: tuple[int, ssl.SSLContext, list[str]]) -> None:
    port, client_ctx, sni_seen = tls_server
    with httpx.HTTPTransport(verify=client_ctx) as transport:
        result = safe_get(
            f"https://kbflow.test:{port}/page?x=1",
            resolver=answers("127.0.0.1"),
            transport=transport,
        )
    # Connected to the pinned IP, yet TLS verified the name and the server saw the name.
    assert result.text == f"host=kbflow.test:{port} path=/page?x=1"
    assert sni_seen == ["kbflow.test"]


@pytest.mark.integration
@pytest.mark.usefixtures("allow_loopback")
def test_certificate_is_checked_against_the_host_name_not_the_ip(
    tls_server: tuple[int, ssl.SSLContext, list[str]],
) -> None:
    port, client_ctx, _ = tls_server
    with httpx.HTTPTransport(verify=client_ctx) as transport, pytest.raises(FetchError) as caught:
        safe_get(
            f"https://impostor.test:{port}/",
            resolver=answers("127.0.0.1"),
            transport=transport,
        )
    assert "TLS handshake failed" in str(caught.value)
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)


# -- allow_loopback (website / REST source tests) and conditional requests ---------------------


@pytest.mark.parametrize(
    ("url", "resolved"),
    [
        ("http://127.0.0.1:8080/", None),
        ("http://127.9.9.9/", None),
        ("http://[::1]/", None),
        ("http://localhost/", ("127.0.0.1", "::1")),
    ],
)
def test_loopback_is_refused_by_default_and_allowed_with_the_flag(
    url: str, resolved: tuple[str, ...] | None
) -> None:
    resolver = answers(*resolved) if resolved is not None else no_resolving
    with pytest.raises(UnsafeUrl, match=r"loopback|blocked host name"):
        check_url(url, resolver=resolver)
    with pytest.raises(UnsafeUrl):
        safe_get(url, resolver=resolver, transport=Recorder(page()).transport)
    assert check_url(url, resolver=resolver, allow_loopback=True)
    result = safe_get(
        url, resolver=resolver, transport=Recorder(page()).transport, allow_loopback=True
    )
    assert result.status_code == 200


@pytest.mark.parametrize(
    ("url", "resolved", "rule"),
    [
        ("http://10.0.0.1/", None, "private"),
        ("http://169.254.169.254/latest/meta-data/", None, "cloud metadata endpoint"),
        ("http://[::ffff:127.0.0.1]/", None, "IPv4-mapped"),
        ("http://0.0.0.0/", None, "unspecified"),
        ("http://[fe80::1]/", None, "link-local"),
        ("http://localhost.localdomain/", None, "blocked host name"),
        ("http://metadata.google.internal/", None, "blocked host name"),
        ("http://localhost/", ("10.0.0.1",), "private"),  # the name passes, not its answers
        ("http://localhost/", ("127.0.0.1", "169.254.169.254"), "cloud metadata"),
        ("http://example.com/", ("192.168.1.1",), "private"),
    ],
)
def test_allow_loopback_opens_loopback_only(
    url: str, resolved: tuple[str, ...] | None, rule: str
) -> None:
    resolver = answers(*resolved) if resolved is not None else no_resolving
    with pytest.raises(UnsafeUrl, match=rule):
        check_url(url, resolver=resolver, allow_loopback=True)
    handler = Recorder(page())
    with pytest.raises(UnsafeUrl, match=rule):
        safe_get(url, resolver=resolver, transport=handler.transport, allow_loopback=True)
    assert handler.requests == []


def test_allow_loopback_still_checks_every_redirect_hop() -> None:
    handler = Recorder(redirect("http://10.0.0.1/admin"), page())
    with pytest.raises(UnsafeUrl, match=r"redirect 1 .* is blocked.*private"):
        safe_get(
            "http://127.0.0.1/",
            resolver=no_resolving,
            transport=handler.transport,
            allow_loopback=True,
        )
    assert len(handler.requests) == 1


def test_check_url_shape_takes_allow_loopback() -> None:
    with pytest.raises(UnsafeUrl, match="loopback"):
        fetch.check_url_shape("http://127.0.0.1/")
    fetch.check_url_shape("http://127.0.0.1/", allow_loopback=True)
    with pytest.raises(UnsafeUrl, match="private"):
        fetch.check_url_shape("http://10.0.0.1/", allow_loopback=True)


def test_result_keeps_the_body_bytes_and_lower_case_headers() -> None:
    body = "café".encode()
    handler = Recorder(
        httpx.Response(200, content=body, headers={"Content-Type": "text/plain", "ETag": '"v1"'})
    )
    result = safe_get(
        "http://example.com/", resolver=answers(PUBLIC_V4), transport=handler.transport
    )
    assert result.content == body
    assert result.text == "café"
    assert result.headers["etag"] == '"v1"'
    assert result.headers["content-type"] == "text/plain"


def test_extra_headers_are_sent_and_a_conditional_304_is_a_result() -> None:
    handler = Recorder(httpx.Response(304, headers={"ETag": '"v1"'}))
    result = safe_get(
        "http://example.com/",
        resolver=answers(PUBLIC_V4),
        transport=handler.transport,
        headers={"If-None-Match": '"v1"', "if-modified-since": "Mon, 01 Jan 2024 00:00:00 GMT"},
    )
    assert (result.status_code, result.text, result.content, result.bytes_read) == (304, "", b"", 0)
    assert result.headers["etag"] == '"v1"'
    (request,) = handler.requests
    assert request.headers["if-none-match"] == '"v1"'
    assert request.headers["if-modified-since"] == "Mon, 01 Jan 2024 00:00:00 GMT"
    assert request.headers["accept-encoding"] == "identity"


def test_a_304_to_an_unconditional_request_is_still_an_error() -> None:
    handler = Recorder(httpx.Response(304))
    with pytest.raises(FetchError) as caught:
        safe_get(
            "http://example.com/",
            resolver=answers(PUBLIC_V4),
            transport=handler.transport,
            headers={"Accept-Language": "en"},
        )
    assert caught.value.status_code == 304
    assert handler.requests[0].headers["accept-language"] == "en"


def test_extra_headers_replace_defaults_case_insensitively() -> None:
    handler = Recorder(page())
    safe_get(
        "http://example.com/",
        resolver=answers(PUBLIC_V4),
        transport=handler.transport,
        headers={"accept": "application/pdf"},
    )
    assert handler.requests[0].headers.get_list("accept") == ["application/pdf"]


@pytest.mark.parametrize("name", ["Host", "accept-encoding", "Content-Length", "Transfer-Encoding"])
def test_headers_that_would_undo_the_guard_are_refused(name: str) -> None:
    handler = Recorder(page())
    with pytest.raises(ConfigError, match="cannot be set on a guarded fetch"):
        safe_get(
            "http://example.com/",
            resolver=answers(PUBLIC_V4),
            transport=handler.transport,
            headers={name: "x"},
        )
    assert handler.requests == []
