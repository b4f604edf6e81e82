"""How people prove who they are: passwords (argon2 hashes), browser sessions of the review
inbox, and one-time review codes. The registry keeps no secret in the clear: a password as an
argon2id hash, a session cookie and a review code as their sha256 (both carry 256 resp. ~60
random bits, and a code lives 15 minutes and is used once, so a fast hash gives nothing away).

- **Passwords**: :meth:`LoginsRepository.set_password` (audited; revokes the user's sessions;
  `sinks.registry.passwords` says which passwords may be chosen);
  :meth:`LoginsRepository.check_password` first reserves the attempt in ``login_attempts`` with one
  conditional ``UPDATE`` (compare-and-set), and only then verifies the password: however many
  guesses arrive at once, at most ``max_failures`` are checked per lock window. A failure
  after ``backoff_after`` makes the next attempt wait (1 s, 2 s, 4 s …); the one that reaches
  ``max_failures`` locks the login for ``lock_s`` (audited); a success clears the count. The
  attempts are kept by the name as typed, so an unknown user id is counted, slowed down and
  locked exactly like a known one, costs the same argon2 work (a dummy hash), and gets the same
  answers.
- **Sessions**: a random cookie secret per login; each has an absolute expiry and an idle
  expiry, and :meth:`LoginsRepository.end_session` revokes it on the server (a copied cookie no
  longer works after logout). Each carries its own CSRF token.
- **Review codes**: :meth:`LoginsRepository.issue_review_code` binds a code to a user, an org and
  optionally one flow run; :meth:`LoginsRepository.redeem_review_code` uses it up in one
  compare-and-set ``UPDATE`` (two runs presenting the same code: one wins), and says why a
  refused code was refused (unknown, used, expired, another org or run), audited.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import secrets
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import case, delete, or_, select, update
from sqlalchemy.exc import IntegrityError

from core.errors import ConfigError, NotFound, Unauthorized
from core.models import AuditAction, Role
from sinks.registry.audit import admin_audit
from sinks.registry.base import Repository
from sinks.registry.passwords import password_problem
from sinks.registry.records import UserRecord
from sinks.registry.schema import (
    AuditRow,
    LoginAttemptRow,
    ReviewCodeRow,
    UserLoginRow,
    UserRow,
    WebSessionRow,
    aware,
    utcnow,
)

CODE_ALPHABET = "ABCDEFGHJKMNPQRSTVWXYZ23456789"  # no 0/O, 1/I/L, U: read aloud, typed back
CODE_GROUPS = 3
CODE_GROUP_LEN = 4
CODE_TTL_MAX = dt.timedelta(minutes=15)
LAST_SEEN_EVERY = dt.timedelta(seconds=30)
BAD_LOGIN = "wrong user or password. Check both and try again."
LOGIN_KEY_MAX = 120  # the longest user id; a longer typed name is counted by its first 120

_hasher = PasswordHasher()  # argon2id with the library's current recommended parameters


@functools.cache
def _dummy_hash() -> str:
    """Verified against when the user does not exist or has no password, so that case costs the
    same time as a wrong password and does not tell an attacker which users exist. Made on the
    first login of a process, whoever logs in (argon2 takes ~0.1 s: every CLI start paid it when
    it was made at import)."""
    return _hasher.hash(secrets.token_urlsafe(16))


def _sha(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def normalize_code(code: str) -> str:
    """A review code as stored: upper case, without the spaces and dashes people type."""
    return "".join(ch for ch in code.upper() if ch.isalnum())


def code_hash(code: str) -> str:
    """What the registry keeps of a review code (its sha256, as normalised)."""
    return _sha(normalize_code(code))


GET_CODE = "get a new one with `kbflow review code --org ORG --as USER` or from the review inbox"
"""How a refused review code's message ends: where to get another."""


def code_refused(org_id: str, flow_run_id: str, reason: str) -> AuditRow:
    """The audit row of a refused review code or decision proof for run ``flow_run_id``."""
    return admin_audit(
        "(review code)", AuditAction.REVIEW_CODE_REFUSED, org_id, None,
        {"flow_run_id": flow_run_id, "reason": reason},
    )  # fmt: skip


@dataclass(frozen=True)
class LoginState:
    """Whether a user can log in with a password, without the hash."""

    user_id: str
    has_password: bool
    must_change: bool
    failed_attempts: int
    locked_until: dt.datetime | None


@dataclass(frozen=True)
class WebSession:
    """A live browser session: its user, its CSRF token and when it ends at the latest."""

    user: UserRecord
    csrf: str
    expires_at: dt.datetime
    must_change: bool


@dataclass(frozen=True)
class IssuedCode:
    """A review code as shown once to the user it was issued to."""

    code: str
    user_id: str
    org_id: str
    flow_run_id: str | None
    expires_at: dt.datetime


class LoginsRepository(Repository):
    """Passwords, browser sessions and one-time review codes (see the module docstring)."""

    # -- passwords -------------------------------------------------------------------------

    def set_password(
        self, user_id: str, password: str, *, actor: str, must_change: bool = False
    ) -> None:
        """Store ``password``'s argon2 hash for the user (audited, never the password), clear
        its failed attempts and lock, and end every session it has.

        Raises:
            NotFound: no such user.
            ConfigError: the password is too short, too long or the user id.
        """
        problem = password_problem(user_id, password)
        if problem:
            raise ConfigError(f"{problem}. Nothing was changed.")
        hashed = _hasher.hash(password)
        now = utcnow()
        with self.session() as s, s.begin():
            user = s.get(UserRow, user_id)
            if user is None:
                raise NotFound(f"user {user_id!r} does not exist (`kbflow users list`).")
            row = s.get(UserLoginRow, user_id)
            if row is None:
                row = UserLoginRow(user_id=user_id, changed_at=now)
                s.add(row)
            row.password_hash = hashed
            row.must_change = must_change
            row.failed_attempts = 0
            row.locked_until = None
            row.changed_at = now
            s.execute(delete(LoginAttemptRow).where(LoginAttemptRow.login == user_id))
            s.execute(
                update(WebSessionRow)
                .where(WebSessionRow.user_id == user_id, WebSessionRow.revoked_at.is_(None))
                .values(revoked_at=now)
            )
            s.add(
                admin_audit(
                    actor, AuditAction.PASSWORD_SET, user.org_id, None,
                    {"user_id": user_id, "must_change": must_change},
                )
            )  # fmt: skip

    def login_state(self, user_id: str) -> LoginState:
        with self.session() as s:
            row = s.get(UserLoginRow, user_id)
            tries = s.get(LoginAttemptRow, user_id[:LOGIN_KEY_MAX])
            attempts = tries.attempts if tries is not None else 0
            locked = aware(tries.locked_until) if tries and tries.locked_until else None
            if row is None:
                return LoginState(user_id, False, False, attempts, locked)
            return LoginState(
                user_id, row.password_hash is not None, row.must_change, attempts, locked
            )

    def check_password(
        self,
        user_id: str,
        password: str,
        *,
        max_failures: int,
        lock_s: float,
        backoff_after: int = 3,
    ) -> tuple[UserRecord, bool]:
        """The user and whether they must choose a new password, when ``password`` is theirs.

        The attempt is reserved (`_reserve_attempt`) before the password is verified, so at
        most ``max_failures`` checks run per lock window however many arrive at once. Known
        and unknown user ids go through the same steps, with the same argon2 work.

        Raises:
            Unauthorized: wrong user or password (one message for both), or the login is
                locked or must wait (the message says until when, the same for any id). Every
                failure is audited; the failure that reaches ``max_failures`` locks the login
                for ``lock_s``.
        """
        key = user_id[:LOGIN_KEY_MAX]
        wait = self._reserve_attempt(key, max_failures=max_failures, lock_s=lock_s)
        if wait is not None:
            raise Unauthorized(
                f"too many failed logins for this user: try again in {wait} s"
                + (" (or ask a superadmin to reset the password)." if wait > 60 else ".")
            )
        dummy = _dummy_hash()  # before the lookup: the first login costs the same for anyone
        with self.session() as s:
            user = s.get(UserRow, user_id) if user_id else None
            row = s.get(UserLoginRow, user_id) if user is not None else None
            stored = row.password_hash if row is not None else None
        try:
            ok = _hasher.verify(stored or dummy, password) and stored is not None
        except (VerificationError, InvalidHashError):
            ok = False
        if user is None or not ok:
            self._login_failed(key, user, max_failures, lock_s, backoff_after)
            raise Unauthorized(BAD_LOGIN)
        assert row is not None and stored is not None
        with self.session() as s, s.begin():
            s.execute(delete(LoginAttemptRow).where(LoginAttemptRow.login == key))
            login = s.get(UserLoginRow, user_id)
            if login is not None:
                login.failed_attempts = 0
                login.locked_until = None
                if _hasher.check_needs_rehash(stored):
                    login.password_hash = _hasher.hash(password)
            s.add(admin_audit(user_id, AuditAction.LOGGED_IN, user.org_id, None, None))
        return UserRecord(user.id, user.name, Role(user.role), user.org_id), row.must_change

    def _reserve_attempt(self, key: str, *, max_failures: int, lock_s: float) -> int | None:
        """Reserve one password check for the login name ``key``: None when reserved, else
        the seconds until one may be.

        One conditional ``UPDATE`` is the compare-and-set: it counts the attempt only while the
        login is not locked and fewer than ``max_failures`` checks were reserved in this window
        (a window whose last attempt is ``lock_s`` old starts again, so a check that never
        finished, say in a crash, does not lock anyone out for good). A name never seen gets
        its row by an ``INSERT``; of two at once, the loser counts through the ``UPDATE``.
        """
        col = LoginAttemptRow
        for _ in range(3):
            now = utcnow()
            stale = now - dt.timedelta(seconds=lock_s)
            try:
                with self.session() as s, s.begin():
                    done = s.execute(
                        update(col)
                        .where(
                            col.login == key,
                            or_(col.locked_until.is_(None), col.locked_until <= now),
                            or_(col.attempts < max_failures, col.last_at <= stale),
                        )
                        .values(
                            attempts=case((col.last_at <= stale, 1), else_=col.attempts + 1),
                            last_at=now,
                        )
                    )
                    if done.rowcount == 1:  # type: ignore[attr-defined]
                        return None
                    row = s.get(col, key)
                    if row is None:
                        s.execute(delete(col).where(col.last_at <= stale, or_(
                            col.locked_until.is_(None), col.locked_until <= now)))  # fmt: skip
                        s.add(col(login=key, attempts=1, locked_until=None, last_at=now))
                        return None
                    until = aware(row.locked_until) if row.locked_until else None
                    if until is None or until <= now:  # full: checks in flight decide it
                        until = aware(row.last_at) + dt.timedelta(seconds=lock_s)
                    return max(1, int((until - now).total_seconds()) + 1)
            except IntegrityError:  # another request added the row first: count through it
                continue
        return 1

    def _login_failed(
        self,
        key: str,
        user: UserRow | None,
        max_failures: int,
        lock_s: float,
        backoff_after: int,
    ) -> None:
        """A reserved check failed: slow down the next one, or lock the login at
        ``max_failures`` (the attempt itself was counted when it was reserved)."""
        now = utcnow()
        locked_now = False
        with self.session() as s, s.begin():
            login = s.scalar(select(LoginAttemptRow).where(LoginAttemptRow.login == key)
                             .with_for_update())  # fmt: skip
            failures = login.attempts if login is not None else 0
            if login is not None:
                held = aware(login.locked_until) if login.locked_until else None
                if failures >= max_failures:
                    login.locked_until = now + dt.timedelta(seconds=lock_s)
                    login.attempts = 0  # the next window starts when the lock ends
                    locked_now = True
                elif failures >= backoff_after:
                    wait = now + dt.timedelta(seconds=min(2 ** (failures - backoff_after), 60))
                    login.locked_until = max(wait, held) if held else wait
            s.add(
                admin_audit(
                    key or "(anonymous)", AuditAction.LOGIN_FAILED,
                    user.org_id if user is not None else None, None,
                    {"known_user": user is not None, "failures": failures},
                )
            )  # fmt: skip
            if locked_now:
                s.add(
                    admin_audit(
                        key or "(anonymous)", AuditAction.LOGIN_LOCKED,
                        user.org_id if user is not None else None, None,
                        {"locked_for_s": lock_s, "known_user": user is not None},
                    )
                )  # fmt: skip

    # -- sessions --------------------------------------------------------------------------

    def start_session(self, user_id: str, *, absolute_s: float) -> tuple[str, str]:
        """A new browser session for the user: (cookie secret, CSRF token). Only the secret's
        hash is stored; the secret is in the cookie alone."""
        secret = secrets.token_urlsafe(32)
        csrf = secrets.token_urlsafe(32)
        now = utcnow()
        with self.session() as s, s.begin():
            s.add(
                WebSessionRow(
                    id_hash=_sha(secret),
                    user_id=user_id,
                    csrf=csrf,
                    created_at=now,
                    last_seen_at=now,
                    expires_at=now + dt.timedelta(seconds=absolute_s),
                )
            )
        return secret, csrf

    def session_for(self, secret: str, *, idle_s: float) -> WebSession:
        """The live session behind a cookie.

        Raises:
            Unauthorized: no such session, logged out, past its absolute expiry, idle too
                long, or its user is gone (the message says which).
        """
        if not secret or len(secret) > 200:
            raise Unauthorized("not logged in.")
        now = utcnow()
        with self.session() as s, s.begin():
            row = s.get(WebSessionRow, _sha(secret))
            if row is None:
                raise Unauthorized("not logged in.")
            if row.revoked_at is not None:
                raise Unauthorized("this session was logged out: log in again.")
            if aware(row.expires_at) <= now:
                raise Unauthorized("this session expired: log in again.")
            if aware(row.last_seen_at) + dt.timedelta(seconds=idle_s) <= now:
                row.revoked_at = now
                raise Unauthorized("this session was idle too long: log in again.")
            user = s.get(UserRow, row.user_id)
            if user is None:
                raise Unauthorized("this session's user no longer exists.")
            if now - aware(row.last_seen_at) >= LAST_SEEN_EVERY:
                row.last_seen_at = now
            login = s.get(UserLoginRow, row.user_id)
            return WebSession(
                UserRecord(user.id, user.name, Role(user.role), user.org_id),
                row.csrf,
                aware(row.expires_at),
                bool(login and login.must_change),
            )

    def end_session(self, secret: str) -> bool:
        """Revoke a session on the server (logout); True when one was live."""
        now = utcnow()
        with self.session() as s, s.begin():
            row = s.get(WebSessionRow, _sha(secret)) if secret else None
            if row is None or row.revoked_at is not None:
                return False
            row.revoked_at = now
            s.add(admin_audit(row.user_id, AuditAction.LOGGED_OUT, None, None, None))
            return True

    # -- review codes ----------------------------------------------------------------------

    def issue_review_code(
        self,
        user_id: str,
        org_id: str,
        *,
        flow_run_id: str | None = None,
        ttl: dt.timedelta = CODE_TTL_MAX,
    ) -> IssuedCode:
        """A new one-time code for ``user_id`` to decide on ``org_id``'s drafts (in one flow
        run, when given), valid for ``ttl`` (at most 15 minutes). Audited; only its hash is
        stored. The caller has checked that the user may decide for the org."""
        ttl = min(ttl, CODE_TTL_MAX)
        raw = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_GROUPS * CODE_GROUP_LEN))
        code = "-".join(raw[i : i + CODE_GROUP_LEN] for i in range(0, len(raw), CODE_GROUP_LEN))
        now = utcnow()
        with self.session() as s, s.begin():
            s.add(
                ReviewCodeRow(
                    code_hash=_sha(raw),
                    user_id=user_id,
                    org_id=org_id,
                    flow_run_id=flow_run_id,
                    created_at=now,
                    expires_at=now + ttl,
                )
            )
            s.add(
                admin_audit(
                    user_id, AuditAction.REVIEW_CODE_ISSUED, org_id, None,
                    {"flow_run_id": flow_run_id, "expires_in_s": int(ttl.total_seconds())},
                )
            )  # fmt: skip
        return IssuedCode(code, user_id, org_id, flow_run_id, now + ttl)

    def redeem_review_code(self, code: str, *, org_id: str, flow_run_id: str) -> str:
        """Use up a review code for a decision on ``org_id`` in run ``flow_run_id``; returns
        the user it was issued to.

        Raises:
            Unauthorized: no code, or it is unknown, used, expired, or for another org or run
                (the message says which; audited). A refused code stays as it was.
        """
        raw = normalize_code(code or "")
        now = utcnow()
        digest = _sha(raw)
        with self.session() as s, s.begin():
            done = s.execute(
                update(ReviewCodeRow)
                .where(
                    ReviewCodeRow.code_hash == digest,
                    ReviewCodeRow.used_at.is_(None),
                    ReviewCodeRow.expires_at > now,
                    ReviewCodeRow.org_id == org_id,
                    (ReviewCodeRow.flow_run_id.is_(None))
                    | (ReviewCodeRow.flow_run_id == flow_run_id),
                )
                .values(used_at=now, used_by_run=flow_run_id)
            )
            if done.rowcount == 1:  # type: ignore[attr-defined]
                row = s.get(ReviewCodeRow, digest)
                assert row is not None
                s.add(
                    admin_audit(
                        row.user_id, AuditAction.REVIEW_CODE_USED, org_id, None,
                        {"flow_run_id": flow_run_id},
                    )
                )  # fmt: skip
                return row.user_id
        why = self._code_refusal(raw, digest, org_id, flow_run_id, now)
        with self.session() as s, s.begin():
            s.add(code_refused(org_id, flow_run_id, why))
        raise Unauthorized(why)

    def _code_refusal(
        self, raw: str, digest: str, org_id: str, flow_run_id: str, now: dt.datetime
    ) -> str:
        get = GET_CODE
        if not raw:
            return f"no review code was given: a typed name proves nothing; {get}."
        with self.session() as s:
            row = s.scalar(select(ReviewCodeRow).where(ReviewCodeRow.code_hash == digest))
        if row is None:
            return f"the review code is not valid (mistyped, or never issued); {get}."
        if row.used_at is not None:
            return f"the review code was already used (each code works once); {get}."
        if aware(row.expires_at) <= now:
            return f"the review code expired (codes last at most 15 minutes); {get}."
        if row.org_id != org_id:
            return f"the review code was issued for another org, not {org_id!r}; {get}."
        return f"the review code was issued for another review run, not {flow_run_id}; {get}."
