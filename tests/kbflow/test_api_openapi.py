"""The shape of ``kbflow serve``'s HTTP layer (issue 30): one router module per domain, none
importing another, and an OpenAPI page that says what every route answers.

The app is only built here (it opens nothing until it starts); what the routes answer, byte for
byte, is `tests/kbflow/test_http_contract.py`'s business.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from core.settings import Settings
from kbflow.api.app import create_app
from kbflow.api.schemas import AnswerBody, AskBody, AskResponse, SearchBody
from kbflow.services.query.tool_models import ResearchInput, ResearchOutput, SearchInput
from kbflow.services.query.tools import ToolError, call_tool, run_tool

API = Path(__file__).resolve().parents[2] / "kbflow" / "api"
METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    return create_app(Settings(home=Path("unused"))).openapi()


def _operations(openapi: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in openapi["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]


def _schema(openapi: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``schema``, its ``$ref`` followed to the component it names."""
    ref = schema.get("$ref")
    if ref is None:
        return schema
    found: dict[str, Any] = openapi["components"]["schemas"][ref.rpartition("/")[2]]
    return found


def test_every_route_says_what_it_answers(openapi: dict[str, Any]) -> None:
    operations = _operations(openapi)
    assert len(operations) >= 18  # every route of the service (/mcp is not an OpenAPI route)
    missing = []
    for method, path, operation in operations:
        answers = [
            _schema(openapi, media.get("schema") or {})
            for status, response in operation["responses"].items()
            if status.startswith("2")
            for media in response.get("content", {}).values()
        ]
        if not answers or not all(answers):
            missing.append(f"{method} {path}")
    assert missing == [], f"routes with no 2xx response schema: {missing}"


def test_json_answers_are_models_not_open_objects(openapi: dict[str, Any]) -> None:
    """A JSON answer names its keys (an object with properties, or an array of such objects),
    so the page says more than "an object"."""
    vague = []
    for method, path, operation in _operations(openapi):
        for status, response in operation["responses"].items():
            media = response.get("content", {}).get("application/json")
            if not status.startswith("2") or media is None:
                continue
            schema = _schema(openapi, media["schema"])
            if schema.get("type") == "array":
                schema = _schema(openapi, schema["items"])
            if not schema.get("properties"):
                vague.append(f"{method} {path}")
    assert vague == [], vague


def test_metrics_declares_its_text_format(openapi: dict[str, Any]) -> None:
    content = openapi["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert content == {"text/plain": {"schema": {"type": "string"}}}


# --- the routers --------------------------------------------------------------------------------


def _route_modules() -> dict[str, ast.Module]:
    """The modules of kbflow/api that make an APIRouter, by module name."""
    modules = {}
    for path in sorted(API.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        makes_router = any(
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "APIRouter"
            for node in ast.walk(tree)
        )
        if makes_router:
            modules[f"kbflow.api.{path.stem}"] = tree
    return modules


def _imported(tree: ast.Module) -> set[str]:
    """Every kbflow.api module ``tree`` imports, lazy imports included."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from inside kbflow.api
                base = "kbflow.api" + (f".{base}" if base else "")
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("kbflow.api.")}


def test_one_router_per_domain_and_none_imports_another() -> None:
    routers = _route_modules()
    assert set(routers) == {
        f"kbflow.api.{domain}"
        for domain in (
            "agent",
            "review",
            "seeds",
            "research",
            "documents",
            "jobs",
            "sources",
            "provenance",
            "health",
            "inbox",
        )
    }
    crossing = sorted(
        f"{module} imports {name}"
        for module, tree in routers.items()
        for name in _imported(tree) & set(routers)
        if name != module
    )
    assert crossing == []


def test_the_app_serves_every_router(openapi: dict[str, Any]) -> None:
    """Every router's routes are in the OpenAPI document, except the inbox's pages (HTML for
    people, not an API: left out of the schema), which the app includes all the same
    (tests/kbflow/test_inbox.py calls them on a real server)."""
    import kbflow.api.app as app_module

    served = {(method, path) for method, path, _ in _operations(openapi)}
    for module in _route_modules():
        router = importlib.import_module(module).router
        routes = {(m, route.path) for route in router.routes for m in route.methods}
        assert routes, module
        if module == "kbflow.api.inbox":
            assert not routes & served  # pages, not API operations
            assert "app.include_router(inbox.router)" in Path(app_module.__file__).read_text()
        else:
            assert routes <= served, module


# --- the agent routes' bodies and answers ------------------------------------------------------


def test_the_agent_bodies_are_the_tools_input_models() -> None:
    """`run_tool` takes the HTTP bodies as they are: they are the tools' input models, made
    strict."""
    assert issubclass(SearchBody, SearchInput) and issubclass(AskBody, ResearchInput)
    for body in (SearchBody, AskBody, AnswerBody):
        assert body.model_config.get("strict") and body.model_config.get("extra") == "forbid"


def test_the_ask_answer_states_the_tools_published_output() -> None:
    """``POST /v1/agent/ask`` answers what ``research_knowledge_search`` publishes, and more."""
    for name, field in ResearchOutput.model_fields.items():
        assert name in AskResponse.model_fields, name
        assert AskResponse.model_fields[name].annotation == field.annotation, name


def test_run_tool_takes_a_checked_body_as_it_is() -> None:
    """Nothing is left for `run_tool` to check: pydantic refuses text that is not UTF-8 (a lone
    surrogate, which JSON Schema lets through and `call_tool` refuses itself); a body of another
    tool's model is a bug, not a 400. Refused before any tool runs (no context needed)."""
    ctx: Any = None
    lone = "ware\udcffhouse"
    with pytest.raises(ValidationError, match="string_unicode"):
        SearchBody(query=lone)
    with pytest.raises(ValidationError, match="string_unicode"):
        AnswerBody(question=lone)
    with pytest.raises(ToolError, match=r"search_knowledge_base: query: .* not valid Unicode"):
        call_tool(ctx, "search_knowledge_base", "bot", {"query": lone})
    with pytest.raises(TypeError, match="takes SearchInput"):
        run_tool(ctx, "search_knowledge_base", "bot", AskBody(queries=["x"]))
    with pytest.raises(ToolError, match="unknown tool 'nope'"):
        run_tool(ctx, "nope", "bot", AskBody(queries=["x"]))
