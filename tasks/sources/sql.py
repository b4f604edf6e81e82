"""The ``sql`` source kind: each row of a table or a SELECT becomes one Markdown document.

Config (`tasks.sources.configs.sql.SqlConfig`, checked by `check_config`)::

    url_env: KB_CRM_URL          # the NAME of an environment variable holding the SQLAlchemy URL
    # or url: sqlite:////data/crm.db   (only a URL without a password)
    table: tickets               # or "schema.tickets"; or
    query: SELECT id, title, body, updated_at FROM tickets WHERE public
    key: id                      # column, or list of columns, naming the row
    title: title                 # optional: the column for the document title
    template: "# {title}\\n\\n{body}"   # optional Markdown template (`tasks.sources.template`)
    version_column: updated_at   # optional: a row whose value is as last synced is unchanged

Credentials never sit in the stored config or on a command line: the URL comes from the named
environment variable, and a ``url`` with a password is refused. Neither the URL nor its password
appears in an item's ``uri``, ``meta`` or any error message (errors name the variable, the
driver, the host and the database).

A ``query`` must be one SELECT (or WITH ... SELECT) statement: no ``;``, and no word that writes
(INSERT, UPDATE, DELETE, INTO, ...) anywhere in it, string literals included. That check is
conservative, not a sandbox: give the source a database user that can only read.

Connecting to PostgreSQL (psycopg) gives up after ``sources_fetch_timeout_s`` unless the URL
sets its own ``connect_timeout``; a SQLite URL must name an existing file.

A ``url`` that reaches this machine (SQLite, DuckDB, any dialect that is not a network server,
a server's Unix socket: `is_file_backed`) is a superadmin's only (`tasks.sources.guard`), and no
database file may lie in kbflow's home or its stores (the registry, the vectors, the
warehouse), whoever added the source: checked when it is added and again at every sync.

Rows are read with a streaming cursor (``stream_results``, a bounded row buffer), so a large
table is never loaded whole. Every sync reads every row (the version column saves the rendering
and the ingest, not the read): that is how a deleted row is noticed.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, NoSuchTableError, SQLAlchemyError

from core.errors import ConfigError
from core.settings import Settings
from tasks.sources.base import Item, Limits, Prior, SourceError
from tasks.sources.configs.sql import SqlConfig, url_secret_params
from tasks.sources.guard import NETWORK_BACKENDS, check_outside_home
from tasks.sources.template import check_template, record_item, text

log = logging.getLogger(__name__)

_BIND = re.compile(r"(?<![:\w\\]):(?=\w)")
_ROW_BUFFER = 500


def check_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``sql`` source config, checked (`SqlConfig`) and normalized (``key`` always a list).

    Raises:
        ConfigError: A key is unknown, missing or invalid; ``url`` carries a password; the query
            is not a plain SELECT.
    """
    return SqlConfig.check(config).stored()


def database_file(url: URL) -> str | None:
    """The local file a file-backed URL opens (SQLite, DuckDB), or None (a server, memory)."""
    if url.get_backend_name() in NETWORK_BACKENDS:
        return None
    database = (url.database or "").removeprefix("file:").split("?", 1)[0]
    return None if database in ("", ":memory:") else database


def _describe(url: URL, env: str | None) -> str:
    """The database without its password or query: ``postgresql+psycopg://kb:***@db:5432/crm``."""
    shown = url.set(query={}).render_as_string(hide_password=True)
    return f"{shown} (from ${env})" if env else shown


def _scrub(message: str, url: URL) -> str:
    secrets = [url.password] if url.password else []
    for name in url_secret_params(url):
        value = url.query[name]
        secrets += [value] if isinstance(value, str) else list(value)
    for secret in secrets:
        if secret and len(str(secret)) >= 3:
            message = message.replace(str(secret), "***")
    return message


def _why(exc: BaseException, url: URL) -> str:
    """The driver's message of ``exc`` (first lines, without the password)."""
    inner = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(inner).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("(Background on this error")]
    return _scrub(" ".join(lines[:3])[:500] or type(inner).__name__, url)


def _part(value: Any) -> str:
    """One key value in an item key: its text, ``%`` and ``/`` escaped."""
    return text(value).replace("%", "%25").replace("/", "%2F")


def safe_name(key_text: str) -> str:
    """A file name stem for an item key: letters, digits, ``.``, ``_``, ``-``."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", key_text).strip("._")[:100]
    return stem or "item"


class SqlConnector:
    """Walks one table or query; see the module docstring."""

    def __init__(
        self,
        config: Mapping[str, Any],
        limits: Limits,
        url: URL,
        *,
        env: str | None,
        timeout_s: float = 20.0,
        settings: Settings | None = None,
    ) -> None:
        self.config = dict(config)
        self.settings = settings
        self.timeout_s = timeout_s
        self.limits = limits
        self.url = url
        self.env = env
        self.complete = False
        self.where = self.config.get("table") or "query"

    def _fail(self, doing: str, exc: BaseException) -> SourceError:
        return SourceError(
            f"sql source: could not {doing} {_describe(self.url, self.env)}: {_why(exc, self.url)}"
        )

    def _engine(self) -> Engine:
        url = self.url
        local = database_file(url)
        if local and self.settings is not None:
            try:
                check_outside_home(self.settings, local)
            except ConfigError as exc:
                raise SourceError(str(exc)) from exc
        if url.get_backend_name() == "sqlite":
            path = url.database or ""
            on_disk = path and path != ":memory:" and not path.startswith("file:")
            if on_disk and not Path(path).is_file():
                raise SourceError(
                    f"sql source: no SQLite database file at {path} ({_describe(url, self.env)})"
                )
        connect_args: dict[str, Any] = {}
        if (
            url.get_backend_name() == "postgresql"
            and url.get_driver_name() in ("psycopg", "psycopg2")
            and "connect_timeout" not in url.query
        ):
            connect_args["connect_timeout"] = max(1, math.ceil(self.timeout_s))
        try:
            return sa.create_engine(url, connect_args=connect_args)
        except NoSuchModuleError as exc:
            raise SourceError(
                f"sql source: no SQLAlchemy dialect for {self.url.drivername!r} "
                f"({_describe(self.url, self.env)}); check the URL's scheme"
            ) from exc
        except ModuleNotFoundError as exc:
            raise SourceError(
                f"sql source: the database driver for {self.url.drivername!r} is not installed "
                f"({exc.name}); install it or name an installed one in the URL "
                "(e.g. postgresql+psycopg://)"
            ) from exc
        except (SQLAlchemyError, ValueError, TypeError) as exc:
            raise self._fail("open", exc) from exc

    def _statement(self, conn: Connection) -> Any:
        if "query" in self.config and self.config.get("query"):
            return sa.text(_BIND.sub(r"\\:", self.config["query"]))
        schema, _, name = self.config["table"].rpartition(".")
        try:
            table = sa.Table(name, sa.MetaData(), schema=schema or None, autoload_with=conn)
        except NoSuchTableError as exc:
            try:
                known = ", ".join(sa.inspect(conn).get_table_names(schema=schema or None)[:40])
            except SQLAlchemyError:
                known = "?"
            raise SourceError(
                f"sql source: no table {self.config['table']!r} in "
                f"{_describe(self.url, self.env)}; tables: {known or 'none'}"
            ) from exc
        missing = [c for c in self.config["key"] if c not in table.c]
        if missing:
            raise self._no_columns(missing, list(table.c.keys()))
        return sa.select(table).order_by(*(table.c[c] for c in self.config["key"]))

    def _no_columns(self, missing: list[str], columns: list[str]) -> SourceError:
        return SourceError(
            f"sql source: column(s) {', '.join(missing)} not in {self.where} "
            f"({_describe(self.url, self.env)}); its columns: {', '.join(columns[:60])}"
        )

    def _check_columns(self, columns: list[str]) -> None:
        wanted = list(self.config["key"])
        wanted += [c for c in (self.config.get("title"), self.config.get("version_column")) if c]
        if self.config.get("template"):
            wanted += [f.split(".", 1)[0] for f in check_template(self.config["template"])]
        missing = [c for c in dict.fromkeys(wanted) if c not in columns]
        if missing:
            raise self._no_columns(missing, columns)

    def items(self, prior: Mapping[str, Prior]) -> Iterator[Item]:
        """Every row of the table or query as an `Item`; see the module docstring.

        Raises:
            SourceError: The database could not be reached or read, or a named column is not
                there (the message names the database without its password).
        """
        self.complete = False
        engine = self._engine()
        try:
            yield from self._walk(engine, prior)
        finally:
            engine.dispose()

    def _walk(self, engine: Engine, prior: Mapping[str, Prior]) -> Iterator[Item]:
        try:
            conn = engine.connect()
        except SQLAlchemyError as exc:
            raise self._fail("connect to", exc) from exc
        with conn:
            try:
                statement = self._statement(conn)
                streaming = conn.execution_options(stream_results=True, yield_per=_ROW_BUFFER)
                result = streaming.execute(statement)
                names = result.keys()
                columns = [str(c) for c in names]
            except SQLAlchemyError as exc:
                raise self._fail(f"read {self.where} from", exc) from exc
            self._check_columns(columns)
            rows = iter(result.mappings())
            seen: set[str] = set()
            count = 0
            while True:
                try:
                    row = next(rows, None)
                except SQLAlchemyError as exc:
                    raise self._fail(f"read {self.where} from", exc) from exc
                if row is None:
                    break
                item = self._item({str(k): v for k, v in row.items()}, prior, seen)
                if item is None:
                    continue
                if count >= self.limits.max_items:
                    result.close()
                    return
                count += 1
                yield item
        self.complete = True

    def _item(self, row: dict[str, Any], prior: Mapping[str, Prior], seen: set[str]) -> Item | None:
        values = [row.get(c) for c in self.config["key"]]
        key_text = "/".join(_part(v) for v in values)
        key = f"row/{key_text}"
        if not self.limits.wanted(key):
            return None
        if key in seen:
            log.warning("sql source %s: duplicate key %s; keeping the first row", self.where, key)
            return None
        seen.add(key)
        uri = f"sql://{self.where}/{key_text}"
        name = f"{safe_name('-'.join(text(v) for v in values))}.md"
        if any(v is None for v in values):
            return Item(key, uri, name, error=f"{key}: a key column is NULL")
        version_column = self.config.get("version_column")
        raw_version = row.get(version_column) if version_column else None
        version = None if raw_version is None else str(raw_version)
        fallback = f"{self.where} {' / '.join(text(v) for v in values)}"
        return record_item(row, key=key, uri=uri, name=name, version=version,
                           prior=prior.get(key), config=self.config, fallback_title=fallback,
                           limits=self.limits)  # fmt: skip


def connector(config: Mapping[str, Any], limits: Limits, *, settings: Settings) -> SqlConnector:
    """The connector of one ``sql`` source.

    Raises:
        ConfigError: The config is invalid, or ``url_env`` names a variable that is not set or
            does not hold a SQLAlchemy URL (its value is never shown).
    """
    checked = check_config(config)
    env = checked.get("url_env")
    if env:
        raw = os.environ.get(env)
        if not raw:
            raise ConfigError(
                f"sql source: environment variable {env} (url_env) is not set; export it with "
                "the database's SQLAlchemy URL, e.g. postgresql+psycopg://user:password@host/db"
            )
    else:
        raw = checked["url"]
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(
            f"sql source: ${env} does not hold a SQLAlchemy URL "
            "(dialect+driver://user:password@host/db); its value is not shown"
        ) from exc
    return SqlConnector(
        checked, limits, url, env=env, timeout_s=settings.sources.sources_fetch_timeout_s,
        settings=settings,
    )  # fmt: skip
