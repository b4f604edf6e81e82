"""MCP sampling: an agent whose org opted in (``KBFLOW_MCP_SAMPLING_ORGS``) and whose client
declares sampling gets its own model asked to read the passages, through ``kbflow serve``'s
stateless /mcp (the tool's reply asks for the input, the client sends the call again with it;
the MCP SDK's ``mcp.Client`` does both). Only approved passages the agent may read are sent;
every quote the agent's model gives back is checked like any model's; an org that did not opt
in is never asked.

The agent's model is a scripted callback here, and the real local model server
(`evals.local_llm`) in the last test, which skips without the ``local-llm`` extra."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

from core.models import DocStatus
from core.settings import Settings
from kbflow.api.launch import launched
from sinks.ledger import Ledger
from tests.conftest import index_records

pytestmark = pytest.mark.integration

POLICY = (
    "Employees must submit expense reports within 30 days of the purchase. Receipts are "
    "required for any expense over 25 euros."
)
DRAFT = "DRAFT-ONLY: expense reports are now due within 7 days."
GLOBEX = "Globex staff file expense claims within 45 days."
QUESTION = "How many days do employees have to submit expense reports?"
QUOTE = "Employees must submit expense reports within 30 days of the purchase."

Sampler = Callable[[types.CreateMessageRequestParams], Awaitable[str]]


@pytest.fixture(scope="module")
def sampling_world(
    tmp_path_factory: pytest.TempPathFactory, embedder: Any
) -> Iterator[dict[str, Any]]:
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.registry import SqlRegistry

    folder = tmp_path_factory.mktemp("sampling")
    settings = Settings(home=folder / "home")
    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)
    try:
        kw = {"store": store, "registry": registry, "embedder": embedder}
        index_records([{"key": "policy", "title": "Expense policy", "text": POLICY}], **kw)
        index_records([{"key": "draft", "title": "Expense policy (draft)", "text": DRAFT}],
                      status=DocStatus.PENDING_REVIEW, **kw)  # fmt: skip
        index_records([{"key": "g", "title": "Globex expenses", "text": GLOBEX}], org="globex",
                      **kw)  # fmt: skip
        registry.catalog.create_agent("acme", "acme-bot", "answers staff")
        registry.catalog.create_agent("globex", "globex-bot", "answers staff")
        registry.people.ensure_user("root", _superadmin())
        tokens = {
            who: registry.tokens.create_token(agent_id=who, expires_at=None, created_by="root")[1]
            for who in ("acme-bot", "globex-bot")
        }
    finally:
        store.close()
        registry.close()
    env = {"KBFLOW_MCP_SAMPLING_ORGS": "acme"}
    with launched(settings.home, folder / "serve.log", env=env, require_ready=False,
                  wait_s=180) as served:  # fmt: skip
        yield {"base": served.base, "tokens": tokens, "home": settings.home}


def _superadmin() -> Any:
    from core.models import Role

    return Role.SUPERADMIN


def call_answer(
    world: dict[str, Any], agent: str, sampler: Sampler | None
) -> tuple[Any, list[Any]]:
    """``answer`` over MCP as ``agent`` with a client that declares sampling when ``sampler``
    is given; returns the tool result and every sampling request the agent was sent."""
    return call_tool(world, agent, sampler, "answer", {"question": QUESTION})


def call_tool(
    world: dict[str, Any], agent: str, sampler: Sampler | None, tool: str, args: dict[str, Any]
) -> tuple[Any, list[Any]]:
    """``tool`` over MCP as ``agent`` (see `call_answer`)."""
    asked: list[types.CreateMessageRequestParams] = []

    async def callback(context: Any, params: types.CreateMessageRequestParams) -> Any:
        asked.append(params)
        assert sampler is not None
        text = await sampler(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(text=text), model="agent-model"
        )

    async def main() -> Any:
        auth = {"Authorization": f"Bearer {world['tokens'][agent]}"}
        async with httpx2.AsyncClient(headers=auth, timeout=300) as http:
            transport = streamable_http_client(f"{world['base']}/mcp", http_client=http)
            extra = {"sampling_callback": callback} if sampler is not None else {}
            async with Client(transport, **extra) as client:
                return await client.call_tool(tool, args)

    return anyio.run(main), asked


def _output(result: Any) -> dict[str, Any]:
    assert not result.is_error, result
    return dict(result.structured_content or json.loads(result.content[0].text))


def _prompt(params: types.CreateMessageRequestParams) -> str:
    return "\n".join(
        m.content.text for m in params.messages if isinstance(m.content, types.TextContent)
    )


async def _scripted(params: types.CreateMessageRequestParams) -> str:
    prompt = _prompt(params)
    chunk = prompt.split("[chunk:", 1)[1].split("]", 1)[0]
    reply = {"claims": [{"text": "Within 30 days of the purchase.", "chunk_ids": [chunk],
                         "quote": QUOTE}]}  # fmt: skip
    return json.dumps(reply)


def test_the_agents_own_model_reads_approved_passages_and_its_quote_is_checked(
    sampling_world: dict[str, Any],
) -> None:
    result, asked = call_answer(sampling_world, "acme-bot", _scripted)
    out = _output(result)
    assert len(asked) == 1  # one prompt: the answer; its reply held to the contract
    prompt = _prompt(asked[0])
    assert QUOTE in prompt  # the approved passage went to the agent's model …
    assert "DRAFT-ONLY" not in prompt and "Globex" not in prompt  # … and nothing else
    assert asked[0].system_prompt and "JSON" in asked[0].system_prompt
    assert out["status"] == "answered", out
    quotes = [c.get("quote") for c in out["citations"]]
    assert QUOTE in quotes
    turn = Ledger(sampling_world["home"]).get_turn(out["turn_id"])
    assert [c.model for c in turn.llm_calls] == ["mcp-sampling:agent-model"]


def test_a_quote_the_agents_model_invents_is_maybe(sampling_world: dict[str, Any]) -> None:
    async def inventing(params: types.CreateMessageRequestParams) -> str:
        prompt = _prompt(params)
        chunk = prompt.split("[chunk:", 1)[1].split("]", 1)[0]
        said = "Expense reports are due within 90 days."
        return json.dumps({"claims": [{"text": said, "chunk_ids": [chunk], "quote": said}]})

    result, asked = call_answer(sampling_world, "acme-bot", inventing)
    out = _output(result)
    assert out["status"] == "maybe" and "90 days" not in json.dumps(out["claims"]), out
    assert len(asked) == 1  # no repair round trip is asked of the agent


def test_an_org_that_did_not_opt_in_is_never_asked(sampling_world: dict[str, Any]) -> None:
    result, asked = call_answer(sampling_world, "globex-bot", _scripted)
    out = _output(result)
    assert asked == []  # the client offered sampling; globex did not opt in
    turn = Ledger(sampling_world["home"]).get_turn(out["turn_id"])
    assert all(not c.model.startswith("mcp-sampling") for c in turn.llm_calls)


def test_a_client_without_sampling_gets_the_configured_model(
    sampling_world: dict[str, Any],
) -> None:
    result, asked = call_answer(sampling_world, "acme-bot", None)
    out = _output(result)
    turn = Ledger(sampling_world["home"]).get_turn(out["turn_id"])
    assert asked == [] and turn.llm_calls[0].model.startswith("extractive")


async def _knowledge_reader(params: types.CreateMessageRequestParams) -> str:
    """The agent's model on research_knowledge_search's two prompts: the triage (every
    candidate could help) and the synthesis (a yes, citing the first passage it was given)."""
    prompt = _prompt(params)
    if '"relevant"' in (params.system_prompt or ""):
        count = prompt.count("\n[") or 1
        return json.dumps({"relevant": list(range(count))})
    chunk = prompt.split("[chunk:", 1)[1].split("]", 1)[0]
    return json.dumps({"answer_status": "yes",
                       "synthesis": f"Within 30 days of the purchase [chunk:{chunk}].",
                       "citations": [{"chunk_id": chunk, "quote": QUOTE}]})  # fmt: skip


def test_research_knowledge_search_is_read_by_the_agents_model_on_approved_passages_only(
    sampling_world: dict[str, Any],
) -> None:
    args = {"queries": [QUESTION, "expense receipts"]}
    result, asked = call_tool(sampling_world, "acme-bot", _knowledge_reader,
                              "research_knowledge_search", args)  # fmt: skip
    out = _output(result)
    assert asked, "the agent's model was never asked"
    for params in asked:  # triage and synthesis: approved, allowed passages only
        prompt = _prompt(params)
        assert "DRAFT-ONLY" not in prompt and "Globex" not in prompt
    assert any(QUOTE in _prompt(params) for params in asked)  # the passage itself was read
    assert out["answer_status"] == "yes", out
    assert QUOTE in json.dumps(out["citations"])
    turn = Ledger(sampling_world["home"]).get_turn(out["turn_id"])
    assert turn.llm_calls and all(c.model == "mcp-sampling:agent-model" for c in turn.llm_calls)
    # globex did not opt in: offered sampling, never asked
    result, asked = call_tool(sampling_world, "globex-bot", _knowledge_reader,
                              "research_knowledge_search", args)  # fmt: skip
    assert asked == [] and not result.is_error


# The agent's model answers in the contract's shape with bounded strings, so that a 270M model
# cannot ramble on until max_tokens under the server's grammar (about 10 tokens a second).
_TEXT = {"type": "string", "minLength": 1, "maxLength": 40}
BOUNDED = {"type": "object", "required": ["claims"], "properties": {"claims": {
    "type": "array", "maxItems": 1, "items": {
        "type": "object", "required": ["text", "chunk_ids", "quote"], "properties": {
            "text": _TEXT, "quote": _TEXT,
            "chunk_ids": {"type": "array", "minItems": 1, "maxItems": 1, "items": _TEXT},
        }}}}}  # fmt: skip


def test_the_local_model_server_reads_for_the_agent(
    sampling_world: dict[str, Any], local_model: Any
) -> None:
    from tasks.llm_openai import OpenAIChat

    model = OpenAIChat(local_model.model_id, base_url=local_model.base_url,
                       json_mode="object-schema", timeout_s=300.0)  # fmt: skip

    async def local(params: types.CreateMessageRequestParams) -> str:
        messages = [{"role": "user", "content": _prompt(params)}]
        reply, _ = await anyio.to_thread.run_sync(
            lambda: model.send(
                purpose="answer",
                system=params.system_prompt or "",
                messages=messages,
                max_tokens=min(params.max_tokens, 200),
                schema=BOUNDED,
            )
        )
        return reply.text

    result, asked = call_answer(sampling_world, "acme-bot", local)
    out = _output(result)
    assert len(asked) == 1 and "DRAFT-ONLY" not in _prompt(asked[0])
    assert out["status"] in {"answered", "maybe", "refused"}
    turn = Ledger(sampling_world["home"]).get_turn(out["turn_id"])
    assert turn.llm_calls[0].model == "mcp-sampling:agent-model"
    for cited in out.get("citations") or []:  # whatever the 270M model said, only real quotes
        assert not cited.get("quote") or cited["quote"] in POLICY
