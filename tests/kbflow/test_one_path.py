"""One path: the CLI's ``kbflow search --agent``, the HTTP ``/v1/agent/search`` and the MCP
``search_knowledge_base`` of the same agent and query reach the same service function,
`kbflow.services.query.search.search`, and return the same hits.

Everything runs in this process so that one spy sees every call: the CLI through typer's
runner, then ``kbflow serve``'s app (`kbflow.api.app.create_app`) under uvicorn in a thread,
called over real HTTP and by the MCP SDK's client (`tests.conftest.app_server`). The CLI goes
first: the embedded store has one owner, and once the service holds it the service is that
owner.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from core.settings import Settings
from tests import web
from tests.conftest import index_records
from tests.kbflow.support import mcp_session

pytestmark = pytest.mark.integration

QUERY = "How many days of annual leave does a new employee get?"
RECORDS = [
    {
        "key": "leave",
        "title": "Leave policy",
        "markdown": True,
        "text": "# Leave policy\n\n## Annual leave\n\n"
        "A new employee gets 25 days of annual leave a year, pro rata in the first year.\n\n"
        "| Years of service | Days of leave |\n|---|---|\n| 0-4 | 25 |\n| 5-9 | 27 |\n"
        "| 10+ | 30 |\n\n## Carry-over\n\n- Up to 5 days carry over to the next year.\n"
        "- Days beyond that lapse on 31 March.\n- Ask your manager to approve a carry-over.\n",
    },
    {
        "key": "expenses",
        "title": "Expense rules",
        "text": "Expenses are reimbursed within 30 days of a claim with receipts attached. "
        "Travel by train is preferred over flights under 500 km.",
    },
    {
        "key": "security",
        "title": "Security basics",
        "text": "Lock your screen when you leave your desk. Report a lost laptop to IT at once.",
    },
]


@pytest.fixture
def home(settings: Settings, embedder: Any) -> dict[str, Any]:
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.registry import SqlRegistry

    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)
    try:
        registry.people.ensure_org("acme")
        registry.catalog.create_collection("acme", "hr", "People policies.", None)
        index_records(
            RECORDS, org="acme", collection="hr", store=store, registry=registry, embedder=embedder
        )
        registry.catalog.create_agent("acme", "hr-bot", "answers staff")
        registry.catalog.set_allowed("hr-bot", ["hr"], allow=True)
        secret = registry.tokens.create_token(
            agent_id="hr-bot", expires_at=None, created_by="root"
        )[1]
    finally:
        store.close()
        registry.close()
    return {"token": secret}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every call of `kbflow.services.query.search.search`: its agent and query text, and the
    hits."""
    from kbflow.services.query import search as service

    seen: list[dict[str, Any]] = []
    real = service.search

    def spy(ctx: Any, query: Any, **kw: Any) -> Any:
        outcome = real(ctx, query, **kw)
        hits = [(h.doc_id, h.chunk_id) for h in outcome.result.hits]
        # the tool hands on the query it checked (a CheckedQuery), the CLI its text
        text = getattr(query, "text", query)
        seen.append({"agent": kw.get("agent"), "query": text, "hits": hits})
        return outcome

    monkeypatch.setattr(service, "search", spy)
    return seen


def _mcp_call(base: str, token: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Call one MCP tool on the service; its JSON output (a tool error fails the test)."""

    async def main() -> dict[str, Any]:
        async with mcp_session(base, token) as session:
            result = await session.call_tool(tool, arguments)
            assert not result.is_error, result
            return dict(json.loads(result.content[0].text))

    return anyio.run(main)


def _mcp_search(base: str, token: str) -> dict[str, Any]:
    return _mcp_call(base, token, "search_knowledge_base", {"query": QUERY})


def test_cli_http_and_mcp_search_take_one_path_to_the_same_hits(
    settings: Settings, home: dict[str, Any], calls: list[dict[str, Any]], request: Any
) -> None:
    from kbflow.cli import app

    done = CliRunner().invoke(app, ["search", QUERY, "--agent", "hr-bot", "--json"])
    assert done.exit_code == 0, done.output
    cli_hits = [(h["doc_id"], h["chunk_id"]) for h in json.loads(done.stdout)["hits"]]

    base = request.getfixturevalue("app_server")
    auth = {"Authorization": f"Bearer {home['token']}"}
    answer = web.post(f"{base}/v1/agent/search", json={"query": QUERY}, headers=auth, timeout=120)
    assert answer.status_code == 200, answer.text
    http_hits = [(h["doc_id"], h["chunk_id"]) for h in answer.json()["results"]]
    mcp_hits = [(h["doc_id"], h["chunk_id"]) for h in _mcp_search(base, home["token"])["results"]]

    assert [c["agent"] for c in calls] == ["hr-bot"] * 3, calls
    assert [c["query"] for c in calls] == [QUERY] * 3
    assert cli_hits, "the search found nothing: the proof needs hits"
    assert cli_hits == http_hits == mcp_hits
    assert [c["hits"] for c in calls] == [cli_hits] * 3
    # the leave policy answers the question: the same first hit everywhere
    assert calls[0]["hits"][0][0] == calls[1]["hits"][0][0] == calls[2]["hits"][0][0]


def _count_checks_and_analyses(
    monkeypatch: pytest.MonkeyPatch, *, for_retrieval: bool
) -> dict[str, int]:
    """How many times the query was checked, and analysed into BM25 terms, since the last reset.

    A check is a call, with the query, of any function that checks a query's text: the one
    check (`tasks.query.bounds.check_query`) and the defensive ones a plain string meets
    (`require_text`, `unbounded_query`, and before issue 43 `tasks.query.retrieve._check_query`).
    Each is replaced in every module that imported it, so a call through any name is counted.
    An analysis is a call of `tasks.text.sparse.words` (where `analyze` starts) on the query
    (its text, stripped or not). ``for_retrieval``: only the analyses made to check or retrieve
    it, the ones whose caller (the first frame outside `tasks.text.sparse`) is in
    `tasks.query` or `kbflow`; an answer's own reading of its question (support scoring, the
    query form, the offline model: `tasks.answer`, `tasks.text.values`) is another job.
    """
    import sys

    from tasks.query import bounds, retrieve
    from tasks.text import sparse

    count = {"checks": 0, "analyses": 0}

    def query_text(value: Any) -> Any:
        text = getattr(value, "text", value)
        return text.strip() if isinstance(text, str) else text

    def retrieval_side() -> bool:
        frame = sys._getframe(2)  # the wrapper's caller
        while frame is not None and frame.f_globals.get("__name__") == sparse.__name__:
            frame = frame.f_back  # type: ignore[assignment]
        caller = frame.f_globals.get("__name__", "") if frame is not None else ""
        return str(caller).startswith(("tasks.query", "kbflow"))

    def counting(func: Any, key: str) -> Any:
        def wrapper(*args: Any, **kw: Any) -> Any:
            ours = args and query_text(args[0]) == QUERY
            if ours and (key == "checks" or not for_retrieval or retrieval_side()):
                count[key] += 1
            return func(*args, **kw)

        return wrapper

    checks = [
        getattr(module, name)
        for module, name in (
            (bounds, "check_query"),
            (bounds, "require_text"),
            (bounds, "unbounded_query"),
            (retrieve, "require_text"),
            (retrieve, "_check_query"),
        )
        if hasattr(module, name)
    ]
    targets = {id(f): counting(f, "checks") for f in checks}
    targets[id(sparse.words)] = counting(sparse.words, "analyses")
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if not name.startswith(("kbflow", "tasks", "core", "sinks")):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in targets and callable(value):
                monkeypatch.setattr(module, attr, targets[id(value)])
    return count


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Every check and every BM25 analysis of the query (`_count_checks_and_analyses`)."""
    return _count_checks_and_analyses(monkeypatch, for_retrieval=False)


@pytest.fixture
def counted_for_retrieval(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Every check of the query, and each BM25 analysis of it made to check or retrieve it."""
    return _count_checks_and_analyses(monkeypatch, for_retrieval=True)


def test_a_search_checks_and_analyses_its_query_once_on_every_surface(
    settings: Settings, home: dict[str, Any], counted: dict[str, int], request: Any
) -> None:
    """Issue 43: the query is checked once where it comes in (`check_query`) and analysed into
    BM25 terms once (the bound counts them, the keyword leg uses them), on the CLI, HTTP and
    MCP alike. Before, it was checked five times and analysed three times (twice on the CLI)."""
    from kbflow.cli import app

    done = CliRunner().invoke(app, ["search", QUERY, "--agent", "hr-bot", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["hits"], "the search found nothing: the proof needs hits"
    assert counted == {"checks": 1, "analyses": 1}, "kbflow search"

    base = request.getfixturevalue("app_server")
    auth = {"Authorization": f"Bearer {home['token']}"}
    counted.update(checks=0, analyses=0)
    answer = web.post(f"{base}/v1/agent/search", json={"query": QUERY}, headers=auth, timeout=120)
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"]
    assert counted == {"checks": 1, "analyses": 1}, "POST /v1/agent/search"

    counted.update(checks=0, analyses=0)
    assert _mcp_search(base, home["token"])["results"]
    assert counted == {"checks": 1, "analyses": 1}, "MCP search_knowledge_base"


ASKED = f"  {QUERY}\n"  # as an agent may send it: the turn strips it, the check takes it as sent


def test_an_ask_and_an_answer_check_their_question_once_and_analyse_it_once_for_retrieval(
    settings: Settings,
    home: dict[str, Any],
    counted_for_retrieval: dict[str, int],
    request: Any,
) -> None:
    """``kbflow ask`` / ``answer``, ``POST /v1/agent/ask`` / ``answer`` and the MCP tools
    ``research_knowledge_search`` / ``answer`` check the question once, at the service
    (`check_query`), and retrieval takes the `CheckedQuery` (stripped, with the same terms) as
    it is. Before, each was checked four times (the service, the turn's `require_text`, then
    retrieval's `unbounded_query` and its `require_text`) and analysed twice for retrieval.
    Support scoring reads the question on its own, and is not counted."""
    from kbflow.cli import app

    counted = counted_for_retrieval
    once = {"checks": 1, "analyses": 1}
    runner = CliRunner()
    for command in ("ask", "answer"):
        counted.update(checks=0, analyses=0)
        done = runner.invoke(app, [command, ASKED, "--agent", "hr-bot", "--json"])
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout)["citations"], f"kbflow {command}: the proof needs hits"
        assert counted == once, f"kbflow {command}"

    base = request.getfixturevalue("app_server")
    auth = {"Authorization": f"Bearer {home['token']}"}
    bodies = {"ask": {"queries": [ASKED]}, "answer": {"question": ASKED}}
    for route, body in bodies.items():
        counted.update(checks=0, analyses=0)
        got = web.post(f"{base}/v1/agent/{route}", json=body, headers=auth, timeout=120)
        assert got.status_code == 200, got.text
        assert got.json()["citations"], f"POST /v1/agent/{route}: the proof needs hits"
        assert counted == once, f"POST /v1/agent/{route}"

    tools = {"research_knowledge_search": bodies["ask"], "answer": bodies["answer"]}
    for tool, arguments in tools.items():
        counted.update(checks=0, analyses=0)
        assert _mcp_call(base, home["token"], tool, arguments)["citations"], tool
        assert counted == once, f"MCP {tool}"
