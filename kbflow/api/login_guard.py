"""The inbox login's guards. What keeps a flood of logins from costing the agents anything: a
rate per client address, a rate for all clients together, and a small cap on password checks
running at once.

An argon2id check takes 64 MiB and a core's worth of time for a moment; forty logins in
parallel took `kbflow serve` from 430 MB to 2.7 GB and another org's answers from 0.1 s to
seconds. So every login attempt, whatever user id it names (known or not), first takes a token
of its client's bucket (429 past it) and of the global one (503 past it), then one of
``login_max_hashing`` slots, without waiting: a request that finds them all taken is answered
503 with Retry-After at once instead of queueing in a worker thread. The limits are per
`kbflow serve` process; the lockout per login name (`sinks.registry.logins`) is in the registry
and holds across processes. And the login page says why someone was sent to it only by a known
reason code (`LOGIN_REASONS`), never by text from its link.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from fastapi import Request

from core.settings import InboxSettings
from kbflow.api.auth import service_of
from kbflow.api.limits import RateLimited, TokenBuckets

LOGIN_REASONS = {
    "logged-out": "This session was logged out: log in again.",
    "expired": "This session expired: log in again.",
    "idle": "This session was idle too long: log in again.",
    "gone": "This session's user no longer exists.",
}
"""What the login page may say about why someone was sent to it, by the code in its ``why``
parameter; any other ``why`` shows nothing (a link cannot put text of its own on the page)."""
MAX_CLIENTS = 10_000
"""Client addresses whose buckets are kept; past it, those that have refilled are forgotten."""
HASHING_RETRY_S = 2


def reason_code(message: str | None) -> str | None:
    """The code of a session refusal's message (`LoginsRepository.session_for`) in
    `LOGIN_REASONS`; None for any other (not logged in at all: nothing to say)."""
    said = (message or "").strip().lower()
    return next((code for code, text in LOGIN_REASONS.items() if text.lower() == said), None)


@dataclass(frozen=True)
class LoginRefused:
    """Why a login attempt was not checked: its HTTP status, a message and when to retry."""

    status: int
    message: str
    retry_after_s: int


class LoginGuard:
    """The login limits of one `kbflow serve` process (see the module docstring).

    >>> guard = LoginGuard(InboxSettings(login_client_burst=1))
    >>> guard.admit("10.0.0.1") is None, guard.admit("10.0.0.1").status
    (True, 429)
    """

    def __init__(self, settings: InboxSettings) -> None:
        self.per_client = TokenBuckets(
            settings.login_client_per_minute, settings.login_client_burst
        )
        self.overall = TokenBuckets(settings.login_global_per_minute, settings.login_global_burst)
        self.hashing = threading.BoundedSemaphore(settings.login_max_hashing)

    def admit(self, client: str) -> LoginRefused | None:
        """Take one attempt of ``client``'s rate and of the global one: None when both allow
        it, else the refusal to answer (the password is then not checked)."""
        self._forget_idle_clients()
        try:
            self.per_client.take(client)
        except RateLimited as exc:
            return LoginRefused(
                429,
                "Too many login attempts from your address. Wait a moment, then try again "
                f"(in {exc.retry_after_s} s).",
                exc.retry_after_s,
            )
        try:
            self.overall.take("all")
        except RateLimited as exc:
            return LoginRefused(
                503,
                "The login is busy right now. Wait a moment, then try again "
                f"(in {exc.retry_after_s} s).",
                exc.retry_after_s,
            )
        return None

    @contextmanager
    def hashing_slot(self) -> Iterator[LoginRefused | None]:
        """One of the password-check slots for the ``with`` block, or (when all are taken)
        the refusal to answer at once: yields None when a slot is held."""
        if not self.hashing.acquire(blocking=False):
            yield LoginRefused(
                503,
                "The login is busy right now. Wait a moment, then try again "
                f"(in {HASHING_RETRY_S} s).",
                HASHING_RETRY_S,
            )
            return
        try:
            yield None
        finally:
            self.hashing.release()

    def _forget_idle_clients(self) -> None:
        """Drop the buckets that have refilled once too many addresses are kept (a flood
        from many addresses must not grow this process without bound)."""
        buckets = self.per_client
        if len(buckets._state) <= MAX_CLIENTS:
            return
        now = time.monotonic()
        full_after = buckets.burst / (buckets.per_minute / 60.0)
        with buckets._lock:
            for key, (_, at) in list(buckets._state.items()):
                if now - at >= full_after:
                    del buckets._state[key]
            if len(buckets._state) > 2 * MAX_CLIENTS:  # all busy: start afresh, globally held
                buckets._state.clear()


_MADE = threading.Lock()


def guard_of(request: Request) -> LoginGuard:
    """This process's login limits, made from its settings on first use."""
    state = request.app.state
    with _MADE:
        guard: LoginGuard | None = getattr(state, "login_guard", None)
        if guard is None:
            guard = state.login_guard = LoginGuard(service_of(request).settings.inbox)
    return guard


def client_of(request: Request) -> str:
    """The client's address; behind a proxy on this machine the one it forwards (uvicorn takes
    X-Forwarded-For from loopback only), so each client has its own bucket there too."""
    return request.client.host if request.client else "unknown"
