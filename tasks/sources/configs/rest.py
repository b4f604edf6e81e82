"""The ``rest`` kind's config (`tasks.sources.rest`): one JSON listing, as a dlt ``rest_api``
resource.

``client`` (``base_url``: an http(s) URL without credentials, a fragment or a secret-looking
query; ``paginator``: a dlt paginator spec; ``auth``: one of `AUTH_KINDS`, naming environment
variables only), ``resource`` (``path`` relative to the base URL, ``params`` of plain values,
``data_selector``), ``key`` (required), ``title`` and ``version_field`` (record fields, dotted for
nested) and ``template`` (`tasks.sources.template`). A secret written into the config itself (an
auth ``token``, ``password``...; a query parameter named like one) is refused.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import ErrorDetails

from core.errors import ConfigError
from tasks.sources.configs import KindConfig, dotted
from tasks.sources.guard import looks_secret, secret_params
from tasks.sources.template import check_template

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FIELD = re.compile(r"\w[\w\-]*(?:\.\w[\w\-]*)*")
_HEADER = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _env_name(value: Any, info: ValidationInfo) -> Any:
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        raise ConfigError(
            f"rest source: client.auth.{info.field_name} must be the NAME of an environment "
            "variable (letters, digits, _) holding the secret"
        )
    return value


EnvName = Annotated[str | None, BeforeValidator(_env_name)]
"""The name of the environment variable that holds a secret (never the secret)."""


class _Auth(_Part):
    """One kind of ``client.auth``; its secret comes from the environment variable it names."""


class BearerAuth(_Auth):
    type: Literal["bearer"]
    token_env: EnvName = Field(None, validate_default=True)


class ApiKeyAuth(_Auth):
    type: Literal["api_key"]
    key_env: EnvName = Field(None, validate_default=True)
    name: str | None = Field(None, validate_default=True)
    location: Literal["header", "query"] | None = None  # None: a header, dlt's default

    @field_validator("name", mode="before")
    @classmethod
    def _header(cls, value: Any) -> str:
        value = "Authorization" if value is None else value
        if not isinstance(value, str) or not _HEADER.fullmatch(value):
            raise ConfigError("rest source: client.auth.name must be an HTTP header name")
        return value

    @field_validator("location", mode="before")
    @classmethod
    def _location(cls, value: Any) -> Any:
        if value is not None and value not in ("header", "query"):
            raise ConfigError(
                "rest source: client.auth.location must be header (the default) or query"
            )
        return value


class BasicAuth(_Auth):
    type: Literal["http_basic"]
    username: str | None = Field(None, validate_default=True)
    password_env: EnvName = Field(None, validate_default=True)

    @field_validator("username", mode="before")
    @classmethod
    def _username(cls, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise ConfigError("rest source: client.auth.username is required")
        return value


AUTH_KINDS: dict[str, type[_Auth]] = {
    "bearer": BearerAuth,
    "api_key": ApiKeyAuth,
    "http_basic": BasicAuth,
}


class RestClient(_Part):
    base_url: str | None = Field(None, validate_default=True)
    paginator: Any = None
    auth: Annotated[BearerAuth | ApiKeyAuth | BasicAuth, Field(discriminator="type")] | None = None

    @field_validator("base_url", mode="before")
    @classmethod
    def _base_url(cls, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError("rest source: client.base_url is required (https://api.example.com/)")
        value = value.strip()
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"rest source: client.base_url {value!r} must be an http(s) URL")
        if parts.username is not None or parts.password is not None:
            raise ConfigError(
                "rest source: client.base_url may not carry credentials (user:password@); use "
                "client.auth with an environment variable"
            )
        if parts.fragment:
            raise ConfigError("rest source: client.base_url may not have a #fragment")
        _refuse_secret_params("client.base_url's query", secret_params(value))
        return value

    @field_validator("paginator", mode="before")
    @classmethod
    def _paginator(cls, spec: Any) -> Any:
        from dlt.sources.rest_api.config_setup import create_paginator

        if spec is None:
            return None
        if not isinstance(spec, str | Mapping):
            raise ConfigError("rest source: client.paginator must be a type name or a mapping")
        spec = spec if isinstance(spec, str) else dict(spec)
        try:
            create_paginator(copy.deepcopy(spec))
        except Exception as exc:
            raise ConfigError(
                f"rest source: client.paginator {spec!r} is not a valid dlt paginator: {exc}"
            ) from exc
        return spec

    @field_validator("auth", mode="before")
    @classmethod
    def _auth_kind(cls, auth: Any) -> Any:
        if auth is None:
            return None
        if not isinstance(auth, Mapping) or not isinstance(auth.get("type"), str):
            raise ConfigError(
                "rest source: client.auth must be a mapping with a type "
                f"({', '.join(AUTH_KINDS)}), e.g. {{type: bearer, token_env: API_TOKEN}}"
            )
        if auth["type"] not in AUTH_KINDS:
            raise ConfigError(
                f"rest source: client.auth type {auth['type']!r} is not supported; use one of "
                f"{', '.join(AUTH_KINDS)}"
            )
        return auth


class RestResource(_Part):
    path: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    data_selector: str | None = None

    @field_validator("path", mode="before")
    @classmethod
    def _path(cls, path: Any) -> str:
        if not isinstance(path, str):
            raise ConfigError("rest source: resource.path must be a string")
        if urlsplit(path).scheme or path.startswith("//"):
            raise ConfigError(
                "rest source: resource.path must be relative to client.base_url, not a full URL"
            )
        _refuse_secret_params("resource.path's query", secret_params(path))
        return path

    @field_validator("params", mode="before")
    @classmethod
    def _params(cls, params: Any) -> dict[str, Any]:
        params = params or {}
        if not isinstance(params, Mapping) or not all(
            isinstance(k, str) and (v is None or isinstance(v, str | int | float | bool | list))
            for k, v in params.items()
        ):
            raise ConfigError("rest source: resource.params must map names to plain values")
        _refuse_secret_params("resource.params", sorted(k for k in params if looks_secret(k)))
        return dict(params)

    @field_validator("data_selector", mode="before")
    @classmethod
    def _selector(cls, selector: Any) -> Any:
        if selector is not None and (not isinstance(selector, str) or not selector.strip()):
            raise ConfigError("rest source: resource.data_selector must be a JSONPath string")
        return selector


class RestConfig(KindConfig):
    """A ``rest`` source's config (see the module docstring)."""

    label: ClassVar[str] = "rest source"

    client: RestClient
    resource: RestResource
    key: str | None = Field(None, validate_default=True)
    title: str | None = None
    template: str | None = None
    version_field: str | None = None

    @classmethod
    def not_a_mapping(cls, config: Any) -> str:
        return "rest source: config must be a mapping"

    @classmethod
    def unknown(cls, where: tuple[str | int, ...], names: list[str]) -> str:
        listed = ", ".join(names)
        if len(where) == 3 and where[:2] == ("client", "auth"):  # the auth's kind is where[2]
            auth = AUTH_KINDS[str(where[2])]
            env_key = next(name for name in auth.model_fields if name.endswith("_env"))
            return (
                f"rest source: client.auth ({where[2]}) may not hold {listed}: secrets are "
                f"never stored; put it in an environment variable and name it with {env_key}"
            )
        parts: dict[tuple[str | int, ...], type[BaseModel]] = {
            ("client",): RestClient,
            ("resource",): RestResource,
        }
        known = ", ".join(parts.get(where, cls).model_fields)
        return f"rest source: unknown {dotted(where) or 'config'} key(s) {listed}; known: {known}"

    @classmethod
    def invalid(cls, where: tuple[str | int, ...], error: ErrorDetails) -> str:
        if where in (("client",), ("resource",)):  # missing, or not a mapping
            return f"rest source: {where[0]} must be a mapping"
        return super().invalid(where, error)

    @field_validator("key", "title", "version_field", mode="before")
    @classmethod
    def _field(cls, value: Any, info: ValidationInfo) -> str | None:
        name = info.field_name
        if value is None:
            if name == "key":
                raise ConfigError(
                    "rest source: key (a record field, dotted for nested) is required"
                )
            return None
        if not isinstance(value, str) or not _FIELD.fullmatch(value.strip()):
            raise ConfigError(
                f"rest source: {name} must be a field name (dotted for nested: meta.id), "
                f"not {value!r}"
            )
        return value.strip()

    @field_validator("template", mode="before")
    @classmethod
    def _template(cls, value: Any) -> Any:
        if value is not None:
            check_template(value)
        return value

    def stored(self) -> dict[str, Any]:
        client, resource = self.client, self.resource
        auth = None if client.auth is None else client.auth.model_dump(exclude_none=True)
        return {
            "client": {"base_url": client.base_url, "paginator": client.paginator, "auth": auth},
            "resource": {
                "path": resource.path,
                "params": dict(resource.params),
                "data_selector": resource.data_selector,
            },
            "key": self.key,
            "title": self.title,
            "template": self.template,
            "version_field": self.version_field,
        }


def _refuse_secret_params(where: str, names: list[str]) -> None:
    if names:
        raise ConfigError(
            f"rest source: {where} holds {', '.join(names)}, which looks like a secret; a "
            "source's config is stored and shown, so secrets never go in it: put the secret in "
            "an environment variable and use client.auth (bearer with token_env, api_key with "
            "key_env, name and location: query for a query parameter, http_basic with "
            "password_env)"
        )
