"""``kbflow tokens``: bearer tokens of the HTTP API, one user or one agent each; the secret is
printed once, when the token is made, and never again."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import typer
from rich.markup import escape

from core import ids
from core.settings import Settings
from kbflow.cli.common import (
    ActorOpt,
    JsonOpt,
    checked,
    command,
    command_group,
    print_json,
    print_table,
)
from kbflow.render import console, err_console
from kbflow.services.catalog import tokens as service

group = command_group(
    "tokens", "Bearer tokens of the HTTP API (one user or one agent each; the secret shown once)."
)

SHOWN_ONCE = (
    "Store this secret now: it cannot be shown again (kbflow keeps only its hash). "
    "Lost it? Revoke the token and create another."
)

UserOpt = Annotated[
    str | None,
    typer.Option("--user", help="The user the token stands for.", callback=checked(ids.user_id)),
]
AgentOpt = Annotated[
    str | None,
    typer.Option("--agent", help="The agent the token stands for.", callback=checked(ids.agent_id)),
]


def _when(at: dt.datetime | None, never: str = "never") -> str:
    return at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC") if at else never


@group.command("create")
@command
def tokens_create(
    settings: Settings,
    actor: ActorOpt,
    user: UserOpt = None,
    agent: AgentOpt = None,
    name: Annotated[str, typer.Option(help="A label to recognise the token by.")] = "",
    expires_days: Annotated[
        int,
        typer.Option(
            "--expires-days",
            min=0,
            max=service.MAX_EXPIRY_DAYS,
            help="Days until it expires (0: never).",
        ),
    ] = service.DEFAULT_EXPIRY_DAYS,
    as_json: JsonOpt = False,
) -> None:
    """Create a token for a user (--user) or an agent (--agent) and print its secret ONCE.

    A user creates their own tokens; an agent's tokens are created by a superadmin or the
    assigned account manager of the agent's org; a superadmin creates anyone's. Audited.
    """
    token, secret = service.create_token(
        settings, user=user, agent=agent, actor=actor, name=name, expires_days=expires_days
    )
    err_console.print(f"[yellow]{SHOWN_ONCE}[/yellow]", soft_wrap=True)
    if as_json:
        print_json({"id": token.id, "secret": secret} | service.token_dict(token))
        return
    console.print(
        f"token [bold]{escape(token.id)}[/bold] for {escape(token.subject)}"
        + (f" ({escape(token.name)})" if token.name else "")
        + f", expires {_when(token.expires_at)}",
        soft_wrap=True,
    )
    typer.echo(secret)


@group.command("list")
@command
def tokens_list(
    settings: Settings,
    user: UserOpt = None,
    agent: AgentOpt = None,
    include_revoked: Annotated[bool, typer.Option("--all", help="Include revoked tokens.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """List tokens (of one user or one agent, if given): who, status, expiry, last use. Never
    their secrets."""
    tokens = service.list_tokens(settings, user=user, agent=agent, include_revoked=include_revoked)
    if as_json:
        print_json([service.token_dict(t) for t in tokens])
        return
    print_table(
        f"tokens ({len(tokens)})",
        ("id", "for", "name", "status", "expires", "last used", "created by"),
        (
            (escape(t.id), escape(t.subject), escape(t.name or "—"), t.status(),
             _when(t.expires_at), _when(t.last_used_at, "—"), escape(t.created_by))
            for t in tokens
        ),
    )  # fmt: skip


@group.command("revoke")
@command
def tokens_revoke(
    settings: Settings,
    token_id: Annotated[str, typer.Argument(help="The token's id (tok_…, see `tokens list`).")],
    actor: ActorOpt,
    as_json: JsonOpt = False,
) -> None:
    """Revoke a token at once (audited). Revoking a revoked token changes nothing.

    A user revokes their own tokens; an agent's tokens are revoked by a superadmin or the
    assigned account manager of the agent's org; a superadmin revokes anyone's.
    """
    token, revoked = service.revoke_token(settings, token_id, actor=actor)
    if as_json:
        print_json(service.token_dict(token) | {"already_revoked": not revoked})
        return
    if revoked:
        console.print(f"token [bold]{escape(token.id)}[/bold] ({escape(token.subject)}) revoked")
    else:
        console.print(
            f"token [bold]{escape(token.id)}[/bold] ({escape(token.subject)}) was already "
            f"revoked at {_when(token.revoked_at)}; nothing changed"
        )
