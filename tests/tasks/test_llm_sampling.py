"""The agent's own model as a chat (`tasks.llm_sampling.SampledChat`): a prompt it has not read
yet is asked for (`SamplingNeeded`), nothing else happens; a prompt it has read returns its reply
and records the call; its reply is checked once, with no repair turn."""

from __future__ import annotations

import json

import pytest

from core.models import LlmCall
from tasks.answer.claude import ClaudeKnowledgeModel
from tasks.answer.contract import Evidence
from tasks.llm_sampling import Sampled, SampledChat, SamplingNeeded

EVIDENCE = [Evidence("c1", "d1", "kb://d1", "Expenses", "Reports are due within 30 days.", 0.8)]
QUESTION = "When are expense reports due?"


def _needed(chat: SampledChat) -> SamplingNeeded:
    with pytest.raises(SamplingNeeded) as info:
        ClaudeKnowledgeModel(chat).answer(QUESTION, EVIDENCE, [])
    return info.value


def test_an_unread_prompt_is_asked_for_with_the_gated_passages_only() -> None:
    need = _needed(SampledChat())
    (message,) = need.messages
    assert (
        "Reports are due within 30 days." in message["content"] and QUESTION in message["content"]
    )
    assert "JSON" in need.system and need.schema is not None and need.max_tokens > 0
    assert need.key == SampledChat.key(need.system, need.messages, need.max_tokens)


def test_a_read_prompt_returns_its_reply_and_records_the_call() -> None:
    need = _needed(SampledChat())
    reply = {"claims": [{"text": "30 days", "chunk_ids": ["c1"],
                         "quote": "Reports are due within 30 days."}]}  # fmt: skip
    chat = SampledChat({need.key: Sampled(json.dumps(reply), "claude-sonnet")})
    calls: list[LlmCall] = []
    (claim,) = ClaudeKnowledgeModel(chat).answer(QUESTION, EVIDENCE, calls)
    assert claim.quote == "Reports are due within 30 days." and claim.chunk_ids == ("c1",)
    assert [c.model for c in calls] == ["mcp-sampling:claude-sonnet"]
    assert chat.model_id == "mcp-sampling:claude-sonnet"


def test_an_invented_quote_is_kept_unverified_without_a_repair_round_trip() -> None:
    need = _needed(SampledChat())
    said = "Reports are due whenever."
    reply = {"claims": [{"text": said, "chunk_ids": ["c1"], "quote": said}]}
    calls: list[LlmCall] = []
    chat = SampledChat({need.key: Sampled(json.dumps(reply), "m")})
    (claim,) = ClaudeKnowledgeModel(chat).answer(QUESTION, EVIDENCE, calls)
    assert claim.quote == "" and "is not in the passage it cites" in claim.unverified
    assert len(calls) == 1  # no repair turn was asked of the agent


def test_a_reply_to_another_prompt_is_not_taken_for_this_one() -> None:
    other = SampledChat.key("another system", [{"role": "user", "content": "x"}], 10)
    need = _needed(SampledChat({other: Sampled('{"claims": []}', "m")}))
    assert need.key != other
