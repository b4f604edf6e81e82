"""The one rule for the names people type: org ids, agent ids, user ids and collection names.

Every id is a short lowercase ASCII slug, so two ids that look alike are the same id: no
whitespace, no zero-width or full-width characters, no ``..`` or ``/`` that could be read as a
path, nothing a shell, a URL or a file name would treat specially. User ids may also hold ``@``,
``.`` and ``+`` (they are often e-mail addresses). Collection paths are slugs joined by ``/``.

Each checker returns the value unchanged when it is valid and raises
:class:`~core.errors.ConfigError` naming the value and the rule when it is not. Creation paths
(the registry, the catalog) and the CLI's options call them, so a bad id is refused at the door
with the same message everywhere.
"""

from __future__ import annotations

import re

from core.errors import ConfigError

_SLUG = re.compile(r"[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?")
_USER = re.compile(r"[a-z0-9](?:[a-z0-9_.@+-]{0,118}[a-z0-9])?")

SLUG_RULE = (
    "1 to 64 lowercase ASCII letters, digits, '-' or '_', starting and ending with a letter or "
    "digit (e.g. 'acme' or 'fresh-foods')"
)
USER_RULE = (
    "1 to 120 lowercase ASCII letters, digits, '-', '_', '.', '@' or '+', starting and ending "
    "with a letter or digit (e.g. 'amy' or 'amy@agency.example')"
)


def _show(value: object) -> str:
    """The value as the user should see it: quoted, escapes visible, long ones cut."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check(kind: str, value: object, pattern: re.Pattern[str], rule: str) -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise ConfigError(f"{kind} {_show(value)} is not valid: use {rule}.")
    return value


def org_id(value: object) -> str:
    """A valid org id, or ConfigError."""
    return _check("org id", value, _SLUG, SLUG_RULE)


def agent_id(value: object) -> str:
    """A valid agent id, or ConfigError."""
    return _check("agent id", value, _SLUG, SLUG_RULE)


def user_id(value: object) -> str:
    """A valid user id, or ConfigError."""
    return _check("user id", value, _USER, USER_RULE)


def audience(value: object) -> str:
    """A valid audience name (documents and agents are tagged with them), or ConfigError."""
    return _check("audience", value, _SLUG, SLUG_RULE)


def collection_name(value: object) -> str:
    """A valid collection name (one path segment), or ConfigError."""
    return _check("collection name", value, _SLUG, SLUG_RULE)


def collection_path(value: object) -> str:
    """A valid collection path (names joined by '/'), normalised: surrounding slashes and
    spaces around each name are dropped, so ``' /policies / hr/ '`` is ``policies/hr``."""
    if not isinstance(value, str):
        raise ConfigError(f"collection path {_show(value)} is not a string.")
    parts = [p.strip() for p in value.strip().strip("/").split("/")]
    if not value.strip() or any(not p for p in parts):
        raise ConfigError(
            f"collection path must be names separated by '/', like 'policies/hr'. "
            f"Currently it is {_show(value)}."
        )
    for part in parts:
        if _SLUG.fullmatch(part) is None:
            raise ConfigError(
                f"collection path {_show(value)} is not valid: its name {_show(part)} must be "
                f"{SLUG_RULE}."
            )
    return "/".join(parts)
