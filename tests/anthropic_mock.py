"""The providers' real SDKs (Anthropic, OpenAI) on a scripted ``httpx2.MockTransport``: no network,
every request kept."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Handler = Callable[[Any], Any]


def message(text: str, tokens_in: int = 1000, tokens_out: int = 500, stop: str = "end_turn") -> Any:
    """A successful Messages API response carrying ``text``."""
    import httpx2

    return httpx2.Response(
        200,
        json={
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": "claude-haiku-4-5",
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out},
        },
    )


def api_error(status: int, kind: str, headers: dict[str, str] | None = None) -> Any:
    """An Anthropic error response (``kind`` as the API names it, e.g. ``overloaded_error``)."""
    import httpx2

    body = {"type": "error", "error": {"type": kind, "message": f"{kind} (test)"}}
    return httpx2.Response(status, json=body, headers=headers)


class Recorder:
    """Serves scripted responses (or raises scripted exceptions) and keeps every request."""

    def __init__(self, *responses: Any) -> None:
        self.responses = list(responses)
        self.requests: list[Any] = []
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: Any) -> Any:
        self.requests.append(request)
        self.bodies.append(json.loads(request.content))
        response = self.responses.pop(0)
        if isinstance(response, Exception):
            raise response
        return response


def anthropic_client(recorder: Recorder) -> Any:
    """A real ``anthropic.Anthropic`` whose HTTP goes to ``recorder``. The SDK's default
    ``max_retries`` is left on: the code under test must switch it off itself."""
    import anthropic
    import httpx2

    return anthropic.Anthropic(
        api_key="t", http_client=httpx2.Client(transport=httpx2.MockTransport(recorder))
    )


def completion(
    text: str | None, tokens_in: int = 100, tokens_out: int = 50, finish: str = "stop"
) -> Any:
    """A successful OpenAI Chat Completions response carrying ``text``."""
    import httpx2

    return httpx2.Response(
        200,
        json={
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": "local-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish,
                }
            ],
            "usage": {
                "prompt_tokens": tokens_in,
                "completion_tokens": tokens_out,
                "total_tokens": tokens_in + tokens_out,
            },
        },
    )


def openai_error(status: int, message: str = "test", headers: dict[str, str] | None = None) -> Any:
    """An OpenAI-style error response."""
    import httpx2

    body = {"error": {"message": message, "type": "server_error", "code": None}}
    return httpx2.Response(status, json=body, headers=headers)


def openai_client(recorder: Recorder) -> Any:
    """A real ``openai.OpenAI`` whose HTTP goes to ``recorder`` (the SDK's retries left on, as
    above)."""
    import httpx2
    import openai

    return openai.OpenAI(
        api_key="t",
        base_url="http://model.test/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(recorder)),
    )
