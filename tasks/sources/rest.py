"""The ``rest`` source kind: each record of a JSON API listing becomes one Markdown document.

Config (`tasks.sources.configs.rest.RestConfig`, checked by `check_config`), shaped like a
dlt ``rest_api`` source with one resource::

    client:
      base_url: https://api.example.com/v1/
      paginator: {type: json_link, next_url_path: next}   # any dlt paginator spec; default:
                                                          # dlt's detection
      auth: {type: bearer, token_env: KB_API_TOKEN}       # the token comes from the environment
    resource:
      path: articles
      params: {status: published}                         # optional query parameters
      data_selector: results                              # optional JSONPath to the records
    key: id                      # field naming a record (dotted for nested: meta.id)
    title: title                 # optional field for the document title
    template: "# {title}\\n\\n{body}"   # optional Markdown template (`tasks.sources.template`)
    version_field: updated_at    # optional: a record whose value is as last synced is unchanged

Auth kinds: ``bearer`` (``token_env``), ``api_key`` (``key_env``, ``name``; sent as a header,
or as a query parameter with ``location: query``) and ``http_basic`` (``username``,
``password_env``). A secret written into the config itself (``token``, ``password``,
``api_key``...) is refused, and so is a query parameter whose name says it holds one
(``?api_key=``, ``token``, ``sig``...) in ``resource.params``, ``client.base_url`` or
``resource.path`` (`tasks.sources.guard.looks_secret`): only environment variable names are
stored, and only those the operator allows the org (``KBFLOW_SOURCES_SECRET_ENV``).

The pages are walked with dlt's `RESTClient` and its paginators. Before any request the base
URL passes kbflow's SSRF guard (`tasks.research.fetch.check_url`; loopback only with the test
setting ``sources_test_allow_loopback``), and every request (each page, each redirect hop) must
stay on the base URL's scheme, host and port: a ``next`` link or a redirect elsewhere stops the
sync with a `SourceError`. The proxy settings and ``.netrc`` of the environment are not used.

Deletions: every sync walks the full listing, and a record missing from a complete walk is
withdrawn by the sync. An incremental cursor (``updated_since``) would list only the changed
records and so hide deletions; the ``version_field`` saves the rendering and the ingest of an
unchanged record, not its listing.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import requests
from requests.auth import AuthBase

from core.errors import ConfigError
from core.settings import Settings
from tasks.research.fetch import FetchError, UnsafeUrl, check_url
from tasks.sources.base import Item, Limits, Prior, SourceError
from tasks.sources.configs.rest import RestConfig
from tasks.sources.sql import safe_name
from tasks.sources.template import lookup, record_item, text

log = logging.getLogger(__name__)

_MAX_REDIRECTS = 5


def check_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``rest`` source config, checked (`RestConfig`) and normalized.

    Raises:
        ConfigError: A key is unknown, missing or invalid, or a secret is written into it.
    """
    return RestConfig.check(config).stored()


def _secret(env: str, what: str) -> str:
    value = os.environ.get(env)
    if not value:
        raise ConfigError(
            f"rest source: environment variable {env} ({what}) is not set; export it with the "
            "API's secret"
        )
    return value


def _auth(spec: Mapping[str, Any] | None) -> AuthBase | None:
    from dlt.sources.helpers.rest_client.auth import APIKeyAuth, BearerTokenAuth, HttpBasicAuth

    if spec is None:
        return None
    if spec["type"] == "bearer":
        return BearerTokenAuth(token=_secret(spec["token_env"], "client.auth.token_env"))
    if spec["type"] == "api_key":
        key = _secret(spec["key_env"], "client.auth.key_env")
        return APIKeyAuth(name=spec["name"], api_key=key, location=spec.get("location", "header"))
    password = _secret(spec["password_env"], "client.auth.password_env")
    return HttpBasicAuth(username=spec["username"], password=password)


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port


class OffOrigin(requests.RequestException):
    """A page link or a redirect led off the source's origin."""


class _SameOriginSession(requests.Session):
    """A session that sends nothing off one origin, with no proxies or ``.netrc`` from the
    environment."""

    def __init__(self, base_url: str) -> None:
        super().__init__()
        self.trust_env = False
        self.max_redirects = _MAX_REDIRECTS
        self.origin = _origin(base_url)
        self.base_url = base_url

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        url = request.url or ""
        if _origin(url) != self.origin:
            shown = urlsplit(url)._replace(query="", fragment="").geturl()
            raise OffOrigin(
                f"{shown} is off the source's origin {self.base_url} (a next-page link or a "
                "redirect to another scheme, host or port is refused)"
            )
        return super().send(request, **kwargs)


class RestConnector:
    """Walks one REST listing; see the module docstring."""

    def __init__(
        self,
        config: Mapping[str, Any],
        limits: Limits,
        auth: AuthBase | None,
        *,
        timeout_s: float,
        allow_loopback: bool,
    ) -> None:
        self.config = dict(config)
        self.limits = limits
        self.auth = auth
        self.timeout_s = timeout_s
        self.allow_loopback = allow_loopback
        self.complete = False
        self.base_url: str = self.config["client"]["base_url"]
        self.path: str = self.config["resource"]["path"]
        self.listing = urljoin(self.base_url, self.path) if self.path else self.base_url

    def _guard(self) -> None:
        try:
            check_url(self.base_url, allow_loopback=self.allow_loopback)
        except UnsafeUrl as exc:
            raise SourceError(
                f"rest source: {self.base_url} is refused by the SSRF guard: {exc}"
            ) from exc
        except FetchError as exc:
            raise SourceError(f"rest source: {self.base_url} cannot be reached: {exc}") from exc

    def _pages(self) -> Iterator[list[Any]]:
        from dlt.sources.helpers.rest_client.client import RESTClient
        from dlt.sources.rest_api.config_setup import create_paginator

        client = self.config["client"]
        resource = self.config["resource"]
        spec = client.get("paginator")
        session = _SameOriginSession(self.base_url)
        rest = RESTClient(
            base_url=self.base_url,
            auth=self.auth,
            paginator=create_paginator(copy.deepcopy(spec)) if spec is not None else None,
            data_selector=resource.get("data_selector"),
            session=session,
        )
        pages = rest.paginate(
            self.path, params=resource.get("params") or None, timeout=self.timeout_s
        )
        try:
            while True:
                try:
                    page = next(pages, None)
                except requests.HTTPError as exc:
                    status = exc.response.status_code if exc.response is not None else "?"
                    raise self._fail(f"answered HTTP {status}", exc) from exc
                except requests.Timeout as exc:
                    raise self._fail(f"timed out after {self.timeout_s:g} s", exc) from exc
                except requests.exceptions.JSONDecodeError as exc:
                    raise self._fail("did not answer JSON", exc) from exc
                except Exception as exc:  # connection failures, dlt paginator errors
                    raise self._fail("could not be listed", exc) from exc
                if page is None:
                    return
                yield list(page)
        finally:
            session.close()

    def _fail(self, what: str, exc: BaseException) -> SourceError:
        detail = str(exc).splitlines()[0][:400] if str(exc) else type(exc).__name__
        return SourceError(f"rest source: {self.listing} {what}: {detail}")

    def items(self, prior: Mapping[str, Prior]) -> Iterator[Item]:
        """Every record of the listing as an `Item`; see the module docstring.

        Raises:
            SourceError: The SSRF guard refused the base URL, or a page could not be fetched or
                read (HTTP error, timeout, not JSON, a link off the origin).
        """
        self.complete = False
        self._guard()
        seen: set[str] = set()
        count = 0
        number = 0
        pages = 0
        for page in self._pages():
            pages += 1
            if pages > self.limits.max_items + 100:
                log.warning("rest source %s: stopped after %d pages", self.listing, pages)
                return
            for record in page:
                number += 1
                item = self._item(record, number, prior, seen)
                if item is None:
                    continue
                if count >= self.limits.max_items:
                    return
                count += 1
                yield item
        self.complete = True

    def _item(
        self, record: Any, number: int, prior: Mapping[str, Prior], seen: set[str]
    ) -> Item | None:
        key_field: str = self.config["key"]
        if not isinstance(record, Mapping):
            return self._keyless(number, f"is a JSON {type(record).__name__}, not an object")
        try:
            raw_key = lookup(record, key_field)
        except ConfigError as exc:
            return self._keyless(number, f"has no key: {exc}")
        if raw_key is None or isinstance(raw_key, Mapping | list | bool):
            return self._keyless(number, f"has no usable key: {key_field} is {raw_key!r}")
        key_text = text(raw_key)
        key = f"rec/{key_text.replace('%', '%25').replace('/', '%2F')}"
        if not self.limits.wanted(key):
            return None
        if key in seen:
            log.warning("rest source %s: duplicate key %s; keeping the first", self.listing, key)
            return None
        seen.add(key)
        uri = f"{self.listing}#{quote(key_text, safe='')}"
        name = f"{safe_name(key_text)}.md"
        version_field = self.config.get("version_field")
        version = None
        if version_field:
            try:
                raw_version = lookup(record, version_field)
            except ConfigError:
                raw_version = None
            version = None if raw_version is None else text(raw_version)
        return record_item(record, key=key, uri=uri, name=name, version=version,
                           prior=prior.get(key), config=self.config, fallback_title=key_text,
                           limits=self.limits)  # fmt: skip

    def _keyless(self, number: int, why: str) -> Item | None:
        key = f"rec/#{number}"
        if not self.limits.wanted(key):
            return None
        return Item(
            key,
            f"{self.listing}#record-{number}",
            f"record-{number}.md",
            error=f"record {number} of {self.listing} {why}",
        )


def connector(config: Mapping[str, Any], limits: Limits, *, settings: Settings) -> RestConnector:
    """The connector of one ``rest`` source.

    Raises:
        ConfigError: The config is invalid, or an auth environment variable is not set.
    """
    checked = check_config(config)
    return RestConnector(
        checked,
        limits,
        _auth(checked["client"]["auth"]),
        timeout_s=settings.sources.sources_fetch_timeout_s,
        allow_loopback=settings.sources.sources_test_allow_loopback,
    )
