"""One decision path: a review decision from the CLI (``kbflow review …``), HTTP
(``POST /v1/admin/documents/{id}/…``), the inbox (``/review/drafts/{id}/…``) and the Prefect
review form (the rows a paused run applies) all reach `tasks.review.decisions.apply_decision`,
the one place a verb becomes a state-machine transition; the first three through
`kbflow.services.review.decisions.decide`, which holds the note rules and the hand-off to a
paused run. Refusals are audited the same way from each surface.

Everything runs in this process so that one spy sees every call: the CLI through typer's
runner first (the embedded store has one owner, and once the service holds it the service is
that owner), then ``kbflow serve``'s app under uvicorn in a thread, over real HTTP.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from typer.testing import CliRunner

from core.models import AuditAction, DocStatus, Role
from core.settings import Settings
from tests import web
from tests.conftest import index_records

pytestmark = pytest.mark.integration

PASSWORD = "reads-every-draft-twice-7"
DRAFT = """## Who we are

Larkspur Cycles builds city bikes in Leeds.

## Prices

| Model | Price | Warranty |
|---|---|---|
| Wren | 899 EUR | 5 years |
| Kestrel | 2,400 EUR | 5 years |

- Write plainly and warmly.
- Never promise delivery dates.
"""


@pytest.fixture
def home(settings: Settings, embedder: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.registry import SqlRegistry

    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # no paused run: every one applies
    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)
    try:
        for org in ("larkspur", "globex"):
            registry.people.ensure_org(org)
        registry.people.ensure_user("root", Role.SUPERADMIN)
        registry.people.ensure_user("amy", Role.ACCOUNT_MANAGER)
        registry.people.ensure_user("gus", Role.ACCOUNT_MANAGER)
        registry.people.assign_am("larkspur", "amy")
        registry.people.assign_am("globex", "gus")
        registry.logins.set_password("amy", PASSWORD, actor="root")
        drafts = index_records(
            [{"key": f"d{i}", "title": f"Brand voice {i}", "text": DRAFT} for i in range(5)],
            org="larkspur", status=DocStatus.PENDING_REVIEW, store=store, registry=registry,
            embedder=embedder,
        )  # fmt: skip
        token = registry.tokens.create_token(user_id="amy", expires_at=None, created_by="root")[1]
        gus = registry.tokens.create_token(user_id="gus", expires_at=None, created_by="root")[1]
    finally:
        store.close()
        registry.close()
    return {"drafts": drafts, "token": token, "gus": gus}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple[str, ...]]]:
    """Every call of the service function (with its surface) and of the transition function
    (with its verb), wherever each name is bound."""
    from kbflow.services.review import decisions as service
    from tasks.review import decisions as bottom

    seen: dict[str, list[tuple[str, ...]]] = {"decide": [], "apply": []}
    real_decide, real_apply = service.decide, bottom.apply_decision

    def decide(*args: Any, **kw: Any) -> Any:
        seen["decide"].append((kw["surface"], str(args[6]), args[5]))
        return real_decide(*args, **kw)

    def apply(verb: Any, doc_id: str, actor: str, **kw: Any) -> Any:
        seen["apply"].append((str(verb), doc_id, actor))
        return real_apply(verb, doc_id, actor, **kw)

    monkeypatch.setattr(service, "decide", decide)
    monkeypatch.setattr(service, "apply_decision", apply)
    monkeypatch.setattr(bottom, "apply_decision", apply)
    return seen


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:2000]
    return found.group(1)


def _status(settings: Settings, doc_id: str) -> str | None:
    from sinks.registry import SqlRegistry

    registry = SqlRegistry.open(settings.registry_url)
    try:
        return registry.documents.get_document(doc_id).status
    finally:
        registry.close()


def _denied(settings: Settings) -> list[str]:
    from sinks.registry import SqlRegistry

    registry = SqlRegistry.open(settings.registry_url)
    try:
        rows = registry.audit.audit_trail("larkspur", None, last=100)
        denied = [r for r in rows if r.action == AuditAction.DENIED.value]
        return [str((r.after or {}).get("attempted")) for r in denied]
    finally:
        registry.close()


def test_cli_http_inbox_and_the_prefect_form_take_one_decision_path(
    settings: Settings, home: dict[str, Any], calls: dict[str, list[tuple[str, ...]]],
    request: Any,
) -> None:  # fmt: skip
    from kbflow.cli import app
    from tasks.review.decisions import Decision
    from tasks.review.steps import apply_decisions_task

    d = home["drafts"]
    done = CliRunner().invoke(app, ["review", "approve", d[0], "--as", "amy", "--json"])
    assert done.exit_code == 0, done.output
    refused = CliRunner().invoke(app, ["review", "approve", d[4], "--as", "gus"])
    assert refused.exit_code != 0 and _status(settings, d[4]) == "pending_review"

    base = request.getfixturevalue("app_server")
    auth = {"Authorization": f"Bearer {home['token']}"}
    rejected = web.post(f"{base}/v1/admin/documents/{d[1]}/reject", headers=auth,
                          json={"note": "off brand"}, timeout=60)  # fmt: skip
    assert rejected.status_code == 200, rejected.text
    other = {"Authorization": f"Bearer {home['gus']}"}
    forbidden = web.post(f"{base}/v1/admin/documents/{d[4]}/approve", headers=other,
                           json={}, timeout=60)  # fmt: skip
    assert forbidden.status_code == 403, forbidden.text

    with web.client(base_url=base, follow_redirects=False, timeout=60) as browser:
        page = browser.get("/review/login")
        login = browser.post("/review/login", data={"user": "amy", "password": PASSWORD,
                                                    "csrf": _csrf(page.text)})  # fmt: skip
        assert login.status_code == 303, login.text
        csrf = _csrf(browser.get(f"/review/drafts/{d[2]}").text)
        approved = browser.post(f"/review/drafts/{d[2]}/approve",
                                data={"csrf": csrf, "note": "reads well"})  # fmt: skip
        assert approved.status_code == 303, approved.text

    # The Prefect review form's rows, as the paused run applies them once the reviewer's
    # proof holds (`flows.review`: prove-reviewer, then apply-review-decisions).
    edited = DRAFT.replace("Leeds", "Leeds and York")
    (outcome,) = apply_decisions_task.fn(
        [Decision(d[3], "edit", content=edited, note="added York")], "amy", settings
    )
    assert outcome.applied, outcome

    assert calls["decide"] == [
        ("cli", "approve", d[0]),
        ("cli", "approve", d[4]),
        ("http", "reject", d[1]),
        ("http", "approve", d[4]),
        ("inbox", "approve", d[2]),
    ]
    assert calls["apply"] == [
        ("approve", d[0], "amy"),
        ("reject", d[1], "amy"),
        ("approve", d[2], "amy"),
        ("edit", d[3], "amy"),
    ]  # the refused ones never reach a transition
    assert [_status(settings, x) for x in d] == [
        "approved", "rejected", "approved", "approved", "pending_review"
    ]  # fmt: skip
    denied = _denied(settings)
    assert sum(f"approve {d[4]}" in row for row in denied) == 2, denied  # CLI and HTTP alike


def test_the_note_rules_are_one_rule_with_one_message(
    settings: Settings, home: dict[str, Any], request: Any
) -> None:
    """A withdraw with a blank note is refused with the same words from the CLI and HTTP; a
    script may reject without a note, a person at the inbox's form says why."""
    from kbflow.cli import app

    d = home["drafts"]
    assert CliRunner().invoke(app, ["review", "approve", d[0], "--as", "amy"]).exit_code == 0
    blank = CliRunner().invoke(app, ["review", "withdraw", d[0], "--as", "amy", "--note", " "])
    assert blank.exit_code != 0 and _status(settings, d[0]) == "approved"
    message = "withdrawing needs a note saying why (it is audited)"
    assert message in " ".join(blank.output.split()), blank.output
    assert CliRunner().invoke(app, ["review", "reject", d[1], "--as", "amy"]).exit_code == 0

    base = request.getfixturevalue("app_server")
    auth = {"Authorization": f"Bearer {home['token']}"}
    refused = web.post(f"{base}/v1/admin/documents/{d[0]}/withdraw", headers=auth,
                         json={"note": " "}, timeout=60)  # fmt: skip
    assert refused.status_code == 422 and refused.json()["detail"] == message
    with web.client(base_url=base, follow_redirects=False, timeout=60) as browser:
        page = browser.get("/review/login")
        browser.post("/review/login", data={"user": "amy", "password": PASSWORD,
                                            "csrf": _csrf(page.text)})  # fmt: skip
        csrf = _csrf(browser.get(f"/review/drafts/{d[2]}").text)
        silent = browser.post(f"/review/drafts/{d[2]}/reject", data={"csrf": csrf})
        assert silent.status_code == 400 and "rejecting needs a note saying why" in silent.text
    assert _status(settings, d[2]) == "pending_review"


def _no_model() -> Any:
    raise AssertionError("an approval embeds nothing")


def test_a_run_that_cannot_be_resumed_leaves_the_decision_to_be_applied_directly(
    settings: Settings, home: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recorded paused run holds the draft, but the Prefect server refuses to resume it
    (it went away, or the run stopped being paused between the look and the resume): the
    decision is applied directly instead of failing (before: the error reached the caller
    and nothing was decided)."""
    from core.errors import JobRunnerUnavailable
    from kbflow.services.orchestration import prefect_api
    from kbflow.services.review.decisions import decide
    from sinks.registry import SqlRegistry
    from tasks.review.decisions import Verb
    from tasks.review.machine import held

    d = home["drafts"]
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    monkeypatch.setattr(prefect_api, "paused_review_run", lambda *a: "run-1")

    def refused(*args: Any) -> None:
        raise JobRunnerUnavailable("the Prefect server at http://127.0.0.1:9/api did not answer")

    monkeypatch.setattr(prefect_api, "resume_run", refused)
    from sinks.qdrant_edge import QdrantEdgeStore

    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=5)
    try:
        registry.review_runs.record_review_run("run-1", "larkspur", [d[0]])
        decided = decide(settings, registry, held(store), _no_model, "amy", d[0], Verb.APPROVE,
                         surface="cli")  # fmt: skip
        assert decided.via_run is None and decided.doc.status == "approved", decided
        assert registry.documents.get_document(d[0]).approved_by == "amy"
    finally:
        store.close()
        registry.close()
