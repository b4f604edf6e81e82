"""The paused review run's form as Prefect stores and renders it, without a Prefect server
(issue 44; the server-backed checks are in test_review.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from prefect._internal.pydantic.v2_schema import create_v2_schema

from flows.review import ReviewDecision, _form_for
from sinks.registry import DocRecord

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
