"""Every admin change names a permitted actor (issue 31, item 4), through the CLI as a user runs it.

Creating (or renaming) an org needs a superadmin; an org's collections (create, describe, move,
delete) and agents (create, allow, disallow, enable/disable) need a superadmin or the org's
assigned account manager. Without ``--as``, as someone else, or as another org's AM: exit 1, a
message that says what was refused and what to do, a ``kb.access.denied`` audit row, and nothing
changed. As the org's AM or a superadmin: done, and audited with that actor.

In-process (typer's CliRunner) on a real registry and Qdrant Edge store in the test's
KBFLOW_HOME.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from core.errors import NotFound
from core.settings import Settings
from sinks.connect import open_vector_store
from sinks.registry import SqlRegistry
from tests.conftest import home_built_once, index_records
from tests.kbflow.support import data, flat, kb, ok

pytestmark = pytest.mark.integration

DENIED = "kb.access.denied"


@pytest.fixture
def people(tmp_path_factory: pytest.TempPathFactory) -> None:
    """root (superadmin); org acme (AM amy, engineer ed) with collections policies and
    policies/hr and agent bot allowed both; org globex (AM gus)."""
    home_built_once("admin_actors-people", _people, tmp_path_factory)


def _people() -> None:
    ok("users", "add", "root", "--role", "superadmin")
    ok("orgs", "create", "acme", "--name", "Acme Cycles", "--as", "root")
    ok("orgs", "create", "globex", "--as", "root")
    ok("users", "add", "amy", "--role", "account_manager", "--as", "root")
    ok("users", "add", "gus", "--role", "account_manager", "--as", "root")
    ok("users", "add", "ed", "--role", "engineer", "--org", "acme", "--as", "root")
    ok("orgs", "assign-am", "acme", "amy", "--as", "root")
    ok("orgs", "assign-am", "globex", "gus", "--as", "root")
    ok("collections", "create", "--org", "acme", "policies", "--description", "Policies.",
       "--as", "root")  # fmt: skip
    ok("collections", "create", "--org", "acme", "hr", "--description", "People policies.",
       "--parent", "policies", "--as", "root")  # fmt: skip
    ok("agents", "create", "--org", "acme", "bot", "--as", "root")
    ok("agents", "allow", "bot", "policies", "policies/hr", "--as", "root")


def snapshot() -> dict[str, Any]:
    """What the registry holds of orgs, collections and agents."""
    registry = SqlRegistry.open(Settings().registry_url)
    try:
        agents: dict[str, Any] = {}
        for agent_id in ("bot", "hr-bot"):
            try:
                agents[agent_id] = registry.catalog.get_agent(agent_id).to_dict()
            except NotFound:
                agents[agent_id] = None
        return {
            "orgs": [(o.id, o.name, o.am_user_id) for o in registry.people.list_orgs()],
            "collections": {
                org: [c.to_dict() for c in registry.catalog.list_collections(org)]
                for org in ("acme", "globex")
            },
            "agents": agents,
        }
    finally:
        registry.close()


def audit(org: str | None = "acme") -> list[dict[str, Any]]:
    return data("audit", "--org", org) if org else data("audit")


@dataclass(frozen=True)
class Change:
    """A catalog change of org acme: its command, the words its refusal says, and the audit
    action it writes when done."""

    name: str
    args: tuple[str, ...]
    what: str
    action: str
    done: Callable[[dict[str, Any]], bool]


def _paths(state: dict[str, Any]) -> list[str]:
    return [c["path"] for c in state["collections"]["acme"]]


CHANGES = [
    Change("collections create",
           ("collections", "create", "--org", "acme", "sales", "--description", "Sales."),
           "create collection 'sales' in org 'acme'", "kb.collection.created",
           lambda s: "sales" in _paths(s)),
    Change("collections describe",
           ("collections", "describe", "--org", "acme", "policies", "Every policy."),
           "describe collection 'policies' of org 'acme'", "kb.collection.described",
           lambda s: any(c["description"] == "Every policy." for c in s["collections"]["acme"])),
    Change("collections move", ("collections", "move", "--org", "acme", "policies/hr"),
           "move collection 'policies/hr' of org 'acme'", "kb.collection.moved",
           lambda s: "hr" in _paths(s)),
    Change("collections delete", ("collections", "delete", "--org", "acme", "policies/hr"),
           "delete collection 'policies/hr' of org 'acme'", "kb.collection.deleted",
           lambda s: "policies/hr" not in _paths(s)),
    Change("agents create", ("agents", "create", "--org", "acme", "hr-bot"),
           "create agent 'hr-bot' in org 'acme'", "kb.agent.created",
           lambda s: s["agents"]["hr-bot"] is not None),
    Change("agents allow", ("agents", "allow", "bot", "default"),
           "allow collections for agent 'bot'", "kb.agent.collections",
           lambda s: len(s["agents"]["bot"]["allowed_collection_ids"]) == 3),
    Change("agents disallow", ("agents", "disallow", "bot", "policies/hr"),
           "disallow collections for agent 'bot'", "kb.agent.collections",
           lambda s: len(s["agents"]["bot"]["allowed_collection_ids"]) == 1),
    Change("agents show --disable", ("agents", "show", "bot", "--disable"),
           "switch the knowledge base of agent 'bot' off", "kb.agent.knowledge_base",
           lambda s: s["agents"]["bot"]["knowledge_base_enabled"] is False),
]  # fmt: skip


@pytest.mark.parametrize("change", CHANGES, ids=[c.name for c in CHANGES])
@pytest.mark.parametrize("admin", ["amy", "root"])
def test_a_catalog_change_needs_the_orgs_am_or_a_superadmin(
    people: None, change: Change, admin: str
) -> None:
    before = snapshot()
    assert not change.done(before)

    anonymous = kb(*change.args)
    assert anonymous.exit_code == 1, anonymous.output
    said = flat(anonymous)
    assert change.what in said and "--as USER" in said, said
    assert "superadmin or the org's assigned account manager" in said
    assert "Nothing was changed" in said and "Traceback" not in anonymous.output

    for intruder, role in (("ed", "engineer"), ("gus", "account_manager"), ("mallory", None)):
        refused = kb(*change.args, "--as", intruder)
        assert refused.exit_code == 1, (intruder, refused.output)
        said = flat(refused)
        assert change.what in said and "Nothing was changed" in said, said
        assert (f"({role})" if role else "unknown user 'mallory'") in said
    assert snapshot() == before  # no refusal changed anything

    denied = [
        r for r in audit() if r["action"] == DENIED and r["after"]["attempted"] == change.what
    ]
    assert [r["actor"] for r in denied] == ["(anonymous)", "ed", "gus", "mallory"]
    assert all("Nothing was changed" in r["after"]["reason"] for r in denied)

    ok(*change.args, "--as", admin)
    after = snapshot()
    assert change.done(after), after
    rows = [r for r in audit() if r["action"] == change.action]
    assert rows[-1]["actor"] == admin, rows


def test_creating_or_renaming_an_org_needs_a_superadmin(people: None) -> None:
    before = snapshot()
    anonymous = kb("orgs", "create", "initech", "--name", "Initech")
    assert anonymous.exit_code == 1, anonymous.output
    said = flat(anonymous)
    assert "create org 'initech'" in said and "superadmin" in said and "--as USER" in said
    assert "kbflow users list" in said and "Nothing was changed" in said
    for intruder, role in (("ed", "engineer"), ("amy", "account_manager")):
        refused = kb("orgs", "create", "initech", "--as", intruder)
        assert refused.exit_code == 1, refused.output
        assert f"user {intruder!r} ({role}) may not create org 'initech'" in flat(refused)
    renamed = kb("orgs", "create", "acme", "--name", "Evil Cycles", "--as", "amy")
    assert renamed.exit_code == 1 and "rename org 'acme'" in flat(renamed)
    assert snapshot() == before

    # The org did not exist: its refusals are agency-wide; acme's rename refusal is acme's.
    denied = [
        r for r in audit(None) if r["action"] == DENIED and "initech" in r["after"]["attempted"]
    ]
    assert [r["actor"] for r in denied] == ["(anonymous)", "ed", "amy"]
    assert [(r["actor"], r["after"]["attempted"]) for r in audit() if r["action"] == DENIED] == [
        ("amy", "rename org 'acme'")
    ]

    made = ok("orgs", "create", "initech", "--name", "Initech", "--as", "root", "--json")
    assert '"id": "initech"' in made.stdout
    assert [(r["actor"], r["action"]) for r in audit("initech")] == [("root", "kb.org.created")]
    ok("orgs", "create", "acme", "--name", "Acme Bikes", "--as", "root")
    renames = [r for r in audit() if r["action"] == "kb.org.renamed"]
    assert [(r["actor"], r["before"]["name"], r["after"]["name"]) for r in renames] == [
        ("root", "Acme Cycles", "Acme Bikes")
    ]


def test_an_unknown_org_or_agent_is_refused_to_an_am_as_another_orgs_is(people: None) -> None:
    for args in (
        ("collections", "create", "--org", "nowhere", "x", "--description", "X."),
        ("agents", "allow", "ghost", "default"),
        ("agents", "show", "ghost", "--enable"),
    ):
        refused = kb(*args, "--as", "amy")
        assert refused.exit_code == 1, refused.output
        assert "does not exist is refused the same way" in flat(refused), args
    # A superadmin is told what is missing.
    missing = kb("agents", "allow", "ghost", "default", "--as", "root")
    assert missing.exit_code == 1 and "agent 'ghost' does not exist" in flat(missing)


def test_a_refused_delete_leaves_the_documents_and_their_vectors(
    people: None, embedder: Any
) -> None:
    settings = Settings()
    registry = SqlRegistry.open(settings.registry_url)
    try:
        with open_vector_store(settings) as store:
            index_records(
                [{"key": "leave", "title": "Leave", "text": "Staff get 28 days of leave."}],
                store=store, registry=registry, embedder=embedder, collection="policies/hr",
            )  # fmt: skip
            stored = store.count("acme")
    finally:
        registry.close()
    assert stored > 0
    delete = ("collections", "delete", "--org", "acme", "policies/hr", "--delete-contents")

    for who in ((), ("--as", "gus"), ("--as", "ed")):
        assert kb(*delete, *who).exit_code == 1
    assert len(data("docs", "list", "--org", "acme")) == 1
    with open_vector_store(settings) as store:
        assert store.count("acme") == stored

    ok(*delete, "--as", "amy")
    assert data("docs", "list", "--org", "acme") == []
    with open_vector_store(settings) as store:
        assert store.count("acme") == 0
    deleted = [r for r in audit() if r["action"] == "kb.collection.deleted"]
    assert [(r["actor"], r["after"]["documents_deleted"]) for r in deleted] == [("amy", 1)]


def test_agent_audiences_stay_a_superadmins(people: None) -> None:
    refused = kb(
        "agents", "create", "--org", "acme", "hr-bot", "--audience", "staff", "--as", "amy"
    )
    assert refused.exit_code == 1 and "superadmin" in flat(refused)
    assert kb("agents", "audience", "bot", "staff", "--as", "amy").exit_code == 1
    assert snapshot()["agents"]["hr-bot"] is None
    ok("agents", "create", "--org", "acme", "hr-bot", "--audience", "staff", "--as", "root")
    assert snapshot()["agents"]["hr-bot"]["audiences"] == ["staff"]
