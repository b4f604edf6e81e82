"""Collections, agent allow-lists and the agent's tools, on real Edge, SQLite and MiniLM.

Every tool call here goes through `call_tool`, which validates the arguments and the result
against the exported JSON schemas.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from typer.testing import CliRunner

from core.errors import ConfigError
from core.settings import Settings
from kbflow.cli import app
from kbflow.services.query.context import OpenHome
from kbflow.services.query.tools import TOOLS, ToolError, call_tool, export_schemas
from sinks.registry import SqlRegistry
from tasks.review.collections import delete_collection, move_collection
from tests.conftest import index_records

TOPIC = "quarterly expense reimbursement rules"
TREE = {  # path -> description
    "policies": "Company policies.",
    "policies/hr": "People policies: leave, expenses, conduct.",
    "policies/hr/travel": "Travel and expense rules.",
    "policies/it": "IT and security policies.",
    "sales": "Sales playbooks and pricing.",
}


@pytest.fixture
def world(settings: Settings, registry: Any, edge_store: Any, embedder: Any) -> dict[str, Any]:
    registry.people.ensure_org("acme")
    registry.people.ensure_org("globex")
    ids: dict[str, int] = {"default": registry.catalog.get_collection("acme", "default").id}
    for path, description in TREE.items():
        parent, _, name = path.rpartition("/")
        ids[path] = registry.catalog.create_collection("acme", name, description, parent or None).id
    docs: dict[str, str] = {}
    kw = {"store": edge_store, "registry": registry, "embedder": embedder}
    for path in ["default", *TREE]:
        record = {"key": path, "title": f"{TOPIC} in {path}", "text": f"{TOPIC}: see {path}."}
        docs[path] = index_records([record], collection=path, **kw)[0]
    docs["globex"] = index_records([{"key": "g", "title": TOPIC, "text": TOPIC}], org="globex",
                                   **kw)[0]  # fmt: skip
    ctx = OpenHome(settings=settings, registry=registry, store=edge_store, embedder=embedder)
    return {"registry": registry, "ids": ids, "docs": docs, "ctx": ctx}


def _agent(world: dict[str, Any], agent_id: str, allowed: list[str], enabled: bool = True) -> str:
    registry: SqlRegistry = world["registry"]
    registry.catalog.create_agent("acme", agent_id, enabled=enabled)
    if allowed:
        registry.catalog.set_allowed(agent_id, [world["ids"][p] for p in allowed], allow=True)
    return agent_id


def _search(world: dict[str, Any], agent: str, **args: Any) -> dict[str, Any]:
    return call_tool(world["ctx"], "search_knowledge_base", agent, {"query": TOPIC, **args})


def _docs(result: dict[str, Any]) -> set[str]:
    return {r["doc_id"] for r in result["results"]}


def test_schemas_are_valid_json_schema_and_exported_by_the_cli() -> None:
    exported = export_schemas()
    assert [t["name"] for t in exported] == list(TOOLS)
    for tool in exported:
        jsonschema.Draft202012Validator.check_schema(tool["input_schema"])
        jsonschema.Draft202012Validator.check_schema(tool["output_schema"])
    printed = CliRunner().invoke(app, ["tools", "schema"])
    assert printed.exit_code == 0 and json.loads(printed.stdout) == exported


def test_the_docs_count_and_name_every_agent_tool() -> None:
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    numbers = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
    for doc in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for said in re.findall(r"\b(one|two|three|four|five|six|\d+)\s+(?:agent\s+)?tools\b", text):
            count = numbers.get(said.lower()) or int(said)
            assert count == len(TOOLS), f"{doc.name} says {said} tools; there are {len(TOOLS)}"
    readme = (repo / "README.md").read_text(encoding="utf-8")
    scope_agents = readme.split("**Scope agents**", 1)[1].split("\n\n", 1)[0]
    collections_and_agents = readme.split("**Collections and agents.**", 1)[1].split("\n\n", 1)[0]
    for name in TOOLS:
        assert f"`{name}`" in scope_agents, name
        assert f"`{name}`" in collections_and_agents, name


def test_an_agent_lists_and_searches_only_its_subtree(world: dict[str, Any]) -> None:
    hr = _agent(world, "hr-bot", ["policies/hr"])
    listed = call_tool(world["ctx"], "list_knowledge_collections", hr, {})
    assert {c["name"] for c in listed["collections"]} == {"hr", "travel"}
    assert all(c["description"] for c in listed["collections"])
    docs = world["docs"]
    assert _docs(_search(world, hr, top_k=50)) == {docs["policies/hr"], docs["policies/hr/travel"]}
    travel = world["ids"]["policies/hr/travel"]
    one = _search(world, hr, collection_id=travel, top_k=50)
    assert _docs(one) == {docs["policies/hr/travel"]}

    everyone = _agent(world, "all-bot", [])
    org_docs = {d for k, d in docs.items() if k != "globex"}
    assert _docs(_search(world, everyone, top_k=50)) == org_docs


def test_a_collection_outside_the_allow_list_is_refused(world: dict[str, Any]) -> None:
    hr = _agent(world, "hr-bot", ["policies/hr"])
    with pytest.raises(ToolError, match=r"may not read collection \d+; it may read: .*hr"):
        _search(world, hr, collection_id=world["ids"]["sales"])


def test_the_master_switch_returns_nothing(world: dict[str, Any]) -> None:
    off = _agent(world, "off-bot", [], enabled=False)
    result = _search(world, off, top_k=50)
    assert result["results"] == [] and "switched off" in result["note"]
    assert call_tool(world["ctx"], "list_knowledge_collections", off, {})["collections"] == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"query": TOPIC, "top_k": 0}, "top_k: 0 is less than the minimum of 1"),
        ({"query": TOPIC, "top_k": 500}, "top_k: 500 is greater than the maximum of 50"),
        ({"query": TOPIC, "collection_id": "policies"}, "collection_id: 'policies' is not of"),
        ({"query": [TOPIC]}, "query: ['quarterly"),
        ({}, "'query' is a required property"),
        ({"query": TOPIC, "colection_id": 3}, "Additional properties are not allowed"),
    ],
)
def test_invalid_arguments_get_a_clear_error(
    world: dict[str, Any], args: dict[str, Any], fragment: str
) -> None:
    hr = _agent(world, "hr-bot", ["policies/hr"])
    with pytest.raises(ToolError) as err:
        call_tool(world["ctx"], "search_knowledge_base", hr, args)
    assert fragment in str(err.value)


def test_listing_makes_no_embedding_call(world: dict[str, Any]) -> None:
    class NoEmbedding:
        model_id, dim = "none", 384

        def embed_documents(self, texts: Any) -> Any:
            raise AssertionError("list_knowledge_collections must not embed")

        embed_query = embed_documents

    ctx: OpenHome = world["ctx"]
    quiet = OpenHome(ctx.settings, ctx.registry, ctx.store, NoEmbedding())  # type: ignore[arg-type]
    _agent(world, "hr-bot", ["policies/hr"])
    assert call_tool(quiet, "list_knowledge_collections", "hr-bot", {})["collections"]


def test_moving_a_collection_keeps_the_gate_paths_right(
    world: dict[str, Any], edge_store: Any
) -> None:
    hr = _agent(world, "hr-bot", ["policies/hr"])
    policies = _agent(world, "policies-bot", ["policies"])
    moved, count = move_collection(world["registry"], edge_store, "acme", "policies/hr", "sales")
    assert moved.path == "sales/hr" and count == 2
    chunks = edge_store.inspect_document_chunks(world["docs"]["policies/hr/travel"])
    assert all(
        c.payload["collection_path"] == ["sales", "sales/hr", "sales/hr/travel"] for c in chunks
    )
    docs = world["docs"]
    assert _docs(_search(world, hr, top_k=50)) == {docs["policies/hr"], docs["policies/hr/travel"]}
    assert _docs(_search(world, policies, top_k=50)) == {docs["policies"], docs["policies/it"]}
    with pytest.raises(ConfigError, match="inside it"):
        world["registry"].catalog.move_collection_rows("acme", "sales", "sales/hr")


def test_deleting_a_collection_moves_or_deletes_its_documents(
    world: dict[str, Any], edge_store: Any
) -> None:
    registry = world["registry"]
    with pytest.raises(ConfigError, match=r"holds 1 document version\(s\) — move them"):
        delete_collection(registry, edge_store, "acme", "sales")
    assert delete_collection(registry, edge_store, "acme", "sales", move_to="default") == {
        "moved": 1, "deleted": 0,
    }  # fmt: skip
    everyone = _agent(world, "all-bot", [])
    assert world["docs"]["sales"] in _docs(_search(world, everyone, top_k=50))
    counts = delete_collection(registry, edge_store, "acme", "policies/it", delete_contents=True)
    assert counts == {"moved": 0, "deleted": 1}
    assert world["docs"]["policies/it"] not in _docs(_search(world, everyone, top_k=50))
    with pytest.raises(ConfigError, match="Default collection cannot be deleted"):
        delete_collection(registry, edge_store, "acme", "default")


def test_new_collections_need_a_description(world: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="needs a description"):
        world["registry"].catalog.create_collection("acme", "misc", "  ")


@hsettings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    allowed=st.lists(st.sampled_from(["default", *TREE]), max_size=3, unique=True),
    enabled=st.booleans(),
    pick=st.integers(min_value=0, max_value=10),
)
def test_property_no_search_leaves_the_allowed_subtree(
    world: dict[str, Any], allowed: list[str], enabled: bool, pick: int
) -> None:
    registry: SqlRegistry = world["registry"]
    agent_id = f"agent-{len(allowed)}-{enabled}-{pick}-{'-'.join(allowed)}".lower()
    agent_id = agent_id.replace("/", "_").rstrip("-")
    try:
        registry.catalog.get_agent(agent_id)
    except Exception:
        _agent(world, agent_id, allowed, enabled)
    docs = world["docs"]
    roots = allowed or ["default", *TREE]
    subtree = {
        p for p in docs if p != "globex" and any(p == r or p.startswith(r + "/") for r in roots)
    }
    readable = call_tool(world["ctx"], "list_knowledge_collections", agent_id, {})["collections"]
    args: dict[str, Any] = {"top_k": 50}
    if readable and pick < len(readable):
        args["collection_id"] = readable[pick]["id"]
    found = _docs(_search(world, agent_id, **args))
    if not enabled:
        assert found == set() and readable == []
        return
    assert found <= {docs[p] for p in subtree}
    if "collection_id" not in args:
        assert found == {docs[p] for p in subtree}


def test_agent_scope_and_org_wide_search_rights(world: dict[str, Any], registry: Any) -> None:
    from core.errors import Forbidden
    from core.models import Role
    from tasks.query.scopes import agent_scope, person_scope

    _agent(world, "hr-bot", ["policies/hr"])
    scope = agent_scope(registry, "hr-bot")
    assert scope is not None and set(scope.collections or ()) == {
        "policies/hr", "policies/hr/travel",
    }  # fmt: skip
    narrowed = agent_scope(registry, "hr-bot", ("policies/hr/travel",))
    assert narrowed is not None and narrowed.collections == ("policies/hr/travel",)
    with pytest.raises(Forbidden, match="may not read sales"):
        agent_scope(registry, "hr-bot", ("sales",))
    _agent(world, "off-bot", [], enabled=False)
    assert agent_scope(registry, "off-bot") is None

    registry.people.ensure_user("root", Role.SUPERADMIN)
    registry.people.ensure_user("ed", Role.ENGINEER, org_id="acme")
    registry.people.ensure_user("amy", Role.ACCOUNT_MANAGER)
    assert person_scope(registry, "root", "acme").all_audiences
    assert person_scope(registry, "ed", "acme").org_id == "acme"
    with pytest.raises(Forbidden, match="belongs to org acme"):
        person_scope(registry, "ed", "globex")
    with pytest.raises(Forbidden, match="org-wide search is for engineers and superadmins"):
        person_scope(registry, "amy", "acme")
    with pytest.raises(Forbidden, match="needs --as USER"):
        person_scope(registry, None, "acme")


def test_collection_and_agent_commands(tmp_path: Any) -> None:
    runner = CliRunner()

    def ok(*args: str) -> str:
        result = runner.invoke(app, list(args))
        assert result.exit_code == 0, result.output
        return result.stdout

    ok("users", "add", "root", "--role", "superadmin")
    ok("orgs", "create", "acme", "--as", "root")
    made = json.loads(ok("collections", "create", "--org", "acme", "policies", "--description",
                         "Company policies.", "--json", "--as", "root"))  # fmt: skip
    ok("collections", "create", "--org", "acme", "hr", "--description", "People.", "--parent",
       "policies", "--as", "root")  # fmt: skip
    listed = json.loads(ok("collections", "list", "--org", "acme", "--json"))
    assert [c["path"] for c in listed] == ["default", "policies", "policies/hr"]
    refused = runner.invoke(
        app, ["collections", "create", "--org", "acme", "x", "--description", "", "--as", "root"]
    )
    assert refused.exit_code == 1 and "needs a description" in refused.output
    ok("agents", "create", "--org", "acme", "hr-bot", "--as", "root")
    ok("agents", "allow", "hr-bot", "policies/hr", "--as", "root")
    shown = json.loads(ok("agents", "show", "hr-bot", "--json"))
    assert [c["path"] for c in shown["readable"]] == ["policies/hr"]
    off = json.loads(ok("agents", "show", "hr-bot", "--disable", "--json", "--as", "root"))
    assert off["knowledge_base_enabled"] is False and off["readable"] == []
    ok("collections", "move", "--org", "acme", "policies/hr", "--as", "root")
    moved = json.loads(ok("collections", "list", "--org", "acme", "--json"))
    assert "hr" in [c["path"] for c in moved]
    ok("collections", "delete", "--org", "acme", str(made["id"]), "--as", "root")
    call = runner.invoke(app, ["tools", "call", "list_knowledge_collections", "--agent",
                               "hr-bot", "--args", "{}"])  # fmt: skip
    assert call.exit_code == 0, call.output
    assert json.loads(call.stdout)["knowledge_base_enabled"] is False
    bad = runner.invoke(app, ["tools", "call", "search_knowledge_base", "--agent", "hr-bot",
                              "--args", '{"query": "x", "top_k": "five"}'])  # fmt: skip
    assert bad.exit_code == 1 and "top_k: 'five' is not of type 'integer'" in bad.output


def test_losing_its_last_collection_never_widens_an_agent(
    world: dict[str, Any], edge_store: Any
) -> None:
    """An empty allow-list means "every collection": neither a disallow nor a delete may
    produce one by accident."""
    registry: SqlRegistry = world["registry"]
    _agent(world, "sales-bot", ["sales"])
    with pytest.raises(ConfigError, match="would let agent sales-bot read every collection"):
        registry.catalog.set_allowed("sales-bot", ["sales"], allow=False)
    delete_collection(world["registry"], edge_store, "acme", "sales", delete_contents=True)
    agent = registry.catalog.get_agent("sales-bot")
    assert agent.allowed_collection_ids == () and not agent.knowledge_base_enabled
    assert _search(world, "sales-bot", top_k=50)["results"] == []


def test_search_results_say_what_their_citation_tags_stand_for(
    world: dict[str, Any], edge_store: Any, embedder: Any
) -> None:
    draft = (
        "# Expense sources\n\n- Receipts over 25 EUR are required [doc:seed1]\n"
        f"- {TOPIC} are on the intranet [url:https://acme.example/expenses]\n\n"
        "---\n## Citations\n- [doc:seed1] Finance handbook\n"
        "- [url:https://acme.example/expenses] Expenses page\n"
    )
    doc = index_records(
        [{"key": "cited", "title": "Expense sources", "text": draft, "markdown": True}],
        collection="default", store=edge_store, registry=world["registry"], embedder=embedder,
        cite_uris={"doc:seed1": "upload:acme/finance.pdf"},
    )[0]  # fmt: skip
    agent = _agent(world, "cite-bot", [])
    found = _search(world, agent, top_k=20)  # call_tool checks the result against the schema
    [hit] = [r for r in found["results"] if r["doc_id"] == doc]
    assert hit["sources"] == [
        {"tag": "[doc:seed1]", "title": "Finance handbook", "uri": "upload:acme/finance.pdf"},
        {
            "tag": "[url:https://acme.example/expenses]",
            "title": "Expenses page",
            "uri": "https://acme.example/expenses",
        },
    ]
    assert "\n- " in hit["text"] and "Citations" not in hit["text"]
    assert all(r["sources"] == [] for r in found["results"] if r["doc_id"] != doc)
