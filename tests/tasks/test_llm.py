"""The answer path's chat client: transient-only retries, strict JSON, one repair — through the
real Anthropic SDK on a scripted transport."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import LlmError, LlmReplyInvalid
from core.models import LlmCall
from tasks.llm import AnthropicChat, complete_json, is_transient, parse_json_object, status_of
from tests.anthropic_mock import Recorder, anthropic_client, api_error, message


def chat(recorder: Recorder, **kwargs: Any) -> tuple[AnthropicChat, list[float]]:
    sleeps: list[float] = []
    return AnthropicChat(
        "unused", "claude-haiku-4-5", client=anthropic_client(recorder), sleep=sleeps.append,
        **kwargs,
    ), sleeps  # fmt: skip


def ask(model: AnthropicChat, calls: list[LlmCall]) -> str:
    return model.complete(purpose="answer", prompt_version="v1", system="rules",
                          messages=[{"role": "user", "content": "hi"}], max_tokens=50,
                          calls=calls)  # fmt: skip


@pytest.mark.parametrize(
    "text",
    [
        "HTTP 503 Service Unavailable",
        "error 429: rate limited",
        "upstream returned 502",
        "The read operation timed out",
        "Connection reset by peer",
        "overloaded",
    ],
)
def test_a_message_is_never_classified_by_its_text(text: str) -> None:
    # Only the SDK's typed errors (and the built-in network errors) decide: an exception
    # whose message merely mentions a status or a timeout is permanent.
    assert not is_transient(RuntimeError(text)) and status_of(RuntimeError(text)) is None


def test_a_permanent_api_error_mentioning_503_and_timeout_fails_at_once() -> None:
    import httpx2

    said = "upstream 503: the read operation timed out"
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": said}}
    recorder = Recorder(httpx2.Response(400, json=body))
    model, sleeps = chat(recorder)
    with pytest.raises(LlmError, match="HTTP 400") as info:
        ask(model, [])
    assert len(recorder.requests) == 1 and sleeps == []
    assert not info.value.transient and not info.value.auth


def test_builtin_network_errors_are_transient() -> None:
    assert is_transient(TimeoutError("slow")) and is_transient(ConnectionResetError("reset"))
    assert status_of(TimeoutError("slow")) is None


@pytest.mark.parametrize(
    "failure",
    [
        api_error(429, "rate_limit_error"),
        api_error(500, "api_error"),
        api_error(529, "overloaded_error"),
        api_error(408, "timeout_error"),
        "connect",
        "read-timeout",
    ],
)
def test_transient_errors_are_retried_with_backoff(failure: Any) -> None:
    import httpx2

    bad = {"connect": httpx2.ConnectError("connection reset"),
           "read-timeout": httpx2.ReadTimeout("read")}.get(failure, failure)  # fmt: skip
    recorder = Recorder(bad, bad, message("ok"))
    model, sleeps = chat(recorder, backoff_s=0.5)
    calls: list[LlmCall] = []
    assert ask(model, calls) == "ok"
    assert len(recorder.requests) == 3 and sleeps == [0.5, 1.0]
    assert calls[0].attempts == 3 and calls[0].reply == "ok" and calls[0].error is None


@pytest.mark.parametrize(
    ("status", "kind", "auth"),
    [(400, "invalid_request_error", False), (401, "authentication_error", True),
     (403, "permission_error", True), (404, "not_found_error", False)],
)  # fmt: skip
def test_other_errors_fail_at_once(status: int, kind: str, auth: bool) -> None:
    recorder = Recorder(api_error(status, kind))
    model, sleeps = chat(recorder)
    calls: list[LlmCall] = []
    with pytest.raises(LlmError) as info:
        ask(model, calls)
    assert len(recorder.requests) == 1 and sleeps == []
    assert info.value.auth is auth and not info.value.transient
    assert f"HTTP {status}" in str(info.value)
    assert calls[0].reply is None and kind in (calls[0].error or "")


def test_three_attempts_then_a_transient_failure_is_raised() -> None:
    recorder = Recorder(*(api_error(503, "api_error") for _ in range(3)))
    model, sleeps = chat(recorder)
    with pytest.raises(LlmError, match="after 3 attempts") as info:
        ask(model, [])
    assert info.value.transient and len(recorder.requests) == 3 and len(sleeps) == 2


@pytest.mark.parametrize(
    ("failure", "transient", "auth"),
    [
        (api_error(529, "overloaded_error"), True, False),
        (api_error(429, "rate_limit_error", {"retry-after": "7"}), True, False),
        ("read-timeout", True, False),
        ("connect", True, False),
        (api_error(400, "invalid_request_error"), False, False),
        (api_error(401, "authentication_error"), False, True),
    ],
)
def test_one_attempt_is_one_request_and_says_whether_a_retry_could_help(
    failure: Any, transient: bool, auth: bool
) -> None:
    # Research makes Prefect its retry layer with attempts=1: this layer must then send exactly
    # one request, never sleep, and hand the classification up on the error.
    import httpx2

    bad = {"connect": httpx2.ConnectError("refused"),
           "read-timeout": httpx2.ReadTimeout("read")}.get(failure, failure)  # fmt: skip
    recorder = Recorder(bad)
    model, sleeps = chat(recorder, attempts=1)
    calls: list[LlmCall] = []
    with pytest.raises(LlmError) as info:
        ask(model, calls)
    assert len(recorder.requests) == 1 and sleeps == []
    assert (info.value.transient, info.value.auth, info.value.attempts) == (transient, auth, 1)
    assert calls[0].attempts == 1 and calls[0].reply is None
    if transient:
        assert "a later retry may succeed" in str(info.value)


def test_retry_after_is_honoured_when_longer() -> None:
    recorder = Recorder(api_error(429, "rate_limit_error", {"retry-after": "7"}), message("ok"))
    model, sleeps = chat(recorder, backoff_s=1.0)
    ask(model, [])
    assert sleeps == [7.0]


def _validate(reply: dict[str, Any]) -> int:
    if not isinstance(reply.get("n"), int):
        raise LlmReplyInvalid('"n" must be an integer')
    return int(reply["n"])


def test_one_repair_turn_fixes_a_broken_reply() -> None:
    recorder = Recorder(message("sure! here it is: {n: 1"), message('```json\n{"n": 2}\n```'))
    model, _ = chat(recorder)
    calls: list[LlmCall] = []
    got = complete_json(model, purpose="triage", prompt_version="v1", system="s",
                        messages=[{"role": "user", "content": "q"}], max_tokens=10, calls=calls,
                        validate=_validate)  # fmt: skip
    assert got == 2
    assert [c.purpose for c in calls] == ["triage", "repair"]
    repair = recorder.bodies[1]["messages"]
    assert repair[1] == {"role": "assistant", "content": "sure! here it is: {n: 1"}
    assert "not valid JSON" in repair[2]["content"]


def test_a_second_broken_reply_raises() -> None:
    recorder = Recorder(message('{"n": "x"}'), message("[1, 2]"))
    model, _ = chat(recorder)
    with pytest.raises(LlmReplyInvalid, match=r"invalid twice.*must be an integer.*JSON object"):
        complete_json(model, purpose="triage", prompt_version="v1", system="s",
                      messages=[{"role": "user", "content": "q"}], max_tokens=10, calls=[],
                      validate=_validate)  # fmt: skip
    assert len(recorder.requests) == 2


def test_parse_json_object_rejects_non_objects() -> None:
    assert parse_json_object(' {"a": 1} ') == {"a": 1}
    with pytest.raises(LlmReplyInvalid, match="JSON object, not list"):
        parse_json_object("[1]")
