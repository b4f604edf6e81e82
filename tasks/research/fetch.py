# Over 500 lines: the SSRF guard and the bounded fetch are one security boundary, reviewed as one.
"""Fetch one public web page for research, guarded against SSRF and bounded in size and time.

`check_url` decides whether a URL may be fetched: http(s) only, no credentials, no internal host
names, and every address the host resolves to must be publicly routable. Numeric hosts are
normalised the way browsers and ``inet_aton`` read them (``2852039166``, ``0251.0376.0251.0376``,
``0xA9FEA9FE``, ``127.1``) before they are checked, and IPv6 addresses that embed an IPv4 address
(IPv4-mapped, NAT64, 6to4) are judged by the address they embed.

`safe_get` connects to the address `check_url` approved, never to a fresh DNS answer: the request
URL is rewritten to that IP while the ``Host`` header and the TLS server name (httpcore's
``sni_hostname`` extension, which also drives certificate hostname checks) keep the original
host. A DNS-rebinding server therefore cannot swap in an internal address between the check and
the connection. Redirects are followed by hand, and every hop is checked and pinned again.

One module on purpose: the URL check and the pinned connection are one SSRF guarantee.

``allow_loopback`` (website and REST source tests, ``KBFLOW_SOURCES_TEST_ALLOW_LOOPBACK``) opens
exactly one hole: 127.0.0.0/8, ``::1`` and the name ``localhost``. Every other private, reserved
or metadata address and every other blocked name stays refused.
"""

from __future__ import annotations

import codecs
import contextlib
import ipaddress
import logging
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import httpx

from core.errors import ConfigError, KbflowError, UnsafeUrl
from core.http import tls_context

logger = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]
"""Resolves ``(host, port)`` to address strings, e.g. ``["93.184.215.14", "2606:2800::1"]``."""

DEFAULT_USER_AGENT = "kbflow-research/0.1 (+research fetch; respects max_bytes)"
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
CONDITIONAL_HEADERS = frozenset({"if-none-match", "if-modified-since"})
"""Request headers that make a 304 Not Modified answer a result rather than an error."""

_ADVICE = (
    "Only http(s) URLs whose host resolves to publicly routable addresses can be fetched; "
    "use the document's public URL, or add the file through the ingest folder instead."
)
_ALLOWED_SCHEMES = frozenset({"http", "https"})
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")

# Names that reach the local machine, the local network or a cloud provider's control plane.
_BLOCKED_NAMES = frozenset(
    {
        "localhost",
        "localhost.localdomain",
        "ip6-localhost",
        "ip6-loopback",
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.com",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.tencentyun.com",
        "kubernetes.default",
        "kubernetes.default.svc",
    }
)
_BLOCKED_SUFFIXES = (
    ".localhost",
    ".local",
    ".localdomain",
    ".internal",
    ".intranet",
    ".lan",
    ".home.arpa",
    ".arpa",
    ".svc.cluster.local",
    ".cluster.local",
)

# Checked first so the message names the endpoint, even where a range below also covers it.
_METADATA_ADDRESSES: dict[IPAddress, str] = {
    ipaddress.ip_address("169.254.169.254"): "AWS/GCP/Azure/OCI instance metadata",
    ipaddress.ip_address("169.254.170.2"): "AWS ECS task metadata",
    ipaddress.ip_address("169.254.169.253"): "AWS VPC DNS",
    ipaddress.ip_address("169.254.169.123"): "AWS time sync",
    ipaddress.ip_address("169.254.0.23"): "Tencent Cloud metadata",
    ipaddress.ip_address("100.100.100.200"): "Alibaba Cloud metadata",
    ipaddress.ip_address("192.0.0.192"): "Oracle Cloud metadata",
    # Publicly numbered, but answered by the Azure host itself.
    ipaddress.ip_address("168.63.129.16"): "Azure WireServer",
    ipaddress.ip_address("fd00:ec2::254"): "AWS instance metadata (IPv6)",
    ipaddress.ip_address("fd00:ec2::23"): "AWS ECS/time sync (IPv6)",
    ipaddress.ip_address("fd00:ec2::253"): "AWS VPC DNS (IPv6)",
}


def _nets(
    *rows: tuple[str, str],
) -> tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...]:
    return tuple((ipaddress.ip_network(net), rule) for net, rule in rows)


# Order matters: the first matching row names the rule in the error message.
_IPV4_BLOCKED = _nets(
    ("0.0.0.0/32", "the unspecified address"),
    ("0.0.0.0/8", "in 'this network' 0.0.0.0/8"),
    ("10.0.0.0/8", "a private address (RFC 1918)"),
    ("100.64.0.0/10", "carrier-grade NAT shared space (CGNAT, 100.64.0.0/10)"),
    ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local address"),
    ("172.16.0.0/12", "a private address (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments (192.0.0.0/24)"),
    ("192.0.2.0/24", "a documentation address (TEST-NET-1)"),
    ("192.88.99.0/24", "the deprecated 6to4 relay anycast range"),
    ("192.168.0.0/16", "a private address (RFC 1918)"),
    ("198.18.0.0/15", "a benchmarking address (198.18.0.0/15)"),
    ("198.51.100.0/24", "a documentation address (TEST-NET-2)"),
    ("203.0.113.0/24", "a documentation address (TEST-NET-3)"),
    ("224.0.0.0/4", "a multicast address"),
    ("255.255.255.255/32", "the broadcast address"),
    ("240.0.0.0/4", "a reserved address (240.0.0.0/4)"),
)
_IPV6_BLOCKED = _nets(
    ("::/128", "the unspecified address"),
    ("::1/128", "a loopback address"),
    ("::ffff:0:0:0/96", "an IPv4-translated address (::ffff:0:0:0/96)"),
    ("::/96", "a deprecated IPv4-compatible address (::/96)"),
    ("64:ff9b:1::/48", "a local-use NAT64 address (64:ff9b:1::/48)"),
    ("100::/64", "a discard-only address (100::/64)"),
    ("2001::/32", "a Teredo tunnel address (2001::/32)"),
    ("2001:2::/48", "a benchmarking address (2001:2::/48)"),
    ("2001::/23", "IETF protocol assignments (2001::/23)"),
    ("2001:db8::/32", "a documentation address (2001:db8::/32)"),
    ("3fff::/20", "a documentation address (3fff::/20)"),
    ("5f00::/16", "an SRv6 SID (5f00::/16)"),
    ("fc00::/7", "a unique local address (ULA, fc00::/7)"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a deprecated site-local address (fec0::/10)"),
    ("ff00::/8", "a multicast address"),
    # Everything routable on the internet lives in 2000::/3; the rest is reserved or special.
    ("::/0", "outside global unicast space 2000::/3"),
)
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
# What ``allow_loopback`` lets through, and nothing more: not ::ffff:127.0.0.1, not 0.0.0.0.
_LOOPBACK_V4 = ipaddress.IPv4Network("127.0.0.0/8")
_LOOPBACK_V6 = ipaddress.IPv6Address("::1")
_LOOPBACK_NAME = "localhost"
# Caller headers that would undo the pinning (Host) or the byte cap (compressed bodies).
_PROTECTED_HEADERS = frozenset({"host", "accept-encoding", "content-length", "transfer-encoding"})


class FetchError(KbflowError, RuntimeError):
    """A fetch failed: offline, unreachable, timed out, too many redirects or a non-2xx answer.

    Attributes:
        url: The URL being fetched when it failed (the last hop for redirects).
        status_code: The HTTP status of a non-2xx answer; ``None`` when no answer came.
        transient: Trying again later may work: a timeout, a connection that failed after the
            name resolved, a 429 or a 5xx. A name that does not resolve (offline, or no such
            host), a TLS failure, a 4xx or a redirect loop is not: retrying cannot help.
    """

    def __init__(
        self, message: str, *, url: str, status_code: int | None = None, transient: bool = False
    ) -> None:
        super().__init__(message)
        self.url = url
        self.status_code = status_code
        self.transient = transient


class RedirectRefused(UnsafeUrl):
    """A redirect the caller's ``follow`` refused (e.g. to another site): nothing was sent to
    its target.

    Attributes:
        url: The hop that answered with the redirect.
        target: Where it pointed.
    """

    def __init__(self, message: str, *, url: str, target: str) -> None:
        super().__init__(message)
        self.url = url
        self.target = target


@dataclass(frozen=True)
class FetchResult:
    """One fetched page: where it ended up, what it said and how it got there.

    Attributes:
        url: The URL asked for.
        final_url: The URL that answered, after redirects.
        status_code: The final (2xx) HTTP status, or 304 when a conditional request (``headers``
            with ``If-None-Match`` / ``If-Modified-Since``) was answered Not Modified.
        content_type: The ``Content-Type`` header, or ``""``.
        text: The body decoded with its declared charset (UTF-8 if none), at most ``max_bytes``.
        bytes_read: Body bytes kept (never more than ``max_bytes``).
        truncated: True when the body went on past ``max_bytes``.
        redirects: Each redirect target, in order.
        headers: The final answer's headers, keys in lower case (``etag``, ``last-modified``).
        content: The body bytes kept, undecoded (``text`` is these, decoded); ``b""`` for a 304.
    """

    url: str
    final_url: str
    status_code: int
    content_type: str
    text: str
    bytes_read: int
    truncated: bool
    redirects: list[str] = field(default_factory=list)
    # Left out of ==: they add nothing to what identifies a fetch (the body is in ``text``).
    headers: dict[str, str] = field(default_factory=dict, compare=False)
    content: bytes = field(default=b"", compare=False, repr=False)


def system_resolver(host: str, port: int) -> list[str]:
    """Resolve ``host`` with the system resolver (``socket.getaddrinfo``), keeping its order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def check_url(
    url: str, *, resolver: Resolver | None = None, allow_loopback: bool = False
) -> list[IPAddress]:
    """Check that ``url`` is safe to fetch and return the addresses a fetch may connect to.

    Args:
        url: An absolute http(s) URL.
        resolver: Turns ``(host, port)`` into address strings; defaults to `system_resolver`.
            Not called for IP-literal hosts or for hosts refused by name.
        allow_loopback: Also pass 127.0.0.0/8, ``::1`` and the name ``localhost`` (for tests
            that serve a site on this machine). Nothing else that is refused becomes allowed.

    Returns:
        The host's addresses, in resolver order, every one of them publicly routable.

    Raises:
        UnsafeUrl: The URL breaks a rule; the message names the URL, the host and the rule.
        FetchError: The host name could not be resolved (offline, or no such name).
    """
    parsed = _parse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    literal, name = _checked_host(url, parsed, allow_loopback=allow_loopback)
    if literal is not None:
        return [literal]

    try:
        answers = (resolver or system_resolver)(name, port)
    except OSError as exc:
        raise FetchError(
            f"could not resolve {name!r} for {url!r}: {exc} — offline or unreachable, or the name "
            "does not exist; check the URL and the network, then try again",
            url=url,
        ) from exc
    if not answers:
        raise FetchError(
            f"{name!r} resolved to no addresses for {url!r} — offline or unreachable; "
            "check the URL and try again",
            url=url,
        )
    addresses: list[IPAddress] = []
    for answer in answers:
        try:
            address = ipaddress.ip_address(answer.split("%", 1)[0])
        except ValueError as exc:
            raise _unsafe(
                url, f"resolver answered {answer!r} for {name!r}, not an IP address"
            ) from exc
        # One bad answer taints the name: a later connection attempt could land on it.
        _refuse_address(url, name, address, resolved=True, allow_loopback=allow_loopback)
        addresses.append(address)
    return list(dict.fromkeys(addresses))


def check_url_shape(url: str, *, allow_loopback: bool = False) -> None:
    """Every rule of `check_url` that needs no name lookup: the scheme, credentials, an address
    written as the host (private, loopback, metadata), blocked and single-label names. What is
    stored to be fetched later (a seed bundle's URLs) is checked by this when stored, offline or
    not; the fetch checks again, with the addresses the name resolves to. ``allow_loopback`` is
    as for `check_url`.

    Raises:
        UnsafeUrl: The URL breaks a rule; the message names the URL, the host and the rule.
    """
    _checked_host(url, _parse(url), allow_loopback=allow_loopback)


def _checked_host(
    url: str, parsed: httpx.URL, *, allow_loopback: bool = False
) -> tuple[IPAddress | None, str]:
    """The URL's host as an address (when it is written as one) and as a name, once both pass
    the rules that need no lookup."""
    host = parsed.raw_host.decode("ascii")
    literal = _host_literal(url, host)
    if literal is not None:
        _refuse_address(url, host, literal, resolved=False, allow_loopback=allow_loopback)
        return literal, host
    name = host.removesuffix(".")
    if allow_loopback and name == _LOOPBACK_NAME:
        # Only the name is let through: what it resolves to is still checked, address by address.
        return None, name
    if name in _BLOCKED_NAMES or name.endswith(_BLOCKED_SUFFIXES):
        raise _unsafe(url, f"host {name!r} is a blocked host name (local, internal or metadata)")
    if len(name) > 253 or any(len(label) > 63 for label in name.split(".")):
        raise _unsafe(url, f"host {name[:80]!r}… is not a valid DNS name (too long)")
    if "." not in name:
        raise _unsafe(
            url,
            f"host {name!r} is a single-label name, which resolves through local search "
            "domains to internal machines",
        )
    return None, name


def safe_get(
    url: str,
    *,
    max_bytes: int = 2_000_000,
    timeout_s: float = 10.0,
    max_redirects: int = 5,
    resolver: Resolver | None = None,
    transport: httpx.BaseTransport | None = None,
    user_agent: str = DEFAULT_USER_AGENT,
    headers: Mapping[str, str] | None = None,
    allow_loopback: bool = False,
    follow: Callable[[str], bool] | None = None,
) -> FetchResult:
    """GET a public URL: checked, pinned to the checked address, bounded in bytes, time and hops.

    Args:
        url: An absolute http(s) URL on a public host.
        max_bytes: Body bytes to keep; a longer body is cut here and ``truncated`` is set.
        timeout_s: Time for the whole fetch, redirects included. Each network operation gets
            what is left when its hop starts, and the deadline is re-checked between body chunks.
        max_redirects: Redirects to follow before giving up.
        resolver: Name resolver, as for `check_url`.
        transport: The httpx transport to send through (tests pass ``httpx.MockTransport``). It
            is the caller's and is not closed. By default each hop gets a fresh
            ``httpx.HTTPTransport``, so no connection is reused across hosts.
        user_agent: The ``User-Agent`` header.
        headers: Extra request headers, sent on every hop (``If-None-Match``,
            ``If-Modified-Since``); they replace defaults of the same name. ``Host``,
            ``Accept-Encoding``, ``Content-Length`` and ``Transfer-Encoding`` are refused: they
            would undo the pinning or the byte cap.
        allow_loopback: As for `check_url`, on every hop.
        follow: Whether a redirect to a URL may be followed (a synced website: same site
            only); a refused one raises `RedirectRefused` before anything is sent to it.

    Returns:
        The page and how it was reached. When ``headers`` hold a conditional header and the
        server answers 304 Not Modified, a result with ``status_code`` 304 and no body.

    Raises:
        UnsafeUrl: The URL, or a redirect hop, breaks a `check_url` rule (`RedirectRefused`:
            ``follow`` refused a hop).
        FetchError: Offline or unreachable, timed out, too many redirects, or a non-2xx answer
            (``status_code`` is set for the latter; a 304 to an unconditional request is one).
        ConfigError: A limit is not positive, or ``headers`` name a protected header.
    """
    if max_bytes <= 0:
        raise ConfigError(f"max_bytes must be greater than 0. Currently it is {max_bytes}.")
    if timeout_s <= 0:
        raise ConfigError(f"timeout_s must be greater than 0. Currently it is {timeout_s}.")
    if max_redirects < 0:
        raise ConfigError(f"max_redirects must be >= 0. Currently it is {max_redirects}.")

    request_headers = _request_headers(user_agent, headers)
    conditional = any(name.lower() in CONDITIONAL_HEADERS for name in request_headers)

    deadline = time.monotonic() + timeout_s
    redirects: list[str] = []
    current, previous, location = url, url, None
    while True:
        try:
            addresses = check_url(current, resolver=resolver, allow_loopback=allow_loopback)
        except UnsafeUrl as exc:
            if not redirects:
                raise
            raise UnsafeUrl(
                f"redirect {len(redirects)} from {previous!r} to {current!r} "
                f"(Location: {location!r}) is blocked: {exc}"
            ) from exc
        if redirects and follow is not None and not follow(current):
            # After the guard's own check, so that an unsafe hop is still said to be unsafe.
            raise RedirectRefused(
                f"{previous!r} redirects to {current!r}, which this fetch may not follow "
                "(another site); nothing was sent there",
                url=previous,
                target=current,
            )
        with _hop_transport(transport) as hop:
            response = _send_pinned(hop, current, addresses, request_headers, deadline, timeout_s)
            try:
                if conditional and response.status_code == 304:
                    return _not_modified(url, current, response, redirects)
                location = response.headers.get("location")
                if response.status_code not in REDIRECT_STATUSES or not location:
                    return _finish(
                        url, current, response, redirects, max_bytes, deadline, timeout_s
                    )
            finally:
                response.close()
        try:
            target = str(httpx.URL(current).join(location))
        except httpx.InvalidURL as exc:
            raise UnsafeUrl(
                f"redirect from {current!r} points to {location!r}, which is not a valid URL: "
                f"{exc}. {_ADVICE}"
            ) from exc
        redirects.append(target)
        if len(redirects) > max_redirects:
            raise FetchError(
                f"{url!r} redirected more than {max_redirects} times (last hop {current!r} -> "
                f"{target!r}); it is probably a redirect loop — fetch the final URL directly or "
                "raise max_redirects",
                url=current,
            )
        logger.debug("redirect %d: %s -> %s", len(redirects), current, target)
        previous, current = current, target


def _request_headers(user_agent: str, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The default request headers with the caller's on top, protected ones refused."""
    headers = {
        "User-Agent": user_agent,
        "Accept": "text/html,text/plain,application/xhtml+xml,*/*;q=0.5",
        # Compressed bodies could expand far past max_bytes inside a single decoded chunk.
        "Accept-Encoding": "identity",
    }
    for name, value in (extra or {}).items():
        if name.lower() in _PROTECTED_HEADERS:
            raise ConfigError(
                f"header {name!r} cannot be set on a guarded fetch: it would undo the address "
                "pinning or the byte cap; leave it out (safe_get sets it)"
            )
        for default in [d for d in headers if d.lower() == name.lower()]:
            del headers[default]
        headers[name] = value
    return headers


def _parse(url: str) -> httpx.URL:
    """Parse ``url`` with httpx (what will send it) and refuse anything ambiguous."""
    if not isinstance(url, str) or not url:
        raise _unsafe(url, "the URL is empty")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F or ch == "\\" for ch in url):
        raise _unsafe(url, "the URL contains whitespace, control characters or backslashes")
    try:
        split = urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise _unsafe(url, f"the URL cannot be parsed ({exc})") from exc
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        # httpx refuses dotted forms with leading zeros (octal); say what they would reach.
        _refuse_numeric_host(url, split)
        raise _unsafe(url, f"the URL cannot be parsed ({exc})") from exc
    if parsed.scheme not in _ALLOWED_SCHEMES:
        raise _unsafe(
            url, f"scheme {parsed.scheme or '(none)'!r} is not allowed (http or https only)"
        )
    if "@" in split.netloc or parsed.userinfo:
        raise _unsafe(url, "the URL carries credentials (user info before '@'), which can mislead")
    if not parsed.raw_host:
        raise _unsafe(url, "the URL has no host")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise _unsafe(url, f"port {parsed.port} is out of range 1-65535")
    # Two parsers must see the same host; a disagreement is how filter bypasses start.
    other = (split.hostname or "").removesuffix(".")
    if other != parsed.host.removesuffix("."):
        raise _unsafe(url, f"parsers disagree on the host ({other!r} vs {parsed.host!r})")
    return parsed


def _refuse_numeric_host(url: str, split: urllib.parse.SplitResult) -> None:
    """Raise the address rule a numeric host breaks, if it is numeric and breaks one."""
    host = split.hostname
    if split.scheme not in _ALLOWED_SCHEMES or not host or split.username is not None:
        return
    literal = None
    with contextlib.suppress(UnsafeUrl):
        literal = _host_literal(url, host)
    if literal is not None:
        _refuse_address(url, host, literal, resolved=False)


def _host_literal(url: str, host: str) -> IPAddress | None:
    """The address an IP-literal host denotes, reading numeric IPv4 forms like ``inet_aton``."""
    if ":" in host:
        address, _, zone = host.partition("%")
        try:
            literal = ipaddress.IPv6Address(address)
        except ValueError as exc:
            raise _unsafe(url, f"host {host!r} is not a valid IPv6 address") from exc
        if zone:
            # Zone ids only mean something for link-local addresses, which are refused anyway.
            reason = _blocked_reason(literal) or "an address that needs no zone id"
            raise _unsafe(url, f"host {host!r} carries an IPv6 zone id; the address is {reason}")
        return literal
    if not set(host) <= _HOST_CHARS:
        raise _unsafe(url, f"host {host!r} contains characters not allowed in a host name")
    labels = host.removesuffix(".").split(".")
    if "" in labels:
        raise _unsafe(url, f"host {host!r} has an empty label")
    if not _is_number(labels[-1]):
        return None
    # WHATWG URL / inet_aton: a host ending in a number is an IPv4 address or it is invalid.
    numbers = [_parse_number(label) for label in labels]
    if len(numbers) > 4 or any(n is None for n in numbers):
        raise _unsafe(url, f"host {host!r} is an ambiguous numeric host, not a valid IPv4 address")
    parts = [n for n in numbers if n is not None]
    last_bits = 8 * (5 - len(parts))
    if any(n > 255 for n in parts[:-1]) or parts[-1] >= 1 << last_bits:
        raise _unsafe(url, f"host {host!r} is an out-of-range numeric host")
    value = parts[-1]
    for index, part in enumerate(parts[:-1]):
        value |= part << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _is_number(label: str) -> bool:
    return label.isdigit() or (label[:2] in ("0x", "0X") and _parse_number(label) is not None)


def _parse_number(label: str) -> int | None:
    """One IPv4 part as WHATWG reads it: ``0x`` hex, leading ``0`` octal, else decimal."""
    try:
        if label[:2] in ("0x", "0X"):
            return int(label[2:] or "0", 16)
        if len(label) > 1 and label.startswith("0"):
            return int(label[1:], 8)
        return int(label, 10) if label.isdigit() else None
    except ValueError:
        return None


def _refuse_address(
    url: str, host: str, address: IPAddress, *, resolved: bool, allow_loopback: bool = False
) -> None:
    if allow_loopback and _is_loopback(address):
        return
    reason = _blocked_reason(address)
    if reason is None:
        return
    where = f"host {host!r} resolves to {address}" if resolved else f"host {host!r} is {address}"
    raise _unsafe(url, f"{where}, which is {reason}")


def _blocked_reason(address: IPAddress) -> str | None:
    """Why ``address`` must not be fetched from, or ``None`` when it is publicly routable."""
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        address = ipaddress.IPv6Address(str(address).split("%", 1)[0])
    if address in _METADATA_ADDRESSES:
        return f"a cloud metadata endpoint ({_METADATA_ADDRESSES[address]})"
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            kind, inner = embedded
            inner_reason = _blocked_reason(inner)
            # Judged by the IPv4 address it carries: that is where the packets end up.
            return f"{kind} embedding {inner}, {inner_reason}" if inner_reason else None
        table = _IPV6_BLOCKED
        if address in _GLOBAL_UNICAST_V6:
            table = table[:-1]
    else:
        table = _IPV4_BLOCKED
    for network, rule in table:
        if address in network:
            return rule
    if not address.is_global:
        # Python's own registry catches special ranges the tables above do not list.
        return "not globally routable"
    return None


def _is_loopback(address: IPAddress) -> bool:
    """127.0.0.0/8 or ``::1`` exactly: no mapped, embedded or zoned spelling of either."""
    if isinstance(address, ipaddress.IPv4Address):
        return address in _LOOPBACK_V4
    return not address.scope_id and address == _LOOPBACK_V6


def _embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    if address.ipv4_mapped is not None:
        return "an IPv4-mapped IPv6 address", address.ipv4_mapped
    if address in _NAT64_WELL_KNOWN:
        return "a NAT64 address", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _SIX_TO_FOUR and address.sixtofour is not None:
        return "a 6to4 address", address.sixtofour
    return None


def _unsafe(url: object, detail: str) -> UnsafeUrl:
    return UnsafeUrl(f"refusing to fetch {url!r}: {detail}. {_ADVICE}")


@contextlib.contextmanager
def _hop_transport(transport: httpx.BaseTransport | None) -> Iterator[httpx.BaseTransport]:
    """The caller's transport as is, or a fresh one per hop (its pool is keyed by IP, not host).

    The fresh ones share one TLS context (`core.http.tls_context`): building a context loads the CA
    bundle, ~19 ms, which was most of an unchanged website sync's time. A context holds no
    connection, so sharing it reuses nothing across hosts: each hop still connects anew,
    pinned to its checked address, and verifies the certificate against its own host name."""
    if transport is not None:
        yield transport
        return
    with httpx.HTTPTransport(retries=0, verify=tls_context()) as own:
        yield own


def _send_pinned(
    transport: httpx.BaseTransport,
    url: str,
    addresses: list[IPAddress],
    headers: dict[str, str],
    deadline: float,
    timeout_s: float,
) -> httpx.Response:
    """Send GET ``url`` to the first checked address that accepts a connection."""
    parsed = httpx.URL(url)
    host = parsed.raw_host.decode("ascii")
    by_name = _host_literal(url, host) is None
    request_headers = dict(headers)
    if by_name:
        request_headers["Host"] = parsed.netloc.decode("ascii")
    last_error: httpx.TransportError | None = None
    for address in addresses:
        remaining = _remaining(deadline, url, timeout_s)
        extensions: dict[str, object] = {"timeout": httpx.Timeout(remaining).as_dict()}
        if by_name:
            # TLS: send the name as SNI and verify the certificate against it, not the IP.
            extensions["sni_hostname"] = host.removesuffix(".")
        request = httpx.Request(
            "GET",
            parsed.copy_with(host=str(address)),
            headers=request_headers,
            extensions=extensions,
        )
        logger.debug("GET %s via %s", url, address)
        try:
            response = transport.handle_request(request)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            last_error = exc  # try the host's next checked address
            continue
        except httpx.TimeoutException as exc:
            raise _timed_out(url, timeout_s) from exc
        except httpx.TransportError as exc:
            raise _unreachable(url, f"{address}", exc) from exc
        response.request = request
        return response
    tried = ", ".join(str(a) for a in addresses)
    raise _unreachable(url, tried, last_error) from last_error


def _finish(
    url: str,
    final_url: str,
    response: httpx.Response,
    redirects: list[str],
    max_bytes: int,
    deadline: float,
    timeout_s: float,
) -> FetchResult:
    if not 200 <= response.status_code < 300:
        after = f" after {len(redirects)} redirect(s)" if redirects else ""
        advice = (
            "the server failed or is rate limiting; try again later"
            if response.status_code >= 500 or response.status_code == 429
            else "check the URL; the page may be gone or need a login"
        )
        raise FetchError(
            f"GET {final_url!r}{after} answered {response.status_code} "
            f"{response.reason_phrase}: {advice}",
            url=final_url,
            status_code=response.status_code,
            transient=response.status_code >= 500 or response.status_code == 429,
        )
    body, truncated = _read_capped(response, max_bytes, deadline, final_url, timeout_s)
    encoding = response.charset_encoding or "utf-8"
    try:
        decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    except LookupError:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    # A cut body may end inside a multi-byte character: leave the fragment out, don't mangle it.
    text = decoder.decode(body, final=not truncated)
    return FetchResult(
        url=url,
        final_url=final_url,
        status_code=response.status_code,
        content_type=response.headers.get("content-type", ""),
        text=text,
        bytes_read=len(body),
        truncated=truncated,
        redirects=list(redirects),
        headers=_lower_headers(response),
        content=body,
    )


def _not_modified(
    url: str, final_url: str, response: httpx.Response, redirects: list[str]
) -> FetchResult:
    """The 304 answer to a conditional request: the caller's copy is current; no body."""
    return FetchResult(
        url=url,
        final_url=final_url,
        status_code=304,
        content_type=response.headers.get("content-type", ""),
        text="",
        bytes_read=0,
        truncated=False,
        redirects=list(redirects),
        headers=_lower_headers(response),
    )


def _lower_headers(response: httpx.Response) -> dict[str, str]:
    """Response headers keyed in lower case; repeated headers joined with ``, ``."""
    return {name.lower(): value for name, value in response.headers.items()}


def _read_capped(
    response: httpx.Response, max_bytes: int, deadline: float, url: str, timeout_s: float
) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in response.iter_bytes():
            if not chunk:
                continue
            room = max_bytes - size
            if len(chunk) > room:
                chunks.append(chunk[:room])
                return b"".join(chunks), True
            chunks.append(chunk)
            size += len(chunk)
            _remaining(deadline, url, timeout_s)
    except httpx.TimeoutException as exc:
        raise _timed_out(url, timeout_s) from exc
    except (httpx.TransportError, httpx.DecodingError) as exc:
        raise _unreachable(url, "the server", exc) from exc
    return b"".join(chunks), False


def _remaining(deadline: float, url: str, timeout_s: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _timed_out(url, timeout_s)
    return remaining


def _timed_out(url: str, timeout_s: float) -> FetchError:
    return FetchError(
        f"fetching {url!r} took longer than {timeout_s}s — the server is slow, or offline or "
        "unreachable; try again later or raise timeout_s",
        url=url,
        transient=True,
    )


def _unreachable(url: str, where: str, exc: BaseException | None) -> FetchError:
    detail = f"{type(exc).__name__}: {exc}" if exc is not None else "no address to try"
    if _caused_by_tls(exc):
        return FetchError(
            f"could not fetch {url!r} from {where}: the TLS handshake failed ({detail}) — the "
            "certificate is invalid or not for this host; check the URL (do not fall back to "
            "plain http)",
            url=url,
        )
    return FetchError(
        f"could not fetch {url!r} from {where} — offline or unreachable ({detail}); check the "
        "network and try again",
        url=url,
        transient=True,
    )


def _caused_by_tls(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, ssl.SSLError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
