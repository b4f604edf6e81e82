"""The review flow paused on a real Prefect server and resumed from another process.

One ``prefect server start`` serves the whole module. Each test seeds its own registry and Edge
store with pending drafts, runs the flow in a child process (the flow blocks while paused),
waits until the run is paused *and* its form schema is stored, then resumes it from here with
``resume_flow_run`` as a reviewer would from the UI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest

from kbflow.models import AuditAction, DocStatus, Role, Scope, SearchMode
from kbflow.settings import Settings
from sinks.registry import SqlRegistry
from sinks.vectors import open_vector_store
from tasks.retrieve import search
from tests.conftest import index_records

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ORG = "larkspur"
AM = "ada-am"
EXPERT = "eli-expert"
DRAFTS = [
    {
        "key": "kiln",
        "title": "Kiln firing schedule",
        "text": "The gas kiln fires stoneware at 1,240 degrees every Thursday night.",
    },
    {
        "key": "glaze",
        "title": "Celadon glaze recipe",
        "text": "Celadon glaze uses two percent red iron oxide in a reduction firing.",
    },
]
QUERIES = {"kiln": "kiln firing stoneware degrees", "glaze": "celadon glaze iron oxide"}
CHILD = (
    "import json, sys\n"
    "from flows.review import review\n"
    "run = review.with_options(flow_run_name=sys.argv[1])\n"
    "report = run(org=sys.argv[2], timeout_s=int(sys.argv[3]))\n"
    "report['model_loaded'] = 'sentence_transformers' in sys.modules\n"
    "print('REPORT ' + json.dumps(report))\n"
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[Any], grace_s: float = 15) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)


@dataclass
class Server:
    api_url: str

    def client(self) -> Any:
        """A sync Prefect client pointed at this server (env changes after import don't count)."""
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: self.api_url}):
            return get_client(sync_client=True)

    def resume(self, flow_run_id: UUID, run_input: dict[str, Any]) -> None:
        from prefect.flow_runs import resume_flow_run
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: self.api_url}):
            resume_flow_run(flow_run_id, run_input=run_input)


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``prefect server start`` on a free loopback port with its own PREFECT_HOME."""
    home = tmp_path_factory.mktemp("prefect-server")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_UI_ENABLED="false",
        DO_NOT_TRACK="1",
    )
    log = (home / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host=127.0.0.1", f"--port={port}"],
        env=env,
        cwd=home,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api_url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited ({proc.returncode}):\n{_tail(home / 'server.log')}")
            try:
                if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prefect server not healthy after 90 s:\n{_tail(home / 'server.log')}")
            time.sleep(0.25)
        yield Server(api_url)
    finally:
        _stop(proc)
        log.close()


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no output)"


@dataclass
class ReviewChild:
    """A review flow running in its own process, until it is resumed or times out."""

    proc: subprocess.Popen[Any]
    run_name: str
    out: Path
    err: Path

    def output(self) -> str:
        return f"stdout:\n{_tail(self.out)}\nstderr:\n{_tail(self.err)}"

    def run_id(self, server: Server) -> UUID:
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

        name_filter = FlowRunFilter(name=FlowRunFilterName(any_=[self.run_name]))
        with server.client() as client:
            (run,) = client.read_flow_runs(flow_run_filter=name_filter)
        return UUID(str(run.id))

    def wait_until_waiting_for_input(self, server: Server, timeout_s: float = 60) -> UUID:
        """The run's id once it is Paused and its form schema is stored (resumable)."""
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

        deadline = time.monotonic() + timeout_s
        name_filter = FlowRunFilter(name=FlowRunFilterName(any_=[self.run_name]))
        with server.client() as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    pytest.fail(f"review exited ({self.proc.returncode}) unpaused\n{self.output()}")
                runs = client.read_flow_runs(flow_run_filter=name_filter)
                state = runs[0].state if runs else None
                keyset = state.state_details.run_input_keyset if state else None
                # The flow stores its form schema just after the Paused state: resuming in
                # between is rejected ("Run input schema not found").
                if state is not None and state.is_paused() and keyset:
                    try:
                        client.read_flow_run_input(runs[0].id, keyset["schema"])
                    except httpx.HTTPStatusError:
                        pass
                    else:
                        return runs[0].id
                time.sleep(0.25)
        pytest.fail(f"run {self.run_name} not paused within {timeout_s} s\n{self.output()}")

    def finish(self, timeout_s: float = 60) -> tuple[int, dict[str, Any] | None]:
        """Exit code and the flow's report (None when it failed)."""
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"review did not finish within {timeout_s} s\n{self.output()}")
        lines = [ln for ln in self.out.read_text().splitlines() if ln.startswith("REPORT ")]
        return rc, (json.loads(lines[-1].removeprefix("REPORT ")) if lines else None)


@pytest.fixture
def start_review(server_env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    children: list[ReviewChild] = []

    def start(org: str = ORG, timeout_s: int = 120) -> ReviewChild:
        name = f"review-test-{uuid.uuid4().hex[:12]}"
        out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with out.open("wb") as fo, err.open("wb") as fe:
            proc = subprocess.Popen(
                [sys.executable, "-c", CHILD, name, org, str(timeout_s)],
                cwd=REPO,
                env=server_env,
                stdout=fo,
                stderr=fe,
            )
        child = ReviewChild(proc, name, out, err)
        children.append(child)
        return child

    yield start
    for child in children:
        _stop(child.proc, grace_s=5)


@pytest.fixture
def server_env(prefect_server: Server) -> dict[str, str]:
    """The child's environment: this test's KBFLOW_HOME, the server, INFO run logs."""
    env = dict(os.environ)
    env.update(PREFECT_API_URL=prefect_server.api_url, PREFECT_LOGGING_LEVEL="INFO")
    return env


@pytest.fixture
def drafts(settings: Settings, registry: SqlRegistry, embedder: Any) -> dict[str, str]:
    """Two pending drafts in ORG, an assigned AM and an expert; the store is closed after."""
    registry.ensure_org(ORG)
    registry.ensure_user(AM, Role.ACCOUNT_MANAGER)
    registry.ensure_user(EXPERT, Role.EXPERT, org_id=ORG)
    registry.ensure_org(ORG, am_user_id=AM)
    with open_vector_store(settings) as store:
        ids = index_records(
            DRAFTS,
            store=store,
            registry=registry,
            embedder=embedder,
            org=ORG,
            status=DocStatus.PENDING_REVIEW,
        )
    return dict(zip([d["key"] for d in DRAFTS], ids, strict=True))


def _visible(settings: Settings, registry: SqlRegistry, embedder: Any) -> dict[str, set[str]]:
    """Doc ids each query finds, per search mode."""
    found: dict[str, set[str]] = {}
    with open_vector_store(settings) as store:
        for mode in SearchMode:
            for key, query in QUERIES.items():
                hits = search(
                    query,
                    Scope(org_id=ORG),
                    store=store,
                    registry=registry,
                    embedder=embedder,
                    mode=mode,
                )
                found[f"{mode.value}:{key}"] = {h.doc_id for h in hits}
    return found


def _decisions_audit(registry: SqlRegistry) -> list[tuple[str, str, str]]:
    return [
        (row.action, row.doc_id, row.actor)
        for row in registry.audit_trail(ORG)
        if row.doc_id is not None and row.action != AuditAction.CREATED.value
    ]


def test_review_is_paused_then_resumed_with_decisions(
    prefect_server: Server,
    start_review: Any,
    drafts: dict[str, str],
    settings: Settings,
    registry: SqlRegistry,
    embedder: Any,
) -> None:
    child = start_review()
    run_id = child.wait_until_waiting_for_input(prefect_server)
    with prefect_server.client() as client:
        keyset = client.read_flow_run(run_id).state.state_details.run_input_keyset
        form = json.loads(client.read_flow_run_input(run_id, keyset["schema"]))
        description = json.loads(client.read_flow_run_input(run_id, keyset["description"]))
    prefilled = form["properties"]["decisions"]["default"]
    assert {(d["doc_id"], d["action"]) for d in prefilled} == {
        (drafts["kiln"], "skip"),
        (drafts["glaze"], "skip"),
    }
    assert all(d["title"] in description for d in DRAFTS)
    # The server validates the answer against the stored form and keeps the run paused.
    with pytest.raises(RuntimeError, match="publish"):
        prefect_server.resume(
            run_id, {"reviewer": AM, "decisions": [{"doc_id": drafts["kiln"], "action": "publish"}]}
        )

    prefect_server.resume(
        run_id,
        {
            "reviewer": AM,
            "decisions": [
                {"doc_id": drafts["kiln"], "action": "approve", "note": "checked"},
                {"doc_id": drafts["glaze"], "action": "reject"},
                {"doc_id": "not-a-pending-doc", "action": "approve"},
            ],
        },
    )
    rc, report = child.finish()
    assert rc == 0, child.output()
    assert report is not None
    counts = (report["pending"], report["applied"], report["skipped"], report["failed"])
    assert counts == (2, 2, 0, 1)
    assert not report["model_loaded"]  # approve/reject never load the embedding model
    assert [(o["doc_id"], o["result"], o["status"]) for o in report["outcomes"]] == [
        (drafts["kiln"], "applied", "approved"),
        (drafts["glaze"], "applied", "rejected"),
        ("not-a-pending-doc", "invalid", None),
    ]

    docs = registry.get_documents(drafts.values())
    assert docs[drafts["kiln"]].status == DocStatus.APPROVED.value
    assert docs[drafts["kiln"]].approved_by == AM
    assert docs[drafts["glaze"]].status == DocStatus.REJECTED.value
    assert sorted(_decisions_audit(registry)) == sorted(
        [
            (AuditAction.APPROVED.value, drafts["kiln"], AM),
            (AuditAction.REJECTED.value, drafts["glaze"], AM),
        ]
    )
    visible = _visible(settings, registry, embedder)
    for mode in SearchMode:
        assert drafts["kiln"] in visible[f"{mode.value}:kiln"], mode
        assert drafts["glaze"] not in visible[f"{mode.value}:glaze"], mode
        assert drafts["glaze"] not in visible[f"{mode.value}:kiln"], mode


def test_edit_replaces_the_draft_and_skip_leaves_it_pending(
    prefect_server: Server,
    start_review: Any,
    drafts: dict[str, str],
    settings: Settings,
    registry: SqlRegistry,
    embedder: Any,
) -> None:
    child = start_review()
    run_id = child.wait_until_waiting_for_input(prefect_server)
    corrected = "# Kiln firing schedule\n\nThe electric kiln fires porcelain at 1,300 degrees.\n"
    prefect_server.resume(
        run_id,
        {
            "reviewer": AM,
            "decisions": [
                {"doc_id": drafts["kiln"], "action": "edit", "content": corrected},
                {"doc_id": drafts["glaze"], "action": "skip"},
            ],
        },
    )
    rc, report = child.finish()
    assert rc == 0, child.output()
    assert report is not None
    assert (report["applied"], report["skipped"], report["skipped_ids"]) == (
        1,
        1,
        [drafts["glaze"]],
    )
    assert report["model_loaded"]
    docs = registry.get_documents(drafts.values())
    assert docs[drafts["kiln"]].status == DocStatus.APPROVED.value
    assert docs[drafts["glaze"]].status == DocStatus.PENDING_REVIEW.value
    assert _decisions_audit(registry) == [(AuditAction.EDITED_APPROVED.value, drafts["kiln"], AM)]
    with open_vector_store(settings) as store:
        hits = search(
            "porcelain kiln degrees",
            Scope(org_id=ORG),
            store=store,
            registry=registry,
            embedder=embedder,
        )
    assert [h.doc_id for h in hits] == [drafts["kiln"]]
    assert "1,300" in hits[0].text and "1,240" not in hits[0].text


def test_unanswered_review_times_out_and_leaves_drafts_pending(
    prefect_server: Server,
    start_review: Any,
    drafts: dict[str, str],
    settings: Settings,
    registry: SqlRegistry,
    embedder: Any,
) -> None:
    child = start_review(timeout_s=3)
    rc, report = child.finish()
    assert rc != 0 and report is None
    assert "FlowPauseTimeout" in child.output()
    run_id = child.run_id(prefect_server)

    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with prefect_server.client() as client:
        state = client.read_flow_run(run_id).state
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    assert state is not None and state.is_failed(), state
    assert any("stay pending_review" in log.message for log in logs)

    docs = registry.get_documents(drafts.values())
    assert {d.status for d in docs.values()} == {DocStatus.PENDING_REVIEW.value}
    assert _decisions_audit(registry) == []
    assert not set(drafts.values()) & set().union(*_visible(settings, registry, embedder).values())


def test_unauthorised_reviewer_changes_nothing(
    prefect_server: Server,
    start_review: Any,
    drafts: dict[str, str],
    settings: Settings,
    registry: SqlRegistry,
    embedder: Any,
) -> None:
    child = start_review()
    run_id = child.wait_until_waiting_for_input(prefect_server)
    prefect_server.resume(
        run_id,
        {
            "reviewer": EXPERT,
            "decisions": [
                {"doc_id": drafts["kiln"], "action": "approve"},
                {"doc_id": drafts["glaze"], "action": "reject"},
            ],
        },
    )
    rc, report = child.finish()
    assert rc == 0, child.output()
    assert report is not None
    assert report["applied"] == 0
    assert [o["result"] for o in report["outcomes"]] == ["forbidden", "forbidden"]
    assert all(EXPERT in o["message"] for o in report["outcomes"])

    docs = registry.get_documents(drafts.values())
    assert {d.status for d in docs.values()} == {DocStatus.PENDING_REVIEW.value}
    assert _decisions_audit(registry) == []
    assert not set(drafts.values()) & set().union(*_visible(settings, registry, embedder).values())


def test_no_pending_documents_returns_without_pausing(
    prefect_server: Server, start_review: Any, registry: SqlRegistry
) -> None:
    registry.ensure_org("quiet")
    rc, report = start_review(org="quiet").finish()
    assert rc == 0
    assert report is not None
    assert (report["pending"], report["applied"], report["outcomes"]) == (0, 0, [])


RESEARCH_CHILD = (
    "import json, sys\n"
    "from flows.research import research\n"
    "run = research.with_options(flow_run_name=sys.argv[1])\n"
    "report = run(org=sys.argv[2], client_name='Fresh Foods', reviewer=sys.argv[3],\n"
    "             review_timeout_s=120)\n"
    "print('REPORT ' + json.dumps(report))\n"
)
BRIEF = """# Fresh Foods brief

## Voice
Our voice is warm, plain and reassuring. Example: "Hi Ana, your order is on its way!"
Avoid jargon such as "synergy" and never promise health cures.

## Products
Fresh Foods sells organic baby food jars in Belgium and the Netherlands, from 2.49 EUR a jar.

## Compliance
Baby food must follow EU food safety and labelling rules. Customer data is processed under GDPR.

## Contacts
Ann Lee, support lead, ann.lee@fresh-foods.example. Escalate recalls to Tom Dubois, quality lead.
"""


def test_a_fresh_orgs_research_drafts_are_reviewed_in_the_paused_flow(
    prefect_server: Server,
    server_env: dict[str, str],
    settings: Settings,
    registry: SqlRegistry,
    embedder: Any,
    tmp_path: Path,
) -> None:
    """Brand-new org -> seed -> research (offline) -> 4 hidden drafts -> paused review:
    approve two, reject two -> exactly the two approved become searchable."""
    from tasks.extract import file_to_document
    from tasks.seed import SeedBundle, seed_bundle

    org = "fresh"
    registry.ensure_org(org, "Fresh Foods")
    registry.ensure_user(AM, Role.ACCOUNT_MANAGER)
    registry.assign_am(org, AM)
    brief = tmp_path / "brief.md"
    brief.write_text(BRIEF)
    with open_vector_store(settings) as store:
        seed_bundle(
            SeedBundle(files=(brief,), prompts=("Focus on parents of babies under one.",)),
            org, registry=registry, store=store, embedder=embedder,
            extract_file=lambda s: file_to_document(s.path),
        )  # fmt: skip

    name = f"research-test-{uuid.uuid4().hex[:12]}"
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    env = {**server_env, "KBFLOW_RESEARCH_OFFLINE": "true"}  # the child is not network-guarded
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen(
            [sys.executable, "-c", RESEARCH_CHILD, name, org, AM],
            cwd=REPO, env=env, stdout=fo, stderr=fe,
        )  # fmt: skip
    child = ReviewChild(proc, f"{name}-review", out, err)
    try:
        run_id = child.wait_until_waiting_for_input(prefect_server, timeout_s=120)
        drafts = [d for d in registry.list_documents(org) if d.source_tag == "agent_synthesis"]
        assert len(drafts) == 4 and {d.status for d in drafts} == {"pending_review"}
        (synthesis_run,) = {d.synthesis_run_id for d in drafts}
        hidden = set().union(*_fresh_visible(settings, registry, embedder, org).values())
        assert not hidden & {d.id for d in drafts}  # no search returns a pending draft

        by_name = {Path(d.uri).name: d.id for d in drafts}
        approve = [by_name["product-context.md"], by_name["key-contacts-extracted.md"]]
        reject = [by_name["brand-voice-playbook.md"], by_name["compliance-notes.md"]]
        prefect_server.resume(
            run_id,
            {
                "reviewer": AM,
                "decisions": [{"doc_id": d, "action": "approve"} for d in approve]
                + [{"doc_id": d, "action": "reject"} for d in reject],
            },
        )
        rc, report = child.finish(timeout_s=120)
        assert rc == 0, child.output()
        assert report is not None and report["synthesis_run_id"] == synthesis_run
        assert report["review"]["applied"] == 4
    finally:
        _stop(proc, grace_s=5)

    visible = set().union(*_fresh_visible(settings, registry, embedder, org).values())
    assert set(approve) <= visible
    assert not set(reject) & visible
    assert visible & {d.id for d in drafts} == set(approve)
    rows = [r for r in registry.audit_trail(org) if r.doc_id in set(approve) | set(reject)]
    decisions = [r for r in rows if r.action != AuditAction.CREATED.value]
    assert (
        sorted(r.action for r in decisions)
        == ["kb.document.approved"] * 2 + ["kb.document.rejected"] * 2
    )
    assert {r.synthesis_run_id for r in rows} == {synthesis_run}


def _fresh_visible(
    settings: Settings, registry: SqlRegistry, embedder: Any, org: str
) -> dict[str, set[str]]:
    queries = ["organic baby food jars price", "support lead email", "warm plain voice"]
    found: dict[str, set[str]] = {}
    with open_vector_store(settings) as store:
        for mode in SearchMode:
            ids: set[str] = set()
            for q in queries:
                hits = search(q, Scope(org_id=org), store=store, registry=registry,
                              embedder=embedder, mode=mode)  # fmt: skip
                ids |= {h.doc_id for h in hits}
            found[mode.value] = ids
    return found
