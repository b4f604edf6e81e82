"""The ``filesystem`` kind's config (`tasks.sources.filesystem`): a folder or a bucket.

``url``: a folder (made an absolute ``file://`` URL; it must exist), ``file://``, or a bucket
(`REMOTE_SCHEMES`: ``s3://bucket/prefix``...), never with credentials in it; ``glob`` (default
``**/*``); ``endpoint_url``: an S3-compatible server, an http(s) URL whose host the SSRF guard
does not refuse by name or address (loopback passes here; the sync refuses it unless the test
setting allows it, and checks what the name resolves to).
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator

from core.errors import ConfigError, UnsafeUrl
from tasks.sources.configs import KindConfig

REMOTE_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss")
DEFAULT_GLOB = "**/*"


class FilesystemConfig(KindConfig):
    """A filesystem source's config (see the module docstring)."""

    label: ClassVar[str] = "filesystem source"

    url: str = Field("", validate_default=True)
    glob: str = DEFAULT_GLOB
    endpoint_url: str | None = None

    @classmethod
    def unknown(cls, where: tuple[str | int, ...], names: list[str]) -> str:
        return (
            f"unknown filesystem source settings: {', '.join(names)} (known: "
            f"{', '.join(sorted(cls.model_fields))}). Credentials come from the environment, "
            "never from the source's settings."
        )

    @field_validator("url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> str:
        if value is not None and not isinstance(value, str):
            raise ConfigError(
                f"a filesystem source's url must be a text, not {type(value).__name__}: a "
                "folder, or s3://bucket/prefix"
            )
        url = (value or "").strip()
        if not url:
            raise ConfigError("a filesystem source needs a url: a folder, or s3://bucket/prefix")
        parts = urllib.parse.urlsplit(url)
        if parts.username or parts.password or "@" in parts.netloc:
            raise ConfigError(
                "the source url holds credentials; remove them and set them in the environment "
                "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for S3)"
            )
        if parts.scheme in ("", "file"):
            path = Path(parts.path if parts.scheme else url).expanduser().resolve()
            if not path.is_dir():
                raise ConfigError(f"{path} is not a folder: give an existing folder to sync")
            return path.as_uri()
        if parts.scheme in REMOTE_SCHEMES:
            if not parts.netloc:
                raise ConfigError(f"{url!r} names no bucket: write {parts.scheme}://BUCKET/prefix")
            return url.rstrip("/")
        raise ConfigError(
            f"{parts.scheme}:// is not a filesystem kbflow syncs: use a folder, file://, "
            f"{', '.join(s + '://' for s in REMOTE_SCHEMES)}"
        )

    @field_validator("glob", mode="before")
    @classmethod
    def _glob(cls, value: Any) -> str:
        if value is not None and not isinstance(value, str):
            raise ConfigError(
                f"glob must be a text pattern such as **/*.pdf, not {type(value).__name__}"
            )
        return value or DEFAULT_GLOB

    @field_validator("endpoint_url", mode="before")
    @classmethod
    def _endpoint(cls, value: Any) -> str | None:
        if not value:
            return None
        endpoint = str(value).strip()
        if urllib.parse.urlsplit(endpoint).scheme not in ("http", "https"):
            raise ConfigError(f"endpoint_url {endpoint!r} must be an http(s) URL")
        from tasks.research.fetch import check_url_shape

        try:
            # Loopback passes here (a test server); the sync refuses it unless the test setting
            # allows it, and checks what the name resolves to.
            check_url_shape(endpoint, allow_loopback=True)
        except UnsafeUrl as exc:
            raise ConfigError(f"endpoint_url: {exc}") from exc
        return endpoint

    def stored(self) -> dict[str, Any]:
        out: dict[str, Any] = {"glob": self.glob, "url": self.url}
        if self.endpoint_url:
            out["endpoint_url"] = self.endpoint_url
        return out
