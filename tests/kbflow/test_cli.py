"""The CLI as a user runs it: real subprocesses, a fresh data directory, JSON out."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kbflow.cli import app

runner = CliRunner()


def _kbflow(*args: str, home: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KBFLOW_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "kbflow.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_help_lists_every_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("ingest", "search", "docs", "demo", "store", "server"):
        assert command in result.output


def test_ingest_of_a_missing_path_fails_clearly(tmp_path: Path) -> None:
    assert runner.invoke(app, ["users", "add", "root", "--role", "superadmin"]).exit_code == 0
    assert runner.invoke(app, ["orgs", "create", "acme", "--as", "root"]).exit_code == 0
    result = runner.invoke(app, ["ingest", str(tmp_path / "nope"), "--org", "acme"])
    assert result.exit_code == 1
    assert "matches no file kbflow can ingest" in result.output


def test_search_rejects_a_bad_top_k() -> None:
    result = runner.invoke(app, ["search", "x", "--org", "acme", "--top-k", "0"])
    assert result.exit_code == 2


def test_research_stopped_by_the_fetch_cap_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import flows.research
    from core.contracts import BudgetSpent, ResearchReport
    from core.errors import BudgetExceeded
    from tasks.research.budget import ResearchBudget

    budget = ResearchBudget("acme-cli", max_fetches=0)
    with pytest.raises(BudgetExceeded) as err:
        budget.charge_fetch("https://acme.example/")
    report = ResearchReport(
        synthesis_run_id=None,
        budget_exceeded=True,
        consumed_tokens=42,
        notes=[str(err.value)],
        budget=BudgetSpent(exceeded=budget.exceeded),
        budget_stop=budget.stop_reason(),
    )
    monkeypatch.setattr(flows.research, "research", lambda **_: report)
    assert runner.invoke(app, ["users", "add", "root", "--role", "superadmin"]).exit_code == 0
    assert runner.invoke(app, ["orgs", "create", "acme-cli", "--as", "root"]).exit_code == 0

    result = runner.invoke(
        app, ["research", "--org", "acme-cli", "--client-name", "Acme", "--as", "root"]
    )

    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert "stopped by the fetch cap" in said
    assert "raise KBFLOW_RESEARCH_MAX_FETCHES (now 0, default 30)" in said
    assert "after 42 tokens" not in said and "Raise --budget" not in said


@pytest.mark.integration
def test_an_ingest_of_too_many_bad_files_fails_with_one_message_and_no_traceback(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.pdf").write_bytes(b"garbage")
    (bad / "b.docx").write_bytes(b"garbage")
    root = _kbflow("users", "add", "root", "--role", "superadmin", home=tmp_path / "home")
    assert root.returncode == 0
    assert _kbflow("orgs", "create", "acme", "--as", "root", home=tmp_path / "home").returncode == 0
    done = _kbflow("ingest", str(bad), "--org", "acme", "--json", home=tmp_path / "home")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    said = " ".join(done.stderr.split())
    assert said.count("2 of 2 documents could not be ingested") == 1, done.stderr[-3000:]
    assert "error: 2 of 2 documents could not be ingested (more than 50%)" in said
    assert done.stdout == ""


def _demo_and_a_sync_offline(home: Path, share: Path) -> tuple[Any, bool]:
    """``kbflow demo``, then a folder source's first sync, in an empty network namespace whose
    only DNS server writes down every name asked (issue 41 #19: no library phones home; the
    offline demo and a local sync need no name at all). Without the rights to make one, the
    demo runs as usual and the lookups are not checked. Also says whether it added ``root``
    (the first superadmin, who adds the source)."""
    from tests import netns

    share.mkdir()
    (share / "visitors.md").write_text("# Visitors\n\nVisitors park by the gatehouse.\n")
    if not netns.available():
        return _kbflow("demo", "--json", home=home), False
    env = {**os.environ, "KBFLOW_HOME": str(home)}
    env = {k: v for k, v in env.items() if not k.startswith("PREFECT_API")}
    cli = [sys.executable, "-m", "kbflow.cli"]
    ran, lookups = netns.run_isolated(
        [
            [*cli, "demo", "--json"],
            [*cli, "users", "add", "root", "--role", "superadmin"],
            [*cli, "sources", "add", "share", "--org", "larkspur", "--kind", "filesystem",
             "--url", str(share), "--collection", "synced", "--as", "root"],
            [*cli, "sources", "sync", "share", "--org", "larkspur", "--as", "root", "--json"],
        ],
        env=env, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    for step in ran[1:]:
        assert step.returncode == 0, step.stderr[-3000:]
    assert json.loads(ran[3].stdout), ran[3].stdout[-2000:]
    own = {socket.gethostname(), socket.getfqdn(), "localhost"}
    unexpected = sorted({name for name in lookups if name.rstrip(".") not in own})
    assert not unexpected, f"looked up with no network and nothing configured: {unexpected}"
    return ran[0], True


@pytest.mark.integration
def test_demo_then_search_and_list_as_json(tmp_path: Path) -> None:
    home = tmp_path / "home"
    demo, root_added = _demo_and_a_sync_offline(home, tmp_path / "share")
    assert demo.returncode == 0, demo.stderr[-3000:]
    report: dict[str, Any] = json.loads(demo.stdout)
    assert report["ok"] is True
    assert report["draft"]["status"] == "pending_review" and report["draft"]["stored_chunks"] > 0
    assert sum(i["documents"] for i in report["ingest"]) == 6
    service = report["service"]  # the demo also ran the service, called it, and stopped it
    assert service["ok"] and service["store_shared"]
    assert [c["status"] for c in service["calls"]] == [200, 200, 200, 401]
    assert service["calls"][1]["summary"]["results"] > 0

    if not root_added:
        root = _kbflow("users", "add", "root", "--role", "superadmin", home=home)
        assert root.returncode == 0, root.stderr[-2000:]
    made = _kbflow("users", "add", "ops", "--role", "engineer", "--as", "root", home=home)
    assert made.returncode == 0, made.stderr[-2000:]
    refused = _kbflow("search", "annual leave days", "--org", "larkspur", home=home)
    assert refused.returncode == 1 and "--as USER" in refused.stderr
    found = _kbflow(
        "search", "annual leave days", "--org", "larkspur", "--as", "ops", "--json", "-k", "3",
        home=home,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr[-3000:]
    hits = json.loads(found.stdout)["hits"]
    assert len(hits) == 3 and hits[0]["uri"].endswith("handbook.md")
    assert {"doc_id", "chunk_id", "title", "uri", "heading_path", "text", "score"} <= set(hits[0])

    hidden = _kbflow(
        "search", "Aurora 3,450 EUR 2027", "--org", "larkspur", "--as", "ops", "--json", home=home
    )
    assert all(
        not h["uri"].endswith("pricing-2027-draft.md") for h in json.loads(hidden.stdout)["hits"]
    )

    listed = _kbflow(
        "docs", "list", "--org", "larkspur", "--collection", "handbook-and-policies", "--json",
        home=home,
    )  # fmt: skip
    statuses = sorted(d["status"] for d in json.loads(listed.stdout))
    assert statuses == ["approved"] * 5 + ["pending_review"]
    approved = {d["id"] for d in json.loads(listed.stdout) if d["status"] == "approved"}
    answers = report["answers"]
    assert answers["ok"] and answers["replay_identical"]
    answered = [t for t in answers["turns"] if t["status"] == "answered"]
    assert answered and all(t["claims"] for t in answered)
    assert {c["doc_id"] for t in answered for c in t["citations"]} <= approved
    research = report["research"]
    assert research["ok"] and research["hidden_while_pending"]
    assert sorted(d["status"] for d in research["drafts"]) == ["approved"] + ["pending_review"] * 3

    rerun = _kbflow("demo", "--json", home=home)
    assert rerun.returncode == 0
    again = json.loads(rerun.stdout)
    assert all(i["documents"] == 0 for i in again["ingest"])
    assert again["research"]["synthesis_run_id"] == research["synthesis_run_id"]
