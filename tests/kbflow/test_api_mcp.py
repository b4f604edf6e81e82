"""`kbflow serve`'s MCP server at /mcp, driven by the MCP SDK's own client over streamable HTTP:
the agent tools with kbflow's schemas, answered for the agent the token names and no other,
kbflow's refusals as tool errors a model can read, and the token checked like on every route.

Both protocol eras the SDK speaks: a ClientSession that opens with ``initialize`` (the handshake
era), and the README's ``mcp.Client``, which negotiates the per-request 2026-07-28 protocol."""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import httpx
import pytest
from mcp import ClientSession

from kbflow.api.launch import REPO
from kbflow.api.mcp import ANSWER_TOOL
from kbflow.services.query.tools import TOOLS
from tests import web
from tests.kbflow.service import LIMITED, TOPIC
from tests.kbflow.support import in_session

pytestmark = pytest.mark.integration  # each test starts or reaches a real service

TOOL_NAMES = [
    "list_knowledge_collections",
    "search_knowledge_base",
    "research_knowledge_search",
    "answer",
]
LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _text(result: Any) -> str:
    return "\n".join(block.text for block in result.content)


def _post_mcp(served: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    return web.post(
        served["base"] + "/mcp", json=LIST_TOOLS, headers={**MCP_HEADERS, **headers}, timeout=60
    )


def test_an_mcp_client_gets_the_agent_tools_for_its_token(served_once: dict[str, Any]) -> None:
    served = served_once

    async def steps(session: ClientSession) -> dict[str, Any]:
        listed = await session.list_tools()
        return {
            "tools": {t.name: t for t in listed.tools},
            "order": [t.name for t in listed.tools],
            "collections": await session.call_tool("list_knowledge_collections", {}),
            "search": await session.call_tool("search_knowledge_base", {"query": TOPIC}),
            "research": await session.call_tool("research_knowledge_search", {"queries": [TOPIC]}),
            "answer": await session.call_tool("answer", {"question": TOPIC}),
        }

    got = in_session(served, "agent", steps)
    assert got["order"] == TOOL_NAMES
    for name in TOOL_NAMES[:3]:  # kbflow's own schemas, not a copy
        assert got["tools"][name].input_schema == TOOLS[name].input_schema, name
        assert got["tools"][name].output_schema == TOOLS[name].output_schema, name
        assert got["tools"][name].description == TOOLS[name].description, name
    assert got["tools"]["answer"].input_schema == ANSWER_TOOL.input_schema
    assert got["tools"]["answer"].input_schema["required"] == ["question"]
    assert got["tools"]["search_knowledge_base"].annotations.read_only_hint is True

    for name in ("collections", "search", "research", "answer"):
        result = got[name]
        assert not result.is_error, (name, _text(result))
        assert json.loads(_text(result)) == result.structured_content, name

    collections = got["collections"].structured_content
    assert collections["agent"] == "hr-bot"
    assert [c["name"] for c in collections["collections"]] == ["hr"]
    search = got["search"].structured_content
    # The TOPIC is in all three documents: hr-bot gets hr's, never sales' (not allowed) nor
    # globex's (another org).
    assert search["agent"] == "hr-bot"
    assert {hit["doc_id"] for hit in search["results"]} == {served["docs"]["hr"]}
    research = got["research"].structured_content
    assert research["answer_status"] in {"yes", "maybe", "no"}
    assert {c["doc_id"] for c in research["citations"]} <= {served["docs"]["hr"]}
    answered = got["answer"].structured_content
    # Offline, no value is asked of these keywords: the passage is handed over ("maybe").
    assert answered["agent"] == "hr-bot" and answered["status"] in ("answered", "maybe"), answered
    assert answered["turn_id"] != research["turn_id"]  # each is a turn of its own in the ledger
    assert {c["doc_id"] for c in answered["citations"]} == {served["docs"]["hr"]}

    metrics = web.get(served["base"] + "/metrics").text
    assert 'kbflow_http_request_seconds_count{method="POST",route="/mcp",status="200"}' in metrics


def test_a_refused_tool_call_says_why(served_once: dict[str, Any]) -> None:
    served = served_once

    async def steps(session: ClientSession) -> dict[str, Any]:
        calls: dict[str, tuple[str, dict[str, Any]]] = {
            "top_k 0": ("search_knowledge_base", {"query": TOPIC, "top_k": 0}),
            "top_k true": ("search_knowledge_base", {"query": TOPIC, "top_k": True}),
            "no query": ("search_knowledge_base", {}),
            "another agent": ("search_knowledge_base", {"query": TOPIC, "agent_id": "off-bot"}),
            "not allowed": ("search_knowledge_base", {"query": TOPIC, "collection_id": 999}),
            "no queries": ("research_knowledge_search", {"queries": []}),
            "long question": ("answer", {"question": "x" * 5000}),
            "unknown tool": ("delete_everything", {}),
        }
        return {case: await session.call_tool(name, args) for case, (name, args) in calls.items()}

    got = in_session(served, "agent", steps)
    says = {
        "top_k 0": "invalid arguments for search_knowledge_base: top_k: 0 is less than the "
        "minimum of 1",
        "top_k true": "invalid arguments for search_knowledge_base: top_k: True is not of type "
        "'integer'",
        "no query": "invalid arguments for search_knowledge_base: arguments: 'query' is a "
        "required property",
        "another agent": "invalid arguments for search_knowledge_base: arguments: Additional "
        "properties are not allowed ('agent_id' was unexpected)",
        "not allowed": "agent hr-bot may not read collection 999; it may read: ",
        "no queries": "invalid arguments for research_knowledge_search: queries: [] should be "
        "non-empty",
        "long question": "invalid arguments for answer: question: ",
        "unknown tool": "unknown tool 'delete_everything'",
    }
    for case, result in got.items():
        assert result.is_error, (case, _text(result))
        assert _text(result).startswith(says[case]), (case, _text(result))
        assert "Traceback" not in _text(result) and str(REPO) not in _text(result), case
    assert _text(got["not allowed"]).endswith("(hr) — call list_knowledge_collections to see them")


def test_an_agent_switched_off_is_told_so(served_once: dict[str, Any]) -> None:
    served = served_once

    async def steps(session: ClientSession) -> dict[str, Any]:
        return {
            "collections": await session.call_tool("list_knowledge_collections", {}),
            "search": await session.call_tool("search_knowledge_base", {"query": TOPIC}),
            "research": await session.call_tool("research_knowledge_search", {"queries": [TOPIC]}),
            "answer": await session.call_tool("answer", {"question": TOPIC}),
        }

    got = in_session(served, "off", steps)
    # Not a tool error: the agent is told, in the result, why there is nothing.
    assert not any(result.is_error for result in got.values())
    assert got["collections"].structured_content["knowledge_base_enabled"] is False
    search = got["search"].structured_content
    assert search["agent"] == "off-bot" and search["results"] == []
    assert search["note"] == "the knowledge base is switched off for agent off-bot"
    research = got["research"].structured_content
    assert research["answer_status"] == "no" and research["citations"] == []
    assert research["miss"]["detail"] == "the knowledge base is switched off for off-bot"
    answered = got["answer"].structured_content
    assert answered["status"] == "refused" and answered["citations"] == []
    assert answered["refusal"]["reason"] == "the knowledge base is switched off for off-bot"


def test_mcp_callers_are_the_tokens_business(served_once: dict[str, Any]) -> None:
    served = served_once
    cases = {
        "no token": (_post_mcp(served, {}), 401, "no token"),
        "not bearer": (_post_mcp(served, {"Authorization": "Basic cm9vdDpyb290"}), 401, "Bearer"),
        "unknown": (
            _post_mcp(served, {"Authorization": "Bearer kbf_not-a-real-token-at-all"}),
            401,
            "malformed token",
        ),
        "revoked": (_bearer(served, "revoked"), 401, "revoked"),
        "a person's token": (_bearer(served, "user"), 403, "this route is for agents"),
    }
    time.sleep(2.1)  # the short-lived token is past its expiry now
    cases["expired"] = (_bearer(served, "expired"), 401, "expired")
    for name, (response, status, says) in cases.items():
        assert response.status_code == status, (name, response.text)
        assert says in response.json()["detail"], (name, response.text)
        if status == 401:
            assert response.headers["www-authenticate"] == "Bearer", name
        assert "Traceback" not in response.text, name

    # The same request with the agent's token is served.
    served_ok = _bearer(served, "agent")
    assert served_ok.status_code == 200, served_ok.text
    assert [t["name"] for t in served_ok.json()["result"]["tools"]] == TOOL_NAMES
    metrics = web.get(served["base"] + "/metrics").text
    assert 'kbflow_http_refused_total{status="401"} 5.0' in metrics
    assert 'kbflow_http_refused_total{status="403"} 1.0' in metrics

    # Stateless: no event stream for a GET to hold open, no session for a DELETE to end.
    auth = {"Authorization": f"Bearer {served['tokens']['agent']}", **MCP_HEADERS}
    for method in ("GET", "DELETE"):
        response = web.request(method, served["base"] + "/mcp", headers=auth, timeout=10)
        assert response.status_code == 405, (method, response.text)
        assert response.headers["allow"] == "POST", method
        assert "POST only" in response.json()["detail"], method


def _bearer(served: dict[str, Any], who: str) -> httpx.Response:
    return _post_mcp(served, {"Authorization": f"Bearer {served['tokens'][who]}"})


@pytest.mark.parametrize("served", [LIMITED], indirect=True)
def test_mcp_requests_spend_the_tokens_rate(served: dict[str, Any]) -> None:
    codes = [_bearer(served, "agent").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    limited = _bearer(served, "agent")
    assert limited.status_code == 429 and 1 <= int(limited.headers["retry-after"]) <= 10
    assert "too many requests" in limited.json()["detail"]
    assert _bearer(served, "off").status_code == 200  # another token, its own bucket


def readme_snippet() -> str:
    """The Python example of the README's "From an MCP client" section."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("### From an MCP client", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "no Python example in the README's MCP section"
    return found.group(1)


def test_the_readme_mcp_example_runs(
    served: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's client (mcp.Client, the SDK's default protocol negotiation), as written,
    but for the service's port and the agent's token."""
    code = readme_snippet()
    assert "http://localhost:8080/mcp" in code
    monkeypatch.setenv("KBFLOW_TOKEN", served["tokens"]["agent"])
    exec(compile(code.replace("http://localhost:8080", served["base"]), "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == str(TOOL_NAMES)
    assert os.environ["KBFLOW_TOKEN"] not in "\n".join(lines)
    printed = lines[1:]
    assert printed and all(served["docs"]["hr"] in line for line in printed), printed
