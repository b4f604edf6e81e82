"""`kbflow serve` as a real process on a loopback port, driven over HTTP: who may call what
(tokens, never the body), the agent routes' answers, and bad input answered without a trace."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.settings import Settings
from tests.conftest import free_port, index_records

REPO = Path(__file__).resolve().parents[2]
TOPIC = "quarterly expense reimbursement rules"
START_TIMEOUT_S = 180


def _wait_healthy(base: str, proc: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"kbflow serve exited {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"kbflow serve did not become ready:\n{log.read_text()}")


@pytest.fixture
def served(settings: Settings, tmp_path: Path, embedder: Any) -> Iterator[dict[str, Any]]:
    """Two orgs' documents, agents and tokens; then the service started on them."""
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.registry import SqlRegistry

    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)
    try:
        kw = {"store": store, "registry": registry, "embedder": embedder}
        registry.ensure_org("acme")
        registry.ensure_org("globex")
        registry.create_collection("acme", "hr", "People policies.", None)
        registry.create_collection("acme", "sales", "Sales playbooks.", None)
        docs = {
            name: index_records(
                [{"key": name, "title": f"{TOPIC} ({name})", "text": f"{TOPIC}: {name} copy."}],
                org=org,
                collection=coll,
                **kw,
            )[0]
            for name, org, coll in (
                ("hr", "acme", "hr"),
                ("sales", "acme", "sales"),
                ("globex", "globex", "default"),
            )
        }
        registry.create_agent("acme", "hr-bot", "answers staff")
        registry.set_allowed("hr-bot", ["hr"], allow=True)
        registry.create_agent("acme", "off-bot", "switched off", enabled=False)
        registry.set_allowed("off-bot", ["hr"], allow=True)
        registry.ensure_user("root", _superadmin())
        soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
        secrets = {
            "agent": registry.create_token(agent_id="hr-bot", expires_at=None, created_by="root"),
            "off": registry.create_token(agent_id="off-bot", expires_at=None, created_by="root"),
            "user": registry.create_token(user_id="root", expires_at=None, created_by="root"),
            "revoked": registry.create_token(agent_id="hr-bot", expires_at=None, created_by="root"),
            "expired": registry.create_token(agent_id="hr-bot", expires_at=soon, created_by="root"),
        }
        registry.revoke_token(secrets["revoked"][0].id, actor="root")
    finally:
        store.close()
        registry.close()
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "KBFLOW_HOME": str(settings.home), "PYTHONPATH": str(REPO)}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kbflow.cli", "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, proc, log)
        yield {
            "base": base,
            "tokens": {k: v[1] for k, v in secrets.items()},
            "docs": docs,
            "log": log,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _superadmin() -> Any:
    from core.models import Role

    return Role.SUPERADMIN


def _call(
    served: dict[str, Any], method: str, path: str, token: str | None = None, **kw: Any
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {served['tokens'][token]}"} if token else {}
    return httpx.request(method, served["base"] + path, headers=headers, timeout=60, **kw)


def _clean(response: httpx.Response) -> None:
    """No response carries a traceback or a path on the server's disk."""
    assert "Traceback" not in response.text
    assert "/tmp/" not in response.text and str(REPO) not in response.text


def test_who_calls_is_the_tokens_business(served: dict[str, Any]) -> None:
    search = {"query": TOPIC}
    cases = {
        "no token": (_call(served, "POST", "/v1/agent/search", json=search), 401, "no token"),
        "not bearer": (
            httpx.post(
                served["base"] + "/v1/agent/search",
                json=search,
                headers={"Authorization": "Basic cm9vdDpyb290"},
            ),
            401,
            "Bearer",
        ),
        "unknown": (
            httpx.post(
                served["base"] + "/v1/agent/search",
                json=search,
                headers={"Authorization": "Bearer kbf_not-a-real-token-at-all"},
            ),
            401,
            "",
        ),
        "revoked": (
            _call(served, "POST", "/v1/agent/search", "revoked", json=search),
            401,
            "revoked",
        ),
        "a user on an agent route": (
            _call(served, "POST", "/v1/agent/search", "user", json=search),
            403,
            "agent",
        ),
    }
    time.sleep(2.1)  # the short-lived token is past its expiry now
    cases["expired"] = (
        _call(served, "POST", "/v1/agent/search", "expired", json=search),
        401,
        "expired",
    )
    for name, (response, status, says) in cases.items():
        assert response.status_code == status, (name, response.text)
        assert says.lower() in response.json()["detail"].lower(), (name, response.text)
        if status == 401:
            assert response.headers["www-authenticate"] == "Bearer", name
        _clean(response)


def test_an_agent_searches_its_own_scope_only(served: dict[str, Any]) -> None:
    response = _call(served, "POST", "/v1/agent/search", "agent", json={"query": TOPIC})
    assert response.status_code == 200, response.text
    found = {hit["doc_id"] for hit in response.json()["results"]}
    assert found == {served["docs"]["hr"]}  # not sales (not allowed), not globex (other org)
    # The body cannot name another agent: the token fixed who asks.
    claim = {"query": TOPIC, "agent_id": "sales-bot"}
    refused = _call(served, "POST", "/v1/agent/search", "agent", json=claim)
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"].endswith("agent_id")
    off = _call(served, "POST", "/v1/agent/search", "off", json={"query": TOPIC})
    assert off.status_code == 200 and off.json()["results"] == []
    assert "switched off" in off.json()["note"]


def test_the_agent_routes_answer_like_the_tools(served: dict[str, Any]) -> None:
    listed = _call(served, "GET", "/v1/agent/collections", "agent")
    assert listed.status_code == 200, listed.text
    assert [c["name"] for c in listed.json()["collections"]] == ["hr"]
    asked = _call(served, "POST", "/v1/agent/ask", "agent", json={"queries": [TOPIC]})
    assert asked.status_code == 200, asked.text
    assert asked.json()["answer_status"] in {"yes", "maybe", "no"}
    answered = _call(served, "POST", "/v1/agent/answer", "agent", json={"question": TOPIC})
    assert answered.status_code == 200, answered.text
    cited = {c["doc_id"] for c in answered.json().get("citations", [])}
    assert cited <= {served["docs"]["hr"]}


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/agent/search", {"query": ""}, "query"),
        ("/v1/agent/search", {"query": TOPIC, "top_k": 0}, "top_k"),
        ("/v1/agent/search", {"query": TOPIC, "top_k": True}, "top_k"),
        ("/v1/agent/search", {}, "query"),
        ("/v1/agent/ask", {"queries": []}, "queries"),
        ("/v1/agent/answer", {"question": "x" * 5000}, "question"),
    ],
)
def test_bad_bodies_name_the_field(
    served: dict[str, Any], path: str, body: dict[str, Any], field: str
) -> None:
    response = _call(served, "POST", path, "agent", json=body)
    assert response.status_code == 422, response.text
    assert any(e["field"].endswith(field) for e in response.json()["errors"]), response.text
    _clean(response)


def test_health_docs_and_garbage(served: dict[str, Any]) -> None:
    assert httpx.get(served["base"] + "/healthz").json() == {"status": "ok"}
    assert httpx.get(served["base"] + "/readyz").json()["vector_store"] == "open"
    assert httpx.get(served["base"] + "/docs").status_code == 200
    schema = httpx.get(served["base"] + "/openapi.json").json()
    assert "/v1/agent/search" in schema["paths"]
    not_json = httpx.post(
        served["base"] + "/v1/agent/search",
        content=b"{not json",
        headers={"Authorization": f"Bearer {served['tokens']['agent']}",
                 "Content-Type": "application/json"},
    )  # fmt: skip
    assert not_json.status_code == 422
    _clean(not_json)
