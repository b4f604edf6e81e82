"""Any OpenAI-compatible Chat Completions endpoint as a chat model, `OpenAIChat`: Ollama, vLLM,
llama.cpp's server, LM Studio, OpenAI, Azure OpenAI, through the ``openai`` SDK. The retry
layer, the call record and the JSON contract are `tasks.llm`'s, as for Claude."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from core.errors import ConfigError
from tasks.llm import DEFAULT_ATTEMPTS, ChatReply, RetryingChat

JsonMode = Literal["schema", "object", "object-schema", "off"]


class OpenAIChat(RetryingChat):
    """Any OpenAI-compatible Chat Completions endpoint through the ``openai`` SDK: Ollama, vLLM,
    llama.cpp's server, LM Studio, OpenAI, Azure OpenAI (its ``/openai/v1/`` URL).

    Args:
        model: the model the server serves (Ollama: ``qwen2.5:7b``; OpenAI: ``gpt-4.1-mini``).
        base_url: the API root, e.g. ``http://localhost:11434/v1``; None: OpenAI's.
        api_key: the key; local servers take none (an empty key is sent as a placeholder).
        client: an ``openai.OpenAI`` to use instead of building one (tests, proxies).
        json_mode: how the JSON shape is asked of the server: ``schema`` (``response_format``
            ``json_schema``, OpenAI's form: the server constrains its output to the caller's
            schema; OpenAI, vLLM, Ollama, LM Studio, llama.cpp's ``llama-server``),
            ``object-schema`` (``json_object`` carrying the schema as ``schema``: the
            llama-cpp-python server's form), ``object`` (``json_object``: any JSON object) or
            ``off`` (the prompt alone). The reply is checked by the caller's validator in every
            mode.
        The rest: `RetryingChat`.
    """

    provider = "OpenAI-compatible"
    key_hint = "check the key named by KBFLOW_LLM_API_KEY_ENV"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str = "",
        client: Any | None = None,
        json_mode: JsonMode = "schema",
        attempts: int = DEFAULT_ATTEMPTS,
        backoff_s: float = 1.0,
        timeout_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(model, attempts=attempts, backoff_s=backoff_s, timeout_s=timeout_s,
                         sleep=sleep)  # fmt: skip
        if json_mode not in ("schema", "object", "object-schema", "off"):
            raise ConfigError(
                f"json_mode must be schema, object, object-schema or off, not {json_mode!r}"
            )
        self.base_url = base_url
        self.json_mode = json_mode
        self._api_key = api_key
        self._client = client.with_options(max_retries=0) if client is not None else None

    def _completions(self) -> Any:
        if self._client is None:
            import openai

            self._client = openai.OpenAI(
                api_key=self._api_key or "no-key", base_url=self.base_url, max_retries=0
            )
        return self._client.chat.completions

    def _response_format(self, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if self.json_mode == "off" or schema is None:
            return None
        if self.json_mode == "object":
            return {"type": "json_object"}
        if self.json_mode == "object-schema":
            return {"type": "json_object", "schema": schema}
        name = str(schema.get("title") or "reply")
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}

    def _request(
        self,
        system: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        schema: dict[str, Any] | None,
    ) -> ChatReply:
        extra: dict[str, Any] = {}
        response_format = self._response_format(schema)
        if response_format is not None:
            extra["response_format"] = response_format
        response = self._completions().create(
            model=self.model_id,
            messages=[{"role": "system", "content": system}, *messages],
            max_tokens=max_tokens,
            temperature=0,
            timeout=self.timeout_s,
            **extra,
        )
        if not response.choices:  # the caller's validator says what is missing
            return ChatReply(text="")
        choice = response.choices[0]
        usage = response.usage
        return ChatReply(
            text=choice.message.content or "",
            input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            truncated=choice.finish_reason == "length",
        )
