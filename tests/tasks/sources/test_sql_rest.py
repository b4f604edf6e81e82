"""Tests for the ``sql`` and ``rest`` source kinds and their Markdown templates.

The sql tests read a real SQLite file; the rest tests a real HTTP server on 127.0.0.1 (allowed
through the SSRF guard only by ``sources_test_allow_loopback``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import sqlalchemy as sa

from core.errors import ConfigError
from core.settings import Settings, SourceSettings
from tasks.sources import rest, sql
from tasks.sources.base import Item, Limits, Prior, SourceError
from tasks.sources.template import check_template, default_markdown, render

TABLE_BODY = "Parts:\n\n| part | qty |\n|---|---|\n| rotor | 2 |"


def walk(connector: Any, prior: dict[str, Prior] | None = None) -> dict[str, Item]:
    return {item.key: item for item in connector.items(prior or {})}


def priors(items: dict[str, Item]) -> dict[str, Prior]:
    return {key: Prior(version=item.version, content_hash=None) for key, item in items.items()}


# --- template ---------------------------------------------------------------------------------


def test_render_substitutes_nested_fields_and_literal_braces() -> None:
    row = {"title": "Heron", "meta": {"author": {"name": "Ada"}}, "tags": ["a", "b"], "n": None}
    out = render("# {title}\n{meta.author.name} {{not a field}} {{{title}}} [{tags}] <{n}>", row)
    assert out == "# Heron\nAda {not a field} {Heron} [a, b] <>"
    assert check_template("{a} {b.c} {a} {{d}}") == ["a", "b.c"]


def test_render_missing_field_names_it_and_the_fields_there() -> None:
    with pytest.raises(ConfigError, match=r"'nope' is missing.*title.*body"):
        render("{nope}", {"title": "x", "body": "y"})
    with pytest.raises(ConfigError, match=r"'meta.who' is missing: 'meta' has the fields when"):
        render("{meta.who}", {"meta": {"when": 1}})


@pytest.mark.parametrize(
    "template",
    ["{x.__class__}", "{x.__class__.__name__}", "{x!r}", "{x:>10}", "{x[0]}", "{0.__class__}"],
)
def test_render_never_introspects(template: str) -> None:
    with pytest.raises(ConfigError) as caught:
        render(template, {"x": "a string"})
    assert "<class" not in str(caught.value)


@pytest.mark.parametrize("template", ["{x", "x}", "{x}}", "a { b"])
def test_unbalanced_braces_are_refused(template: str) -> None:
    with pytest.raises(ConfigError, match=r"unbalanced|not a field reference"):
        check_template(template)


def test_default_markdown_lists_short_fields_and_keeps_long_ones_verbatim() -> None:
    doc = default_markdown(
        {"id": 3, "title": "Rotor  check", "body": TABLE_BODY, "meta": {"a": 1}}, "title"
    )
    assert doc.startswith("# Rotor check\n")
    assert "- **id:** 3" in doc and "- **meta.a:** 1" in doc
    assert f"## body\n\n{TABLE_BODY}\n" in doc
    assert default_markdown({"id": 3}, None, fallback_title="tickets 3").startswith("# tickets 3")


# --- sql ----------------------------------------------------------------------------------------


ROWS = [
    (1, "Heron turbine", "Check every 400 hours.", {"author": "ada"}, "2026-01-01"),
    (2, "Rotor", TABLE_BODY, {"author": "bob"}, "2026-01-01"),
    (3, "Blade", "Inspect blades.", {"author": "cy"}, "2026-01-02"),
    (4, "Gearbox", "Oil monthly.", {}, "2026-01-03"),
    (5, "Tower", "Paint yearly.", {"author": "dee"}, "2026-01-04"),
]


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[sa.Engine]:
    url = f"sqlite:///{tmp_path / 'crm.db'}"
    engine = sa.create_engine(url)
    meta = sa.MetaData()
    table = sa.Table(
        "tickets",
        meta,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("title", sa.Text),
        sa.Column("body", sa.Text),
        sa.Column("meta", sa.JSON),
        sa.Column("updated_at", sa.Text),
    )
    meta.create_all(engine)
    with engine.begin() as conn:
        conn.execute(
            table.insert(),
            [
                dict(zip(("id", "title", "body", "meta", "updated_at"), r, strict=True))
                for r in ROWS
            ],
        )
    monkeypatch.setenv("KB_TEST_SQL_URL", url)
    yield engine
    engine.dispose()


def sql_source(**extra: Any) -> dict[str, Any]:
    return {"url_env": "KB_TEST_SQL_URL", "table": "tickets", "key": "id", **extra}


def test_sql_walks_every_row_as_markdown(db: sa.Engine) -> None:
    conn = sql.connector(sql_source(title="title"), Limits(), settings=Settings())
    items = walk(conn)
    assert conn.complete is True
    assert sorted(items) == [f"row/{i}" for i in range(1, 6)]
    two = items["row/2"]
    assert (two.uri, two.name, two.version, two.error) == ("sql://tickets/2", "2.md", None, None)
    doc = (two.data or b"").decode()
    assert doc.startswith("# Rotor\n") and f"## body\n\n{TABLE_BODY}" in doc
    assert "- **updated_at:** 2026-01-01" in doc
    assert "crm.db" not in two.uri and not two.meta


def test_sql_changed_row_and_version_column(db: sa.Engine) -> None:
    config = sql_source(title="title", version_column="updated_at")
    first = walk(sql.connector(config, Limits(), settings=Settings()))
    assert first["row/2"].version == "2026-01-01" and first["row/2"].data
    with db.begin() as conn:
        conn.execute(
            sa.text("UPDATE tickets SET body = 'Replaced', updated_at = '2026-02-01' WHERE id = 2")
        )
    second = walk(sql.connector(config, Limits(), settings=Settings()), priors(first))
    changed = second["row/2"]
    assert changed.version == "2026-02-01" and not changed.unchanged
    assert "Replaced" in (changed.data or b"").decode()
    others = [second[f"row/{i}"] for i in (1, 3, 4, 5)]
    assert all(item.unchanged and item.data is None for item in others)
    # Without a version column, the content is read and rendered anew every time.
    plain = walk(sql.connector(sql_source(), Limits(), settings=Settings()), priors(first))
    assert not plain["row/1"].unchanged and plain["row/1"].data


def test_sql_row_missing_a_template_field_is_an_error_item(db: sa.Engine) -> None:
    template = "# {title}\n\nBy {meta.author}.\n\n{body}\n"
    conn = sql.connector(sql_source(template=template), Limits(), settings=Settings())
    items = walk(conn)
    assert conn.complete is True
    bad = items["row/4"]
    assert bad.data is None and bad.error and "meta.author" in bad.error
    assert "missing" in bad.error
    assert (
        items["row/1"].data or b""
    ).decode() == "# Heron turbine\n\nBy ada.\n\nCheck every 400 hours.\n"
    assert sum(1 for i in items.values() if i.data) == 4


def test_sql_query_limits_and_filters(db: sa.Engine) -> None:
    query = "SELECT id, title, body FROM tickets WHERE id >= 2 AND title <> ':x'"
    capped = sql.connector(
        sql_source(table=None, query=query), Limits(max_items=2), settings=Settings()
    )
    items = walk(capped)
    assert len(items) == 2 and capped.complete is False
    assert all(i.uri.startswith("sql://query/") for i in items.values())
    some = sql.connector(
        sql_source(key=["id", "title"]), Limits(include=["row/3/*"]), settings=Settings()
    )
    assert list(walk(some)) == ["row/3/Blade"] and some.complete is True


def test_sql_unknown_column_is_a_source_error(db: sa.Engine) -> None:
    conn = sql.connector(sql_source(title="headline"), Limits(), settings=Settings())
    with pytest.raises(SourceError, match=r"headline.*its columns: id, title"):
        walk(conn)
    missing_table = sql.connector(sql_source(table="nope"), Limits(), settings=Settings())
    with pytest.raises(SourceError, match=r"no table 'nope'.*tickets"):
        walk(missing_table)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"url": "postgresql://kb:hunter2@db.example/crm", "table": "t", "key": "id"}, "url_env"),
        (
            {
                "url": "postgresql://kb@db.example/crm?sslpassword=hunter2",
                "table": "t",
                "key": "id",
            },
            "url_env",
        ),
        ({"url_env": "postgresql://x@y/z", "table": "t", "key": "id"}, "NAME of an environment"),
        ({"url_env": "DB", "table": "t", "query": "SELECT 1", "key": "id"}, "exactly one"),
        ({"url_env": "DB", "table": "t"}, "key"),
        ({"url_env": "DB", "query": "DELETE FROM t", "key": "id"}, "SELECT or WITH"),
        ({"url_env": "DB", "query": "SELECT 1; DROP TABLE t", "key": "id"}, "';'"),
        (
            {
                "url_env": "DB",
                "query": "WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x",
                "key": "id",
            },
            "'DELETE'",
        ),
        ({"url_env": "DB", "query": "SELECT * INTO copy FROM t", "key": "id"}, "'INTO'"),
        ({"url_env": "DB", "table": "t", "key": "id", "template": "{a"}, "unbalanced"),
        ({"url_env": "DB", "table": "t", "key": "id", "password": "x"}, "unknown"),
    ],
)
def test_sql_check_config_refuses(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        sql.check_config(config)
    assert "hunter2" not in str(caught.value)


def test_sql_url_without_password_is_allowed(db: sa.Engine) -> None:
    url = db.url.render_as_string(hide_password=False)
    config = sql.check_config({"url": url, "query": "SELECT id FROM tickets", "key": "id"})
    assert config["key"] == ["id"]
    assert len(walk(sql.connector(config, Limits(), settings=Settings()))) == 5


def test_sql_connection_failure_hides_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "KB_TEST_PG_URL", "postgresql+psycopg://kb:s3cr3t-pw@127.0.0.1:1/crm?sslpassword=other-pw"
    )
    conn = sql.connector(
        {"url_env": "KB_TEST_PG_URL", "table": "tickets", "key": "id"},
        Limits(),
        settings=Settings(),
    )
    with pytest.raises(SourceError) as caught:
        walk(conn)
    message = str(caught.value)
    assert "s3cr3t-pw" not in message and "other-pw" not in message
    assert "KB_TEST_PG_URL" in message and "127.0.0.1" in message
    assert conn.complete is False


def test_sql_missing_sqlite_file_is_a_source_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KB_TEST_SQL_URL", f"sqlite:///{tmp_path / 'absent.db'}")
    with pytest.raises(SourceError, match="no SQLite database file"):
        walk(sql.connector(sql_source(), Limits(), settings=Settings()))
    assert not (tmp_path / "absent.db").exists()


def test_sql_unset_env_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KB_TEST_UNSET_URL", raising=False)
    with pytest.raises(ConfigError, match=r"KB_TEST_UNSET_URL.*not set"):
        sql.connector(
            {"url_env": "KB_TEST_UNSET_URL", "table": "t", "key": "id"},
            Limits(),
            settings=Settings(),
        )
    monkeypatch.setenv("KB_TEST_UNSET_URL", "not a url with secret-pw")
    with pytest.raises(ConfigError) as caught:
        sql.connector(
            {"url_env": "KB_TEST_UNSET_URL", "table": "t", "key": "id"},
            Limits(),
            settings=Settings(),
        )
    assert "secret-pw" not in str(caught.value)


# --- rest ---------------------------------------------------------------------------------------

TOKEN = "tok-123-secret"
PAGE_SIZE = 2


@dataclass
class Api:
    base: str
    records: list[dict[str, Any]]
    seen_auth: list[str | None] = field(default_factory=list)
    next_override: str | None = None


def _records() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"id": i, "title": f"Article {i}", "body": f"Body {i}.", "meta": {"updated": "v1"}}
        for i in range(1, 6)
    ]
    out.insert(3, {"title": "No id here", "body": "orphan"})
    return out


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    state = Api(base="", records=_records())

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            state.seen_auth.append(self.headers.get("Authorization"))
            parts = urlsplit(self.path)
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._send(401, {"error": "unauthorized"})
            if parts.path == "/api/text":
                body = b"<html>not json</html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return None
            if parts.path == "/api/moved":
                port = self.server.server_address[1]
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{port}/api/items")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            if parts.path != "/api/items":
                return self._send(404, {"error": "not found"})
            page = int(parse_qs(parts.query).get("page", ["1"])[0])
            chunk = state.records[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
            more = page * PAGE_SIZE < len(state.records)
            nxt = (state.next_override or f"/api/items?page={page + 1}") if more else None
            return self._send(200, {"results": chunk, "next": nxt})

        def _send(self, status: int, payload: Any) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.base = f"http://127.0.0.1:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("KB_TEST_API_TOKEN", TOKEN)
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


LOOPBACK = Settings(
    sources=SourceSettings(sources_test_allow_loopback=True, sources_fetch_timeout_s=5)
)


def rest_source(api: Api, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "client": {
            "base_url": api.base,
            "paginator": {"type": "json_link", "next_url_path": "next"},
            "auth": {"type": "bearer", "token_env": "KB_TEST_API_TOKEN"},
        },
        "resource": {"path": "api/items", "data_selector": "results"},
        "key": "id",
        "title": "title",
    }
    return {**config, **extra}


def test_rest_walks_every_page(api: Api) -> None:
    conn = rest.connector(rest_source(api), Limits(), settings=LOOPBACK)
    items = walk(conn)
    assert conn.complete is True
    good = {k: v for k, v in items.items() if v.data}
    assert sorted(good) == [f"rec/{i}" for i in range(1, 6)]
    one = items["rec/1"]
    assert one.uri == f"{api.base}api/items#1" and one.name == "1.md"
    assert (one.data or b"").decode().startswith("# Article 1\n")
    errors = [i for i in items.values() if i.error]
    assert len(errors) == 1 and "has no key" in (errors[0].error or "")
    assert "'id' is missing" in (errors[0].error or "")
    assert len(api.seen_auth) == 3 and set(api.seen_auth) == {f"Bearer {TOKEN}"}


def test_rest_changed_record_and_version_field(api: Api) -> None:
    config = rest_source(api, version_field="meta.updated", template="# {title}\n\n{body}\n")
    first = walk(rest.connector(config, Limits(), settings=LOOPBACK))
    assert first["rec/2"].version == "v1" and first["rec/2"].data == b"# Article 2\n\nBody 2.\n"
    api.records[1] = {"id": 2, "title": "Article 2", "body": "New body.", "meta": {"updated": "v2"}}
    second = walk(rest.connector(config, Limits(), settings=LOOPBACK), priors(first))
    assert second["rec/2"].data == b"# Article 2\n\nNew body.\n" and second["rec/2"].version == "v2"
    assert all(second[f"rec/{i}"].unchanged for i in (1, 3, 4, 5))


def test_rest_loopback_needs_the_test_setting(api: Api) -> None:
    conn = rest.connector(rest_source(api), Limits(), settings=Settings())
    with pytest.raises(SourceError, match="SSRF guard"):
        walk(conn)
    assert api.seen_auth == [] and conn.complete is False


def test_rest_token_comes_from_the_environment(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KB_TEST_API_TOKEN")
    with pytest.raises(ConfigError, match=r"KB_TEST_API_TOKEN.*not set"):
        rest.connector(rest_source(api), Limits(), settings=LOOPBACK)
    inline = rest_source(api)
    inline["client"]["auth"] = {"type": "bearer", "token": TOKEN}
    with pytest.raises(ConfigError, match="token_env") as caught:
        rest.check_config(inline)
    assert TOKEN not in str(caught.value)


def test_rest_listing_failures_are_source_errors(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_TEST_API_TOKEN", "wrong")
    with pytest.raises(SourceError, match="HTTP 401"):
        walk(rest.connector(rest_source(api), Limits(), settings=LOOPBACK))
    monkeypatch.setenv("KB_TEST_API_TOKEN", TOKEN)
    text = rest_source(api, resource={"path": "api/text", "data_selector": "results"})
    with pytest.raises(SourceError, match="did not answer JSON"):
        walk(rest.connector(text, Limits(), settings=LOOPBACK))
    moved = rest_source(api, resource={"path": "api/moved", "data_selector": "results"})
    with pytest.raises(SourceError, match="off the source's origin"):
        walk(rest.connector(moved, Limits(), settings=LOOPBACK))
    port = urlsplit(api.base).port
    api.next_override = f"http://localhost:{port}/api/items?page=2"
    conn = rest.connector(rest_source(api), Limits(), settings=LOOPBACK)
    with pytest.raises(SourceError, match="off the source's origin"):
        walk(conn)
    assert conn.complete is False


def test_rest_max_items_stops_incomplete(api: Api) -> None:
    conn = rest.connector(rest_source(api), Limits(max_items=3), settings=LOOPBACK)
    assert len(walk(conn)) == 3 and conn.complete is False


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"client": {"base_url": "ftp://x.example/"}}, "http"),
        ({"client": {"base_url": "https://u:p@x.example/"}}, "credentials"),
        (
            {"client": {"base_url": "https://x.example/", "paginator": {"type": "nope"}}},
            "paginator",
        ),
        (
            {
                "client": {
                    "base_url": "https://x.example/",
                    "auth": {"type": "http_basic", "username": "u", "password": "p"},
                }
            },
            "password_env",
        ),
        ({"resource": {"path": "https://evil.example/x"}}, "relative"),
        ({"key": None}, "key"),
        ({"template": "{x"}, "unbalanced"),
    ],
)
def test_rest_check_config_refuses(change: dict[str, Any], message: str) -> None:
    api = Api(base="https://api.example.com/", records=[])
    with pytest.raises(ConfigError, match=message):
        rest.check_config(rest_source(api, **change))
