"""The research request (camelCase or snake_case ids, a positive budget) and the corpus, which
renders each entry with its citation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.models import CorpusEntry, ResearchCorpus, ResearchRequest


def test_request_accepts_camel_and_snake_case() -> None:
    camel = ResearchRequest.model_validate(
        {
            "orgId": "acme",
            "clientName": "Acme Ltd",
            "am_inputs": [{"docId": "d1", "source": "am_file", "title": "T", "snippet": "s"}],
            "budget_cap_tokens": 5000,
            "model": "claude-haiku-4-5",
        }
    )
    snake = ResearchRequest.model_validate(
        {
            "org_id": "acme",
            "client_name": "Acme Ltd",
            "am_inputs": [{"doc_id": "d1", "source": "am_file", "title": "T", "snippet": "s"}],
            "budget_cap_tokens": 5000,
            "model": "claude-haiku-4-5",
        }
    )
    assert camel == snake
    dumped = camel.model_dump(by_alias=True)
    assert dumped["orgId"] == "acme" and dumped["clientName"] == "Acme Ltd"
    assert dumped["am_inputs"][0]["docId"] == "d1"
    assert ResearchRequest.model_validate({"orgId": "a", "clientName": "b"}).budget_cap_tokens == (
        200_000
    )


def test_request_rejects_a_non_positive_budget() -> None:
    with pytest.raises(ValidationError, match="budget_cap_tokens"):
        ResearchRequest.model_validate({"orgId": "a", "clientName": "b", "budget_cap_tokens": 0})


def test_corpus_renders_every_entry_with_its_citation() -> None:
    corpus = ResearchCorpus(
        "Acme",
        (
            CorpusEntry("doc:1", "Handbook", "We speak plainly.", "am_file"),
            CorpusEntry("url:https://acme.example/", "Homepage", "Acme makes anvils.", "public"),
        ),
    )
    assert corpus.cite_ids() == {"doc:1", "url:https://acme.example/"}
    assert corpus.render().startswith("[doc:1] Handbook\nWe speak plainly.")
    assert "[url:https://acme.example/] Homepage" in corpus.render()
