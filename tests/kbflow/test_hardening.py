"""What a hostile review of kbflow found (issue 13), each pinned through the CLI as a user runs it.

In-process (typer's CliRunner) on a real registry and Qdrant Edge store in the test's
KBFLOW_HOME; documents are indexed with ``index_records`` with the store closed before any
command runs (each command opens it itself). Ingest-through-a-flow cases live in
``tests/flows/test_ingest_hardening.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from core.models import DocStatus
from core.settings import Settings
from kbflow.cli import EXIT_CONFLICT
from sinks.connect import open_vector_store
from sinks.registry import SqlRegistry
from tests.conftest import home_built_once, index_records
from tests.kbflow.support import data, flat, kb, ok

pytestmark = pytest.mark.integration

EXEC_TEXT = "The board approved the Osprey acquisition for 48 million euros in June."
PUBLIC_TEXT = "Osprey bicycles ship from the Leeds warehouse within three working days."
PROMPT = "Focus on the Osprey acquisition rumours and the board's private concerns."


@pytest.fixture
def people(tmp_path_factory: pytest.TempPathFactory) -> None:
    """root (the first superadmin), org acme with AM amy, engineer ed, expert eve."""
    home_built_once("hardening-people", _people, tmp_path_factory)


def _people() -> None:
    ok("users", "add", "root", "--role", "superadmin")  # the bootstrap: no --as needed
    ok("orgs", "create", "acme", "--name", "Acme Cycles", "--as", "root")
    ok("users", "add", "amy", "--role", "account_manager", "--as", "root")
    ok("users", "add", "ed", "--role", "engineer", "--org", "acme", "--as", "root")
    ok("users", "add", "eve", "--role", "expert", "--org", "acme", "--as", "root")
    ok("orgs", "assign-am", "acme", "amy", "--as", "root")
    ok("agents", "create", "--org", "acme", "bot", "--as", "root")


def index(records: list[dict[str, str]], embedder: Any, **kw: Any) -> dict[str, str]:
    settings = Settings()
    registry = SqlRegistry.open(settings.registry_url)
    try:
        with open_vector_store(settings) as store:
            ids = index_records(records, store=store, registry=registry, embedder=embedder, **kw)
    finally:
        registry.close()
    return {r["key"]: doc_id for r, doc_id in zip(records, ids, strict=True)}


# --- who may grant what -------------------------------------------------------------------------


def test_users_roles_and_am_assignments_need_a_superadmin(people: None) -> None:
    # The attack: anyone made themselves superadmin, then read a rejected draft.
    for args in (
        ("users", "add", "mallory", "--role", "superadmin"),
        ("users", "add", "mallory", "--role", "superadmin", "--as", "ed"),
        ("users", "add", "mallory", "--role", "engineer", "--as", "amy"),
        ("users", "add", "ed", "--role", "superadmin", "--as", "ed"),
        ("orgs", "assign-am", "acme", "amy"),
        ("orgs", "assign-am", "acme", "amy", "--as", "eve"),
        ("orgs", "create", "globex", "--am", "amy", "--as", "ed"),
    ):
        refused = kb(*args)
        assert refused.exit_code == 1, (args, refused.output)
        assert "superadmin" in flat(refused), args
    users = {u["id"]: u["role"] for u in data("users", "list")}
    assert users == {"root": "superadmin", "amy": "account_manager", "ed": "engineer",
                     "eve": "expert"}  # fmt: skip
    assert "globex" not in {o["id"] for o in data("orgs", "list")}

    agency = data("audit")
    denied = [r for r in agency if r["action"] == "kb.access.denied"]
    assert {r["actor"] for r in denied} >= {"(anonymous)", "ed", "amy"}
    saved = [r for r in agency if r["action"] == "kb.user.saved"]
    assert {r["after"]["user_id"] for r in saved} >= {"root", "amy"}
    acme = data("audit", "--org", "acme")
    assigned = [r for r in acme if r["action"] == "kb.org.am_assigned"]
    assert [(r["actor"], r["after"]["am_user_id"]) for r in assigned] == [("root", "amy")]
    assert any(r["action"] == "kb.user.saved" and r["after"]["user_id"] == "ed" for r in acme)


def test_only_the_very_first_superadmin_needs_no_superadmin() -> None:
    first = kb("users", "add", "eng", "--role", "engineer")
    assert first.exit_code == 1 and "--as" in flat(first)
    ok("users", "add", "root", "--role", "superadmin")
    second = kb("users", "add", "root2", "--role", "superadmin")
    assert second.exit_code == 1 and "superadmin" in flat(second)
    ok("users", "add", "root2", "--role", "superadmin", "--as", "root")


# --- ids are short slugs, one rule everywhere --------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    ["", " ", "../x", "a/b", "ac\u200bme", "ａｃｍｅ", "Acme", "x" * 5000, "acme\n", "-acme"],
)
def test_org_ids_are_short_slugs(bad: str) -> None:
    created = kb("orgs", "create", "--", bad)
    assert created.exit_code != 0
    assert "org id" in flat(created) and "lowercase" in flat(created)
    assert data("orgs", "list") == []
    searched = kb("search", "anything", "--org", bad, "--as", "root")
    assert searched.exit_code == 2 and "org id" in flat(searched)  # refused, no traceback
    assert searched.exception is None or isinstance(searched.exception, SystemExit)


@pytest.mark.parametrize("bad", ["..", "", "a/b", "HR", "h r", "hr\u200b"])
def test_collection_names_are_short_slugs(people: None, bad: str) -> None:
    made = kb("collections", "create", "--org", "acme", bad, "--description", "x", "--as", "root")
    assert made.exit_code != 0
    assert "collection" in flat(made)
    assert {c["path"] for c in data("collections", "list", "--org", "acme")} == {"default"}


def test_user_and_agent_ids_follow_the_rule_too(people: None) -> None:
    assert kb("users", "add", "amy\u200b", "--role", "expert", "--as", "root").exit_code == 1
    assert kb("users", "add", "", "--role", "expert", "--as", "root").exit_code == 1
    ok("users", "add", "amy.lee@agency.example", "--role", "expert", "--as", "root")
    assert kb("agents", "create", "--org", "acme", "../bot", "--as", "root").exit_code == 1
    assert kb("agents", "create", "--org", "acme", "Bot", "--as", "root").exit_code == 1


# --- ingest refuses what it cannot take clearly -------------------------------------------------


def test_ingest_refuses_an_empty_path_and_an_unknown_org(people: None, tmp_path: Path) -> None:
    empty = kb("ingest", "", "--org", "acme")
    assert empty.exit_code == 1 and "empty path" in flat(empty)
    blank = kb("ingest", "  ", "--org", "acme")
    assert blank.exit_code == 1 and "empty path" in flat(blank)
    (tmp_path / "a.md").write_text("# A\n\nSome text.\n")
    unknown = kb("ingest", str(tmp_path / "a.md"), "--org", "no-such-org")
    assert unknown.exit_code == 1
    assert "org 'no-such-org' does not exist" in flat(unknown)
    assert "kbflow orgs create no-such-org" in flat(unknown)
    assert [o["id"] for o in data("orgs", "list")] == ["acme"]  # nothing was created


# --- agent-tool arguments: argument errors, never "degraded" ----------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ('{"query": "warehouse", "top_k": 5.0}', "top_k"),
        ('{"query": "warehouse", "top_k": true}', "top_k"),
        ('{"query": "\\ud800"}', "not valid Unicode"),
        ('{"query": "ware\\udcffhouse"}', "not valid Unicode"),
    ],
)
def test_bad_tool_arguments_are_argument_errors(
    people: None, embedder: Any, args: str, expected: str
) -> None:
    index([{"key": "p", "title": "Shipping", "text": PUBLIC_TEXT}], embedder)
    called = kb("tools", "call", "search_knowledge_base", "--agent", "bot", "--args", args)
    assert called.exit_code == 1, called.output
    assert expected in flat(called) and "invalid arguments" in flat(called)
    assert "degraded" not in called.output


def test_an_invalid_utf8_query_is_refused_not_degraded(people: None, embedder: Any) -> None:
    index([{"key": "p", "title": "Shipping", "text": PUBLIC_TEXT}], embedder)
    # Bytes that are not UTF-8 on a command line reach Python as lone surrogates.
    for args in (
        ("search", "ware\udcffhouse", "--agent", "bot", "--json"),
        ("answer", "ware\udcffhouse?", "--agent", "bot", "--json"),
        ("ask", "ware\udcffhouse", "--agent", "bot", "--json"),
    ):
        refused = kb(*args)
        assert refused.exit_code == 1, (args, refused.output)
        assert "not valid Unicode" in flat(refused)
        assert '"degraded": true' not in refused.output


def test_an_invalid_utf8_query_from_a_real_shell_is_refused(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "KBFLOW_HOME": str(tmp_path / "home")}
    subprocess.run([sys.executable, "-m", "kbflow.cli", "users", "add", "root", "--role",
                    "superadmin"], env=env, check=True, capture_output=True)  # fmt: skip
    subprocess.run([sys.executable, "-m", "kbflow.cli", "orgs", "create", "acme", "--as", "root"],
                   env=env, check=True, capture_output=True)  # fmt: skip
    done = subprocess.run(
        [sys.executable.encode(), b"-m", b"kbflow.cli", b"search", b"ware\xffhouse", b"--org",
         b"acme", b"--as", b"root", b"--json"],
        env=env, capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert b"not valid Unicode" in done.stderr and b'"degraded": true' not in done.stdout


# --- audiences come from who you are, never from the request -----------------------------------


@pytest.fixture
def audiences(people: None, embedder: Any, tmp_path: Path) -> dict[str, str]:
    docs = index([{"key": "exec", "title": "Board minutes", "text": EXEC_TEXT}], embedder,
                 audience="executives")  # fmt: skip
    docs |= index([{"key": "public", "title": "Shipping", "text": PUBLIC_TEXT}], embedder)
    ok("seed", "--org", "acme", "--as", "amy", "--prompt", PROMPT)
    return docs


def _hit_ids(*args: str) -> set[str]:
    return {h["doc_id"] for h in data("search", *args)["hits"]}


def test_an_agent_reads_only_its_own_audiences(audiences: dict[str, str]) -> None:
    query = "Osprey acquisition board"
    assert audiences["exec"] not in _hit_ids(query, "--agent", "bot")
    for asked in ("executives", "account_manager"):
        refused = kb("search", query, "--agent", "bot", "--audience", asked)
        assert refused.exit_code == 1 and "does not read the audience" in flat(refused)
    # An agent's audiences are set on the agent, by a superadmin.
    assert kb("agents", "audience", "bot", "executives").exit_code == 1
    assert kb("agents", "audience", "bot", "executives", "--as", "amy").exit_code == 1
    ok("agents", "audience", "bot", "executives", "--as", "root")
    assert audiences["exec"] in _hit_ids(query, "--agent", "bot")
    args = json.dumps({"query": query, "top_k": 10})
    tool = json.loads(
        ok("tools", "call", "search_knowledge_base", "--agent", "bot", "--args", args).stdout
    )
    assert audiences["exec"] in {r["doc_id"] for r in tool["results"]}
    # --audience may narrow to what the agent reads; it never widens (checked above).
    assert audiences["exec"] in _hit_ids(query, "--agent", "bot", "--audience", "executives")
    audit = data("audit", "--org", "acme")
    assert any(r["action"] == "kb.agent.audiences" and r["actor"] == "root" for r in audit)


def test_a_person_reads_the_audiences_of_their_role(audiences: dict[str, str]) -> None:
    query = "Osprey acquisition board"
    assert audiences["exec"] not in _hit_ids(query, "--org", "acme", "--as", "ed")
    refused = kb("search", query, "--org", "acme", "--as", "ed", "--audience", "executives")
    assert refused.exit_code == 1 and "does not read the audience" in flat(refused)
    assert audiences["exec"] in _hit_ids(query, "--org", "acme", "--as", "root")


def test_seed_inputs_are_never_returned_by_any_search(audiences: dict[str, str]) -> None:
    ok("agents", "audience", "bot", "account_manager", "executives", "--as", "root")
    ok("agents", "create", "--org", "acme", "seedreader", "--audience", "account_manager",
       "--as", "root")  # fmt: skip
    query = "Osprey acquisition rumours board private concerns"
    for args in (
        ("--agent", "bot"),
        ("--agent", "seedreader"),
        ("--agent", "bot", "--audience", "account_manager"),
        ("--org", "acme", "--as", "ed"),
        ("--org", "acme", "--as", "root"),
        ("--org", "acme", "--as", "root", "--audience", "account_manager"),
    ):
        for mode in ("hybrid", "keyword", "dense"):
            hits = data("search", query, *args, "--mode", mode, "-k", "50")["hits"]
            assert all(PROMPT not in h["text"] for h in hits), (args, mode)
            assert all(h["collection"] != "am-inputs" for h in hits), (args, mode)
    # Reviewers still read them, through the inspection path.
    listed = data("seed", "list", "--org", "acme", "--as", "eve")
    assert [d["source_tag"] for d in listed] == ["am_prompt"]
    shown = data("review", "show", listed[0]["id"], "--as", "amy")
    assert PROMPT in shown["text"]
    assert kb("seed", "list", "--org", "acme", "--as", "ed").exit_code == 1


# --- seed and research: the org's AM or a superadmin -------------------------------------------


def test_seed_and_research_need_the_orgs_am_or_a_superadmin(people: None, tmp_path: Path) -> None:
    for actor in ((), ("--as", "ed"), ("--as", "eve"), ("--as", "nobody")):
        seeded = kb("seed", "--org", "acme", "--prompt", "Focus on B2B", *actor)
        assert seeded.exit_code == 1, (actor, seeded.output)
        researched = kb("research", "--org", "acme", "--client-name", "Acme", *actor)
        assert researched.exit_code == 1, (actor, researched.output)
        assert "forbidden" in flat(researched)
    ok("seed", "--org", "acme", "--prompt", "Focus on B2B", "--as", "root")
    assert [d["source_tag"] for d in data("seed", "list", "--org", "acme", "--as", "amy")] == [
        "am_prompt"
    ]


def test_the_seed_file_cap_holds_for_the_orgs_bundle(people: None, tmp_path: Path) -> None:
    files = []
    for i in range(22):
        f = tmp_path / f"brief-{i:02d}.md"
        f.write_text(f"# Brief {i}\n\nNote number {i} about the client.\n")
        files.append(f)

    def seed(batch: list[Path]) -> Result:
        args = ["seed", "--org", "acme", "--as", "amy"]
        for f in batch:
            args += ["--file", str(f)]
        return kb(*args)

    assert seed(files[:15]).exit_code == 0
    over = seed(files[15:21])
    assert over.exit_code == 1 and "cap of 20 files" in flat(over) and "holds 15" in flat(over)
    assert len(data("seed", "list", "--org", "acme", "--as", "amy")) == 15  # nothing stored
    assert seed(files[15:20]).exit_code == 0
    assert seed(files[:3]).exit_code == 0  # re-seeding files already in the bundle: no new room
    assert seed([files[21]]).exit_code == 1
    assert len(data("seed", "list", "--org", "acme", "--as", "amy")) == 20


def test_a_symbolic_link_is_never_seeded(people: None, tmp_path: Path) -> None:
    link = tmp_path / "passwd.md"
    link.symlink_to("/etc/passwd")
    refused = kb("seed", "--org", "acme", "--as", "amy", "--file", str(link))
    assert refused.exit_code == 1 and "symbolic link" in flat(refused)
    assert data("seed", "list", "--org", "acme", "--as", "amy") == []


# --- review: rights before the store; withdrawal; editing an approved document -----------------


def test_a_refused_reviewer_is_told_at_once_even_while_the_store_is_busy(
    people: None, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = index([{"key": "d", "title": "Draft", "text": PUBLIC_TEXT}], embedder,
                status=DocStatus.PENDING_REVIEW)["d"]  # fmt: skip
    monkeypatch.setenv("KBFLOW_STORE_LOCK_TIMEOUT_S", "20")
    settings = Settings()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, pathlib; from sinks.qdrant_edge import QdrantEdgeStore; "
         "s = QdrantEdgeStore.open(pathlib.Path(sys.argv[1]), lock_timeout_s=5); "
         "print('held', flush=True); sys.stdin.read(); s.close()",
         str(settings.vectors_dir)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for actor in ("nobody", "ed"):
            started = time.monotonic()
            refused = kb("review", "show", doc, "--as", actor)
            assert time.monotonic() - started < 10  # not the 20 s lock wait
            assert refused.exit_code == 1
            assert "forbidden" in flat(refused) and "busy" not in flat(refused)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    shown = data("review", "show", doc, "--as", "eve")  # an expert may read it
    assert PUBLIC_TEXT in shown["text"]


def test_an_approved_document_can_be_withdrawn_and_answers_citing_it_are_flagged(
    people: None, embedder: Any
) -> None:
    doc = index([{"key": "ship", "title": "Shipping", "text": PUBLIC_TEXT}], embedder)["ship"]
    answered = data("answer", "From which warehouse do Osprey bicycles ship?", "--agent", "bot")
    # Offline, no value of a kind is asked: the cited passage comes as "maybe", still recorded
    # as citing the document (provenance flags it below all the same).
    assert answered["status"] in ("answered", "maybe")
    assert doc in {c["doc_id"] for c in answered["citations"]}
    assert data("provenance", "--stale") == []

    rejected = kb("review", "reject", doc, "--as", "amy")
    assert rejected.exit_code == EXIT_CONFLICT and "review withdraw" in flat(rejected)
    assert kb("review", "withdraw", doc, "--as", "amy").exit_code == 2  # --note is required
    assert kb("review", "withdraw", doc, "--as", "ed", "--note", "x").exit_code == 1
    withdrawn = data("review", "withdraw", doc, "--as", "amy", "--note", "recalled by legal")
    assert withdrawn["status"] == "withdrawn"
    again = kb("review", "withdraw", doc, "--as", "amy", "--note", "twice")
    assert again.exit_code == EXIT_CONFLICT

    for mode in ("hybrid", "keyword", "dense"):
        assert doc not in _hit_ids("Osprey Leeds warehouse", "--agent", "bot", "--mode", mode)
    row = data("audit", "--org", "acme", "--doc", doc)[-1]
    assert (row["action"], row["actor"], row["after"]["note"]) == (
        "kb.document.withdrawn", "amy", "recalled by legal")  # fmt: skip
    stale = data("provenance", "--stale")
    assert [r["turn_id"] for r in stale] == [answered["turn_id"]]
    assert stale[0]["stale"] == "document withdrawn"


def test_editing_an_approved_document_makes_a_new_version_that_supersedes_it(
    people: None, embedder: Any
) -> None:
    old = index([{"key": "ship", "title": "Shipping", "text": PUBLIC_TEXT}], embedder)["ship"]
    edited = data(
        "review", "edit", old, "--as", "amy", "--note", "moved warehouse",
        "--content", "# Shipping\n\nOsprey bicycles ship from the York warehouse within two days.",
    )  # fmt: skip
    assert edited["id"] != old and edited["version"] == 2 and edited["status"] == "approved"
    assert (edited["edited_by"], edited["approved_by"]) == ("amy", "amy")
    docs = {d["id"]: d for d in data("docs", "list", "--org", "acme")}
    assert docs[old]["status"] == "superseded"
    for mode in ("hybrid", "keyword", "dense"):
        hits = data("search", "Osprey warehouse ship", "--agent", "bot", "--mode", mode)["hits"]
        assert {h["doc_id"] for h in hits} == {edited["id"]}, mode
        assert all("Leeds" not in h["text"] for h in hits)
    assert kb("review", "edit", old, "--as", "amy", "--content", "x").exit_code == EXIT_CONFLICT
    assert kb("review", "edit", edited["id"], "--as", "ed", "--content", "x").exit_code == 1
