"""The review flow paused on a real Prefect server and resumed from another process.

One ``prefect server start`` serves the whole module. Each test seeds its own registry and Edge
store with pending drafts, runs the flow in a child process (the flow blocks while paused) --
a script calling the flow, or the ``kbflow`` CLI itself -- waits until the run is paused *and*
its form schema is stored, then resumes it from here with ``resume_flow_run`` as a reviewer
would from the UI. Final states are read back from the server's API.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest

from core import prefect_database
from core.models import AuditAction, DocStatus, Role, Scope, SearchMode
from core.settings import Settings
from sinks.connect import open_vector_store
from sinks.registry import SqlRegistry
from tasks.query.retrieve import search
from tests import web
from tests.conftest import free_port, index_records

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
    "from core.errors import RunFailed\n"
    "run = review.with_options(flow_run_name=sys.argv[1])\n"
    "reviewer = sys.argv[4] if len(sys.argv) > 4 else None\n"
    "try:\n"
    "    report = run(org=sys.argv[2], timeout_s=int(sys.argv[3]), reviewer=reviewer).to_dict()\n"
    "except RunFailed as exc:  # the run ended Failed; its report comes with the error\n"
    "    print('FAILED ' + str(exc))\n"
    "    report = exc.report\n"
    "loaders = ('onnxruntime', 'sentence_transformers')  # the embedder's two backends\n"
    "report['model_loaded'] = any(name in sys.modules for name in loaders)\n"
    "print('REPORT ' + json.dumps(report))\n"
)
NOTICE = re.compile(r"waiting for (.+): flow run (\S+) \(([0-9a-f-]{36})\)\n +(\S+)\n +(.+)\n")


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
        """Resume as a program does: a review code in ``code`` is sent as the proof it signs
        for exactly these decisions and this run (`tasks.review.codes.sign_decisions`)."""
        from prefect.flow_runs import resume_flow_run
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from tasks.review.codes import is_proof, sign_decisions

        code = run_input.get("code")
        if code and not is_proof(code):
            run_input = {**run_input, "code": sign_decisions(code, str(flow_run_id), run_input)}
        with temporary_settings({PREFECT_API_URL: self.api_url}):
            resume_flow_run(flow_run_id, run_input=run_input)


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``prefect server start`` on a free loopback port with its own PREFECT_HOME."""
    home = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_UI_ENABLED="false",
        DO_NOT_TRACK="1",
    )
    prefect_database.seed(home, build=True, environ=env)  # migrated once per machine
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
                if web.get(f"{api_url}/health", timeout=2).status_code == 200:
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
    """A process that runs a flow which pauses for review, until it is resumed or times out:
    a script calling the flow (``run_name`` known) or the ``kbflow`` CLI (id from stderr)."""

    proc: subprocess.Popen[Any]
    run_name: str | None
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

    def notice(self, timeout_s: float = 120) -> re.Match[str]:
        """The CLI's "waiting for ..." lines on stderr, once they are there."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = NOTICE.search(self.err.read_text(errors="replace"))
            if found:
                return found
            if self.proc.poll() is not None:
                pytest.fail(f"exited ({self.proc.returncode}) without a notice\n{self.output()}")
            time.sleep(0.25)
        pytest.fail(f"no waiting notice within {timeout_s} s\n{self.output()}")

    def wait_until_waiting_for_input(
        self, server: Server, timeout_s: float = 60, run_id: UUID | None = None
    ) -> UUID:
        """The run's id once it is Paused and its form schema is stored (resumable)."""
        from prefect.client.schemas.filters import (
            FlowRunFilter,
            FlowRunFilterId,
            FlowRunFilterName,
        )

        deadline = time.monotonic() + timeout_s
        run_filter = (
            FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
            if run_id is not None
            else FlowRunFilter(name=FlowRunFilterName(any_=[self.run_name]))
        )
        with server.client() as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    pytest.fail(f"review exited ({self.proc.returncode}) unpaused\n{self.output()}")
                runs = client.read_flow_runs(flow_run_filter=run_filter)
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
        pytest.fail(
            f"run {self.run_name or run_id} not paused within {timeout_s} s\n{self.output()}"
        )

    def finish(self, timeout_s: float = 60) -> tuple[int, dict[str, Any] | None]:
        """Exit code and the flow's report (None when it failed without one)."""
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"review did not finish within {timeout_s} s\n{self.output()}")
        lines = [ln for ln in self.out.read_text().splitlines() if ln.startswith("REPORT ")]
        return rc, (json.loads(lines[-1].removeprefix("REPORT ")) if lines else None)


@pytest.fixture
def start_review(server_env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    children: list[ReviewChild] = []

    def start(
        org: str = ORG,
        timeout_s: int = 120,
        reviewer: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ReviewChild:
        name = f"review-test-{uuid.uuid4().hex[:12]}"
        out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        prefill = [reviewer] if reviewer else []
        with out.open("wb") as fo, err.open("wb") as fe:
            proc = subprocess.Popen(
                [sys.executable, "-c", CHILD, name, org, str(timeout_s), *prefill],
                cwd=REPO,
                env={**server_env, **(env or {})},
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
def start_cli(server_env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    """``kbflow ARGS...`` as a user runs it against the module's server (WARNING logs)."""
    children: list[ReviewChild] = []

    def start(*args: str) -> ReviewChild:
        name = f"cli-{uuid.uuid4().hex[:12]}"
        out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        env = {**server_env, "PREFECT_LOGGING_LEVEL": "WARNING", "KBFLOW_RESEARCH_OFFLINE": "true"}
        with out.open("wb") as fo, err.open("wb") as fe:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kbflow.cli", *args],
                cwd=REPO, env=env, stdout=fo, stderr=fe,
            )  # fmt: skip
        child = ReviewChild(proc, None, out, err)
        children.append(child)
        return child

    yield start
    for child in children:
        _stop(child.proc, grace_s=5)


def _final_state(server: Server, run_id: UUID) -> Any:
    """The run's state as the server reports it."""
    with server.client() as client:
        return client.read_flow_run(run_id).state


def _runs_of(server: Server, flow_name: str, org: str) -> list[Any]:
    """The flow runs of ``flow_name`` started for ``org``."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with server.client() as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])))
    return [r for r in runs if r.parameters.get("org") == org]


@pytest.fixture
def server_env(prefect_server: Server) -> dict[str, str]:
    """The child's environment: this test's KBFLOW_HOME, the server, INFO run logs, and a
    paused run that looks for its resume every 0.25 s rather than every 2 s (the default), so
    that no test idles up to 2 s after each resume."""
    env = dict(os.environ)
    env.update(
        PREFECT_API_URL=prefect_server.api_url,
        PREFECT_LOGGING_LEVEL="INFO",
        KBFLOW_REVIEW_POLL_S="0.25",
    )
    return env


@pytest.fixture
def drafts(settings: Settings, registry: SqlRegistry, embedder: Any) -> dict[str, str]:
    """Two pending drafts in ORG, an assigned AM and an expert; the store is closed after."""
    registry.people.ensure_org(ORG)
    registry.people.ensure_user(AM, Role.ACCOUNT_MANAGER)
    registry.people.ensure_user(EXPERT, Role.EXPERT, org_id=ORG)
    registry.people.ensure_org(ORG, am_user_id=AM)
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


def code_for(registry: SqlRegistry, user: str = AM, org: str = ORG) -> str:
    """A one-time review code for ``user``, issued as `kbflow review code` does (the registry
    call, without the rights check: a test may issue one to someone who may not decide)."""
    return registry.logins.issue_review_code(user, org).code


def _decisions_audit(registry: SqlRegistry) -> list[tuple[str, str, str]]:
    return [
        (row.action, row.doc_id, row.actor)
        for row in registry.audit.audit_trail(ORG)
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
    prefilled = {
        name.removeprefix("doc_"): field["default"]["action"]
        for name, field in form["properties"].items()
        if name.startswith("doc_")
    }
    assert prefilled == {drafts["kiln"]: "skip", drafts["glaze"]: "skip"}
    assert "review" in description
    # The server validates the form's fields against the stored schema and keeps the run
    # paused; rows of `decisions` (for programs, not in the form) are checked by the flow.
    with pytest.raises(RuntimeError, match="publish"):
        prefect_server.resume(
            run_id, {"code": code_for(registry), f"doc_{drafts['kiln']}": {"action": "publish"}}
        )

    prefect_server.resume(
        run_id,
        {
            "code": code_for(registry),
            "decisions": [
                {"doc_id": drafts["kiln"], "action": "approve", "note": "checked"},
                {"doc_id": drafts["glaze"], "action": "reject"},
                {"doc_id": "not-a-pending-doc", "action": "approve"},
                {"doc_id": drafts["glaze"], "action": "publish"},
            ],
        },
    )
    rc, report = child.finish()
    assert rc == 0, child.output()
    assert report is not None
    counts = (report["pending"], report["applied"], report["skipped"], report["failed"])
    assert counts == (2, 2, 0, 2)
    assert _final_state(prefect_server, run_id).is_completed()  # invalid rows among applied
    assert not report["model_loaded"]  # approve/reject never load the embedding model
    assert [(o["doc_id"], o["result"], o["status"]) for o in report["outcomes"]] == [
        (drafts["glaze"], "invalid", None),  # "publish" is no action: reported, not a crash
        (drafts["kiln"], "applied", "approved"),
        (drafts["glaze"], "applied", "rejected"),
        ("not-a-pending-doc", "invalid", None),
    ]
    assert "publish" in report["outcomes"][0]["message"]

    docs = registry.documents.get_documents(drafts.values())
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
            "code": code_for(registry),
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
    docs = registry.documents.get_documents(drafts.values())
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
    assert "ReviewTimeout: no decisions arrived within 3s" in child.output()
    run_id = child.run_id(prefect_server)

    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with prefect_server.client() as client:
        state = client.read_flow_run(run_id).state
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    assert state is not None and state.is_failed(), state
    assert any("stay pending_review" in log.message for log in logs)

    docs = registry.documents.get_documents(drafts.values())
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
            "code": code_for(registry, EXPERT),  # issued before their rights were checked
            "decisions": [
                {"doc_id": drafts["kiln"], "action": "approve"},
                {"doc_id": drafts["glaze"], "action": "reject"},
            ],
        },
    )
    rc, report = child.finish()
    assert rc == 0, child.output()
    assert report is not None  # the caller still gets the report, with the RunFailed
    assert report["applied"] == 0
    assert [o["result"] for o in report["outcomes"]] == ["forbidden", "forbidden"]
    assert all(EXPERT in o["message"] for o in report["outcomes"])
    # The run did not do its job: it ends Failed, the reason as its state message.
    state = _final_state(prefect_server, run_id)
    assert state.is_failed(), state
    assert state.message.startswith(
        f"review of org {ORG!r} refused: nothing was applied: user {EXPERT!r} (expert)"
    ), state.message
    assert f"FAILED {state.message}" in child.output()

    docs = registry.documents.get_documents(drafts.values())
    assert {d.status for d in docs.values()} == {DocStatus.PENDING_REVIEW.value}
    assert _decisions_audit(registry) == []
    assert not set(drafts.values()) & set().union(*_visible(settings, registry, embedder).values())


def test_the_form_holds_no_draft_text_and_an_unchanged_edit_approves(
    prefect_server: Server,
    start_review: Any,
    drafts: dict[str, str],
    registry: SqlRegistry,
) -> None:
    """Anyone who reaches the Prefect API can read the stored form (hostile review): it names
    each draft (title, id) and where to read it, asks for a review code, and holds no draft
    text anywhere; `decisions` (for programs) stays out of it. An edit whose content equals
    the stored draft approves it as it is (nothing re-embedded)."""
    from flows.review import DraftDecision, ReviewDecision

    child = start_review(reviewer=AM)
    run_id = child.wait_until_waiting_for_input(prefect_server)
    with web.client(base_url=prefect_server.api_url) as anonymous:  # no credential at all
        keyset = anonymous.get(f"/flow_runs/{run_id}").json()["state"]["state_details"][
            "run_input_keyset"
        ]
        stored = {
            key: anonymous.get(f"/flow_runs/{run_id}/input/{name}").text
            for key, name in keyset.items()
        }
    for draft in DRAFTS:
        for key, text in stored.items():
            assert draft["text"] not in text, key
            assert draft["text"][:30] not in text, key
    form = (
        json.loads(json.loads(stored["schema"]))
        if stored["schema"].startswith('"')
        else (json.loads(stored["schema"]))
    )
    props = form["properties"]
    assert props["code"]["description"] == ReviewDecision.model_fields["code"].description
    assert form["required"] == ["code"]  # so the Prefect UI does not label it "(Optional)"
    assert "reviewer" not in props and "decisions" not in props
    definition = form["definitions"]["DraftDecision"]["properties"]
    assert definition["content"]["description"] == DraftDecision.model_fields["content"].description
    ordered = sorted(DRAFTS, key=lambda d: d["title"])
    for number, draft in enumerate(ordered, start=1):
        field = props[f"doc_{drafts[draft['key']]}"]
        assert field["title"] == f"Draft {number} of {len(DRAFTS)}: {draft['title']}"
        assert drafts[draft["key"]] in field["description"]
        assert f"/review/drafts/{drafts[draft['key']]}" in field["description"]  # its inbox page
        assert "kbflow review show" in field["description"]
        assert field["default"] == {"action": "skip", "content": "", "note": ""}

    before = registry.documents.get_document(drafts["kiln"])
    kiln = next(d for d in DRAFTS if d["key"] == "kiln")
    prefect_server.resume(
        run_id,
        {"code": code_for(registry),
         f"doc_{drafts['kiln']}": {"action": "edit", "note": "ok",
                                   "content": f"# {kiln['title']}\n\n{kiln['text']}\n"},
         f"doc_{drafts['glaze']}": {"action": "skip", "content": "", "note": ""}},
    )  # fmt: skip
    rc, report = child.finish()
    assert rc == 0, child.output()
    assert report is not None
    from flows.review import UNCHANGED_EDIT

    assert report["reviewer"] == AM  # the code's user, not a typed name
    assert report["outcomes"] == [
        {
            "doc_id": drafts["kiln"],
            "action": "approve",
            "result": "applied",
            "message": UNCHANGED_EDIT,
            "status": "approved",
        }
    ]
    assert not report["model_loaded"]  # nothing was re-embedded
    after = registry.documents.get_document(drafts["kiln"])
    assert (after.status, after.content_hash) == ("approved", before.content_hash)
    assert _decisions_audit(registry) == [(AuditAction.APPROVED.value, drafts["kiln"], AM)]
    assert registry.documents.get_document(drafts["glaze"]).status == DocStatus.PENDING_REVIEW.value
    assert _final_state(prefect_server, run_id).is_completed()
    with prefect_server.client() as client:  # the run's page says what was decided, by whom
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        (artifact,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
    assert AM in str(artifact.data) and drafts["kiln"] in str(artifact.data)


@pytest.mark.parametrize("typed", [AM, "root"])
def test_a_typed_name_without_a_code_applies_nothing_and_the_run_fails(
    typed: str,
    prefect_server: Server,
    start_review: Any,
    drafts: dict[str, str],
    settings: Settings,
    registry: SqlRegistry,
    embedder: Any,
) -> None:
    """The hostile review's replay: an anonymous resume naming the org's AM (or a superadmin)
    and replacing a draft with the attacker's text applies nothing; the run ends Failed.

    The form's schema requires ``code`` (so the Prefect UI does not call it optional): Prefect
    itself rejects a resume without one and the run stays paused; with an empty one the run
    gets it and refuses it."""
    registry.people.ensure_user("root", Role.SUPERADMIN)
    child = start_review()
    run_id = child.wait_until_waiting_for_input(prefect_server)
    forged: dict[str, Any] = {
        "reviewer": typed,
        f"doc_{drafts['kiln']}": {"action": "edit", "content": "ATTACKER TEXT", "note": ""},
        f"doc_{drafts['glaze']}": {"action": "approve", "content": "", "note": ""},
    }
    with web.client(base_url=prefect_server.api_url) as anonymous:
        without = anonymous.post(f"/flow_runs/{run_id}/resume", json={"run_input": forged})
        assert without.status_code < 300 and without.json()["status"] == "REJECT", without.text
        assert "code" in without.json()["details"]["reason"]
        assert _final_state(prefect_server, run_id).is_paused()
        answer = anonymous.post(
            f"/flow_runs/{run_id}/resume", json={"run_input": {**forged, "code": ""}}
        )
    assert answer.status_code < 300, answer.text  # Prefect accepts it; the flow refuses it
    rc, report = child.finish()
    assert rc == 0, child.output()
    assert report is not None and report["applied"] == 0
    state = _final_state(prefect_server, run_id)
    assert state.is_failed(), state
    assert "no review code was given" in state.message, state.message
    docs = registry.documents.get_documents(drafts.values())
    assert {d.status for d in docs.values()} == {DocStatus.PENDING_REVIEW.value}
    assert _decisions_audit(registry) == []
    refused = [r for r in registry.audit.audit_trail(ORG) if r.action == "kb.review_code.refused"]
    assert len(refused) == 1
    assert not set(drafts.values()) & set().union(*_visible(settings, registry, embedder).values())


def test_a_used_code_is_refused_and_nothing_is_applied(
    prefect_server: Server, start_review: Any, drafts: dict[str, str], registry: SqlRegistry
) -> None:
    code = code_for(registry)
    registry.logins.redeem_review_code(code, org_id=ORG, flow_run_id="an-earlier-run")
    child = start_review()
    run_id = child.wait_until_waiting_for_input(prefect_server)
    prefect_server.resume(
        run_id, {"code": code, "decisions": [{"doc_id": drafts["kiln"], "action": "approve"}]}
    )
    rc, report = child.finish()
    assert rc == 0 and report is not None and report["applied"] == 0, child.output()
    state = _final_state(prefect_server, run_id)
    assert state.is_failed() and "already used" in state.message, state
    assert registry.documents.get_document(drafts["kiln"]).status == DocStatus.PENDING_REVIEW.value
    # The run's log says it in one line, with what to do, and holds no Python traceback.
    logged = child.out.read_text(errors="replace") + child.err.read_text(errors="replace")
    assert "Traceback" not in logged, logged
    (line,) = [ln for ln in logged.splitlines() if "review refused" in ln]
    assert "already used" in line and "nothing was applied" in line, line
    assert "kbflow review code" in line and "review inbox" in line, line


def test_a_lost_race_is_reported_and_the_run_still_completes(
    prefect_server: Server,
    start_review: Any,
    drafts: dict[str, str],
    settings: Settings,
    registry: SqlRegistry,
) -> None:
    from tasks.review.machine import approve, held

    child = start_review()
    run_id = child.wait_until_waiting_for_input(prefect_server)
    with open_vector_store(settings) as store:  # someone decides first, from the CLI say
        approve(drafts["kiln"], AM, registry=registry, open_store=held(store))
    prefect_server.resume(
        run_id,
        {"code": code_for(registry), "decisions": [
            {"doc_id": drafts["kiln"], "action": "reject"},
            {"doc_id": drafts["glaze"], "action": "approve"},
        ]},
    )  # fmt: skip
    rc, report = child.finish()
    assert rc == 0, child.output()
    assert report is not None
    assert [(o["doc_id"], o["result"]) for o in report["outcomes"]] == [
        (drafts["kiln"], "conflict"),
        (drafts["glaze"], "applied"),
    ]
    assert "FAILED" not in child.output()
    assert _final_state(prefect_server, run_id).is_completed()
    assert registry.documents.get_document(drafts["kiln"]).status == DocStatus.APPROVED.value


def test_review_flow_command_prints_the_run_and_its_link_while_waiting(
    prefect_server: Server,
    start_cli: Any,
    drafts: dict[str, str],
    registry: SqlRegistry,
) -> None:
    cli = start_cli("review", "flow", "--org", ORG, "--as", AM, "--timeout", "120", "--json")
    notice = cli.notice()
    what, _name, run_id, url, todo = notice.groups()
    assert what == f"decisions on 2 drafts of org {ORG}"
    assert url == f"{prefect_server.api_url.removesuffix('/api')}/runs/flow-run/{run_id}"
    assert "Resume" in todo and "pending_review" in todo
    # Printed while the run waits: it is paused, the command still running.
    assert cli.wait_until_waiting_for_input(prefect_server, run_id=UUID(run_id)) == UUID(run_id)
    assert cli.proc.poll() is None
    prefect_server.resume(
        UUID(run_id),
        {"code": code_for(registry), "decisions": [
            {"doc_id": drafts["kiln"], "action": "approve"},
            {"doc_id": drafts["glaze"], "action": "reject"},
        ]},
    )  # fmt: skip
    assert cli.proc.wait(timeout=60) == 0, cli.output()
    report = json.loads(cli.out.read_text())
    assert (report["applied"], report["failed"]) == (2, 0)
    assert _final_state(prefect_server, UUID(run_id)).is_completed()
    assert "Traceback" not in cli.err.read_text()


def test_review_flow_command_times_out_with_one_message_and_no_traceback(
    prefect_server: Server, start_cli: Any, drafts: dict[str, str], registry: SqlRegistry
) -> None:
    cli = start_cli("review", "flow", "--org", ORG, "--as", AM, "--timeout", "3")
    assert cli.proc.wait(timeout=90) == 1, cli.output()
    err = cli.err.read_text()
    assert "Traceback" not in err, err
    assert err.count("no decisions arrived within 3s") == 1, err
    assert "error: no decisions arrived within 3s, so the 2 drafts of org 'larkspur'" in " ".join(
        err.split()
    )
    assert {d.status for d in registry.documents.get_documents(drafts.values()).values()} == {
        DocStatus.PENDING_REVIEW.value
    }


def test_no_pending_documents_returns_without_pausing(
    prefect_server: Server, start_review: Any, registry: SqlRegistry
) -> None:
    registry.people.ensure_org("quiet")
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
    "print('REPORT ' + json.dumps(report.to_dict()))\n"
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
    org = "fresh"
    _seed_fresh_org(org, settings, registry, embedder, tmp_path)
    child = _start_research(org, server_env, tmp_path)
    proc = child.proc
    try:
        run_id = child.wait_until_waiting_for_input(prefect_server, timeout_s=120)
        drafts = [
            d for d in registry.documents.list_documents(org) if d.source_tag == "agent_synthesis"
        ]
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
                "code": code_for(registry, AM, org),
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
    rows = [r for r in registry.audit.audit_trail(org) if r.doc_id in set(approve) | set(reject)]
    decisions = [r for r in rows if r.action != AuditAction.CREATED.value]
    assert (
        sorted(r.action for r in decisions)
        == ["kb.document.approved"] * 2 + ["kb.document.rejected"] * 2
    )
    assert {r.synthesis_run_id for r in rows} == {synthesis_run}


def test_a_decision_between_the_drafts_and_the_pause_waits_for_the_run(
    prefect_server: Server,
    server_env: dict[str, str],
    settings: Settings,
    registry: SqlRegistry,
    embedder: Any,
    tmp_path: Path,
) -> None:
    """The research run's drafts are in the inbox a moment before its review subflow has
    paused (the subflow is still being created, listing its drafts, storing its form). An AM
    who approves one in that moment gets her decision taken by that run once it pauses, not
    applied directly beside it: on 7494260 it was applied directly, and the run then paused on
    a draft already decided (the whole-day browser test failed on this in a clean-clone run)."""
    from kbflow.services.review.inbox import decide

    org = "fresh"
    _seed_fresh_org(org, settings, registry, embedder, tmp_path)
    child = _start_research(org, server_env, tmp_path)
    proc = child.proc
    try:
        drafts: list[Any] = []
        deadline = time.monotonic() + 120
        while len(drafts) < 4 and time.monotonic() < deadline and proc.poll() is None:
            drafts = [d for d in registry.documents.list_documents(org)
                      if d.source_tag == "agent_synthesis"]  # fmt: skip
            time.sleep(0.02)
        assert len(drafts) == 4, child.output()
        with web.client(base_url=prefect_server.api_url, timeout=10) as api:
            found = api.post(
                "/flow_runs/filter", json={"flow_runs": {"name": {"any_": [child.run_name]}}}
            ).json()
        paused = [r for r in found if r["state"]["type"] == "PAUSED"]
        assert not paused, "the review had paused already: this test shows nothing"
        with _inbox(settings, registry, embedder, prefect_server.api_url) as ctx:
            decided = decide(ctx, settings, registry.people.get_user(AM), drafts[0].id, "approve")
        assert decided.via_run is not None, decided.message  # went through the run
        rc, report = child.finish(timeout_s=120)
        assert rc == 0, child.output()
        assert _final_state(prefect_server, UUID(decided.via_run)).is_completed()
        assert report is not None and report["review"]["applied"] == 1
        assert report["review"]["skipped"] == 3
    finally:
        _stop(proc, grace_s=5)
    assert registry.documents.get_document(drafts[0].id).status == DocStatus.APPROVED.value
    assert registry.documents.get_document(drafts[0].id).approved_by == AM


def _start_research(org: str, server_env: dict[str, str], tmp_path: Path) -> ReviewChild:
    """A research run (offline) for ``org`` as its AM, in a child process; its review subflow
    is the child's run to wait for."""
    name = f"research-test-{uuid.uuid4().hex[:12]}"
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    env = {**server_env, "KBFLOW_RESEARCH_OFFLINE": "true"}  # the child is not network-guarded
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen(
            [sys.executable, "-c", RESEARCH_CHILD, name, org, AM],
            cwd=REPO, env=env, stdout=fo, stderr=fe,
        )  # fmt: skip
    return ReviewChild(proc, f"{name}-review", out, err)


def _seed_fresh_org(
    org: str, settings: Settings, registry: SqlRegistry, embedder: Any, tmp_path: Path
) -> None:
    """A new org with its assigned AM and a seed bundle (the brief and a prompt)."""
    from tasks.ingest.extract import file_to_document
    from tasks.research.seed import SeedBundle, seed_bundle

    registry.people.ensure_org(org, "Fresh Foods")
    registry.people.ensure_user(AM, Role.ACCOUNT_MANAGER)
    registry.people.assign_am(org, AM)
    brief = tmp_path / "brief.md"
    brief.write_text(BRIEF)
    with open_vector_store(settings) as store:
        seed_bundle(
            SeedBundle(files=(brief,), prompts=("Focus on parents of babies under one.",)),
            org, registry=registry, store=store, embedder=embedder,
            extract_file=lambda s: file_to_document(s.path),
        )  # fmt: skip


def test_research_command_shows_where_to_review_and_fails_when_nobody_answers(
    prefect_server: Server,
    start_cli: Any,
    settings: Settings,
    registry: SqlRegistry,
    embedder: Any,
    tmp_path: Path,
) -> None:
    """The review subflow's address is printed while it waits; when nobody answers, the
    research run ends Failed with the reason, and the command says so once, without a
    traceback (exit 1, its JSON report on stdout)."""
    org = "fresh-wait"
    # Waited out in full: long enough for this test to see the run paused and the command
    # still running (seen 0.3 s after the notice on two cores at load 9), no longer.
    wait_s = 6
    _seed_fresh_org(org, settings, registry, embedder, tmp_path)
    cli = start_cli(
        "research", "--org", org, "--client-name", "Fresh Foods", "--as", AM,
        "--review-timeout", str(wait_s), "--json",
    )  # fmt: skip
    what, name, review_id, url, _todo = cli.notice().groups()
    assert what == f"decisions on 4 drafts of org {org}" and name.endswith("-review")
    assert url == f"{prefect_server.api_url.removesuffix('/api')}/runs/flow-run/{review_id}"
    cli.wait_until_waiting_for_input(prefect_server, run_id=UUID(review_id))
    assert cli.proc.poll() is None  # printed while waiting

    assert cli.proc.wait(timeout=120) == 1, cli.output()
    err = cli.err.read_text()
    assert "Traceback" not in err, err
    assert err.count(f"no decisions arrived within {wait_s}s") == 1, err
    report = json.loads(cli.out.read_text())
    assert len(report["doc_ids"]) == 4 and "review" not in report
    assert report["review_failed"].startswith(f"no decisions arrived within {wait_s}s")
    assert _final_state(prefect_server, UUID(review_id)).is_failed()
    (run,) = _runs_of(prefect_server, "research", org)
    assert run.state.is_failed(), run.state
    assert run.state.message == (
        f"the review of research run {report['synthesis_run_id']} failed, its 4 drafts stay "
        f"pending_review: {report['review_failed']}"
    )
    assert {
        d.status for d in registry.documents.list_documents(org) if d.id in report["doc_ids"]
    } == {DocStatus.PENDING_REVIEW.value}


def test_research_stopped_by_its_budget_ends_failed_with_the_reason(
    prefect_server: Server, start_cli: Any, registry: SqlRegistry
) -> None:
    org = "broke"
    registry.people.ensure_org(org, "Broke Ltd")
    registry.people.ensure_user(AM, Role.ACCOUNT_MANAGER)
    registry.people.assign_am(org, AM)
    args = ("research", "--org", org, "--client-name", "Broke", "--as", AM, "--budget", "1",
            "--review-timeout", "0")  # fmt: skip
    as_json = start_cli(*args, "--json")
    assert as_json.proc.wait(timeout=180) == 0, as_json.output()  # as before: JSON exits 0
    report = json.loads(as_json.out.read_text())
    assert report["budget_exceeded"] is True and report["doc_ids"] == []
    (run,) = _runs_of(prefect_server, "research", org)
    assert run.state.is_failed(), run.state
    assert run.state.message.startswith(f"research budget exceeded for org {org!r}: ")
    assert "Nothing was persisted" in run.state.message
    assert "Traceback" not in as_json.err.read_text()

    text = start_cli(*args)
    assert text.proc.wait(timeout=180) == 1, text.output()  # as before: text mode exits 1
    assert "budget exceeded" in text.out.read_text()
    assert registry.documents.list_documents(org) == []


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


class _OpenedLate:
    """A vector store opened on first use (the inbox's context, while the review child may
    still need the store for itself)."""

    def __init__(self, settings: Settings) -> None:
        self._settings, self._store, self._stack = settings, None, ExitStack()

    def __getattr__(self, name: str) -> Any:
        if self._store is None:
            self._store = self._stack.enter_context(open_vector_store(self._settings))
        return getattr(self._store, name)

    def close(self) -> None:
        self._stack.close()


@contextmanager
def _inbox(settings: Settings, registry: SqlRegistry, embedder: Any, api_url: str) -> Any:
    """What ``kbflow serve``'s inbox decides with: its context, and the Prefect server known."""
    from kbflow.services.query.context import OpenHome

    store = _OpenedLate(settings)
    before = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = api_url
    try:
        yield OpenHome(settings=settings, registry=registry, store=store, embedder=embedder)
    finally:
        store.close()
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before


def test_input_swapped_after_the_inbox_resumes_is_refused(
    prefect_server: Server,
    start_review: Any,
    drafts: dict[str, str],
    settings: Settings,
    registry: SqlRegistry,
    embedder: Any,
) -> None:
    """Issue 41 #1, the race: amy approves the kiln draft in the inbox, which resumes the paused
    run; another client of the Prefect API reads her input the moment it is stored, deletes it
    and posts its own decisions with what it found there, inside the run's polling window. The
    run refuses the swapped input (the proof covers exactly amy's decisions and this run, and
    the code itself was never there), applies nothing of the attacker's, and amy's decision is
    applied directly; on ad21d18 the attacker's edit and approval were applied as amy's."""
    from kbflow.services.review.inbox import decide

    # The default poll: the window between the resume and the run reading its input, which
    # the attacker must hit, is as wide as users get.
    child = start_review(env={"KBFLOW_REVIEW_POLL_S": "2"})
    run_id = child.wait_until_waiting_for_input(prefect_server)
    stolen: dict[str, Any] = {}
    swapped = threading.Event()

    def attacker() -> None:
        key = f"/flow_runs/{run_id}/input/paused-1-response"
        deadline = time.monotonic() + 60
        with web.client(base_url=prefect_server.api_url, timeout=10) as api:
            while time.monotonic() < deadline:
                found = api.get(key)
                if found.status_code == 200:
                    stolen.update(json.loads(found.json()) if isinstance(found.json(), str)
                                  else found.json())  # fmt: skip
                    api.delete(key)
                    forged = {
                        "code": stolen.get("code", ""),
                        f"doc_{drafts['kiln']}": {"action": "edit", "content": "ATTACKER TEXT",
                                                  "note": ""},
                        f"doc_{drafts['glaze']}": {"action": "approve", "content": "",
                                                   "note": ""},
                    }  # fmt: skip
                    posted = api.post(
                        f"/flow_runs/{run_id}/input",
                        json={"key": "paused-1-response", "value": json.dumps(forged)},
                    )
                    assert posted.status_code < 300, posted.text
                    swapped.set()
                    return
                time.sleep(0.003)

    thief = threading.Thread(target=attacker)
    thief.start()
    with _inbox(settings, registry, embedder, prefect_server.api_url) as ctx:
        amy = registry.people.get_user(AM)
        decided = decide(ctx, settings, amy, drafts["kiln"], "approve")
    thief.join()
    assert swapped.is_set(), "the attacker never saw the input (the test proves nothing)"
    rc, _ = child.finish()
    assert rc == 0, child.output()
    docs = registry.documents.get_documents(drafts.values())
    assert docs[drafts["glaze"]].status == DocStatus.PENDING_REVIEW.value  # never approved
    code = str(stolen.get("code", ""))
    assert code.startswith("kbp1."), f"a bare code went into Prefect's storage: {code!r}"
    state = _final_state(prefect_server, run_id)
    assert state.is_failed() and "not the ones the review code signed" in state.message, state
    assert docs[drafts["kiln"]].status == DocStatus.APPROVED.value  # amy's, applied directly
    assert docs[drafts["kiln"]].approved_by == AM and decided.doc.id == drafts["kiln"]
    with open_vector_store(settings) as store:
        hits = search("kiln firing stoneware degrees", Scope(org_id=ORG), store=store,
                      registry=registry, embedder=embedder)  # fmt: skip
    assert hits and all("ATTACKER" not in h.text for h in hits)
    assert "1,240" in hits[0].text


def test_a_planted_paused_run_gets_no_inbox_decision(
    prefect_server: Server,
    drafts: dict[str, str],
    settings: Settings,
    registry: SqlRegistry,
    embedder: Any,
) -> None:
    """Issue 41 #4: an anonymous client plants a paused ``review`` run for the org whose form
    names amy's draft. The inbox hands her decision to no run kbflow did not record: it is
    applied directly, at once, and the planted run gets nothing (on ad21d18 the inbox resumed
    it with a fresh valid code and waited 30 s for a decision that never came)."""
    from kbflow.services.review.inbox import decide

    with web.client(base_url=prefect_server.api_url, timeout=10) as api:
        flow = api.post("/flows/", json={"name": "review"}).json()
        run = api.post(
            "/flow_runs/",
            json={"flow_id": flow["id"], "parameters": {"org": ORG}, "name": "planted",
                  "state": {"type": "PAUSED", "name": "Paused", "state_details": {
                      "pause_reschedule": False,
                      "run_input_keyset": {"schema": "paused-1-schema",
                                           "response": "paused-1-response",
                                           "description": "paused-1-description"}}}},
        ).json()  # fmt: skip
        schema = {"type": "object", "properties": {"code": {"type": "string"},
                  f"doc_{drafts['kiln']}": {"type": "object"}}}  # fmt: skip
        stored = api.post(
            f"/flow_runs/{run['id']}/input",
            json={"key": "paused-1-schema", "value": json.dumps(schema)},
        )
        assert stored.status_code < 300, stored.text
        assert api.get(f"/flow_runs/{run['id']}").json()["state"]["type"] == "PAUSED"
        started = time.monotonic()
        with _inbox(settings, registry, embedder, prefect_server.api_url) as ctx:
            decided = decide(ctx, settings, registry.people.get_user(AM), drafts["kiln"], "approve")
        took = time.monotonic() - started
        planted = api.get(f"/flow_runs/{run['id']}").json()
        response = api.get(f"/flow_runs/{run['id']}/input/paused-1-response")
    assert decided.via_run is None and took < 15, (decided, took)
    assert registry.documents.get_document(drafts["kiln"]).status == DocStatus.APPROVED.value
    assert planted["state"]["type"] == "PAUSED"  # never resumed
    assert response.status_code == 404  # no code, no decision handed to it
    issued = [r for r in registry.audit.audit_trail(ORG) if r.action == "kb.review_code.issued"]
    assert issued == []


def test_a_cli_decision_on_a_draft_a_paused_run_holds_goes_through_that_run(
    prefect_server: Server,
    start_review: Any,
    start_cli: Any,
    drafts: dict[str, str],
    registry: SqlRegistry,
) -> None:
    """One decision path (issue 43): ``kbflow review approve`` from a shell that knows the
    Prefect server hands the decision to the paused review run kbflow started and recorded,
    found when the decision is made (the run started first here), as the inbox does; the run
    applies it as the AM and completes. Before, the CLI applied it directly and the run went
    on waiting for a draft that was no longer pending."""
    child = start_review()
    run_id = child.wait_until_waiting_for_input(prefect_server)
    cli = start_cli("review", "approve", drafts["kiln"], "--as", AM)
    assert cli.proc.wait(timeout=90) == 0, cli.output()
    assert f"applied by review run {run_id}" in " ".join(cli.output().split()), cli.output()
    # the form's other draft is left as it was: the run applied one decision and completed
    rc, report = child.finish()
    assert rc == 0, child.output()
    assert report is not None
    assert [(o["doc_id"], o["result"]) for o in report["outcomes"]] == [(drafts["kiln"], "applied")]
    assert _final_state(prefect_server, run_id).is_completed()
    docs = registry.documents.get_documents(drafts.values())
    assert (docs[drafts["kiln"]].status, docs[drafts["kiln"]].approved_by) == ("approved", AM)
    assert docs[drafts["glaze"]].status == DocStatus.PENDING_REVIEW.value
    issued = [r for r in registry.audit.audit_trail(ORG) if r.action == "kb.review_code.issued"]
    assert [r.actor for r in issued] == [AM]  # the proof was signed for amy, for this run


def test_an_inbox_decision_finds_a_kbflow_server_started_after_the_service(
    prefect_server: Server,
    start_review: Any,
    drafts: dict[str, str],
    settings: Settings,
    registry: SqlRegistry,
    embedder: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 44: ``kbflow serve`` started before ``kbflow server`` has no PREFECT_API_URL; an
    inbox decision on a draft that a paused run holds must still go through that run, found at
    decision time through the home's record of its running server (before, it was applied
    directly and the run stayed paused until it timed out)."""
    from kbflow.services.orchestration.server import _record_server
    from kbflow.services.query.context import OpenHome
    from kbflow.services.review.inbox import decide

    child = start_review()
    run_id = child.wait_until_waiting_for_input(prefect_server)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # the service started with none
    store = _OpenedLate(settings)
    ctx = OpenHome(settings=settings, registry=registry, store=store, embedder=embedder)
    try:
        _record_server(settings.home, prefect_server.api_url)  # `kbflow server` starts now
        decided = decide(ctx, settings, registry.people.get_user(AM), drafts["kiln"], "approve")
    finally:
        store.close()
    assert decided.via_run == str(run_id), decided
    rc, report = child.finish()
    assert rc == 0, child.output()
    assert report is not None
    assert [(o["doc_id"], o["result"]) for o in report["outcomes"]] == [(drafts["kiln"], "applied")]
    assert _final_state(prefect_server, run_id).is_completed()
    doc = registry.documents.get_document(drafts["kiln"])
    assert (doc.status, doc.approved_by) == ("approved", AM)
