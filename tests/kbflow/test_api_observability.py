"""`kbflow serve`'s structured request log and its per-org, per-agent and per-tool metrics (issue
33 items 3 and 4): with ``KBFLOW_LOG_FORMAT=json`` one JSON line per request names its id, route,
status, latency, caller, org, MCP tool and outcome, and never a token or a query's text; every
answer carries ``X-Request-ID``; ``/metrics`` counts requests by org, agent and MCP tool and
reads the review backlog and the store's size when scraped.

One `kbflow serve` (a real process, json logs) serves the module's live tests.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest

from core.models import DocStatus, Role
from core.settings import Settings
from kbflow.api import gauges
from kbflow.api.app import _Observed
from kbflow.api.launch import REPO, launched
from kbflow.api.logs import JsonFormatter, RequestFacts, begin_request, end_request
from kbflow.api.metrics import Measured, Metrics
from sinks.registry import SqlRegistry
from tests import web
from tests.conftest import index_records

SEARCH_TEXT = "zephyr-quokka travel allowance"  # a query's text: never in the log
MCP_TEXT = "marmalade-okapi per diem"
ASK_TEXT = "What is the hotel limit, kestrel-wombat?"
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
UNKNOWN_TOKEN = "kbf_" + "Q" * 43  # well formed, never issued


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Iterator[dict[str, Any]]:
    """An org with an approved document and a pending draft, its agent and a person, their
    tokens; then `kbflow serve` on them with json logs."""
    from sinks.qdrant_edge import QdrantEdgeStore

    home = tmp_path_factory.mktemp("observed") / "home"
    settings = Settings(home=home)
    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=5)
    try:
        registry.people.ensure_org("acme")
        registry.people.ensure_user("root", Role.SUPERADMIN)
        kw = {"store": store, "registry": registry, "embedder": embedder}
        index_records(
            [{"key": "travel", "title": "Travel policy", "text": "Hotels: 150 EUR a night."}],
            org="acme", **kw,
        )  # fmt: skip
        index_records(
            [{"key": "draft", "title": "Travel draft", "text": "Trains: first class."}],
            org="acme", status=DocStatus.PENDING_REVIEW, **kw,
        )  # fmt: skip
        registry.catalog.create_agent("acme", "bot")
        agent = registry.tokens.create_token(agent_id="bot", expires_at=None, created_by="root")[1]
        user = registry.tokens.create_token(user_id="root", expires_at=None, created_by="root")[1]
        points = store.count("acme")
    finally:
        store.close()
        registry.close()
    log = home.parent / "serve.log"
    env = {"KBFLOW_LOG_FORMAT": "json", "KBFLOW_API_RATE_BURST": "1000"}
    with launched(home, log, env=env, require_ready=False) as served:
        yield {"base": served.base, "log": log, "agent": agent, "user": user, "points": points}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _lines_of(log: Path, request_ids: set[str], wait_s: float = 10) -> dict[str, dict[str, Any]]:
    """The request lines of ``request_ids`` (each written just after its answer has gone)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = {}
        for line in log.read_text().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("logger") == "kbflow.access" and record["request_id"] in request_ids:
                    found[record["request_id"]] = record
        if set(found) == request_ids or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.mark.integration
def test_each_request_has_one_json_line_naming_it_and_no_secret(live: dict[str, Any]) -> None:
    base, agent, user = live["base"], live["agent"], live["user"]
    with web.client(base_url=base, timeout=60) as http:
        searched = http.post(
            "/v1/agent/search?debug=1", json={"query": SEARCH_TEXT}, headers=_bearer(agent)
        )
        called = http.post(
            "/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "search_knowledge_base", "arguments": {"query": MCP_TEXT}},
            },
            headers={**MCP_HEADERS, **_bearer(agent)},
        )
        asked = http.post("/v1/agent/ask", json={"queries": [ASK_TEXT]}, headers=_bearer(agent))
        unknown = http.post("/v1/agent/search", json={"query": "x"}, headers=_bearer(UNKNOWN_TOKEN))
        forbidden = http.post("/v1/agent/search", json={"query": "x"}, headers=_bearer(user))
        invalid = http.post("/v1/agent/search", json={"query": 5}, headers=_bearer(agent))
    answers = {
        "search": searched,
        "mcp": called,
        "ask": asked,
        "unknown": unknown,
        "forbidden": forbidden,
        "invalid": invalid,
    }
    assert [r.status_code for r in answers.values()] == [200, 200, 200, 401, 403, 422]
    assert not called.json()["result"].get("isError"), called.text
    ids = {name: r.headers["X-Request-ID"] for name, r in answers.items()}
    assert len(set(ids.values())) == len(ids)
    lines = _lines_of(live["log"], set(ids.values()))
    line = {name: lines.get(rid) for name, rid in ids.items()}
    assert all(line.values()), (line, live["log"].read_text()[-3000:])

    for name, record in line.items():
        assert record is not None
        assert record["status"] == answers[name].status_code
        assert record["latency_ms"] > 0 and record["level"] in ("info", "error")
        assert record["method"] == "POST" and record["ts"].endswith("+00:00")
    search, mcp = line["search"], line["mcp"]
    assert search is not None and mcp is not None
    assert (search["route"], search["agent"], search["org"]) == ("/v1/agent/search", "bot", "acme")
    assert search["tool"] is None and search["user"] is None
    assert (mcp["route"], mcp["agent"], mcp["org"]) == ("/mcp", "bot", "acme")
    assert (mcp["tool"], mcp["outcome"]) == ("search_knowledge_base", None)
    assert line["ask"] is not None and line["ask"]["route"] == "/v1/agent/ask"
    assert line["ask"]["outcome"] == asked.json()["answer_status"] in ("yes", "maybe", "no")
    assert line["unknown"] is not None and line["unknown"]["agent"] is None
    assert line["unknown"]["org"] is None
    assert line["forbidden"] is not None
    assert (line["forbidden"]["user"], line["forbidden"]["agent"]) == ("root", None)
    assert line["invalid"] is not None
    assert (line["invalid"]["agent"], line["invalid"]["org"]) == ("bot", "acme")

    text = live["log"].read_text()
    for secret in (agent, user, UNKNOWN_TOKEN, SEARCH_TEXT, MCP_TEXT, ASK_TEXT, "debug=1"):
        assert secret not in text, f"{secret[:12]}… is in the log"
    # The log is JSON lines only, uvicorn's startup lines included; no access line of its own.
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert any(r["logger"].startswith("uvicorn") for r in records)
    assert not any(r["logger"] == "uvicorn.access" for r in records)


@pytest.mark.integration
def test_a_safe_request_id_is_kept_and_any_other_replaced(live: dict[str, Any]) -> None:
    with web.client(base_url=live["base"], timeout=30) as http:
        kept = http.get("/healthz", headers={"X-Request-ID": "trace-42.a_B"})
        for unsafe in ("x" * 200, "has space", 'quote"d', ""):
            replaced = http.get("/nowhere", headers={"X-Request-ID": unsafe})
            assert replaced.status_code == 404
            assert re.fullmatch(r"[0-9a-f]{32}", replaced.headers["X-Request-ID"]), unsafe
        plain = http.get("/v1/agent/collections")  # a 401 gets one too
    assert kept.headers["X-Request-ID"] == "trace-42.a_B"
    assert plain.status_code == 401 and re.fullmatch(r"[0-9a-f]{32}", plain.headers["X-Request-ID"])
    assert _lines_of(live["log"], {"trace-42.a_B"})["trace-42.a_B"]["route"] == "/healthz"


def _scrape(base: str) -> dict[str, float]:
    text = web.get(f"{base}/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        if line.startswith("kbflow_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.mark.integration
def test_metrics_count_orgs_agents_tools_the_backlog_and_the_store(live: dict[str, Any]) -> None:
    base, agent = live["base"], live["agent"]
    with web.client(base_url=base, timeout=60) as http:
        assert http.get("/v1/agent/collections", headers=_bearer(agent)).status_code == 200
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "list_knowledge_collections", "arguments": {}},
        }
        assert http.post("/mcp", json=call, headers={**MCP_HEADERS, **_bearer(agent)}).is_success
        bad = {**call, "params": {"name": "no_such_tool", "arguments": {}}}
        assert http.post("/mcp", json=bad, headers={**MCP_HEADERS, **_bearer(agent)}).is_success
    seen = _scrape(base)
    assert seen['kbflow_org_requests_total{org="acme",status_class="2xx"}'] >= 2
    assert seen['kbflow_agent_requests_total{agent="bot",status_class="2xx"}'] >= 2
    assert seen['kbflow_mcp_tool_calls_total{outcome="ok",tool="list_knowledge_collections"}'] >= 1
    assert seen['kbflow_mcp_tool_calls_total{outcome="error",tool="unknown"}'] >= 1
    assert seen['kbflow_review_backlog_documents{org="acme"}'] == 1
    assert seen['kbflow_review_oldest_pending_seconds{org="acme"}'] > 0
    assert seen['kbflow_store_points{org="acme"}'] == live["points"] > 0
    assert seen["kbflow_store_disk_bytes"] > 0
    assert any(name.startswith("kbflow_http_request_seconds_count{") for name in seen)


@pytest.mark.integration
def test_only_real_orgs_get_a_label(live: dict[str, Any]) -> None:
    """Issue 41 #17: requests naming orgs that do not exist (a superadmin's token on an admin
    path) get no org label; on ad21d18 each took one of the label's slots."""
    with web.client(base_url=live["base"], timeout=30, headers=_bearer(live["user"])) as http:
        for k in range(5):
            assert http.get(f"/v1/admin/orgs/ghost-{k}/sources").status_code in (403, 404)
        assert http.get("/v1/admin/orgs/acme/sources").status_code == 200
    seen = _scrape(live["base"])
    assert not [name for name in seen if 'org="ghost-' in name]
    assert seen['kbflow_org_requests_total{org="acme",status_class="2xx"}'] >= 1


def test_per_org_and_agent_labels_stop_at_the_cap() -> None:
    capped = gauges.CappedLabel(2)
    assert [capped.label(v) for v in ("a", "b", "c", "a", "d", "b")] == [
        "a", "b", gauges.OTHER, "a", gauges.OTHER, "b",
    ]  # fmt: skip
    metrics = Metrics()
    for i in range(gauges.LABEL_CAP + 5):
        metrics.observe(RequestFacts(f"r{i}", "GET", "/v1/x", 200, 1.0, f"agent-{i}", None, "o"))
    text = generate_latest(metrics.registry).decode()
    agents = re.findall(r'kbflow_agent_requests_total\{agent="([^"]+)"', text)
    assert len(agents) == gauges.LABEL_CAP + 1 and gauges.OTHER in agents
    assert f'agent="{gauges.OTHER}",status_class="2xx"}} 5.0' in text
    assert f"At most {gauges.LABEL_CAP} agents" in text  # the HELP says so


def test_a_500_gets_its_request_id_and_is_counted() -> None:
    metrics = Metrics()
    app = _Observed()
    app.measured = partial(Measured, metrics=metrics)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("boom")

    with TestClient(app, raise_server_exceptions=False) as client:
        answer = client.get("/boom", headers={"X-Request-ID": "r-500"})
    assert answer.status_code == 500 and answer.headers["X-Request-ID"] == "r-500"
    text = generate_latest(metrics.registry).decode()
    assert 'kbflow_http_request_seconds_count{method="GET",route="/boom",status="500"} 1.0' in text


def test_other_records_are_json_lines_with_the_request_id() -> None:
    formatter = JsonFormatter()
    record = logging_record("store busy", exc=True)
    token = begin_request({}, RequestFacts("rid-7", "POST"))
    try:
        line = formatter.format(record)
    finally:
        end_request(token)
    out = json.loads(line)
    assert "\n" not in line
    assert (out["level"], out["message"], out["request_id"]) == ("warning", "store busy", "rid-7")
    assert "ValueError: inner" in out["exc"]
    assert "request_id" not in json.loads(formatter.format(logging_record("outside")))


def logging_record(message: str, *, exc: bool = False) -> Any:
    import logging
    import sys

    info = None
    if exc:
        try:
            raise ValueError("inner")
        except ValueError:
            info = sys.exc_info()
    return logging.LogRecord("kbflow.x", logging.WARNING, __file__, 1, message, None, info)


def test_the_log_format_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().api.log_format == "text"
    monkeypatch.setenv("KBFLOW_LOG_FORMAT", "JSON")
    assert Settings().api.log_format == "json"
    monkeypatch.setenv("KBFLOW_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match=r"KBFLOW_LOG_FORMAT\) must be one of text, json"):
        Settings()


def test_the_grafana_dashboard_charts_only_metrics_the_service_exports() -> None:
    import datetime as dt

    metrics = Metrics()
    metrics.watch_research(lambda after: [])
    now = dt.datetime.now(dt.UTC)
    metrics.watch_knowledge(lambda: {"o": (1, now)}, lambda: {"o": 3}, lambda: 10, lambda: now)
    metrics.observe(RequestFacts("r", "POST", "/mcp", 200, 1.0, "a", None, "o", "answer"))
    text = generate_latest(metrics.registry).decode()  # families, and the samples seen
    exported = set(re.findall(r"^(?:# TYPE )?(kbflow_\w+)", text, re.M))
    dashboard = json.loads((REPO / "deployments" / "grafana-kbflow.json").read_text())
    charted = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"\b(kbflow_\w+)", target["expr"])
    }
    assert charted and charted <= exported, charted - exported
    for name in ("org_requests_total", "mcp_tool_calls_total", "review_oldest_pending_seconds",
                 "backup_age_seconds"):  # fmt: skip
        assert f"kbflow_{name}" in charted


def test_the_newest_backups_age_is_exported_once_there_is_one(tmp_path: Path) -> None:
    """`kbflow_backup_age_seconds`: absent with no backup; after `kbflow backup`, the age of
    the newest one in <home>/backups (what an alert on a missed daily backup watches)."""
    from kbflow.api import health
    from kbflow.services.backup.backups import backup
    from kbflow.services.query.context import open_home

    settings = Settings(home=tmp_path / "home")
    SqlRegistry.open(settings.registry_url).close()

    def age() -> float | None:
        metrics = Metrics()
        with open_home(settings) as ctx:
            health.watch_knowledge(metrics, ctx, settings)
            text = generate_latest(metrics.registry).decode()
        found = re.search(r"^kbflow_backup_age_seconds (\S+)$", text, re.M)
        return None if found is None else float(found.group(1))

    assert age() is None
    backup(settings)
    time.sleep(1.2)
    measured = age()
    assert measured is not None and 1.0 <= measured < 120, measured
