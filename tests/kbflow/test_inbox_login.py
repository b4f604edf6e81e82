"""The review inbox's login under attack (findings 7, 11 and 16 of a hostile review): floods are
refused before any password is checked, and never with more than two checks at once; unknown
and known user ids get the same answers; the login page prints no text from its link; and no
way of setting a password takes a short or common one.

The inbox's router runs in this process (FastAPI's TestClient) on a real SQLite registry,
without the store or the model: the login needs only the settings and the registry.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, Literal

import pytest
from argon2 import PasswordHasher
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from core.models import AuditAction, Role
from core.settings import Settings
from kbflow.api import inbox
from sinks.registry import SqlRegistry, logins

pytestmark = pytest.mark.integration

PASSWORD = "likes-long-kestrel-phrases"
UNLIMITED = {
    "login_client_per_minute": 10_000,
    "login_client_burst": 10_000,
    "login_global_per_minute": 10_000,
    "login_global_burst": 10_000,
}


@pytest.fixture
def people(registry: SqlRegistry) -> SqlRegistry:
    registry.people.ensure_org("acme")
    registry.people.ensure_user("root", Role.SUPERADMIN)
    registry.people.ensure_user("amy", Role.ACCOUNT_MANAGER)
    registry.people.assign_am("acme", "amy")
    registry.logins.set_password("amy", PASSWORD, actor="root")
    return registry


def _app(settings: Settings, registry: SqlRegistry, **changes: Any) -> FastAPI:
    app = FastAPI()
    app.include_router(inbox.router)
    ctx = SimpleNamespace(registry=registry)
    app.state.service = SimpleNamespace(settings=Settings(home=settings.home, **changes), ctx=ctx)
    return app


@pytest.fixture
def client_of(settings: Settings, people: SqlRegistry) -> Iterator[Any]:
    """Browsers at given addresses on one app: ``client_of(address, **settings)``."""
    apps: dict[str, FastAPI] = {}

    def make(address: str = "10.0.0.1", **changes: Any) -> TestClient:
        key = repr(sorted(changes.items()))
        app = apps.setdefault(key, _app(settings, people, **changes))
        return TestClient(app, client=(address, 40000), follow_redirects=False)

    yield make


def _log_in(client: TestClient, user: str, password: str) -> Any:
    page = client.get("/review/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf, page.text[:2000]
    return client.post(
        "/review/login", data={"user": user, "password": password, "csrf": csrf.group(1)}
    )


def _failures(registry: SqlRegistry) -> int:
    return sum(r.action == AuditAction.LOGIN_FAILED.value for r in registry.audit.audit_trail(None))


class _SlowHasher(PasswordHasher):
    """argon2 that holds each verification a moment and counts how many run at once."""

    def __init__(self) -> None:
        super().__init__()
        self.running = self.most = self.verified = 0
        self._lock = threading.Lock()

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        with self._lock:
            self.running += 1
            self.verified += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.5)
            return super().verify(hash, password)
        finally:
            with self._lock:
                self.running -= 1


# --- finding 7: floods are refused unchecked -------------------------------------------------


def test_a_flood_from_one_address_is_refused_before_any_password_is_checked(
    client_of: Any, people: SqlRegistry
) -> None:
    """Unknown user ids (each new, so no lockout applies) from one address: past its burst, a
    429 with Retry-After and no password check; another address still gets its own."""
    attacker = client_of("203.0.113.7", login_client_burst=3, login_client_per_minute=1)
    answers = [_log_in(attacker, f"nobody{i}", "guess-guess-guess") for i in range(5)]
    assert [a.status_code for a in answers] == [401, 401, 401, 429, 429]
    assert int(answers[3].headers["retry-after"]) >= 1
    assert _failures(people) == 3  # the refused ones were never checked
    # the right password from the same address is refused too, until the rate allows it
    assert _log_in(attacker, "amy", PASSWORD).status_code == 429
    other = client_of("198.51.100.2", login_client_burst=3, login_client_per_minute=1)
    assert _log_in(other, "amy", PASSWORD).status_code == 303


def test_a_flood_from_many_addresses_meets_the_global_rate(
    client_of: Any, people: SqlRegistry
) -> None:
    limits = {**UNLIMITED, "login_global_burst": 3, "login_global_per_minute": 1}
    answers = [
        _log_in(client_of(f"203.0.113.{i}", **limits), f"nobody{i}", "guess-guess-guess")
        for i in range(5)
    ]
    assert [a.status_code for a in answers] == [401, 401, 401, 503, 503]
    assert int(answers[3].headers["retry-after"]) >= 1
    assert _failures(people) == 3


def test_parallel_logins_never_hash_more_than_two_passwords_at_once(
    client_of: Any, people: SqlRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight logins at once (unknown ids, from eight addresses): at most two argon2 checks
    run together; the others are answered 503 with Retry-After at once, not queued."""
    hasher = _SlowHasher()
    monkeypatch.setattr(logins, "_hasher", hasher)
    clients = [client_of(f"203.0.113.{i}", **UNLIMITED) for i in range(8)]
    pages = [c.get("/review/login") for c in clients]
    start = threading.Barrier(len(clients))
    answers: list[Any] = []

    def post(client: TestClient, page: Any) -> None:
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf
        start.wait(timeout=30)
        answers.append(client.post("/review/login", data={
            "user": f"nobody-{id(client)}", "password": "guess-guess-guess",
            "csrf": csrf.group(1)}))  # fmt: skip

    pairs = zip(clients, pages, strict=True)
    threads = [threading.Thread(target=post, args=pair) for pair in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(answers) == 8
    assert hasher.most <= 2, f"{hasher.most} password checks ran at once"
    busy = [a for a in answers if a.status_code == 503]
    assert len(busy) == 8 - hasher.verified and busy
    assert all(int(a.headers["retry-after"]) >= 1 for a in busy)
    assert sorted({a.status_code for a in answers}) == [401, 503]


# --- finding 11: unknown and known ids answered alike ----------------------------------------


def _shape(answer: Any, user: str) -> tuple[int, str, dict[str, str]]:
    """An answer with what differs by chance masked: the CSRF token, the typed id, the wait."""

    def mask(text: str) -> str:
        text = re.sub(r"kbflow_login_csrf=[^;]+", "kbflow_login_csrf=TOKEN", text)
        text = re.sub(r'name="csrf" value="[^"]+"', 'name="csrf" value="TOKEN"', text)
        text = re.sub(r"try again in \d+ s", "try again in N s", text)
        return text.replace(f'value="{user}"', 'value="ID"')

    headers = {k: mask(v) for k, v in answer.headers.items() if k not in ("date", "x-request-id")}
    return answer.status_code, mask(answer.text), headers


def test_unknown_and_known_user_ids_get_the_same_answers(
    client_of: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five wrong passwords for amy and for zed (no such user; same length): the same
    statuses, pages and headers each time, the lockout included; and an unknown id costs an
    argon2 verification, as a known one does (against a dummy hash)."""
    shapes: dict[str, list[tuple[int, str, dict[str, str]]]] = {}
    for user in ("amy", "zed"):
        client = client_of("192.0.2.1", login_max_failures=3, login_lock_s=600, **UNLIMITED)
        shapes[user] = [
            _shape(_log_in(client, user, f"wrong-password-number-{i}"), user) for i in range(5)
        ]
    assert [s[0] for s in shapes["amy"]] == [401] * 5
    assert "too many failed logins" in shapes["amy"][-1][1]
    for i, (known, unknown) in enumerate(zip(shapes["amy"], shapes["zed"], strict=True)):
        assert known == unknown, f"attempt {i + 1} tells amy (real) from zed (unknown)"
    hasher = _SlowHasher()
    monkeypatch.setattr(logins, "_hasher", hasher)
    fresh = client_of("192.0.2.2", **UNLIMITED)
    assert _log_in(fresh, "nobody-at-all", "wrong-password-number-1").status_code == 401
    assert hasher.verified == 1


# --- finding 16: no text from the link, no weak password --------------------------------------


def test_the_login_page_shows_only_known_reasons(client_of: Any, people: SqlRegistry) -> None:
    browser = client_of(**UNLIMITED)
    planted = "Your account is suspended. Call +1 555 0100 to restore it"
    page = browser.get("/review/login", params={"why": planted})
    assert page.status_code == 200 and "suspended" not in page.text and "555" not in page.text
    assert "This session expired" in browser.get("/review/login?why=expired").text
    # a logged-out session is sent to the login page with a code, not its message
    secret, _ = people.logins.start_session("amy", absolute_s=3600)
    people.logins.end_session(secret)
    browser.cookies.set(inbox.SESSION_COOKIE, secret)
    where = browser.get("/review").headers["location"]
    assert where.endswith("&why=logged-out"), where
    assert "This session was logged out" in browser.get(where).text


def test_the_password_page_refuses_a_short_or_common_password(
    client_of: Any, people: SqlRegistry
) -> None:
    browser = client_of(**UNLIMITED)
    assert _log_in(browser, "amy", PASSWORD).status_code == 303
    for weak in ("password12", "1234567890", "password1234", "123456789012", "amy-is-reviewing"):
        page = browser.get("/review/password")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf
        answer = browser.post(
            "/review/password",
            data={"csrf": csrf.group(1), "current": PASSWORD, "new": weak, "again": weak},
        )
        assert answer.status_code == 400, weak
        assert "Nothing was changed" in answer.text
    assert people.logins.check_password("amy", PASSWORD, max_failures=5, lock_s=60)[0].id == "amy"


def test_the_cli_refuses_a_short_or_common_password(
    settings: Settings, people: SqlRegistry
) -> None:
    from kbflow.cli import app

    runner = CliRunner()
    for weak in ("password12", "1234567890", "qwertyuiop12"):
        result = runner.invoke(
            app, ["users", "set-password", "amy", "--as", "root", "--password-stdin"],
            input=weak + "\n",
        )  # fmt: skip
        assert result.exit_code != 0, (weak, result.output)
    assert people.logins.check_password("amy", PASSWORD, max_failures=5, lock_s=60)[0].id == "amy"
    ok = runner.invoke(
        app, ["users", "set-password", "amy", "--as", "root", "--password-stdin"],
        input="three unrelated lantern words\n",
    )  # fmt: skip
    assert ok.exit_code == 0, ok.output
