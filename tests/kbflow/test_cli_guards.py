"""Two findings of a hostile review, pinned through the CLI as a user runs it (typer's CliRunner
on a real registry in the test's KBFLOW_HOME):

- M2: the last superadmin cannot be demoted, and the first-superadmin bootstrap (no --as) never
  reopens once a superadmin existed;
- L3: ``kbflow ingest --audience`` follows the audience rule (as HTTP uploads do), and a bad one
  stores nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from core.settings import Settings
from sinks.registry import SqlRegistry
from tests.kbflow.support import data, flat, kb, ok

# --- M2: the superadmin bootstrap ---------------------------------------------------------------


def _users() -> dict[str, str]:
    return {u["id"]: u["role"] for u in data("users", "list")}


def test_the_last_superadmin_cannot_demote_themselves_and_the_bootstrap_stays_closed() -> None:
    ok("users", "add", "root", "--role", "superadmin")  # the bootstrap on a fresh registry
    ok("orgs", "create", "acme", "--as", "root")
    ok("users", "add", "amy", "--role", "account_manager", "--as", "root")
    ok("users", "add", "mal", "--role", "account_manager", "--as", "root")
    ok("orgs", "assign-am", "acme", "amy", "--as", "root")

    demoted = kb("users", "add", "root", "--role", "engineer", "--as", "root")
    assert demoted.exit_code == 1, demoted.output
    said = flat(demoted)
    assert "last superadmin" in said and "Make another superadmin first" in said
    assert _users()["root"] == "superadmin"

    # The review's attack: with no superadmin left, anyone claimed the bootstrap.
    claimed = kb("users", "add", "mallory", "--role", "superadmin")
    assert claimed.exit_code == 1, claimed.output
    assert "mallory" not in _users()
    hijack = kb("orgs", "assign-am", "acme", "mal", "--as", "mallory")
    assert hijack.exit_code == 1
    assert {o["id"]: o["am_user_id"] for o in data("orgs", "list")}["acme"] == "amy"

    denied = [r for r in data("audit") if r["action"] == "kb.access.denied"]
    assert any(r["actor"] == "root" and "last superadmin" in r["after"]["reason"] for r in denied)


def test_the_bootstrap_stays_closed_after_the_only_superadmin_was_removed_outside_kbflow() -> None:
    ok("users", "add", "root", "--role", "superadmin")
    registry = SqlRegistry.open(Settings().registry_url)
    try:
        with registry.engine.begin() as conn:  # bypasses every check kbflow makes
            conn.execute(text("UPDATE users SET role = 'engineer' WHERE id = 'root'"))
        assert registry.people.count_superadmins() == 0
    finally:
        registry.close()
    claimed = kb("users", "add", "mallory", "--role", "superadmin")
    assert claimed.exit_code == 1, claimed.output
    assert "bootstrap" in flat(claimed) and "is closed" in flat(claimed)
    claimed = kb("users", "add", "mallory", "--role", "superadmin", "--as", "mallory")
    assert claimed.exit_code == 1, claimed.output
    assert "only registered users" in flat(claimed)
    assert _users() == {"root": "engineer"}


def test_a_superadmin_may_be_demoted_while_another_remains() -> None:
    ok("users", "add", "root", "--role", "superadmin")
    ok("users", "add", "root2", "--role", "superadmin", "--as", "root")
    ok("users", "add", "root", "--role", "engineer", "--as", "root2")
    assert _users() == {"root": "engineer", "root2": "superadmin"}
    refused = kb("users", "add", "root2", "--role", "expert", "--as", "root2")
    assert refused.exit_code == 1 and "last superadmin" in flat(refused)


# --- L3: ingest --audience ----------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["EXEC", "exec team", "../x", ""])
def test_ingest_refuses_a_bad_audience_and_stores_nothing(tmp_path: Path, bad: str) -> None:
    ok("users", "add", "root", "--role", "superadmin")
    ok("orgs", "create", "acme", "--as", "root")
    doc = tmp_path / "memo.md"
    doc.write_text("# Memo\n\nThe board meets on Tuesday.\n")

    refused = kb("ingest", str(doc), "--org", "acme", "--audience", bad)

    assert refused.exit_code == 1, refused.output
    said = flat(refused)
    assert "--audience" in said and repr(bad) in said
    assert "lowercase ASCII letters" in said  # the allowed form
    assert "Traceback" not in refused.output
    assert data("docs", "list", "--org", "acme") == []
