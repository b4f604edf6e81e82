"""The ``filesystem`` kind: a local folder, or a bucket on S3, GCS or Azure through dlt's
authenticated fsspec clients.

Config: ``url`` (``/srv/share/policies``, ``file:///srv/share``, ``s3://bucket/prefix``,
``gs://…``, ``az://…``), optional ``glob`` (default ``**/*``) and, for an S3-compatible server,
``endpoint_url``. Credentials are never part of the config: S3 reads ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL``) from the environment; GCS and Azure use dlt's own configuration
(``SOURCES__FILESYSTEM__CREDENTIALS__…`` variables, or ``.dlt/secrets.toml``).

A custom ``endpoint_url`` is a superadmin's only (`tasks.sources.guard`): it points a signed
request at a server of the source's choosing. It passes the SSRF guard of research
(`tasks.research.fetch`) by its shape when stored and by the addresses its host resolves to at
every sync: no private, link-local, metadata or loopback address (loopback only with the
test-only ``sources_test_allow_loopback``).

An item's version is its ETag where the store gives one (S3, GCS, Azure), else its
modification time and size, as the listing gives them: an unchanged re-sync lists the source
and reads no file. Symbolic links in a local folder are not followed.
"""

from __future__ import annotations

import os
import posixpath
import stat
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from core.settings import Settings
from tasks.sources.base import Item, Limits, Prior, SourceError, too_big
from tasks.sources.configs.filesystem import FilesystemConfig


def is_local(config: Mapping[str, Any]) -> bool:
    return urllib.parse.urlsplit(str(config["url"])).scheme in ("", "file")


def check_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config, checked (`FilesystemConfig`) and normalised (a local path becomes an
    absolute ``file://`` URL).

    Raises:
        ConfigError: a missing or unsupported ``url``, an unknown key, or credentials in it.
    """
    return FilesystemConfig.check(config).stored()


def connector(
    config: Mapping[str, Any], limits: Limits, *, settings: Settings
) -> FilesystemConnector:
    return FilesystemConnector(
        dict(config), limits, allow_loopback=settings.sources.sources_test_allow_loopback
    )


class FilesystemConnector:
    """Lists the folder or bucket with dlt's filesystem source; reads only what changed."""

    def __init__(
        self, config: dict[str, Any], limits: Limits, *, allow_loopback: bool = False
    ) -> None:
        self.config = config
        self.limits = limits
        self.allow_loopback = allow_loopback
        self.complete = False

    def items(self, prior: Mapping[str, Prior]) -> Iterator[Item]:
        self.complete = False
        listing = self._listing()
        count = 0
        root = self.config["url"].rstrip("/")
        while True:
            try:
                entry = next(listing)
            except StopIteration:
                break
            except SourceError:
                raise
            except Exception as exc:  # the listing itself failed: nothing is withdrawn
                raise SourceError(_listing_error(root, exc)) from exc
            for file in entry if isinstance(entry, list) else [entry]:
                key = str(file["relative_path"])
                if not self.limits.wanted(key):
                    continue
                if count >= self.limits.max_items:
                    return  # a cap stopped the walk: complete stays False
                count += 1
                yield self._item(file, key, prior.get(key))
        self.complete = True

    def _item(self, file: Any, key: str, before: Prior | None) -> Item:
        uri = str(file["file_url"])
        name = posixpath.basename(key) or "item"
        modified = file.get("modification_date")
        size = int(file.get("size_in_bytes") or 0)
        version = file.get("etag") or f"{modified.isoformat() if modified else '?'}:{size}"
        if before is not None and before.version == version:
            return Item(key=key, uri=uri, name=name, version=version, unchanged=True)
        if size > self.limits.max_item_bytes:
            return Item(key=key, uri=uri, name=name, version=version,
                        error=too_big(key, size, self.limits))  # fmt: skip
        try:
            data = file.read_bytes()
        except Exception as exc:  # one unreadable object: reported, the rest go on
            return Item(key=key, uri=uri, name=name, version=version,
                        error=f"could not read {key}: {type(exc).__name__}: {exc}")  # fmt: skip
        return Item(key=key, uri=uri, name=name, version=version, data=data)

    def _listing(self) -> Iterator[Any]:
        if self.config["url"].startswith("file://"):
            return _local_listing(self.config["url"], self.config["glob"])
        if self.config.get("endpoint_url"):
            _check_endpoint(str(self.config["endpoint_url"]), allow_loopback=self.allow_loopback)
        return _remote_listing(self.config)


def _check_endpoint(endpoint: str, *, allow_loopback: bool) -> None:
    """The SSRF guard on a custom endpoint, by the addresses its host resolves to now.

    Raises:
        SourceError: the guard refuses it, or its name does not resolve (nothing was sent).
    """
    from core.errors import UnsafeUrl
    from tasks.research.fetch import FetchError, check_url

    try:
        check_url(endpoint, allow_loopback=allow_loopback)
    except UnsafeUrl as exc:
        raise SourceError(f"endpoint_url {endpoint} is refused by the SSRF guard: {exc}") from exc
    except FetchError as exc:
        raise SourceError(f"endpoint_url {endpoint} cannot be reached: {exc}") from exc


def _aws_credentials(config: Mapping[str, Any]) -> Any:
    """S3 credentials from the environment (boto's own names), never from the config."""
    from dlt.common.configuration.specs import AwsCredentials

    creds = AwsCredentials()
    creds.aws_access_key_id = os.environ.get("AWS_ACCESS_KEY_ID")  # type: ignore[assignment]
    creds.aws_secret_access_key = os.environ.get("AWS_SECRET_ACCESS_KEY")  # type: ignore[assignment]
    creds.aws_session_token = os.environ.get("AWS_SESSION_TOKEN")  # type: ignore[assignment]
    creds.region_name = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
    creds.endpoint_url = config.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL")
    return creds


class _RemoteFile(dict[str, Any]):
    """An object of a bucket, as listed, read through the listing's client."""

    def read_bytes(self) -> bytes:
        return bytes(self["fs"].cat_file(self["path"]))


def _remote_listing(config: Mapping[str, Any]) -> Iterator[_RemoteFile]:
    """A bucket's objects with their ETags (an object's version), through dlt's authenticated
    fsspec client (dlt's own listing drops the ETag, and a second-resolution modification
    time misses a same-size change within a second)."""
    from dlt.common.storages.fsspec_filesystem import MTIME_DISPATCH, fsspec_filesystem

    url = str(config["url"])
    scheme = urllib.parse.urlsplit(url).scheme
    credentials = _aws_credentials(config) if scheme == "s3" else None
    try:
        fs, _ = fsspec_filesystem(url, credentials)  # type: ignore[arg-type]
        root = fs._strip_protocol(url).rstrip("/")
        fs.invalidate_cache()
        found = fs.glob(posixpath.join(root, str(config["glob"])), detail=True)
    except Exception as exc:
        raise SourceError(_listing_error(url, exc)) from exc
    for path in sorted(found):
        md = found[path]
        if md.get("type") != "file":
            continue
        rel = path[len(root) :].lstrip("/") if path.startswith(root) else path
        etag = md.get("ETag") or md.get("etag") or md.get("md5Hash") or md.get("version_id")
        yield _RemoteFile(
            relative_path=rel,
            file_url=f"{scheme}://{path}",
            path=path,
            fs=fs,
            etag=str(etag).strip('"') if etag else None,
            modification_date=MTIME_DISPATCH[scheme](md) if scheme in MTIME_DISPATCH else None,
            size_in_bytes=md.get("size"),
        )


class _LocalFile(dict[str, Any]):
    """A local file as dlt's listing describes one, read without following a link."""

    def read_bytes(self) -> bytes:
        fd = os.open(self["path"], os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            return fh.read()


def _local_listing(url: str, glob: str) -> Iterator[_LocalFile]:
    """The files under a local folder in a stable order, never through a symbolic link (a link
    could lead anywhere on this machine: dlt's local listing follows them)."""
    import datetime as dt
    import fnmatch

    root = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    if not root.is_dir() or root.is_symlink():
        raise SourceError(f"{root} is not a folder (or is a link): check the source's url")
    pattern = "*" if glob in ("**/*", "**", "*") else glob
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not (Path(folder) / d).is_symlink())
        for name in sorted(files):
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            if not (fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(name, pattern)):
                continue
            try:
                st = path.lstat()
            except OSError:
                continue  # gone since the folder was read
            if not stat.S_ISREG(st.st_mode):
                continue  # links, sockets, devices: never read
            yield _LocalFile(
                relative_path=rel,
                file_url=path.as_uri(),
                path=str(path),
                modification_date=dt.datetime.fromtimestamp(st.st_mtime, dt.UTC),
                size_in_bytes=st.st_size,
            )


def _listing_error(url: str, exc: BaseException) -> str:
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    for secret in (os.environ.get("AWS_SECRET_ACCESS_KEY"), os.environ.get("AWS_SESSION_TOKEN")):
        if secret:
            detail = detail.replace(secret, "***")
    return (
        f"could not list {url}: {type(exc).__name__}: {detail[:300]}. Check the URL, that the "
        "bucket or folder exists and that the credentials in the environment may list it."
    )
