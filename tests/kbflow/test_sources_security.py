"""What a synced source may reach (`tasks.sources.guard`, `kbflow.services.sources.definitions`),
each attack of the hostile review reproduced against a loopback listener that records every request
it gets: the worker's secrets, this machine's files and kbflow's own stores, a custom S3
endpoint, secrets in a stored config, an unknown audience and the test-only loopback switch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError, Forbidden
from core.models import Role
from core.settings import Settings
from kbflow.services.sources import definitions as service
from sinks.registry import SqlRegistry
from tasks.sources import kind_module
from tasks.sources.base import Limits, SourceError
from tests.flows.source_servers import serve_http

ORG = "acme"
SECRET = "sk-ant-worker-secret-0451"


class Listener:
    """A loopback HTTP server answering an empty JSON listing; keeps each request's line and
    headers."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.base = ""

    def seen(self) -> str:
        with self.lock:
            return repr(self.requests)


@pytest.fixture
def listener() -> Iterator[Listener]:
    got = Listener()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            with got.lock:
                got.requests.append((self.path, dict(self.headers)))
            body = b'{"results": []}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    for base in serve_http(Handler):
        got.base = base
        yield got


@pytest.fixture
def people(settings: Settings) -> Iterator[SqlRegistry]:
    """acme with its AM amy, and the superadmin root."""
    reg = SqlRegistry.open(settings.registry_url)
    reg.people.ensure_user("root", Role.SUPERADMIN, bootstrap=True)
    reg.people.ensure_org(ORG)
    reg.people.ensure_user("amy", Role.ACCOUNT_MANAGER)
    reg.people.assign_am(ORG, "amy")
    yield reg
    reg.close()


def _denied(registry: SqlRegistry) -> list[dict[str, Any]]:
    return [
        {"actor": row.actor, **(row.after or {})}
        for row in registry.audit.audit_trail(ORG)
        if row.action == "kb.access.denied"
    ]


def _rest(base: str, token_env: str) -> dict[str, Any]:
    return {
        "client": {"base_url": f"{base}/api/", "auth": {"type": "bearer", "token_env": token_env}},
        "resource": {"path": "articles", "data_selector": "results"},
        "key": "id",
    }


def _walk(settings: Settings, kind: str, config: dict[str, Any]) -> list[Any]:
    conn = kind_module(kind).connector(config, Limits(), settings=settings)
    return list(conn.items({}))


# --- 2: a source names only the environment variables the operator allows its org -----------


def test_an_am_cannot_send_the_workers_secrets_to_their_host(
    settings: Settings, people: SqlRegistry, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("KB_API_TOKEN", "the-org-token")
    loopback = settings.replace(sources_test_allow_loopback=True)
    for env, where in (("ANTHROPIC_API_KEY", "token_env"), ("KB_API_TOKEN", "token_env")):
        fields = service.source_fields("rest", _rest(listener.base, env), collection="c",
                                       status="pending_review")  # fmt: skip
        with pytest.raises(Forbidden, match=f"{env}.*KBFLOW_SOURCES_SECRET_ENV"):
            service.add_source(loopback, ORG, "api", fields, actor="amy")
        with pytest.raises(Forbidden, match=where):  # a superadmin too: the operator's list
            service.add_source(loopback, ORG, "api", fields, actor="root")
    sql = service.source_fields("sql", {"url_env": "ANTHROPIC_API_KEY", "table": "t", "key": "id"},
                                collection="c", status="approved")  # fmt: skip
    with pytest.raises(Forbidden, match="url_env"):
        service.add_source(loopback, ORG, "db", sql, actor="amy")
    assert people.sources.list_sources(ORG) == []
    denied = _denied(people)
    assert len(denied) == 5 and {d["actor"] for d in denied} == {"amy", "root"}
    assert all("KBFLOW_SOURCES_SECRET_ENV" in d["reason"] for d in denied)

    # The operator lists acme's token: that one is taken, and sent only where it was meant.
    allowed = loopback.replace(sources_secret_env="acme:KB_API_TOKEN,globex:ANTHROPIC_API_KEY")
    fields = service.source_fields("rest", _rest(listener.base, "KB_API_TOKEN"), collection="c",
                                   status="pending_review")  # fmt: skip
    made = service.add_source(allowed, ORG, "api", fields, actor="amy")
    with pytest.raises(Forbidden):  # changed to another org's variable: refused, audited
        service.update_source(allowed, "api", ORG, {"config": _rest(listener.base,
                              "ANTHROPIC_API_KEY")}, actor="amy")  # fmt: skip
    assert len(_denied(people)) == 6
    assert _walk(allowed, "rest", made.config) == []
    assert SECRET not in listener.seen() and "Bearer the-org-token" in listener.seen()

    # A source stored before the list changed: its sync stops before reading the variable.
    from tasks.sources.guard import check_before_sync

    with pytest.raises(SourceError, match="KB_API_TOKEN"):
        check_before_sync(loopback, ORG, made.config)


# --- 3: a file-backed SQL source is a superadmin's, and never reads kbflow's stores ---------


def test_a_sqlite_source_is_a_superadmins_and_never_reads_kbflows_stores(
    settings: Settings, people: SqlRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlalchemy as sa

    other = tmp_path / "other.db"
    with sa.create_engine(f"sqlite:///{other}").begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)"))
    registry_db = settings.home.resolve() / "registry.db"
    assert registry_db.is_file()

    def sql(url: str) -> dict[str, Any]:
        return service.source_fields("sql", {"url": url, "table": "users", "key": "id"},
                                     collection="c", status="approved")  # fmt: skip

    for url in (f"sqlite:///{other}", f"sqlite:///{registry_db}", "duckdb:////etc/kb.duckdb",
                "postgresql://kb@/crm?host=/var/run/postgresql"):  # fmt: skip
        with pytest.raises(Forbidden, match="superadmin"):
            service.add_source(settings, ORG, "db", sql(url), actor="amy")
    assert people.sources.list_sources(ORG) == []
    assert "a file-backed SQL database" in _denied(people)[0]["attempted"]

    # Even a superadmin's may not point into the home, by name or through a link.
    link = tmp_path / "innocent.db"
    link.symlink_to(registry_db)
    for url in (f"sqlite:///{registry_db}", f"sqlite:///{link}",
                f"sqlite:///{settings.home}/../home/registry.db"):  # fmt: skip
        with pytest.raises(ConfigError, match="kbflow's own stores"):
            service.add_source(settings, ORG, "db", sql(url), actor="root")
    assert people.sources.list_sources(ORG) == []
    service.add_source(settings, ORG, "db", sql(f"sqlite:///{other}"), actor="root")

    # A URL from the environment is checked at the sync: the registry is never opened.
    monkeypatch.setenv("KB_DB_URL", f"sqlite:///{registry_db}")
    with pytest.raises(SourceError, match="kbflow's own stores"):
        _walk(settings, "sql", {"url_env": "KB_DB_URL", "table": "users", "key": "id"})
    assert service.source_fields(
        "sql",
        {"url": "postgresql://kb@db.example/crm", "table": "t", "key": "id"},
        collection="c",
        status="approved",
    )


# --- 8: a custom S3 endpoint is a superadmin's and passes the SSRF guard ----------------------


def test_a_custom_s3_endpoint_is_a_superadmins_and_passes_the_ssrf_guard(
    settings: Settings, people: SqlRegistry, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWORKER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")

    def s3(endpoint: str) -> dict[str, Any]:
        config = {"url": "s3://kbdocs/docs", "endpoint_url": endpoint}
        return service.source_fields("filesystem", config, collection="c", status="approved")

    with pytest.raises(Forbidden, match="superadmin"):
        service.add_source(settings, ORG, "bucket", s3(listener.base), actor="amy")
    assert "a custom S3 endpoint_url" in _denied(people)[0]["attempted"]
    for endpoint in ("http://169.254.169.254", "http://10.0.0.7:9000", "http://[fd00::1]/",
                     "http://metadata.google.internal"):  # fmt: skip
        with pytest.raises(ConfigError, match="endpoint_url"):
            s3(endpoint)
    # Loopback is stored (a test server) but never reached without the test-only switch.
    made = service.add_source(settings, ORG, "bucket", s3(listener.base), actor="root")
    with pytest.raises(SourceError, match="SSRF guard"):
        _walk(settings.replace(sources_test_allow_loopback=False), "filesystem", made.config)
    assert listener.requests == []
    assert service.source_fields("filesystem", {"url": "s3://kbdocs/docs"}, collection="c",
                                 status="approved")["config"] == {"url": "s3://kbdocs/docs",
                                                                  "glob": "**/*"}  # fmt: skip


# --- 13: no secret in a stored config's URLs or parameters ------------------------------------


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"params": {"api_key": "abc123"}}, "api_key"),
        ({"params": {"status": "published", "accessToken": "abc"}}, "accessToken"),
        ({"params": {"sig": "abc"}}, "sig"),
        ({"params": {"X-Amz-Signature": "abc"}}, "X-Amz-Signature"),
        ({"params": {"auth": "abc"}}, "auth"),
        ({"params": {"client_secret": "abc"}}, "client_secret"),
        ({"base_url": "https://api.example.com/v1/?token=abc"}, "token"),
        ({"base_url": "https://api.example.com/v1/?key=abc&page=1"}, "key"),
        ({"path": "articles?password=abc"}, "password"),
    ],
)
def test_a_secret_in_a_rest_url_or_params_is_refused(change: dict[str, Any], named: str) -> None:
    config = _rest("https://api.example.com", "KB_API_TOKEN")
    config["client"] |= {k: v for k, v in change.items() if k == "base_url"}
    config["resource"] |= {k: v for k, v in change.items() if k != "base_url"}
    with pytest.raises(ConfigError, match=f"{named}.*looks like a secret.*_env"):
        service.source_fields("rest", config, collection="c", status="approved")


def test_plain_rest_params_and_a_query_key_from_the_environment_are_kept() -> None:
    config = _rest("https://api.example.com", "KB_API_TOKEN")
    config["resource"]["params"] = {"author": "amy", "page_size": 50, "sort": "updated"}
    config["client"]["auth"] = {"type": "api_key", "key_env": "KB_KEY", "name": "api_key",
                                "location": "query"}  # fmt: skip
    fields = service.source_fields("rest", config, collection="c", status="approved")
    assert fields["config"]["resource"]["params"]["author"] == "amy"
    assert fields["config"]["client"]["auth"]["location"] == "query"
    with pytest.raises(ConfigError, match="looks like a secret"):
        service.source_fields("website", {"start_url": "https://docs.example.com/?token=x"},
                              collection="c", status="approved")  # fmt: skip


# --- 18: the audience follows the audience rule -----------------------------------------------


@pytest.mark.parametrize("audience", ["EXEC", "exec team", "../hr", "x" * 65])
def test_an_audience_outside_the_rule_is_refused(audience: str) -> None:
    with pytest.raises(ConfigError, match="audience"):
        service.source_fields("filesystem", {"url": "s3://b/x"}, collection="c",
                              status="approved", audience=audience)  # fmt: skip
    fields = service.source_fields("filesystem", {"url": "s3://b/x"}, collection="c",
                                   status="approved", audience="exec")  # fmt: skip
    assert fields["audience"] == "exec"


def test_an_audience_change_is_checked_too(settings: Settings, people: SqlRegistry) -> None:
    fields = service.source_fields("filesystem", {"url": "s3://b/x"}, collection="c",
                                   status="approved")  # fmt: skip
    service.add_source(settings, ORG, "bucket", fields, actor="amy")
    with pytest.raises(ConfigError, match="audience"):
        service.update_source(settings, "bucket", ORG, {"audience": "EXEC"}, actor="amy")
    assert people.sources.list_sources(ORG)[0].audience is None


# --- 15: the loopback switch is a test's, never .env's ----------------------------------------


def test_the_loopback_switch_is_honoured_only_from_a_tests_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("KBFLOW_SOURCES_TEST_ALLOW_LOOPBACK=true\n")
    assert Settings().sources.sources_test_allow_loopback is False
    assert "ignored" in caplog.text
    (tmp_path / ".env").write_text('KBFLOW_SOURCES={"sources_test_allow_loopback": true}\n')
    assert Settings().sources.sources_test_allow_loopback is False
    (tmp_path / ".env").unlink()

    monkeypatch.setenv("KBFLOW_SOURCES", '{"sources_test_allow_loopback": true}')
    assert Settings().sources.sources_test_allow_loopback is False
    monkeypatch.delenv("KBFLOW_SOURCES")
    monkeypatch.setenv("KBFLOW_SOURCES_TEST_ALLOW_LOOPBACK", "true")
    assert Settings().sources.sources_test_allow_loopback is True  # a test runs: honoured
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    assert Settings().sources.sources_test_allow_loopback is False  # a server, say: ignored
    assert Settings(sources_test_allow_loopback=True).sources.sources_test_allow_loopback
