"""Bearer tokens of the HTTP API: each stands for one user or one agent, and only the sha256 of
its secret is stored.

A secret is ``kbf_`` and 43 URL-safe characters (``secrets.token_urlsafe(32)``: 256 random
bits). :meth:`TokensRepository.create_token` returns it once; the row keeps its hash, so a copy
of the registry lets nobody call the API. :meth:`TokensRepository.verify_token` finds the row by
the hash (an indexed lookup: timing can at most reveal a hash of a 256-bit secret, which gives
nothing away) and compares the hashes again with :func:`hmac.compare_digest`.

Who a token belongs to is read from the registry at every use: a user's role and org, an
agent's org, collections and audiences are those of the moment, not of the day the token was
made. A token whose user or agent is gone no longer verifies; an agent whose knowledge base is
switched off still does (it is the same agent) and its scope is empty, as on the command line.

Revoking is idempotent: revoking a revoked token changes nothing (the first revocation's time
and audit row stand) and says so, so a script may retry it safely.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from core.errors import ConfigError, NotFound, Unauthorized
from core.models import AuditAction
from sinks.registry.audit import admin_audit
from sinks.registry.base import Repository
from sinks.registry.schema import AgentRow, ApiTokenRow, UserRow, utcnow

SECRET_PREFIX = "kbf_"
TOKEN_ID_PREFIX = "tok_"
_SECRET = re.compile(r"kbf_[A-Za-z0-9_-]{43}")
NAME_MAX = 200
LAST_USED_EVERY = dt.timedelta(minutes=1)
"""``last_used_at`` is written at most this often per token, so verifying is mostly a read."""


def hash_secret(secret: str) -> str:
    """The sha256 (hex) of a token's secret: what the registry keeps instead of it."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _aware(at: dt.datetime | None) -> dt.datetime | None:
    if at is None:
        return None
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)  # SQLite drops the zone


def _utc(at: dt.datetime | None) -> dt.datetime | None:
    """A time the caller gave, in UTC (naive: read as UTC), as every stored time is."""
    aware = _aware(at)
    return None if aware is None else aware.astimezone(dt.UTC)


def _iso(at: dt.datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def _when(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class TokenRecord:
    """A detached snapshot of one token: who it stands for and its dates. It holds neither the
    secret nor its hash, so no repr, log line or JSON can leak them."""

    id: str
    user_id: str | None
    agent_id: str | None
    name: str
    created_by: str
    created_at: dt.datetime
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None

    @property
    def subject(self) -> str:
        """``user amy`` or ``agent bot``."""
        return f"user {self.user_id}" if self.user_id else f"agent {self.agent_id}"

    def status(self, now: dt.datetime | None = None) -> str:
        """``revoked``, ``expired`` or ``active`` (at ``now``)."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= (_utc(now) or utcnow()):
            return "expired"
        return "active"

    def to_dict(self, now: dt.datetime | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user_id,
            "agent": self.agent_id,
            "name": self.name,
            "created_by": self.created_by,
            "created_at": _iso(self.created_at),
            "expires_at": _iso(self.expires_at),
            "revoked_at": _iso(self.revoked_at),
            "last_used_at": _iso(self.last_used_at),
            "status": self.status(now),
        }


def _record(row: ApiTokenRow) -> TokenRecord:
    created = _aware(row.created_at)
    assert created is not None
    return TokenRecord(
        id=row.id,
        user_id=row.user_id,
        agent_id=row.agent_id,
        name=row.name,
        created_by=row.created_by,
        created_at=created,
        expires_at=_aware(row.expires_at),
        revoked_at=_aware(row.revoked_at),
        last_used_at=_aware(row.last_used_at),
    )


def _subject_after(row: ApiTokenRow) -> dict[str, Any]:
    return {"token_id": row.id, "user": row.user_id, "agent": row.agent_id, "name": row.name}


class TokensRepository(Repository):
    """Bearer tokens: made (secret shown once), listed, revoked and verified (audited)."""

    def create_token(
        self,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        name: str = "",
        expires_at: dt.datetime | None,
        created_by: str,
        now: dt.datetime | None = None,
    ) -> tuple[TokenRecord, str]:
        """A new token for the user or the agent (exactly one), and its secret — returned this
        once and never stored. ``expires_at`` None: it never expires. Audited.

        Raises:
            ConfigError: neither or both subjects, a name too long, an expiry not in the future.
            NotFound: no such user or agent.
        """
        if (user_id is None) == (agent_id is None):
            raise ConfigError("a token stands for exactly one user or one agent: give one.")
        name = name.strip()
        if len(name) > NAME_MAX:
            raise ConfigError(f"a token's name is at most {NAME_MAX} characters ({len(name)}).")
        now = _utc(now) or utcnow()
        expires_at = _utc(expires_at)
        if expires_at is not None and expires_at <= now:
            raise ConfigError(f"a token must expire in the future, not at {_when(expires_at)}.")
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        with self.session() as s, s.begin():
            if user_id is not None:
                user = s.get(UserRow, user_id)
                if user is None:
                    raise NotFound(f"user {user_id!r} does not exist (`kbflow users list`).")
                org_id = user.org_id
            else:
                agent = s.get(AgentRow, agent_id)
                if agent is None:
                    raise NotFound(f"agent {agent_id!r} does not exist (`kbflow agents show`).")
                org_id = agent.org_id
            token_id = TOKEN_ID_PREFIX + secrets.token_hex(6)
            while s.get(ApiTokenRow, token_id) is not None:  # 48 bits: all but never
                token_id = TOKEN_ID_PREFIX + secrets.token_hex(6)
            row = ApiTokenRow(
                id=token_id,
                secret_hash=hash_secret(secret),
                user_id=user_id,
                agent_id=agent_id,
                name=name,
                created_by=created_by,
                created_at=now,
                expires_at=expires_at,
            )
            s.add(row)
            s.add(
                admin_audit(
                    created_by, AuditAction.TOKEN_CREATED, org_id, None,
                    _subject_after(row) | {"expires_at": _iso(expires_at)},
                )
            )  # fmt: skip
            s.flush()
            return _record(row), secret

    def get_token(self, token_id: str) -> TokenRecord:
        with self.session() as s:
            row = s.get(ApiTokenRow, token_id)
            if row is None:
                raise NotFound(
                    f"token {token_id!r} does not exist — `kbflow tokens list --all` shows them."
                )
            return _record(row)

    def list_tokens(
        self,
        user_id: str | None = None,
        agent_id: str | None = None,
        include_revoked: bool = False,
    ) -> list[TokenRecord]:
        """Tokens, oldest first: of one user or one agent when given, else every one; revoked
        ones only with ``include_revoked`` (expired ones always: they still need revoking or
        replacing)."""
        query = select(ApiTokenRow).order_by(ApiTokenRow.created_at, ApiTokenRow.id)
        if user_id is not None:
            query = query.where(ApiTokenRow.user_id == user_id)
        if agent_id is not None:
            query = query.where(ApiTokenRow.agent_id == agent_id)
        if not include_revoked:
            query = query.where(ApiTokenRow.revoked_at.is_(None))
        with self.session() as s:
            return [_record(row) for row in s.scalars(query)]

    def revoke_token(
        self, token_id: str, *, actor: str, now: dt.datetime | None = None
    ) -> tuple[TokenRecord, bool]:
        """Revoke the token at once (audited). Idempotent: a token already revoked stays as it
        was (its first revocation's time, no second audit row); the flag says whether this
        call revoked it.

        Raises:
            NotFound: no such token.
        """
        now = _utc(now) or utcnow()
        with self.session() as s, s.begin():
            row = s.get(ApiTokenRow, token_id)
            if row is None:
                raise NotFound(
                    f"token {token_id!r} does not exist — `kbflow tokens list --all` shows them."
                )
            done = s.execute(
                update(ApiTokenRow)
                .where(ApiTokenRow.id == token_id, ApiTokenRow.revoked_at.is_(None))
                .values(revoked_at=now)
            )
            revoked = bool(done.rowcount)  # type: ignore[attr-defined]
            if revoked:
                org_id = self._subject_org(s, row)
                s.add(
                    admin_audit(actor, AuditAction.TOKEN_REVOKED, org_id, None, _subject_after(row))
                )
        return self.get_token(token_id), revoked

    @staticmethod
    def _subject_org(s: Session, row: ApiTokenRow) -> str | None:
        if row.user_id is not None:
            user = s.get(UserRow, row.user_id)
            return None if user is None else user.org_id
        agent = s.get(AgentRow, row.agent_id)
        return None if agent is None else agent.org_id

    def verify_token(self, secret: str, now: dt.datetime | None = None) -> TokenRecord:
        """The token behind ``secret``, if it may be used at ``now`` (default: now); records
        its use (``last_used_at``, at most once per :data:`LAST_USED_EVERY`).

        Raises:
            Unauthorized: no secret, a malformed one, an unknown one, a revoked or expired
                token, or one whose user or agent no longer exists — the message says which.
        """
        if not isinstance(secret, str) or not secret:
            raise Unauthorized("no token given: send `Authorization: Bearer kbf_…`.")
        if _SECRET.fullmatch(secret) is None:
            raise Unauthorized(
                "malformed token: a kbflow token is 'kbf_' followed by 43 URL-safe characters."
            )
        now = _utc(now) or utcnow()
        digest = hash_secret(secret)
        with self.session() as s:
            row = s.scalar(select(ApiTokenRow).where(ApiTokenRow.secret_hash == digest))
            if row is None or not hmac.compare_digest(row.secret_hash, digest):
                raise Unauthorized(
                    "unknown token: it was never issued here (copied wrong?); "
                    "`kbflow tokens create` makes one."
                )
            token = _record(row)
            if token.revoked_at is not None:
                # Never the token's id or holder: a 401 tells a caller nothing about who it was.
                raise Unauthorized(
                    f"this token was revoked at {_when(token.revoked_at)}; ask for a new one "
                    "(`kbflow tokens create`)."
                )
            if token.expires_at is not None and token.expires_at <= now:
                raise Unauthorized(
                    f"this token expired at {_when(token.expires_at)}; make a new one with "
                    "`kbflow tokens create`."
                )
            subject = (
                s.get(UserRow, token.user_id)
                if token.user_id is not None
                else s.get(AgentRow, token.agent_id)
            )
            if subject is None:
                raise Unauthorized("this token's holder no longer exists; ask for a new one.")
        last = token.last_used_at
        if last is None or now - last >= LAST_USED_EVERY:
            cutoff = now - LAST_USED_EVERY
            with self.session() as s, s.begin():
                s.execute(
                    update(ApiTokenRow)
                    .where(
                        ApiTokenRow.id == token.id,
                        or_(
                            ApiTokenRow.last_used_at.is_(None),
                            ApiTokenRow.last_used_at <= cutoff,
                        ),
                    )
                    .values(last_used_at=now)
                )
            token = replace(token, last_used_at=now)
        return token
