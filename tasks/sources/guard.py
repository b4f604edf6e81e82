"""What a synced source may reach, beyond its kind's own config check (docs/SOURCES.md).

- **Secrets by name only, and only the operator's**: a source names the environment variable
  that holds its secret (a REST ``token_env``, ``key_env``, ``password_env``; a SQL
  ``url_env``; any ``*_env``), and may name only those the operator lists for its org in
  ``KBFLOW_SOURCES_SECRET_ENV`` (`check_secret_envs`): otherwise an account manager could send
  the worker's own keys (``ANTHROPIC_API_KEY``...) to a host of their choosing.
- **No secret in a URL's query or a request's parameters** (`secret_params`): ``?api_key=…``
  would be stored, listed and audited in clear.
- **What reaches this machine is a superadmin's** (`superadmin_reason`): a local folder, a
  file-backed SQL database, a custom S3 endpoint.
- **Never the home's own stores** (`check_outside_home`): a SQL source may not read the
  registry, the vectors or the warehouse, even a superadmin's.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from core.errors import ConfigError, Forbidden
from core.settings import Settings

_SECRET_WORDS = frozenset(
    {
        "key", "apikey", "token", "secret", "password", "passwd", "pwd", "pass", "sig",
        "signature", "auth", "authorization", "credential", "credentials", "jwt", "bearer",
        "session", "sessionid", "sid", "otp", "hmac", "cookie",
    }
)  # fmt: skip
_SECRET_PARTS = ("token", "secret", "passw", "apikey", "signature", "credential", "private")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def looks_secret(name: str) -> bool:
    """Whether a query parameter's name says it carries a secret (``api_key``, ``token``,
    ``X-Amz-Signature``, ``accessToken``, ``sig``, ``auth``...); ``author`` or ``page`` do not."""
    words = re.split(r"[^a-z0-9]+", _CAMEL.sub("_", name).lower())
    joined = "".join(words)
    return any(w in _SECRET_WORDS for w in words) or any(p in joined for p in _SECRET_PARTS)


def secret_params(url: str) -> list[str]:
    """The names in ``url``'s query string that look like secrets."""
    query = urllib.parse.urlsplit(url).query
    names = [name for name, _ in urllib.parse.parse_qsl(query, keep_blank_values=True)]
    return sorted({name for name in names if looks_secret(name)})


def env_names(config: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Each ``(where, NAME)`` a config names an environment variable with: every key ending in
    ``_env``, however deep (``client.auth.token_env``, ``url_env``)."""
    if isinstance(config, Mapping):
        for key, value in config.items():
            where = f"{path}.{key}" if path else str(key)
            if str(key).endswith("_env") and isinstance(value, str):
                yield where, value
            else:
                yield from env_names(value, where)
    elif isinstance(config, list | tuple):
        for index, value in enumerate(config):
            yield from env_names(value, f"{path}[{index}]")


def check_secret_envs(settings: Settings, org: str, config: Mapping[str, Any]) -> None:
    """Refuse a config naming an environment variable the operator did not list for ``org``.

    Raises:
        Forbidden: a name outside ``KBFLOW_SOURCES_SECRET_ENV``'s pairs for ``org``; the message
            says which and what to do.
    """
    allowed = settings.sources.secret_envs(org)
    refused = [(where, name) for where, name in env_names(config) if name not in allowed]
    if not refused:
        return
    named = ", ".join(f"{name} ({where})" for where, name in refused)
    pairs = ",".join(f"{org}:{name}" for _, name in refused)
    listed = ", ".join(sorted(allowed)) or "none"
    raise Forbidden(
        f"the source names environment variable(s) {named} that the operator has not allowed "
        f"for org {org!r} (allowed: {listed}). Name an allowed variable, or ask the operator "
        f"to add {pairs!r} to KBFLOW_SOURCES_SECRET_ENV in the environment of kbflow and its "
        "workers. Nothing was changed."
    )


def check_before_sync(settings: Settings, org: str, config: Mapping[str, Any]) -> None:
    """`check_secret_envs` at the start of a sync: a source stored before the operator's list
    changed (or before there was one) reads no variable the list leaves out.

    Raises:
        SourceError: a variable it names is not allowed; nothing was read.
    """
    from tasks.sources.base import SourceError

    try:
        check_secret_envs(settings, org, config)
    except Forbidden as exc:
        raise SourceError(f"not synced: {exc}".replace(" Nothing was changed.", "")) from exc


def superadmin_reason(kind: str, config: Mapping[str, Any]) -> str | None:
    """Why only a superadmin may have this source (it reaches this machine or a server of
    their choosing), or None."""
    if kind == "filesystem":
        from tasks.sources.filesystem import is_local

        if is_local(config):
            return "a local folder"
        if config.get("endpoint_url"):
            return "a custom S3 endpoint_url"
    if kind == "sql" and config.get("url") and is_file_backed(str(config["url"])):
        return "a file-backed SQL database"
    return None


def protected_paths(settings: Settings) -> list[Path]:
    """The home and the store files outside it (a SQLite registry, a DuckDB warehouse)."""
    from sqlalchemy.engine import make_url

    paths = [settings.home.expanduser().resolve()]
    for url in (settings.registry_url, settings.stores.warehouse_url):
        if not url:
            continue
        try:
            database = make_url(url).database
        except Exception:  # not a URL this check understands: nothing to add
            continue
        if database and database != ":memory:":
            paths.append(Path(database.removeprefix("file:").split("?", 1)[0]).resolve())
    return paths


def check_outside_home(settings: Settings, path: str | Path) -> None:
    """Refuse a database file in kbflow's home or one of its stores (a link to one too).

    Raises:
        ConfigError: ``path`` is, or lies under, one of `protected_paths`.
    """
    target = Path(path).expanduser()
    resolved = target.resolve()
    for protected in protected_paths(settings):
        inside = resolved == protected or protected in resolved.parents
        same = False
        try:
            same = target.exists() and protected.exists() and target.samefile(protected)
        except OSError:
            same = False
        if inside or same:
            raise ConfigError(
                f"sql source: {target} is in kbflow's own stores ({protected}): a source may "
                "never read the registry, the vectors or the warehouse; point it at another "
                "database"
            )


NETWORK_BACKENDS = frozenset(
    {"postgresql", "mysql", "mariadb", "mssql", "oracle", "redshift", "cockroachdb",
     "snowflake", "clickhouse", "trino", "presto", "bigquery", "databricks"}
)  # fmt: skip
"""Dialects that talk to a database server over the network (with a host): the only ones an
account manager may name in ``url``."""


def is_file_backed(raw: str) -> bool:
    """Whether a SQLAlchemy URL reaches this machine rather than a database server: any
    dialect outside `NETWORK_BACKENDS` (SQLite, DuckDB, ...), one without a host, or one with
    a path in its host or query (a Unix socket, ``?database=/path``). Unreadable: True."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):
        return True
    if url.get_backend_name() not in NETWORK_BACKENDS or not url.host:
        return True
    values = [url.host]
    for value in url.query.values():
        values += [value] if isinstance(value, str) else list(value)
    return any(str(v).strip().startswith(("/", "~", ".", "file:")) for v in values)
