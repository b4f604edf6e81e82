"""Passwords, inbox sessions and one-time review codes in the registry, on real SQLite (and
PostgreSQL in its pass): nothing secret stored in the clear, lockout after failures, sessions
that end (idle, absolute, logout) on the server, and codes that work once, for one org (and
run), before they expire — two redeemers of one code: one wins."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Literal

import pytest
from argon2 import PasswordHasher
from sqlalchemy import select, update

from core.errors import ConfigError, Unauthorized
from core.models import AuditAction, Role
from sinks.registry import SqlRegistry, logins
from sinks.registry.logins import BAD_LOGIN, normalize_code
from sinks.registry.schema import (
    AuditRow,
    ReviewCodeRow,
    UserLoginRow,
    WebSessionRow,
    utcnow,
)

PASSWORD = "correct horse battery"
RUN = "0c1d2e3f-0000-4000-8000-000000000001"
OTHER_RUN = "0c1d2e3f-0000-4000-8000-000000000002"


@pytest.fixture
def people(registry: SqlRegistry) -> SqlRegistry:
    registry.people.ensure_org("acme")
    registry.people.ensure_org("other")
    registry.people.ensure_user("amy", Role.ACCOUNT_MANAGER, org_id="acme")
    registry.people.assign_am("acme", "amy")
    registry.people.ensure_user("root", Role.SUPERADMIN)
    return registry


def actions(registry: SqlRegistry) -> list[str]:
    with registry.session() as s:
        return list(s.scalars(select(AuditRow.action).order_by(AuditRow.id)))


def check(registry: SqlRegistry, user: str, password: str, **kw: float) -> str:
    limits = {"max_failures": 5, "lock_s": 900, **kw}
    try:
        found, _ = registry.logins.check_password(user, password, **limits)  # type: ignore[arg-type]
    except Unauthorized as exc:
        return str(exc)
    return found.id


# --- passwords ---------------------------------------------------------------------------------


def test_a_password_is_stored_as_an_argon2_hash_and_checks(people: SqlRegistry) -> None:
    people.logins.set_password("amy", PASSWORD, actor="root")
    with people.session() as s:
        row = s.get(UserLoginRow, "amy")
        assert row is not None and row.password_hash is not None
        assert row.password_hash.startswith("$argon2id$")
        assert PASSWORD not in row.password_hash
    assert check(people, "amy", PASSWORD) == "amy"
    assert AuditAction.PASSWORD_SET.value in actions(people)
    assert AuditAction.LOGGED_IN.value in actions(people)


def test_a_weak_password_is_refused_and_nothing_is_stored(people: SqlRegistry) -> None:
    weak_ones = (
        "short", "amy", "aaaaaaaaaaaaaaa", "x" * 2000,
        # finding 16: short, common, sequences, the user id inside
        "password12", "1234567890", "password1234", "123456789012", "qwertyuiop12",
        "p@ssw0rd2024!", "abcabcabcabc", "amy-reviews-drafts",
    )  # fmt: skip
    for weak in weak_ones:
        with pytest.raises(ConfigError):
            people.logins.set_password("amy", weak, actor="root")
    assert not people.logins.login_state("amy").has_password


def test_wrong_password_and_unknown_user_get_one_message(people: SqlRegistry) -> None:
    people.logins.set_password("amy", PASSWORD, actor="root")
    assert check(people, "amy", PASSWORD + "!") == BAD_LOGIN
    assert check(people, "nobody", PASSWORD) == BAD_LOGIN
    assert check(people, "root", PASSWORD) == BAD_LOGIN  # a user without a password
    assert actions(people).count(AuditAction.LOGIN_FAILED.value) == 3


def test_failures_slow_down_then_lock_and_a_reset_unlocks(people: SqlRegistry) -> None:
    people.logins.set_password("amy", PASSWORD, actor="root")
    assert check(people, "amy", "wrong password 1", backoff_after=99) == BAD_LOGIN
    assert check(people, "amy", "wrong password 2", backoff_after=99) == BAD_LOGIN
    assert check(people, "amy", "wrong password 3", max_failures=3, backoff_after=99) == BAD_LOGIN
    # Locked now: even the right password is refused until the lock ends.
    assert "too many failed logins" in check(people, "amy", PASSWORD)
    assert AuditAction.LOGIN_LOCKED.value in actions(people)
    people.logins.set_password("amy", PASSWORD, actor="root")  # a superadmin's reset
    assert check(people, "amy", PASSWORD) == "amy"


def test_backoff_makes_the_next_attempt_wait(people: SqlRegistry) -> None:
    people.logins.set_password("amy", PASSWORD, actor="root")
    assert check(people, "amy", "wrong password 1", backoff_after=1) == BAD_LOGIN
    assert "try again in" in check(people, "amy", PASSWORD, backoff_after=1)


def test_concurrent_guesses_are_all_counted(people: SqlRegistry) -> None:
    people.logins.set_password("amy", PASSWORD, actor="root")
    threads = [
        threading.Thread(
            target=check,
            args=(people, "amy", f"wrong password {i}"),
            kwargs={"max_failures": 100, "backoff_after": 100},
        )
        for i in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert people.logins.login_state("amy").failed_attempts == 6


class _SlowCountingHasher(PasswordHasher):
    """argon2 as the registry uses it, counting each verification and holding it a moment, so
    that guesses sent together are all in flight together."""

    def __init__(self) -> None:
        super().__init__()
        self.verified = 0
        self._count = threading.Lock()

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        with self._count:
            self.verified += 1
        time.sleep(0.05)
        return super().verify(hash, password)


def test_parallel_guesses_check_at_most_max_failures_per_lock_window(
    people: SqlRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 6: 30 guesses at once, 29 wrong and the right one: each attempt is reserved in
    the registry before its password is verified, so at most 5 are checked; the others are
    refused as locked unchecked (the right one gets in only if it was among the 5)."""
    people.logins.set_password("amy", PASSWORD, actor="root")
    hasher = _SlowCountingHasher()
    monkeypatch.setattr(logins, "_hasher", hasher)
    start = threading.Barrier(30)
    answers: list[str] = []

    def guess(password: str) -> None:
        start.wait(timeout=30)
        answers.append(check(people, "amy", password, max_failures=5, backoff_after=99))

    guesses = [f"wrong password {i}" for i in range(29)] + [PASSWORD]
    threads = [threading.Thread(target=guess, args=(g,)) for g in guesses]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(answers) == 30
    assert hasher.verified <= 5, f"{hasher.verified} of 30 parallel guesses were checked"
    got_in = answers.count("amy")
    assert answers.count(BAD_LOGIN) + got_in == hasher.verified
    refused = [a for a in answers if a.startswith("too many failed logins")]
    assert len(refused) == 30 - hasher.verified
    assert actions(people).count(AuditAction.LOGIN_FAILED.value) == hasher.verified - got_in


def test_a_success_clears_the_reserved_attempts(people: SqlRegistry) -> None:
    people.logins.set_password("amy", PASSWORD, actor="root")
    limits = {"max_failures": 3, "backoff_after": 99}
    for i in range(2):
        assert check(people, "amy", f"wrong password {i}", **limits) == BAD_LOGIN
    assert check(people, "amy", PASSWORD, **limits) == "amy"  # the 3rd of 3: checked
    assert people.logins.login_state("amy").failed_attempts == 0
    for i in range(2):  # a new window of 3
        assert check(people, "amy", f"wrong password {i}", **limits) == BAD_LOGIN
    assert check(people, "amy", PASSWORD, **limits) == "amy"


def test_an_unknown_user_id_is_slowed_and_locked_like_a_known_one(people: SqlRegistry) -> None:
    """Finding 11: the same failures give the same answers, whether the id exists or not."""
    people.logins.set_password("amy", PASSWORD, actor="root")
    for who in ("amy", "nobody"):
        said = [check(people, who, f"wrong password {i}", max_failures=4) for i in range(5)]
        assert said[:3] == [BAD_LOGIN] * 3
        assert said[3].startswith("too many failed logins")  # the 3rd failure: wait 1 s
        assert said[4].startswith("too many failed logins")
    assert people.logins.login_state("nobody").failed_attempts == 3


# --- sessions ----------------------------------------------------------------------------------


def test_a_session_lives_until_logout_and_not_after(people: SqlRegistry) -> None:
    secret, csrf = people.logins.start_session("amy", absolute_s=3600)
    with people.session() as s:
        assert s.get(WebSessionRow, secret) is None  # only its hash is the key
    live = people.logins.session_for(secret, idle_s=600)
    assert live.user.id == "amy" and live.csrf == csrf
    assert people.logins.end_session(secret)
    with pytest.raises(Unauthorized, match="logged out"):
        people.logins.session_for(secret, idle_s=600)
    assert not people.logins.end_session(secret)  # idempotent


def test_sessions_end_when_idle_or_past_their_absolute_expiry(people: SqlRegistry) -> None:
    idle, _ = people.logins.start_session("amy", absolute_s=3600)
    old, _ = people.logins.start_session("amy", absolute_s=3600)
    with people.session() as s, s.begin():
        past = utcnow() - dt.timedelta(hours=2)
        s.execute(update(WebSessionRow).values(last_seen_at=past))
    with pytest.raises(Unauthorized, match="idle"):
        people.logins.session_for(idle, idle_s=600)
    with people.session() as s, s.begin():
        s.execute(update(WebSessionRow).values(expires_at=utcnow() - dt.timedelta(seconds=1)))
    with pytest.raises(Unauthorized, match="expired"):
        people.logins.session_for(old, idle_s=10**6)
    with pytest.raises(Unauthorized, match="not logged in"):
        people.logins.session_for("forged", idle_s=600)


def test_a_new_password_ends_every_session(people: SqlRegistry) -> None:
    people.logins.set_password("amy", PASSWORD, actor="root")
    secret, _ = people.logins.start_session("amy", absolute_s=3600)
    people.logins.set_password("amy", PASSWORD + " two", actor="amy")
    with pytest.raises(Unauthorized, match="logged out"):
        people.logins.session_for(secret, idle_s=600)


# --- review codes ------------------------------------------------------------------------------


def test_a_code_works_once_for_its_org_and_only_its_hash_is_kept(people: SqlRegistry) -> None:
    issued = people.logins.issue_review_code("amy", "acme")
    with people.session() as s:
        stored = list(s.scalars(select(ReviewCodeRow.code_hash)))
    assert normalize_code(issued.code) not in stored and len(stored) == 1
    typed = issued.code.lower().replace("-", " ")  # as a person might type it
    with pytest.raises(Unauthorized, match="another org"):
        people.logins.redeem_review_code(issued.code, org_id="other", flow_run_id=RUN)
    assert people.logins.redeem_review_code(typed, org_id="acme", flow_run_id=RUN) == "amy"
    with pytest.raises(Unauthorized, match="already used"):
        people.logins.redeem_review_code(issued.code, org_id="acme", flow_run_id=RUN)
    trail = actions(people)
    assert AuditAction.REVIEW_CODE_ISSUED.value in trail
    assert AuditAction.REVIEW_CODE_USED.value in trail
    assert trail.count(AuditAction.REVIEW_CODE_REFUSED.value) == 2


def test_a_code_bound_to_a_run_works_only_there(people: SqlRegistry) -> None:
    issued = people.logins.issue_review_code("amy", "acme", flow_run_id=RUN)
    with pytest.raises(Unauthorized, match="another review run"):
        people.logins.redeem_review_code(issued.code, org_id="acme", flow_run_id=OTHER_RUN)
    assert people.logins.redeem_review_code(issued.code, org_id="acme", flow_run_id=RUN) == "amy"


def test_expired_missing_and_made_up_codes_are_refused(people: SqlRegistry) -> None:
    issued = people.logins.issue_review_code("amy", "acme", ttl=dt.timedelta(hours=5))
    with people.session() as s:
        row = s.scalars(select(ReviewCodeRow)).one()
        assert row.expires_at.replace(tzinfo=dt.UTC) - row.created_at.replace(
            tzinfo=dt.UTC
        ) <= dt.timedelta(minutes=15)  # capped
    with people.session() as s, s.begin():
        s.execute(update(ReviewCodeRow).values(expires_at=utcnow() - dt.timedelta(seconds=1)))
    with pytest.raises(Unauthorized, match="expired"):
        people.logins.redeem_review_code(issued.code, org_id="acme", flow_run_id=RUN)
    with pytest.raises(Unauthorized, match="no review code"):
        people.logins.redeem_review_code("", org_id="acme", flow_run_id=RUN)
    with pytest.raises(Unauthorized, match="not valid"):
        people.logins.redeem_review_code("AAAA-BBBB-CCCC", org_id="acme", flow_run_id=RUN)


def test_two_redeemers_of_one_code_one_wins(people: SqlRegistry) -> None:
    issued = people.logins.issue_review_code("amy", "acme")
    results: list[str] = []

    def redeem() -> None:
        try:
            results.append(
                people.logins.redeem_review_code(issued.code, org_id="acme", flow_run_id=RUN)
            )
        except Unauthorized:
            results.append("refused")

    threads = [threading.Thread(target=redeem) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["amy", "refused", "refused", "refused"]
