"""Bearer tokens of the HTTP API (`kbflow tokens`): made for one user or one agent, the secret
shown once, listed without it, revoked.

Who may do what is checked here, by `tasks.review.access.authorize_token_admin`: a superadmin
any token, a user their own, an agent's tokens a superadmin or the AM of the agent's org. The
registry keeps only each secret's hash and audits every creation and revocation.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, cast

from core.errors import ConfigError
from core.settings import Settings
from kbflow.services.catalog.types import TokenDict

if TYPE_CHECKING:
    from sinks.registry import TokenRecord

DEFAULT_EXPIRY_DAYS = 90
MAX_EXPIRY_DAYS = 3650


def token_dict(token: TokenRecord, now: dt.datetime | None = None) -> TokenDict:
    """A token as JSON: who it stands for, its dates and status — never its secret or hash."""
    return cast("TokenDict", token.to_dict(now))


def _one_subject(user: str | None, agent: str | None) -> None:
    if user is not None and agent is not None:
        raise ConfigError(
            "a token stands for one user or one agent: give --user or --agent, not both."
        )


def create_token(
    settings: Settings,
    *,
    user: str | None,
    agent: str | None,
    actor: str | None,
    name: str = "",
    expires_days: int = DEFAULT_EXPIRY_DAYS,
    now: dt.datetime | None = None,
) -> tuple[TokenRecord, str]:
    """A new token for ``user`` or ``agent`` (exactly one) and its secret, which is never
    shown again. It expires after ``expires_days`` (0: never). ``actor`` must be allowed to
    manage that subject's tokens; audited."""
    _one_subject(user, agent)
    if user is None and agent is None:
        raise ConfigError("say whom the token is for: --user USER or --agent AGENT.")
    if not 0 <= expires_days <= MAX_EXPIRY_DAYS:
        raise ConfigError(f"--expires-days is 0 (never) to {MAX_EXPIRY_DAYS}, not {expires_days}.")
    from sinks.connect import open_registry
    from tasks.review.access import authorize_token_admin

    now = now or dt.datetime.now(dt.UTC)
    expires_at = now + dt.timedelta(days=expires_days) if expires_days else None
    subject = f"user {user!r}" if user is not None else f"agent {agent!r}"
    with open_registry(settings) as registry:
        admin = authorize_token_admin(
            registry, actor, f"create tokens for {subject}", user_id=user, agent_id=agent
        )
        return registry.tokens.create_token(
            user_id=user, agent_id=agent, name=name, expires_at=expires_at,
            created_by=admin.id, now=now,
        )  # fmt: skip


def list_tokens(
    settings: Settings, *, user: str | None, agent: str | None, include_revoked: bool
) -> list[TokenRecord]:
    """Tokens (of one user or one agent, if given), without their secrets; revoked ones only
    with ``include_revoked``."""
    _one_subject(user, agent)
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        if user is not None:
            registry.people.get_user(user)  # a typo is "does not exist", not an empty list
        if agent is not None:
            registry.catalog.get_agent(agent)
        return registry.tokens.list_tokens(
            user_id=user, agent_id=agent, include_revoked=include_revoked
        )


def revoke_token(
    settings: Settings, token_id: str, *, actor: str | None
) -> tuple[TokenRecord, bool]:
    """Revoke a token at once; ``actor`` must be allowed to manage its subject's tokens.
    Revoking a revoked token changes nothing; the flag says whether this call revoked it."""
    from sinks.connect import open_registry
    from tasks.review.access import authorize_token_admin

    with open_registry(settings) as registry:
        token = registry.tokens.get_token(token_id)
        admin = authorize_token_admin(
            registry, actor, f"revoke token {token.id} of {token.subject}",
            user_id=token.user_id, agent_id=token.agent_id,
        )  # fmt: skip
        return registry.tokens.revoke_token(token.id, actor=admin.id)
