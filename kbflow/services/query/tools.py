"""The agent's knowledge tools: plain functions with JSON-schema inputs and outputs.

Three tools. Progressive disclosure: `list_knowledge_collections` says what the agent may read
(no embedding call), then `search_knowledge_base` searches all of it or one collection;
`research_knowledge_search` answers yes / maybe / no with a cited synthesis
(`kbflow.services.query.answers`).
All go through the gate: an agent's scope is its org, its allowed collections and their
descendants, and nothing at all when its knowledge base is switched off. Usable from any agent
framework: `TOOLS` maps each name to its schemas and function; `call_tool` validates raw JSON
arguments and the result (the CLI, the MCP server); `run_tool` takes arguments already checked
by the tool's input model (the HTTP routes, whose response model checks the result). The
schemas come from the pydantic models in `kbflow.services.query.tool_models`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel

from core.errors import KbflowError
from kbflow.services.query import search as searching
from kbflow.services.query.context import OpenHome
from kbflow.services.query.tool_models import (
    DEFAULT_TOP_K,
    ListInput,
    ListOutput,
    ResearchInput,
    ResearchOutput,
    SearchInput,
    SearchOutput,
    tool_schema,
)
from kbflow.services.query.types import (
    AskTurn,
    CollectionsListed,
    JsonSchema,
    PassagesFound,
    SourceJson,
    ToolExport,
    ToolResult,
)
from sinks.registry import AgentRecord, SqlRegistry
from tasks.query.bounds import check_query
from tasks.query.public_uri import publish_uris

if TYPE_CHECKING:
    from tasks.llm import ChatModel


class ToolError(KbflowError, ValueError):
    """A tool call was refused: bad arguments, unknown agent, or a collection not allowed."""


def list_knowledge_collections(ctx: OpenHome, agent_id: str) -> CollectionsListed:
    """The collections the agent may read: id, name, description, parent. No embedding call."""
    agent = _agent(ctx.registry, agent_id)
    readable = ctx.registry.catalog.readable_collections(agent)
    return {
        "agent": agent.id,
        "knowledge_base_enabled": agent.knowledge_base_enabled,
        "collections": [
            {"id": c.id, "name": c.name, "description": c.description, "parent_id": c.parent_id}
            for c in readable
        ],
    }


def search_knowledge_base(
    ctx: OpenHome,
    agent_id: str,
    query: str,
    collection_id: int | None = None,
    top_k: int = DEFAULT_TOP_K,
) -> PassagesFound:
    """Search every collection the agent may read, or one of them (refused if not allowed).

    The query's one check (`check_query`): the HTTP route, MCP and ``kbflow tools call`` all
    reach it here, and the search below takes the `CheckedQuery` as it is."""
    checked = check_query(query)
    agent = _agent(ctx.registry, agent_id)
    out: PassagesFound = {
        "agent": agent.id,
        "query": query,
        "collection_id": collection_id,
        "results": [],
        "kb_context_provided": False,
        "degraded": False,
        "paused": False,
        "note": None,
    }
    if not agent.knowledge_base_enabled:
        out["note"] = f"the knowledge base is switched off for agent {agent.id}"
        return out
    readable = ctx.registry.catalog.readable_collections(agent)
    if collection_id is not None:
        chosen = [c for c in readable if c.id == collection_id]
        if not chosen:
            allowed = ", ".join(f"{c.id} ({c.name})" for c in readable) or "none"
            raise ToolError(
                f"agent {agent.id} may not read collection {collection_id}; it may read: "
                f"{allowed} — call list_knowledge_collections to see them"
            )
        paths: tuple[str, ...] = (chosen[0].path,)
    else:
        paths = tuple(c.path for c in readable)
    if not paths:
        out["note"] = f"agent {agent.id} may read no collection"
        return out
    chosen_paths = paths if collection_id is not None else ()
    result = searching.search(
        ctx,
        checked,
        agent=agent.id,
        top_k=top_k,
        collections=chosen_paths,
        agent_read=(agent, readable),
    ).result
    out.update(
        {
            "kb_context_provided": result.kb_context_provided,
            "degraded": result.degraded,
            "paused": result.paused,
            "note": result.reason,
            "results": [
                {
                    "doc_id": h.doc_id,
                    "chunk_id": h.chunk_id,
                    "title": h.title,
                    "uri": h.uri,
                    "collection": h.collection,
                    "heading_path": h.heading_path,
                    "location": h.location.to_payload() if h.location else None,
                    "text": h.text,
                    "score": h.score,
                    "sources": cast("list[SourceJson]", [src.to_dict() for src in h.sources]),
                }
                for h in result.hits
            ],
        }
    )
    return cast("PassagesFound", dict(publish_uris(out, agent.org_id)))


def research_knowledge_search(
    ctx: OpenHome, agent_id: str, queries: list[str], *, chat: ChatModel | None = None
) -> AskTurn:
    """The tri-state knowledge search (recorded in the ledger): see
    `kbflow.services.query.answers.ask`. ``chat``: the model that reads (MCP sampling: the calling
    agent's own), instead of the configured one."""
    from kbflow.services.query.answers import ask

    return ask(ctx, _agent(ctx.registry, agent_id).id, queries, chat=chat)


def _agent(registry: SqlRegistry, agent_id: str) -> AgentRecord:
    try:
        return registry.catalog.get_agent(agent_id)
    except KbflowError as exc:
        raise ToolError(str(exc)) from exc


@dataclass(frozen=True)
class Tool:
    """A tool: its models say what it takes and returns, their schemas are what it publishes."""

    name: str
    description: str
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    func: Callable[..., ToolResult]

    @cached_property
    def input_schema(self) -> JsonSchema:
        return tool_schema(self.input_model)

    @cached_property
    def output_schema(self) -> JsonSchema:
        return tool_schema(self.output_model)

    def export(self) -> ToolExport:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "output_schema": self.output_schema,
        }


TOOLS: dict[str, Tool] = {
    "list_knowledge_collections": Tool(
        "list_knowledge_collections",
        "List the knowledge collections you may read (id, name, description, parent). Call "
        "this first, then search the collection whose description fits the question.",
        ListInput,
        ListOutput,
        list_knowledge_collections,
    ),
    "search_knowledge_base": Tool(
        "search_knowledge_base",
        "Search approved knowledge in the collections you may read, or in one of them "
        "(collection_id from list_knowledge_collections). Returns cited passages.",
        SearchInput,
        SearchOutput,
        search_knowledge_base,
    ),
    "research_knowledge_search": Tool(
        "research_knowledge_search",
        "Research 1 to 5 queries in the approved knowledge you may read. Returns yes / maybe / "
        "no with a cited synthesis and steering: yes = answer from it; maybe = use it and "
        "research the gaps; no = research live (the miss says why).",
        ResearchInput,
        ResearchOutput,
        research_knowledge_search,
    ),
}


def _strict_validator(schema: JsonSchema) -> Any:
    """A JSON Schema validator whose "integer" is an integer: JSON Schema lets 5.0 pass (and
    Python's True is an int), but a tool that slices by ``top_k`` must not get either."""
    return _strict_validator_of(json.dumps(schema, sort_keys=True))


@functools.lru_cache(maxsize=64)
def _strict_validator_of(schema_json: str) -> Any:
    """Built once per schema: building one (and checking the schema) costs milliseconds."""
    import jsonschema

    schema = json.loads(schema_json)
    base = jsonschema.validators.validator_for(schema)
    base.check_schema(schema)
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _c, v: isinstance(v, int) and not isinstance(v, bool)
    ).redefine("number", lambda _c, v: isinstance(v, int | float) and not isinstance(v, bool))
    return jsonschema.validators.extend(base, type_checker=checker)(schema)


@functools.lru_cache(maxsize=64)
def _output_validator_of(schema_json: str) -> Any:
    """The plain validator of an output schema, built (and the schema checked) once: checking
    the schema on every call cost ~30 ms a search."""
    import jsonschema

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _first_unencodable(value: Any, where: str = "arguments") -> tuple[str, str] | None:
    """The first string (and where it is) that cannot be encoded as UTF-8, if any."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where, value
        return None
    items: Any = (
        value.items()
        if isinstance(value, dict)
        else (enumerate(value) if isinstance(value, list) else ())
    )
    for key, item in items:
        found = _first_unencodable(item, str(key) if where == "arguments" else f"{where}/{key}")
        if found is not None:
            return found
    return None


def export_schemas() -> list[ToolExport]:
    return [tool.export() for tool in TOOLS.values()]


def _tool(name: str) -> Tool:
    tool = TOOLS.get(name)
    if tool is None:
        raise ToolError(f"unknown tool {name!r} — tools: {', '.join(TOOLS)}")
    return tool


def check_arguments(name: str, schema: JsonSchema, arguments: Any) -> None:
    """Refuse ``arguments`` that do not fit ``schema``, the input schema of tool ``name``.

    Strict where JSON Schema is lax (``5.0`` and ``true`` are not integers), and text must be
    UTF-8. Shared by `call_tool` and the other surfaces that publish a tool schema (the MCP
    server's ``answer``), so every caller gets the same refusal.

    Raises:
        ToolError: naming the tool, the argument and what is wrong with it.
    """
    import jsonschema

    try:
        _strict_validator(schema).validate(arguments)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "arguments"
        raise ToolError(f"invalid arguments for {name}: {where}: {exc.message}") from None
    bad_text = _first_unencodable(arguments)
    if bad_text is not None:
        where, value = bad_text
        raise ToolError(
            f"invalid arguments for {name}: {where}: {value!r} is not valid Unicode text (it "
            "holds a lone surrogate, e.g. from bytes that are not UTF-8); send UTF-8 text."
        )


def call_tool(ctx: OpenHome, name: str, agent_id: str, arguments: Any, **extra: Any) -> ToolResult:
    """Validate raw JSON arguments against the tool's input schema, call it, validate the
    result against its output schema (``kbflow tools call``, the MCP server). ``extra``: the
    caller's own keywords for the tool (never the client's: e.g. the MCP server's ``chat``)."""
    tool = _tool(name)
    check_arguments(name, tool.input_schema, arguments)
    result = tool.func(ctx, agent_id, **arguments, **extra)
    # our own contract: a bug if it fails
    _output_validator_of(json.dumps(tool.output_schema, sort_keys=True)).validate(result)
    return result


def run_tool(ctx: OpenHome, name: str, agent_id: str, arguments: BaseModel) -> ToolResult:
    """Call tool ``name`` with arguments its input model has already checked (an HTTP body that
    FastAPI validated: pydantic refuses a lone surrogate too, so nothing is left to check). The
    result is returned unchecked: the caller checks it with the tool's output model (the
    route's response model).

    Raises:
        TypeError: ``arguments`` is not an instance of the tool's input model (a bug).
        ToolError: an unknown tool, or the tool's own refusal.
    """
    tool = _tool(name)
    if not isinstance(arguments, tool.input_model):
        raise TypeError(f"{name} takes {tool.input_model.__name__}, not {type(arguments).__name__}")
    # The keys sent only: a left-out argument takes the tool's default, as with call_tool.
    return tool.func(ctx, agent_id, **arguments.model_dump(exclude_unset=True))
