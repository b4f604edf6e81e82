"""The ``website`` kind's config (`tasks.sources.website`): one site, by its sitemap or a crawl.

Exactly one of ``sitemap`` or ``start_url``, each an absolute http(s) URL (normalised: the item
keys' spelling) without credentials or a secret-looking query, whose host the SSRF guard does
not refuse by name or address (loopback passes here; the sync refuses it unless the test setting
allows); the caps ``max_pages``, ``max_bytes`` and ``max_depth`` as whole numbers (a numeric text
is taken), ``user_agent`` a one-line text, ``trust_lastmod`` true or false.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ValidationInfo, field_validator, model_validator

from core.errors import ConfigError, UnsafeUrl
from tasks.research.fetch import check_url_shape
from tasks.sources.configs import KindConfig
from tasks.sources.guard import secret_params
from tasks.sources.website_parse import normalise

DEFAULT_MAX_PAGES = 500
DEFAULT_MAX_BYTES = 200_000_000
DEFAULT_MAX_DEPTH = 5
_MINIMUM = {"max_pages": 1, "max_bytes": 1, "max_depth": 0}


class WebsiteConfig(KindConfig):
    """A website source's config. Each URL must be an absolute http(s) URL without credentials
    or a secret-looking query, whose host is not refused by name or address (loopback passes
    here; the sync refuses it unless the test setting allows)."""

    label: ClassVar[str] = "website source"

    sitemap: str | None = None
    start_url: str | None = None
    max_pages: int = DEFAULT_MAX_PAGES
    max_bytes: int = DEFAULT_MAX_BYTES
    max_depth: int = DEFAULT_MAX_DEPTH
    user_agent: str | None = None
    trust_lastmod: bool = True

    @classmethod
    def not_a_mapping(cls, config: Any) -> str:
        return (
            f"a website source's settings must be a mapping, not {type(config).__name__}: "
            'give {"sitemap": URL} or {"start_url": URL}'
        )

    @classmethod
    def unknown(cls, where: tuple[str | int, ...], names: list[str]) -> str:
        return (
            f"unknown website source settings: {', '.join(names)} (known: "
            f"{', '.join(cls.model_fields)}); fix the spelling or leave them out"
        )

    @field_validator("sitemap", "start_url", mode="before")
    @classmethod
    def _url(cls, value: Any, info: ValidationInfo) -> str | None:
        return None if value is None or value == "" else _config_url(str(info.field_name), value)

    @field_validator("max_pages", "max_bytes", "max_depth", mode="before")
    @classmethod
    def _whole(cls, value: Any, info: ValidationInfo) -> int:
        key = str(info.field_name)
        default: int = cls.model_fields[key].default
        if value is None:
            return default
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int) or value < _MINIMUM[key]:
            raise ConfigError(
                f"{key} must be a whole number of at least {_MINIMUM[key]}, not {value!r}: set "
                f"it to a number or leave it out (default {default:,})"
            )
        return value

    @field_validator("user_agent", mode="before")
    @classmethod
    def _agent(cls, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(
                f"user_agent must be a non-empty text, not {value!r}: name your crawler, e.g. "
                "'acme-kb/1.0 (+https://acme.example/bot)', or leave it out"
            )
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
            raise ConfigError(
                f"user_agent {value!r} contains control characters or line breaks; remove them"
            )
        return value.strip()

    @field_validator("trust_lastmod", mode="before")
    @classmethod
    def _trust(cls, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ConfigError(f"trust_lastmod must be true or false, not {value!r}")
        return value

    @model_validator(mode="after")
    def _one_mode(self) -> WebsiteConfig:
        if (self.sitemap is None) == (self.start_url is None):
            got = "neither" if self.sitemap is None else "both"
            raise ConfigError(
                f"a website source needs exactly one of 'sitemap' (the URL of the site's "
                f"sitemap.xml) or 'start_url' (a page to crawl from), got {got}: set one of them"
            )
        return self

    def stored(self) -> dict[str, Any]:
        mode = "sitemap" if self.sitemap is not None else "start_url"
        out: dict[str, Any] = {
            mode: getattr(self, mode),
            "max_pages": self.max_pages,
            "max_bytes": self.max_bytes,
            "max_depth": self.max_depth,
            "trust_lastmod": self.trust_lastmod,
        }
        if self.user_agent is not None:
            out["user_agent"] = self.user_agent
        return out


def _config_url(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a URL text, not {value!r}: give https://…")
    url = normalise(value.strip())
    if url is None:
        raise ConfigError(
            f"{key} {value!r} is not an absolute http(s) URL without credentials: give the full "
            "URL, e.g. https://docs.example.com/sitemap.xml"
        )
    try:
        # Loopback passes here (a test site); the sync refuses it unless the test setting allows.
        check_url_shape(url, allow_loopback=True)
    except UnsafeUrl as exc:
        raise ConfigError(f"{key}: {exc}") from exc
    secrets = secret_params(url)
    if secrets:
        raise ConfigError(
            f"{key}'s query holds {', '.join(secrets)}, which looks like a secret; a source's "
            "config is stored and shown, so it never holds one: sync a public page instead"
        )
    return url
