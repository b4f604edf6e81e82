"""The agent tools over MCP: ``kbflow serve`` answers the Model Context Protocol at ``/mcp``.

An MCP-capable agent runtime needs only the URL and an agent's bearer token. The tools are the
agent routes' own: ``list_knowledge_collections``, ``search_knowledge_base`` and
``research_knowledge_search`` go through `kbflow.services.query.tools.call_tool` (their published
schemas, their checks: MCP arguments are raw JSON, checked once there), ``answer`` through
`kbflow.services.query.answers.answer` after the same check against its published schema (the HTTP
route's body, `kbflow.api.schemas.AnswerBody`); each runs in the service's store, for the agent
the token names (a tool's arguments never name the caller).

Transport: streamable HTTP, stateless, with JSON responses. Each POST stands alone (no session
to keep, nothing to resume, no stream left open when uvicorn stops), and it is checked like any
other request before the MCP SDK sees it: the token (401, 403 for a person's token) and its rate
(429), answered by the app's own error handlers. A tool that refuses (bad arguments, a
collection the agent may not read) answers a tool result with ``isError`` and kbflow's message,
which the calling model can read and act on.

The query path imports no Prefect (tests/test_layers.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

import kbflow
from core.errors import KbflowError
from kbflow.api.auth import Service, agent_of, caller_of, service_of
from kbflow.api.logs import RequestFacts, request_facts
from kbflow.api.schemas import AnswerBody
from kbflow.services.query import answers, tools
from kbflow.services.query.context import OpenHome
from kbflow.services.query.tool_models import tool_schema
from kbflow.services.query.types import AnswerTurn, ToolResult
from tasks.llm import ChatModel
from tasks.llm_sampling import Sampled, SampledChat, SamplingNeeded

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
"""Where `create_app` mounts the MCP endpoint: the URL an agent runtime is given."""

CALLER_KEY = "kbflow.mcp.caller"
"""Where the gate leaves the checked caller in the ASGI scope, for the tool handler to read."""

INTERNAL_ERROR = "internal error: the server's log has the details"
NOT_POST = (
    "{method} /mcp: this MCP endpoint is stateless streamable HTTP and takes POST only "
    "(no event stream to open, no session to end)"
)

ANSWER_DESCRIPTION = (
    "Answer a question from the approved knowledge you may read, with a citation on every "
    "claim, or refuse when that knowledge does not answer it. The answer is recorded."
)


@dataclass(frozen=True)
class AgentCall:
    """Who an MCP request acts for (from its token, nothing else), the service it uses, and
    the request's facts (its log line and metrics: the tool called and how it ended)."""

    service: Service
    agent_id: str
    facts: RequestFacts | None = None


@dataclass(frozen=True)
class McpTool:
    """A tool as MCP publishes it, and how it runs in the service's store for an agent
    (``run(ctx, agent_id, arguments, chat)``: ``chat`` is the agent's own model when it reads
    through MCP sampling, else None)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    read_only: bool
    run: Callable[[OpenHome, str, dict[str, Any], ChatModel | None], ToolResult | AnswerTurn]
    reads: bool = False
    """A model reads for it (answer, research_knowledge_search): the agent's own may."""

    def listing(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema,
            output_schema=self.output_schema,
            annotations=types.ToolAnnotations(read_only_hint=self.read_only),
        )


def _kbflow_tool(name: str, *, read_only: bool) -> McpTool:
    """One of `kbflow.services.query.tools.TOOLS`, run by `call_tool` as ``kbflow tools call`` runs
    it: the raw JSON arguments checked once, against the tool's published schema."""
    tool = tools.TOOLS[name]

    def run(
        ctx: OpenHome, agent_id: str, arguments: dict[str, Any], chat: ChatModel | None
    ) -> ToolResult:
        extra = {"chat": chat} if chat is not None else {}
        return tools.call_tool(ctx, name, agent_id, arguments, **extra)

    return McpTool(name, tool.description, tool.input_schema, tool.output_schema, read_only, run,
                   reads=name == "research_knowledge_search")  # fmt: skip


def _answer(
    ctx: OpenHome, agent_id: str, arguments: dict[str, Any], chat: ChatModel | None
) -> AnswerTurn:
    tools.check_arguments("answer", ANSWER_TOOL.input_schema, arguments)
    return answers.answer(ctx, agent_id, arguments["question"], chat=chat)


# ``answer``'s schema is the HTTP route's body (``POST /v1/agent/answer``); its result has none
# published (a turn's output), so MCP gets none either.
ANSWER_TOOL = McpTool(
    "answer", ANSWER_DESCRIPTION, tool_schema(AnswerBody), None, read_only=False, run=_answer,
    reads=True,
)  # fmt: skip

MCP_TOOLS: dict[str, McpTool] = {
    tool.name: tool
    for tool in (
        _kbflow_tool("list_knowledge_collections", read_only=True),
        _kbflow_tool("search_knowledge_base", read_only=True),
        # Not read-only: each research turn is recorded in the ledger.
        _kbflow_tool("research_knowledge_search", read_only=False),
        ANSWER_TOOL,
    )
}


def run_tool(
    call: AgentCall,
    name: str,
    arguments: dict[str, Any],
    sampled: dict[str, Sampled] | None = None,
) -> types.CallToolResult | types.InputRequiredResult:
    """Run tool ``name`` for the caller (blocking: the store, the model): its JSON result, or
    ``isError`` with kbflow's message when the tool refuses.

    ``sampled``: the agent declared MCP sampling, with what its model has read so far (None:
    it did not). When the agent's org lets its model read (`AnswerSettings.samples_for`), a
    reading tool runs on it; a prompt it has not read yet comes back as the input the tool
    requires (`_sampling_request`), and the call is made again with the reply."""
    tool = MCP_TOOLS.get(name)
    try:
        if tool is None:
            raise tools.ToolError(f"unknown tool {name!r} — tools: {', '.join(MCP_TOOLS)}")
        ctx = call.service.read()
        chat = None
        if sampled is not None and tool.reads:
            org = ctx.registry.catalog.get_agent(call.agent_id).org_id
            chat = SampledChat(sampled) if ctx.settings.answers.samples_for(org) else None
        # Side by side, as on the HTTP routes: the ledger takes its own writes one at a time.
        result = tool.run(ctx, call.agent_id, arguments, chat)
    except SamplingNeeded as need:
        return _sampling_request(need, sampled or {})
    except KbflowError as exc:
        return _refused(str(exc), call)
    except Exception:
        # As on every other route: logged here, never a traceback or a path to the caller.
        log.exception("unexpected error in MCP tool %s", name)
        return _refused(INTERNAL_ERROR, call)
    if result.get("degraded"):
        call.service.count_degraded(call.facts)
    if name in ("answer", "research_knowledge_search"):
        route = "ask" if name != "answer" else "answer"
        call.service.count_outcome(route, result, call.facts)
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(result, ensure_ascii=False))],
        structured_content=dict(result),
    )


SAMPLING = types.ClientCapabilities(sampling=types.SamplingCapability())
MAX_SAMPLED_CHARS = 200_000
"""The most text an agent's model may hand back over one tool call's round trips, all replies
together (a reply past it is refused, not cut)."""


def _sampling_request(
    need: SamplingNeeded, sampled: dict[str, Sampled]
) -> types.InputRequiredResult:
    """Ask the agent's model to read ``need``'s prompt: the gated, scrubbed passages in a user
    message, kbflow's instructions as the system prompt. What it read so far travels in the
    request state, which the agent sends back with the reply (it is the agent's own text: it
    is checked as such when it comes back)."""
    message = types.SamplingMessage(
        role="user", content=types.TextContent(text=need.messages[-1]["content"])
    )
    request = types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(
            messages=[message],
            system_prompt=need.system,
            max_tokens=need.max_tokens,
            temperature=0,
            include_context="none",
        )
    )
    state = [[key, got.text, got.model] for key, got in sampled.items()]
    return types.InputRequiredResult(
        input_requests={need.key: request}, request_state=json.dumps(state, ensure_ascii=False)
    )


def sampled_so_far(params: types.CallToolRequestParams) -> dict[str, Sampled]:
    """What the agent's model has read for this tool call: the request state it sent back and
    the replies it brings now, by prompt key.

    Raises:
        ToolError: the state or a reply is malformed, or too long (`MAX_SAMPLED_CHARS`).
    """
    out: dict[str, Sampled] = {}
    state = params.request_state
    if state:
        try:
            rows = json.loads(state)
            pairs = [(str(k), Sampled(str(t), str(m))) for k, t, m in rows]
        except (ValueError, TypeError) as exc:
            raise tools.ToolError("the request state is not the one kbflow sent: call the tool "
                                  "again without it") from exc  # fmt: skip
        out.update(pairs)
    for key, reply in (params.input_responses or {}).items():
        if not isinstance(reply, types.CreateMessageResult):
            raise tools.ToolError(f"input {key[:12]}: a sampling reply (CreateMessageResult) "
                                  "was expected")  # fmt: skip
        content = reply.content
        text = content.text if isinstance(content, types.TextContent) else ""
        if not text:
            raise tools.ToolError(f"input {key[:12]}: the sampling reply holds no text")
        out[str(key)] = Sampled(text, reply.model or "agent")
    if sum(len(s.text) for s in out.values()) > MAX_SAMPLED_CHARS:
        raise tools.ToolError(f"the agent's model replied with more than {MAX_SAMPLED_CHARS:,} "
                              "characters over this call")  # fmt: skip
    return out


def _refused(message: str, call: AgentCall | None = None) -> types.CallToolResult:
    if call is not None and call.facts is not None:
        call.facts.outcome = "error"
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


async def _list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[tool.listing() for tool in MCP_TOOLS.values()])


async def _call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    call = ctx.request.scope.get(CALLER_KEY) if isinstance(ctx.request, Request) else None
    if not isinstance(call, AgentCall):
        # Only reachable if the server is served without `McpEndpoint`'s gate in front.
        log.error("MCP tool call without a checked caller: refused")
        return _refused(INTERNAL_ERROR)
    if call.facts is not None:  # a published tool's name only: the name is the client's text
        call.facts.tool = params.name if params.name in MCP_TOOLS else "unknown"
    arguments = dict(params.arguments or {})
    sampled: dict[str, Sampled] | None = None
    if _can_sample(ctx):  # the agent's model may read for it, if its org lets it (run_tool)
        try:
            sampled = sampled_so_far(params)
        except KbflowError as exc:
            return _refused(str(exc), call)
    try:
        return await call.service.within_deadline(
            partial(run_tool, call, params.name, arguments, sampled)
        )
    except KbflowError as exc:  # past the deadline
        return _refused(str(exc), call)


def _can_sample(ctx: ServerRequestContext[Any, Any]) -> bool:
    """The client declared sampling, on a protocol where a tool may ask for it in its reply
    (2026-07-28 and later: the input a tool requires; stateless, so no request of our own)."""
    return bool(
        ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        and ctx.session.check_client_capability(SAMPLING)
    )


def _input_schema(name: str) -> dict[str, Any] | None:
    tool = MCP_TOOLS.get(name)
    return tool.input_schema if tool else None


def mcp_server() -> Server[Any]:
    """The MCP server: kbflow's agent tools, listed with their schemas, called by name."""
    return Server(
        "kbflow",
        version=kbflow.__version__,
        instructions=(
            "Approved knowledge for this agent: call list_knowledge_collections first, then "
            "search_knowledge_base; research_knowledge_search says yes / maybe / no with "
            "citations; answer gives a cited answer or refuses."
        ),
        get_tool_input_schema=_input_schema,
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
    )


class McpEndpoint:
    """The ASGI app mounted at ``/mcp``: every request's token checked, then the MCP server.

    Enter `run` in the app's lifespan: the SDK's session manager serves requests only inside it.
    """

    def __init__(self) -> None:
        # No Host/Origin checks (the SDK's DNS-rebinding guard): every request needs a bearer
        # token a rebinding page does not have, and the REST routes beside it check none either.
        self.sessions = StreamableHTTPSessionManager(
            mcp_server(), json_response=True, stateless=True, security_settings=None
        )

    def run(self) -> AbstractAsyncContextManager[None]:
        """The session manager's lifetime (its task group): the app's lifespan enters it."""
        return self.sessions.run()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        if request.method != "POST":
            # Stateless: no stream for a GET to open (it would hang there, and hold up the
            # server's shutdown) and no session for a DELETE to end. The spec's answer is 405.
            refused = JSONResponse(
                {"detail": NOT_POST.format(method=request.method)},
                status_code=405,
                headers={"Allow": "POST"},
            )
            await refused(scope, receive, send)
            return
        # The registry is blocking I/O: off the event loop, as FastAPI runs a sync dependency.
        # A refusal (Unauthorized, Forbidden, RateLimited) is raised to the app's handlers.
        agent_id = await anyio.to_thread.run_sync(_agent_of_request, request)
        scope[CALLER_KEY] = AgentCall(service_of(request), agent_id, request_facts(scope))
        await self.sessions.handle_request(scope, receive, send)


def _agent_of_request(request: Request) -> str:
    """The agent the request's ``Authorization`` header names, after the same checks as the
    agent routes: a valid agent token, within its rate."""
    return agent_of(caller_of(request, request.headers.get("authorization")))
