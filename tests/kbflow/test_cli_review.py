"""The review commands as a reviewer runs them: orgs, users, review, audit and reconcile.

In-process (typer's CliRunner) on a real registry and Qdrant Edge store in the test's
KBFLOW_HOME. The test seeds orgs and users through the CLI itself and drafts with
``index_records``, closing the store before any command runs (each command opens it itself).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core.models import DocStatus
from core.settings import Settings
from kbflow.cli import EXIT_CONFLICT
from kbflow.render import console
from sinks.connect import open_vector_store
from sinks.registry import SqlRegistry
from tasks.ingest.discover import Source
from tasks.ingest.index import IngestTarget, WorkItem, index_batch
from tests.conftest import REPO, _no_files, index_records
from tests.kbflow.support import data, flat, kb, ok

pytestmark = pytest.mark.integration


DRAFTS = [
    {
        "key": "leave",
        "title": "Leave policy",
        "text": "Staff receive twenty-eight days of annual leave, booked through the Heron portal.",
    },
    {
        "key": "returns",
        "title": "Returns policy",
        "text": "Bicycles may be returned within thirty days with the original receipt.",
    },
    {
        "key": "pricing",
        "title": "Pricing memo",
        "text": "The Zephyr gravel bike has a wholesale price of 1450 EUR from March.",
    },
]
CREATED = "kb.document.created"
ROOT = ("--as", "root")


@dataclass
class Seeded:
    settings: Settings
    docs: dict[str, str]  # record key -> doc id


@pytest.fixture
def seeded(embedder: Any) -> Seeded:
    """Org acme (AM amy, expert eve, engineer ed), org globex (AM gus), three acme drafts."""
    ok("users", "add", "root", "--role", "superadmin")  # the first superadmin needs no --as
    ok("orgs", "create", "acme", "--name", "Acme Cycles", *ROOT)
    ok("users", "add", "amy", "--role", "account_manager", "--name", "Amy Reviewer", *ROOT)
    ok("users", "add", "gus", "--role", "account_manager", *ROOT)
    ok("users", "add", "eve", "--role", "expert", "--org", "acme", *ROOT)
    ok("users", "add", "ed", "--role", "engineer", "--org", "acme", *ROOT)
    ok("orgs", "assign-am", "acme", "amy", *ROOT)
    ok("orgs", "create", "globex", "--am", "gus", *ROOT)
    settings = Settings()  # as the CLI builds it: KBFLOW_HOME comes from the test's environment
    registry = SqlRegistry.open(settings.registry_url)
    try:
        with open_vector_store(settings) as store:
            index_records(
                DRAFTS,
                store=store,
                registry=registry,
                embedder=embedder,
                status=DocStatus.PENDING_REVIEW,
            )
        by_uri = {d.uri: d.id for d in registry.documents.list_documents("acme")}
    finally:
        registry.close()
    return Seeded(settings, {r["key"]: by_uri[f"test://acme/{r['key']}"] for r in DRAFTS})


def statuses() -> dict[str, str | None]:
    return {d["id"]: d["status"] for d in data("docs", "list", "--org", "acme")}


def audit_rows(*args: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = data("audit", "--org", "acme", *args)
    return rows


def only_refusals_since(before: list[dict[str, Any]], *actors: str) -> list[str]:
    """What the audit rows added since ``before`` attempted: each must be a refusal
    (``kb.access.denied``) of one of ``actors``."""
    added = audit_rows()[len(before) :]
    assert audit_rows()[: len(before)] == before
    assert all(r["action"] == "kb.access.denied" and r["actor"] in actors for r in added), added
    return [str(r["after"]["attempted"]) for r in added]


def hits(query: str, mode: str = "hybrid") -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = data(
        "search", query, "--org", "acme", "--as", "ed", "--mode", mode
    )["hits"]
    return found


def found_ids(query: str, mode: str = "hybrid") -> set[str]:
    return {h["doc_id"] for h in hits(query, mode)}


# --- orgs and users --------------------------------------------------------------------------


def test_orgs_and_users_are_listed(seeded: Seeded) -> None:
    orgs = data("orgs", "list")
    assert orgs == [
        {"id": "acme", "name": "Acme Cycles", "am_user_id": "amy"},
        {"id": "globex", "name": "globex", "am_user_id": "gus"},
    ]
    users = {u["id"]: u for u in data("users", "list")}
    assert users["amy"] == {
        "id": "amy",
        "name": "Amy Reviewer",
        "role": "account_manager",
        "org_id": None,
    }
    assert users["eve"]["role"] == "expert" and users["eve"]["org_id"] == "acme"
    table = ok("orgs", "list")
    assert "Acme Cycles" in table.output and "amy" in table.output


def test_users_add_with_a_bad_role_or_org_fails_clearly() -> None:
    ok("users", "add", "root", "--role", "superadmin")
    bad_role = kb("users", "add", "zed", "--role", "boss", *ROOT)
    assert bad_role.exit_code == 2
    assert "Invalid value for '--role'" in flat(bad_role)
    assert "account_manager" in bad_role.output

    no_org = kb("users", "add", "zed", "--role", "expert", "--org", "nowhere", *ROOT)
    assert no_org.exit_code == 1
    assert "org 'nowhere' does not exist" in flat(no_org)
    assert [u["id"] for u in data("users", "list")] == ["root"]


def test_only_an_account_manager_can_be_assigned_to_an_org(seeded: Seeded) -> None:
    refused = kb("orgs", "assign-am", "acme", "eve", *ROOT)
    assert refused.exit_code == 1
    assert "not an account_manager" in flat(refused)

    created = kb("orgs", "create", "initech", "--am", "ed", *ROOT)
    assert created.exit_code == 1
    assert "Org 'initech' is saved with account manager none" in flat(created)
    assert {o["id"]: o["am_user_id"] for o in data("orgs", "list")}["acme"] == "amy"


# --- decisions -------------------------------------------------------------------------------


def test_the_assigned_am_approves_and_search_then_finds_it(seeded: Seeded) -> None:
    leave = seeded.docs["leave"]
    assert leave not in found_ids("annual leave Heron portal")

    doc = data("review", "approve", leave, "--as", "amy", "--note", "checked the dates")
    assert doc["status"] == "approved" and doc["approved_by"] == "amy"

    assert statuses() == {
        leave: "approved",
        seeded.docs["returns"]: "pending_review",
        seeded.docs["pricing"]: "pending_review",
    }
    assert leave in found_ids("annual leave Heron portal")
    assert found_ids("annual leave Heron portal") == {leave}  # the other drafts stay hidden


def test_the_assigned_am_rejects_and_it_stays_hidden(seeded: Seeded) -> None:
    returns = seeded.docs["returns"]
    result = ok("review", "reject", returns, "--as", "amy", "--note", "wrong period")
    assert "rejected" in result.output and returns in flat(result)

    assert statuses()[returns] == "rejected"
    assert returns not in found_ids("returned within thirty days receipt", "keyword")
    listed = data("review", "list", "--org", "acme", "--as", "amy", "--status", "rejected")
    assert [d["id"] for run in listed["runs"] for d in run["documents"]] == [returns]


def test_a_second_decision_on_the_same_doc_is_a_conflict(seeded: Seeded) -> None:
    leave = seeded.docs["leave"]
    ok("review", "approve", leave, "--as", "amy")

    again = kb("review", "approve", leave, "--as", "amy")
    assert again.exit_code == EXIT_CONFLICT == 3
    assert "conflict:" in again.output
    assert f"cannot approve document {leave}: it is approved" in flat(again)
    late_reject = kb("review", "reject", leave, "--as", "amy")
    assert late_reject.exit_code == EXIT_CONFLICT

    assert statuses()[leave] == "approved"
    assert [r["action"] for r in audit_rows("--doc", leave)] == [CREATED, "kb.document.approved"]
    assert leave in found_ids("annual leave Heron portal")


@pytest.mark.parametrize(
    ("actor", "why"),
    [
        # Neither the document's org nor whether it exists is said to who may not decide it.
        ("eve", "(expert) may not review documents: document"),
        ("gus", "(account_manager) may not review documents: document"),
        ("ed", "(engineer) may not review documents: document"),
        ("mallory", "unknown user 'mallory'"),
    ],
)
def test_anyone_but_the_assigned_am_is_forbidden_and_nothing_changes(
    seeded: Seeded, actor: str, why: str
) -> None:
    before = (statuses(), audit_rows())
    tried = []
    for doc_id in seeded.docs.values():
        for verb in (["approve"], ["reject"], ["edit", "--content", "# Hijacked\n\nNew text."]):
            result = kb("review", verb[0], doc_id, *verb[1:], "--as", actor)
            assert result.exit_code == 1, result.output
            assert "forbidden:" in result.output and why in flat(result)
            tried.append(f"{verb[0]} {doc_id}")
    assert statuses() == before[0]
    # nothing changed but the audit of each refusal, as from HTTP and the inbox
    assert only_refusals_since(before[1], actor) == tried
    assert data("reconcile")["repaired"] == []  # no vector payload was touched either
    assert found_ids("annual leave returns pricing") == set()


def test_edit_replaces_the_text_and_approves_it(seeded: Seeded, tmp_path: Path) -> None:
    leave, pricing = seeded.docs["leave"], seeded.docs["pricing"]
    new_text = "# Leave policy\n\nStaff receive thirty days of annual leave, booked in Osprey."
    doc = data("review", "edit", leave, "--as", "amy", "--content", new_text, "--note", "fixed")
    assert doc["status"] == "approved" and doc["edited_by"] == "amy"

    osprey = hits("Osprey", "keyword")
    assert [h["doc_id"] for h in osprey] == [leave] and "Osprey" in osprey[0]["text"]
    assert not [h for h in hits("Heron portal twenty-eight", "keyword") if "Heron" in h["text"]]
    shown = data("review", "show", leave, "--as", "eve")
    assert "Osprey" in " ".join(shown["chunks"]) and "Heron" not in shown["text"]

    memo = tmp_path / "memo.md"
    memo.write_text("# Pricing memo\n\nThe Zephyr wholesale price is 1390 EUR.", encoding="utf-8")
    ok("review", "edit", pricing, "--as", "amy", "--file", str(memo))
    assert pricing in found_ids("Zephyr wholesale 1390", "keyword")

    neither = kb("review", "edit", seeded.docs["returns"], "--as", "amy")
    assert neither.exit_code == 1
    assert "exactly one of --file PATH or --content TEXT" in flat(neither)
    assert statuses()[seeded.docs["returns"]] == "pending_review"


# --- reading drafts --------------------------------------------------------------------------


def test_a_withdrawal_is_undone_by_restore(seeded: Seeded) -> None:
    leave, returns = seeded.docs["leave"], seeded.docs["returns"]
    ok("review", "approve", leave, "--as", "amy")
    ok("review", "withdraw", leave, "--as", "amy", "--note", "recalled by legal")
    assert leave not in found_ids("annual leave Heron portal")
    before = (statuses(), audit_rows())

    assert kb("review", "restore", leave, "--as", "amy").exit_code == 2  # --note is required
    for actor in ("gus", "ed", "eve"):  # another org's AM, an engineer, an expert
        refused = kb("review", "restore", leave, "--as", actor, "--note", "mine now")
        assert refused.exit_code == 1 and "forbidden:" in refused.output, refused.output
    pending = kb("review", "restore", returns, "--as", "amy", "--note", "x")
    assert pending.exit_code == EXIT_CONFLICT
    assert f"cannot restore document {returns}: it is pending_review" in flat(pending)
    assert "kbflow review approve" in flat(pending)
    assert statuses() == before[0]  # nothing changed but the refusals' audit rows
    assert only_refusals_since(before[1], "gus", "ed", "eve") == [f"restore {leave}"] * 3

    restored = data("review", "restore", leave, "--as", "amy", "--note", "legal cleared it")
    assert restored["id"] != leave and restored["version"] == 2
    assert (restored["status"], restored["approved_by"]) == ("approved", "amy")
    assert statuses()[leave] == "withdrawn"  # the withdrawn version stays as it was
    assert found_ids("annual leave Heron portal") == {restored["id"]}
    assert any("Heron portal" in h["text"] for h in hits("Heron portal", "keyword"))
    rows = audit_rows("--doc", restored["id"])
    assert [r["action"] for r in rows] == [CREATED, "kb.document.restored"]
    assert (rows[-1]["actor"], rows[-1]["after"]["note"], rows[-1]["after"]["restored_from"]) == (
        "amy", "legal cleared it", leave,
    )  # fmt: skip
    assert "kb.document.restored" not in [r["action"] for r in audit_rows("--doc", leave)]

    again = kb("review", "restore", leave, "--as", "amy", "--note", "twice")
    assert again.exit_code == EXIT_CONFLICT and "conflict:" in again.output
    assert f"{restored['id']} (v2), is approved and in service" in flat(again)

    # Withdrawn again, the newest version is restored again; the text output names both ids.
    ok("review", "withdraw", restored["id"], "--as", "root", "--note", "recalled again")
    done = flat(ok("review", "restore", restored["id"], "--as", "root", "--note", "cleared"))
    newest = next(d["id"] for d in data("docs", "list", "--org", "acme") if d["version"] == 3)
    assert f"restored {restored['id']} as {newest}" in done and "now approved" in done
    assert found_ids("annual leave Heron portal") == {newest}
    assert data("reconcile")["repaired"] == []


def test_an_expert_lists_and_reads_drafts_an_engineer_may_not(seeded: Seeded) -> None:
    listed = data("review", "list", "--org", "acme", "--as", "eve")
    assert [run["synthesis_run_id"] for run in listed["runs"]] == [None]
    assert {d["id"] for d in listed["runs"][0]["documents"]} == set(seeded.docs.values())
    table = ok("review", "list", "--org", "acme", "--as", "eve")
    assert seeded.docs["leave"] in table.output and "Pricing memo" in table.output

    shown = data("review", "show", seeded.docs["leave"], "--as", "eve")
    assert shown["document"]["status"] == "pending_review"
    assert "Heron portal" in shown["text"] and len(shown["chunks"]) == 1
    page = ok("review", "show", seeded.docs["leave"], "--as", "eve")
    assert "Leave policy" in page.output and "Heron portal" in flat(page)

    for args in (
        ("review", "list", "--org", "acme", "--as", "ed"),
        ("review", "show", seeded.docs["leave"], "--as", "ed"),
        ("review", "list", "--org", "acme", "--as", "gus"),
    ):
        refused = kb(*args)
        assert refused.exit_code == 1 and "may not inspect drafts" in flat(refused)
        assert "Heron" not in refused.output


def test_review_list_groups_drafts_by_synthesis_run(
    seeded: Seeded, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = SqlRegistry.open(seeded.settings.registry_url)
    try:
        with open_vector_store(seeded.settings) as store:
            for run in ("run-a", "run-b"):
                _index_run(run, store=store, registry=registry, embedder=embedder)
    finally:
        registry.close()
    runs = data("review", "list", "--org", "acme", "--as", "amy")["runs"]
    grouped = {run["synthesis_run_id"]: len(run["documents"]) for run in runs}
    assert grouped == {None: 3, "run-a": 2, "run-b": 2}
    table = ok("review", "list", "--org", "acme", "--as", "amy")
    assert "synthesis run run-a (2)" in table.output

    # At 80 columns each draft is a block: its whole id, and each value whole on its line.
    # (A command's console reads COLUMNS once, when its process starts: set here instead.)
    monkeypatch.setattr(console, "width", 80)
    narrow = kb("review", "list", "--org", "acme", "--as", "amy")
    assert narrow.exit_code == 0, narrow.output
    lines = narrow.output.splitlines()
    assert max(len(line) for line in lines) <= 80, narrow.output
    for run in runs:
        for doc in run["documents"]:
            assert doc["id"] in lines, narrow.output
            assert any(" ".join(line.split()) == f"title {doc['title']}" for line in lines), (
                narrow.output
            )


def _index_run(run_id: str, *, store: Any, registry: SqlRegistry, embedder: Any) -> None:
    """Two drafts written by one synthesis run (``index_records`` does not set the run id)."""
    coll = registry.catalog.ensure_collection("acme", "research")
    target = IngestTarget(
        org_id="acme",
        collection_id=coll.id,
        collection_path=coll.path,
        status=DocStatus.PENDING_REVIEW,
        source_tag="research",
        synthesis_run_id=run_id,
    )
    items = [
        WorkItem(
            Source(
                source_key=f"test://acme/{run_id}/{n}",
                uri=f"test://acme/{run_id}/{n}",
                content_hash=f"{run_id}-{n}",
                path=Path(f"{run_id}-{n}"),
                record=(f"Finding {n} of {run_id}", f"Research finding number {n} of {run_id}."),
            )
        )
        for n in (1, 2)
    ]
    report = index_batch(
        items, target, store=store, registry=registry, embedder=embedder, extract_file=_no_files
    )
    assert report.documents == 2, report.skipped


# --- audit and reconcile ---------------------------------------------------------------------


def test_audit_has_one_row_per_transition(seeded: Seeded) -> None:
    leave, returns, pricing = (seeded.docs[k] for k in ("leave", "returns", "pricing"))
    ok("review", "approve", leave, "--as", "amy")
    ok("review", "reject", returns, "--as", "amy", "--note", "out of date")
    ok("review", "edit", pricing, "--as", "amy", "--content", "# Pricing memo\n\n1390 EUR.")

    rows = [r for r in audit_rows() if r["doc_id"]]  # the documents' rows (not org/users)
    assert len(rows) == 6
    by_doc: dict[str, list[str]] = {}
    for row in rows:
        by_doc.setdefault(row["doc_id"], []).append(row["action"])
    assert by_doc == {
        leave: [CREATED, "kb.document.approved"],
        returns: [CREATED, "kb.document.rejected"],
        pricing: [CREATED, "kb.document.edited_approved"],
    }
    decisions = [r for r in rows if r["action"] != CREATED]
    assert {r["actor"] for r in decisions} == {"amy"}
    assert all(r["before"] == {"status": "pending_review"} for r in decisions)
    rejected = next(r for r in decisions if r["doc_id"] == returns)
    assert rejected["after"] == {
        "status": "rejected",
        "rejected_by": "amy",
        "note": "out of date",
    }

    assert [r["action"] for r in audit_rows("--doc", returns)] == [CREATED, "kb.document.rejected"]
    assert [r["action"] for r in audit_rows("--limit", "1")] == ["kb.document.edited_approved"]
    table = flat(ok("audit", "--org", "acme"))
    assert "pending_review → rejected (rejected_by=amy, note=out of date)" in table

    unknown = kb("audit", "--org", "nowhere")
    assert unknown.exit_code == 1 and "org 'nowhere' does not exist" in flat(unknown)


def test_reconcile_repairs_a_drifted_payload(seeded: Seeded) -> None:
    clean = data("reconcile")
    assert clean["documents"] == 3 and clean["repaired"] == [] and clean["orphans_removed"] == []

    leave = seeded.docs["leave"]
    with open_vector_store(seeded.settings) as store:  # a crash between the two writes, say
        store.set_document_payload(leave, {"status": "approved"})
    assert leave not in found_ids("annual leave Heron portal")  # the registry re-check holds

    expected = [{"doc_id": leave, "was": ["approved/ingested"], "now": "pending_review/ingested"}]
    for _ in range(2):  # a dry run changes nothing, so it reports the same twice
        assert data("reconcile", "--org", "acme", "--dry-run")["repaired"] == expected
    assert data("reconcile", "--org", "globex")["documents"] == 0
    fixed = ok("reconcile", "--org", "acme")
    assert f"repaired {leave}: approved/ingested → pending_review/ingested" in flat(fixed)
    assert data("reconcile")["repaired"] == []


# --- help and imports ------------------------------------------------------------------------


def test_help_describes_the_review_commands() -> None:
    top = ok("--help").output
    for command in ("orgs", "users", "review", "audit", "reconcile"):
        assert command in top
    review = ok("review", "--help").output
    for command in ("list", "show", "approve", "reject", "withdraw", "restore", "edit", "flow"):
        assert command in review
    assert "Undo a withdrawal" in flat(ok("review", "restore", "--help"))
    flow = flat(ok("review", "flow", "--help"))
    assert "Prefect UI" in flow and "kbflow server" in flow and "PREFECT_API_URL" in flow
    assert "Exit code 3" in flat(ok("review", "approve", "--help"))


def test_review_commands_do_not_import_prefect(seeded: Seeded) -> None:
    """Only `review flow` may load Prefect; it refuses to pause where no UI can reach it."""
    leave = seeded.docs["leave"]
    script = f"""
import sys
from typer.testing import CliRunner
from kbflow.cli import app
runner = CliRunner()
for args in (
    ["orgs", "list"], ["users", "list"], ["review", "list", "--org", "acme", "--as", "eve"],
    ["review", "show", "{leave}", "--as", "eve"], ["review", "approve", "{leave}", "--as", "amy"],
    ["audit", "--org", "acme"], ["reconcile", "--dry-run"],
):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (args, result.output)
assert "prefect" not in sys.modules, "a review command imported prefect"
flow = runner.invoke(app, ["review", "flow", "--org", "acme", "--as", "amy"])
assert flow.exit_code == 1 and "PREFECT_API_URL is not set" in flow.output, flow.output
"""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


CONTACTS_DRAFT = """# Key contacts

## People

Who to call:

- Ana Diaz, CEO [doc:seed7]
- Bo Berg, head of sales [doc:seed7]

| name | role |
|---|---|
| Ana Diaz | CEO |
| Bo Berg | Sales |

---
## Citations
- [doc:seed7] Team sheet.xlsx
"""


def test_review_show_keeps_lists_and_tables_on_their_lines_and_lists_citations(
    seeded: Seeded, embedder: Any
) -> None:
    registry = SqlRegistry.open(seeded.settings.registry_url)
    try:
        with open_vector_store(seeded.settings) as store:
            [doc] = index_records(
                [{"key": "contacts", "title": "Key contacts", "text": CONTACTS_DRAFT,
                  "markdown": True}],
                store=store, registry=registry, embedder=embedder,
                status=DocStatus.PENDING_REVIEW, cite_uris={"doc:seed7": "upload:acme/team.xlsx"},
            )  # fmt: skip
    finally:
        registry.close()

    shown = data("review", "show", doc, "--as", "eve")
    [chunk] = shown["chunks"]
    assert "Who to call:\n\n- Ana Diaz, CEO [doc:seed7]\n- Bo Berg, head of sales" in chunk
    assert "| name | role |\n|---|---|\n| Ana Diaz | CEO |\n| Bo Berg | Sales |" in chunk
    assert "Citations" not in chunk and "Team sheet.xlsx" not in chunk  # metadata, not a chunk
    assert shown["document"]["citations"] == [
        {"tag": "[doc:seed7]", "title": "Team sheet.xlsx", "uri": "upload:acme/team.xlsx"}
    ]
    page = ok("review", "show", doc, "--as", "eve")
    lines = [line.strip() for line in page.output.splitlines()]
    assert (
        "- Ana Diaz, CEO [doc:seed7]" in lines and "- Bo Berg, head of sales [doc:seed7]" in lines
    )
    assert "| Ana Diaz | CEO |" in lines and "| Bo Berg | Sales |" in lines
    assert "[doc:seed7] Team sheet.xlsx · upload:acme/team.xlsx" in lines

    ok("review", "approve", doc, "--as", "amy")
    [hit] = [h for h in hits("Ana Diaz CEO Bo Berg sales", "keyword") if h["doc_id"] == doc]
    assert hit["sources"] == shown["document"]["citations"]
    listing = flat(ok("search", "Ana Diaz CEO", "--org", "acme", "--as", "ed"))
    assert "Ana Diaz, CEO [Team sheet.xlsx]" in listing  # the title, not the bare id
    assert "cites [doc:seed7] Team sheet.xlsx · upload:acme/team.xlsx" in listing
