"""Tests for the source kinds' config models (tasks.sources.configs): what each kind stores
(the same keys in the same order as before they were models), unknown keys, and pydantic's own
faults always as a `ConfigError` that never shows the value given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from core.errors import ConfigError
from tasks.sources import KINDS, filesystem, kind_module, rest, sql, website
from tasks.sources.configs import KindConfig

API = {"base_url": "https://api.example.com/v1/"}


@pytest.mark.parametrize(
    ("module", "config", "stored"),
    [
        (filesystem, {"url": "s3://kb/docs/"}, '{"glob": "**/*", "url": "s3://kb/docs"}'),
        (
            filesystem,
            {"endpoint_url": " https://minio.example ", "glob": "*.pdf", "url": "s3://kb"},
            '{"glob": "*.pdf", "url": "s3://kb", "endpoint_url": "https://minio.example"}',
        ),
        (
            website,
            {"user_agent": "bot/1", "sitemap": "https://e.example/s.xml", "start_url": ""},
            '{"sitemap": "https://e.example/s.xml", "max_pages": 500, "max_bytes": 200000000, '
            '"max_depth": 5, "trust_lastmod": true, "user_agent": "bot/1"}',
        ),
        (
            sql,
            {"key": "id", "table": "tickets", "url_env": "CRM_URL"},
            '{"url_env": "CRM_URL", "table": "tickets", "key": ["id"], "title": null, '
            '"version_column": null, "template": null}',
        ),
        (
            rest,
            {
                "key": "id",
                "resource": {"path": "items"},
                "client": {**API, "auth": {"type": "api_key", "key_env": "K"}},
            },
            '{"client": {"base_url": "https://api.example.com/v1/", "paginator": null, "auth": '
            '{"type": "api_key", "key_env": "K", "name": "Authorization"}}, "resource": '
            '{"path": "items", "params": {}, "data_selector": null}, "key": "id", "title": null, '
            '"template": null, "version_field": null}',
        ),
    ],
)
def test_each_kind_stores_its_config_as_before(
    module: Any, config: dict[str, Any], stored: str
) -> None:
    assert json.dumps(module.check_config(config)) == stored
    # What was stored passes the check again unchanged (an update re-checks it).
    assert json.dumps(module.check_config(json.loads(stored))) == stored


@pytest.mark.parametrize(
    ("module", "config", "message"),
    [
        (
            filesystem,
            {"url": "s3://kb", "secret": "x", "region": "eu"},
            "unknown filesystem source settings: region, secret (known: endpoint_url, glob, url)",
        ),
        (
            website,
            {"start_url": "https://e.example/", "depth": 2},
            "unknown website source settings: depth (known: sitemap, start_url, max_pages",
        ),
        (
            sql,
            {"url_env": "DB", "table": "t", "key": "id", "password": "hunter2"},
            "sql source: unknown config key(s) password; known: url_env, url, table, query",
        ),
        (
            rest,
            {"client": API, "resource": {}, "key": "id", "pages": 3},
            "rest source: unknown config key(s) pages; known: client, resource, key, title",
        ),
        (
            rest,
            {"client": {**API, "timeout": 3}, "resource": {}, "key": "id"},
            "rest source: unknown client key(s) timeout; known: base_url, paginator, auth",
        ),
        (
            rest,
            {"client": API, "resource": {"method": "POST"}, "key": "id"},
            "rest source: unknown resource key(s) method; known: path, params, data_selector",
        ),
    ],
)
def test_unknown_keys_are_refused_by_name(
    module: Any, config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        module.check_config(config)


@pytest.mark.parametrize(
    ("auth", "env_key"),
    [
        ({"type": "bearer", "token": "hunter2"}, "token_env"),
        ({"type": "api_key", "api_key": "hunter2", "name": "X-Key"}, "key_env"),
        ({"type": "http_basic", "username": "u", "password": "hunter2"}, "password_env"),
    ],
)
def test_a_secret_written_into_the_auth_is_refused(auth: dict[str, Any], env_key: str) -> None:
    config = {"client": {**API, "auth": auth}, "resource": {}, "key": "id"}
    with pytest.raises(ConfigError, match=f"may not hold .*name it with {env_key}$") as caught:
        rest.check_config(config)
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", [["url", "s3://kb"], "s3://kb", None, 3])
def test_a_config_that_is_not_a_mapping_is_refused(kind: str, config: Any) -> None:
    with pytest.raises(ConfigError, match="mapping"):
        kind_module(kind).check_config(config)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        # Both were taken as str(value) before: a glob of 5 matched the file "5".
        ({"url": "s3://kb", "glob": 5}, "glob must be a text pattern"),
        ({"url": 5}, "url must be a text"),
    ],
)
def test_filesystem_values_must_be_texts(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        filesystem.check_config(config)


def test_a_url_no_url_can_hold_is_a_config_error() -> None:
    # JSON can write a lone surrogate; quoting it raised UnicodeEncodeError (a 500) before.
    with pytest.raises(ConfigError, match="not an absolute http"):
        website.check_config({"start_url": "https://e.example/\ud800"})


def test_a_local_folder_becomes_a_file_url(tmp_path: Path) -> None:
    assert filesystem.check_config({"url": str(tmp_path)}) == {
        "glob": "**/*",
        "url": tmp_path.resolve().as_uri(),
    }


class _Counted(KindConfig):
    """A kind with a field no validator words: pydantic's own fault reaches the user."""

    label: ClassVar[str] = "counted source"
    count: int
    token_note: str = ""


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"count": "hunter2"},
            "counted source: count is not valid: Input should be a valid integer",
        ),
        ({}, "counted source: count is required"),
        ({"count": 1, "token_note": ["hunter2"]}, "counted source: token_note is not valid"),
    ],
)
def test_pydantic_faults_are_config_errors_without_the_value(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _Counted.check(config)
    error = caught.value
    assert str(error).startswith(message)
    assert "hunter2" not in str(error)
    # pydantic's error (it holds the input) is neither the cause nor the context.
    assert error.__cause__ is None and error.__context__ is None


def test_a_validators_own_error_is_raised_as_it_was_worded() -> None:
    with pytest.raises(ConfigError) as caught:
        sql.check_config(
            {"url": "postgresql://kb:hunter2@db.example/crm", "table": "t", "key": "k"}
        )
    assert str(caught.value).startswith("sql source: url carries a password or secret")
    assert "hunter2" not in str(caught.value)
    assert caught.value.__context__ is None


def test_every_kind_has_a_checked_config() -> None:
    for kind in KINDS:
        module = kind_module(kind)
        assert callable(module.check_config) and callable(module.connector), kind
