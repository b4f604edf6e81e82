"""The paused review run's form as Prefect stores and renders it, and its refusal of a code,
without a Prefect server (issue 44; the server-backed checks are in test_review.py)."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from prefect._internal.pydantic.v2_schema import create_v2_schema

from core.models import Role
from core.settings import Settings
from flows.review import ReviewDecision, _form_for
from sinks.registry import DocRecord, SqlRegistry
from tasks.review.codes import sign_decisions
from tasks.review.steps import Proven, prove_reviewer_task

ORG, AM = "acme", "amy"


def _draft(doc_id: str, title: str) -> DocRecord:
    now = dt.datetime.now(dt.UTC)
    return DocRecord(
        id=doc_id, org_id=ORG, collection_path="kb", source_key=f"k-{doc_id}", title=title,
        uri=f"kb://{ORG}/{doc_id}", content_hash="h", version=1, status="pending_review",
        source_tag="agent_synthesis", synthesis_run_id="r", audience=None, effective_date=None,
        parse_status="ingested", chunk_count=1, created_at=now, updated_at=now,
    )  # fmt: skip


@pytest.mark.parametrize("review_url", [None, "https://kb.example.com/"])
def test_the_form_requires_the_code_and_links_each_draft_to_its_inbox_page(
    review_url: str | None,
) -> None:
    drafts = [_draft("d1" * 16, "Brand voice"), _draft("d2" * 16, "Contacts")]
    form = _form_for(ORG, drafts, review_url)
    schema = create_v2_schema(form.__name__, model_base=form)  # what Prefect stores
    # The Prefect UI labels every property not in `required` "(Optional)".
    assert schema["required"] == ["code"]
    assert "optional" not in schema["properties"]["code"]["title"].lower()
    for doc in drafts:
        described = schema["properties"][f"doc_{doc.id}"]["description"]
        page = f"/review/drafts/{doc.id}"
        assert (f"https://kb.example.com{page}" if review_url else f"`{page}`") in described
        assert f"kbflow review show {doc.id}" in described
    # A missing code still reaches the run (which then fails with nothing applied).
    assert form.model_validate({}).code == ""
    assert ReviewDecision.model_validate({"decisions": []}).code == ""


def test_a_used_code_is_refused_in_one_line_that_says_what_to_do(
    settings: Settings, registry: SqlRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    registry.people.ensure_org(ORG, am_user_id=AM)
    registry.people.ensure_user(AM, Role.ACCOUNT_MANAGER)
    code = registry.logins.issue_review_code(AM, ORG).code
    registry.logins.redeem_review_code(code, org_id=ORG, flow_run_id="an-earlier-run")
    run_input = {"code": "", "decisions": [{"doc_id": "x", "action": "approve"}]}
    proof = sign_decisions(code, "this-run", run_input)
    with caplog.at_level(logging.DEBUG):
        proven = prove_reviewer_task.fn(proof, ORG, "this-run", run_input, settings)
    assert proven.reviewer is None and proven.refused is not None
    assert "already used" in proven.refused
    assert "kbflow review code" in proven.refused and "review inbox" in proven.refused
    assert "Traceback" not in caplog.text
    assert isinstance(proven, Proven)
