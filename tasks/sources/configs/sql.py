"""The ``sql`` kind's config (`tasks.sources.sql`): one table or SELECT of one database.

Exactly one of ``url_env`` (the NAME of the environment variable holding the SQLAlchemy URL) or
``url`` (a URL without a password or a secret-looking query parameter); exactly one of
``table`` (``name`` or ``schema.name``) or ``query`` (one read-only SELECT: `check_query`);
``key`` (a column or a list of columns, required); optional ``title`` and ``version_column``
(columns) and ``template`` (`tasks.sources.template`). No message shows the URL's password.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field, ValidationInfo, field_validator, model_validator
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from core.errors import ConfigError
from tasks.sources.configs import KindConfig
from tasks.sources.template import check_template

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(?:\.[A-Za-z_][A-Za-z0-9_$]*)?")
_STARTS = re.compile(r"\s*(select|with)\b", re.IGNORECASE)
_WRITES = re.compile(
    r"\b(insert|update|delete|merge|upsert|drop|alter|create|truncate|grant|revoke|copy|call|"
    r"exec|execute|into|attach|detach|pragma|vacuum|lock|reindex|analyze|comment|refresh|"
    r"listen|notify|prepare|do)\b",
    re.IGNORECASE,
)
_SECRET_PARAM = re.compile(r"pass|secret|token|key|credential", re.IGNORECASE)


def check_query(query: str) -> str:
    """``query`` if it is one read-only SELECT statement.

    Raises:
        ConfigError: It is not a string starting with SELECT or WITH, holds a ``;``, or a word
            that writes.
    """
    if not isinstance(query, str) or not query.strip():
        raise ConfigError("sql source: query must be a SELECT statement")
    if not _STARTS.match(query):
        raise ConfigError(
            "sql source: query must start with SELECT or WITH (no comments before it): only "
            "reading queries are allowed"
        )
    if ";" in query:
        raise ConfigError(
            "sql source: query must be one statement without ';' (drop a trailing ';')"
        )
    word = _WRITES.search(query)
    if word:
        raise ConfigError(
            f"sql source: query contains {word.group(0)!r}, which can write; only a plain "
            "SELECT is allowed (the check also looks inside string literals: put such a query "
            "in a view and name it with table)"
        )
    return query.strip()


class SqlConfig(KindConfig):
    """A ``sql`` source's config (see the module docstring); ``key`` is always a list."""

    label: ClassVar[str] = "sql source"

    url_env: str | None = None
    url: str | None = None
    table: str | None = None
    query: str | None = None
    key: list[str] | None = Field(None, validate_default=True)
    title: str | None = None
    template: str | None = None
    version_column: str | None = None

    @classmethod
    def not_a_mapping(cls, config: Any) -> str:
        return "sql source: the config must be a mapping"

    @classmethod
    def unknown(cls, where: tuple[str | int, ...], names: list[str]) -> str:
        return (
            f"sql source: unknown config key(s) {', '.join(names)}; known: "
            f"{', '.join(cls.model_fields)}"
        )

    @field_validator("url_env", mode="before")
    @classmethod
    def _url_env(cls, value: Any) -> str | None:
        if value is not None and (not isinstance(value, str) or not _ENV_NAME.fullmatch(value)):
            raise ConfigError(
                "sql source: url_env must be the NAME of an environment variable (letters, "
                "digits, _), not a URL"
            )
        return value

    @field_validator("url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            raise ConfigError("sql source: url must be a string")
        try:
            url = make_url(value)
        except (ArgumentError, ValueError) as exc:
            raise ConfigError(
                "sql source: url is not a SQLAlchemy URL (dialect+driver://user@host/db)"
            ) from exc
        if url.password is not None or url_secret_params(url):
            raise ConfigError(
                "sql source: url carries a password or secret; put the URL in an environment "
                "variable and name it with url_env instead (credentials are never stored)"
            )
        return value

    @field_validator("table", mode="before")
    @classmethod
    def _table(cls, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not _IDENT.fullmatch(value.strip()):
            raise ConfigError(
                f"sql source: table must be a table name or schema.table, not {value!r}"
            )
        return value.strip()

    @field_validator("query", mode="before")
    @classmethod
    def _query(cls, value: Any) -> str | None:
        return None if value is None else check_query(value)

    @field_validator("key", mode="before")
    @classmethod
    def _key(cls, value: Any) -> list[str]:
        if value is None:
            raise ConfigError("sql source: key (the column or columns naming a row) is required")
        items = [value] if isinstance(value, str) else value
        if (
            not isinstance(items, Sequence)
            or not items
            or not all(isinstance(i, str) and i.strip() for i in items)
        ):
            raise ConfigError("sql source: key must be a column name or a list of column names")
        return [i.strip() for i in items]

    @field_validator("title", "version_column", mode="before")
    @classmethod
    def _column(cls, value: Any, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"sql source: {info.field_name} must be a column name, not {value!r}")
        return value.strip()

    @field_validator("template", mode="before")
    @classmethod
    def _template(cls, value: Any) -> str | None:
        if value is not None:
            check_template(value)
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> SqlConfig:
        if (self.url_env is None) == (self.url is None):
            raise ConfigError(
                "sql source: give exactly one of url_env (the name of an environment variable "
                "holding the SQLAlchemy URL) or url (a URL without a password)"
            )
        if (self.table is None) == (self.query is None):
            raise ConfigError("sql source: give exactly one of table or query")
        return self

    def stored(self) -> dict[str, Any]:
        source = {"url_env": self.url_env} if self.url_env is not None else {"url": self.url}
        what = {"table": self.table} if self.table is not None else {"query": self.query}
        return {**source, **what, "key": list(self.key or ()), "title": self.title,
                "version_column": self.version_column, "template": self.template}  # fmt: skip


def url_secret_params(url: URL) -> list[str]:
    """The URL's query parameters that look like secrets (``?sslpassword=``, ``?token=``)."""
    return [name for name in url.query if _SECRET_PARAM.search(name)]
