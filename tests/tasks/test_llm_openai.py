"""The OpenAI-compatible provider: the same retry layer, JSON contract and call record as Claude,
through the real ``openai`` SDK on a scripted transport; and which provider the settings pick.
(The same provider against a real llama.cpp server: tests/tasks/test_llm_local_server.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError, LlmError, LlmReplyInvalid
from core.models import LlmCall
from core.settings import Settings
from tasks.llm import AnthropicChat, complete_json
from tasks.llm_choice import chat_model, provider_of
from tasks.llm_openai import OpenAIChat
from tests.anthropic_mock import Recorder, completion, openai_client, openai_error

SCHEMA = {"title": "count", "type": "object", "properties": {"n": {"type": "integer"}},
          "required": ["n"]}  # fmt: skip


def chat(recorder: Recorder, **kwargs: Any) -> tuple[OpenAIChat, list[float]]:
    sleeps: list[float] = []
    model = OpenAIChat("local-model", client=openai_client(recorder), sleep=sleeps.append,
                       **kwargs)  # fmt: skip
    return model, sleeps


def _validate(reply: dict[str, Any]) -> int:
    if not isinstance(reply.get("n"), int):
        raise LlmReplyInvalid('"n" must be an integer')
    return int(reply["n"])


def ask_json(model: OpenAIChat, calls: list[LlmCall]) -> int:
    return complete_json(model, purpose="triage", prompt_version="v1", system="rules",
                         messages=[{"role": "user", "content": "q"}], max_tokens=20,
                         calls=calls, validate=_validate, schema=SCHEMA)  # fmt: skip


def test_the_system_prompt_the_schema_and_temperature_zero_are_sent() -> None:
    recorder = Recorder(completion('{"n": 3}', tokens_in=12, tokens_out=4))
    model, _ = chat(recorder)
    calls: list[LlmCall] = []
    assert ask_json(model, calls) == 3
    body = recorder.bodies[0]
    assert body["messages"][0] == {"role": "system", "content": "rules"}
    assert body["messages"][1] == {"role": "user", "content": "q"}
    assert body["temperature"] == 0 and body["max_tokens"] == 20
    assert body["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "count", "schema": SCHEMA}
    }  # fmt: skip
    assert str(recorder.requests[0].url) == "http://model.test/v1/chat/completions"
    (call,) = calls
    assert (call.model, call.reply, call.input_tokens, call.output_tokens) == (
        "local-model", '{"n": 3}', 12, 4
    )  # fmt: skip


@pytest.mark.parametrize(("mode", "expected"), [("object", {"type": "json_object"}), ("off", None)])
def test_servers_without_json_schema_get_json_object_or_the_prompt_alone(
    mode: Any, expected: Any
) -> None:
    recorder = Recorder(completion('{"n": 1}'))
    model, _ = chat(recorder, json_mode=mode)
    assert ask_json(model, []) == 1
    assert recorder.bodies[0].get("response_format") == expected


def test_a_broken_reply_gets_one_repair_turn_then_fails() -> None:
    recorder = Recorder(completion("n is 1"), completion('{"n": "one"}'))
    model, _ = chat(recorder)
    calls: list[LlmCall] = []
    with pytest.raises(LlmReplyInvalid, match="invalid twice"):
        ask_json(model, calls)
    assert [c.purpose for c in calls] == ["triage", "repair"]
    repair = recorder.bodies[1]["messages"]
    assert repair[-2] == {"role": "assistant", "content": "n is 1"}
    assert "not valid JSON" in repair[-1]["content"]


def test_an_empty_choice_list_or_null_content_is_a_broken_reply_not_a_crash() -> None:
    import httpx2

    empty = httpx2.Response(200, json={"id": "x", "object": "chat.completion", "created": 0,
                                       "model": "m", "choices": []})  # fmt: skip
    recorder = Recorder(empty, completion(None))
    model, _ = chat(recorder)
    with pytest.raises(LlmReplyInvalid, match="invalid twice"):
        ask_json(model, [])


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_transient_statuses_are_retried_with_backoff(status: int) -> None:
    recorder = Recorder(openai_error(status), openai_error(status), completion('{"n": 2}'))
    model, sleeps = chat(recorder, backoff_s=0.5)
    calls: list[LlmCall] = []
    assert ask_json(model, calls) == 2
    assert len(recorder.requests) == 3 and sleeps == [0.5, 1.0]
    assert calls[0].attempts == 3


def test_a_server_that_is_down_is_a_transient_error_saying_so() -> None:
    import httpx2

    recorder = Recorder(*(httpx2.ConnectError("refused") for _ in range(3)))
    model, sleeps = chat(recorder)
    calls: list[LlmCall] = []
    with pytest.raises(LlmError, match="after 3 attempts") as info:
        ask_json(model, calls)
    assert info.value.transient and len(sleeps) == 2
    assert calls[0].reply is None and "APIConnectionError" in (calls[0].error or "")


@pytest.mark.parametrize(("status", "auth"), [(400, False), (401, True), (404, False)])
def test_other_statuses_fail_at_once(status: int, auth: bool) -> None:
    recorder = Recorder(openai_error(status))
    model, sleeps = chat(recorder)
    with pytest.raises(LlmError, match=f"HTTP {status}") as info:
        ask_json(model, [])
    assert len(recorder.requests) == 1 and sleeps == []
    assert info.value.auth is auth and not info.value.transient
    if auth:
        assert "KBFLOW_LLM_API_KEY_ENV" in str(info.value)


def test_retry_after_is_honoured() -> None:
    recorder = Recorder(openai_error(429, headers={"retry-after": "4"}), completion('{"n": 0}'))
    model, sleeps = chat(recorder, backoff_s=1.0)
    ask_json(model, [])
    assert sleeps == [4.0]


def test_a_truncated_reply_says_so() -> None:
    recorder = Recorder(completion('{"n": ', finish="length"))
    model, _ = chat(recorder)
    reply, attempts = model.send(purpose="x", system="s", messages=[{"role": "user",
                                 "content": "q"}], max_tokens=3)  # fmt: skip
    assert reply.truncated and attempts == 1 and reply.text == '{"n": '


# -- which provider the settings pick -------------------------------------------------------------


def _settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for name in ("ANTHROPIC_API_KEY", "KBFLOW_ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings(home=tmp_path)


def test_auto_is_offline_without_a_key_or_a_url(tmp_path: Path, monkeypatch: Any) -> None:
    settings = _settings(tmp_path, monkeypatch)
    assert provider_of(settings) == "none" and chat_model(settings) is None


def test_auto_prefers_claude_by_key_then_a_server_by_url(tmp_path: Path, monkeypatch: Any) -> None:
    url = "http://localhost:8080/v1"
    both = _settings(tmp_path, monkeypatch, ANTHROPIC_API_KEY="sk-x", KBFLOW_LLM_BASE_URL=url,
                     KBFLOW_LLM_MODEL="m")  # fmt: skip
    assert isinstance(chat_model(both), AnthropicChat)
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    url = Settings(home=tmp_path)
    got = chat_model(url)
    assert isinstance(got, OpenAIChat)
    assert (got.base_url, got.model_id, got.json_mode) == ("http://localhost:8080/v1", "m",
                                                           "schema")  # fmt: skip


def test_the_key_is_read_from_the_variable_the_operator_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path, monkeypatch, KBFLOW_LLM_PROVIDER="openai",
                         KBFLOW_LLM_MODEL="gpt-4.1-mini", KBFLOW_LLM_API_KEY_ENV="MY_LLM_KEY",
                         MY_LLM_KEY="sk-mine", OPENAI_API_KEY="sk-not-this")  # fmt: skip
    got = chat_model(settings)
    assert isinstance(got, OpenAIChat) and got._api_key == "sk-mine"
    # The key is never a setting of its own: nothing in the settings' dump holds it.
    assert "sk-mine" not in json.dumps(settings.model_dump(mode="json"))


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"KBFLOW_LLM_PROVIDER": "openai"}, "KBFLOW_LLM_MODEL is not set"),
        ({"KBFLOW_LLM_PROVIDER": "anthropic"}, "ANTHROPIC_API_KEY is not set"),
    ],
)
def test_a_chosen_provider_that_cannot_work_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        chat_model(_settings(tmp_path, monkeypatch, **env))


def test_the_knowledge_model_answers_through_an_openai_compatible_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kbflow.services.query.answers import knowledge_model
    from tasks.answer.contract import Evidence

    reply = {"claims": [{"text": "The Pro plan costs 49 EUR a month.", "chunk_ids": ["c1"],
                         "quote": "Pro | 49 EUR / month"}]}  # fmt: skip
    recorder = Recorder(completion(json.dumps(reply)))
    settings = _settings(tmp_path, monkeypatch, KBFLOW_LLM_MODEL="local-model")
    model, why = knowledge_model(settings, client=openai_client(recorder))
    assert why is None and model is not None and model.model_id == "local-model"
    evidence = [Evidence("c1", "d1", "kb://d1", "Plans",
                         "| plan | price |\n|---|---|\n| Pro | 49 EUR / month |", 0.8)]  # fmt: skip
    calls: list[LlmCall] = []
    (claim,) = model.answer("What does the Pro plan cost?", evidence, calls)
    assert claim.chunk_ids == ("c1",) and claim.quote and "49 EUR" in claim.quote
    assert recorder.bodies[0]["response_format"]["json_schema"]["name"] == "answer"
