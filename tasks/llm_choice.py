"""Which model reads for kbflow: `provider_of` picks the provider from the settings
(``KBFLOW_LLM_PROVIDER``: Claude by key, an OpenAI-compatible server by URL, or none: offline)
and `chat_model` builds its chat (`tasks.llm.AnthropicChat`, `tasks.llm_openai.OpenAIChat`)."""

from __future__ import annotations

import os
from typing import Any, Literal

from core.errors import ConfigError
from tasks.llm import DEFAULT_ATTEMPTS, AnthropicChat, RetryingChat
from tasks.llm_openai import OpenAIChat

Provider = Literal["anthropic", "openai", "none"]


def provider_of(settings: Any, forced: str | None = None) -> Provider:
    """Which provider reads: ``forced`` when given, else ``KBFLOW_LLM_PROVIDER``; ``auto`` is
    anthropic when its key is set, else openai when ``KBFLOW_LLM_BASE_URL`` is set, else none."""
    answers = settings.answers
    choice = forced or answers.llm_provider
    if choice == "auto":
        if answers.anthropic_api_key and answers.anthropic_api_key.get_secret_value():
            return "anthropic"
        return "openai" if answers.llm_base_url else "none"
    if choice not in ("anthropic", "openai", "none"):
        raise ConfigError(f"the LLM provider must be anthropic, openai or none, not {choice!r}")
    return choice  # type: ignore[return-value]


def chat_model(
    settings: Any,
    *,
    provider: str | None = None,
    model_id: str | None = None,
    client: Any | None = None,
    attempts: int = DEFAULT_ATTEMPTS,
    timeout_s: float | None = None,
) -> RetryingChat | None:
    """The configured chat model (`provider_of`), or None when none is (offline).

    Args:
        provider: this provider, whatever the settings say.
        model_id: this model, whatever the settings say (replay of a recorded turn).
        client: the provider SDK's client to use (tests, proxies).

    Raises:
        ConfigError: the provider is chosen but cannot be used (no key, no model), with what
            to set.
    """
    answers = settings.answers
    chosen = provider_of(settings, provider)
    timeout = timeout_s or answers.llm_timeout_s
    if chosen == "none":
        return None
    if chosen == "anthropic":
        key = answers.anthropic_api_key.get_secret_value() if answers.anthropic_api_key else ""
        if not key and client is None:
            raise ConfigError(
                "the reading model is Claude but ANTHROPIC_API_KEY is not set — set it, point "
                "KBFLOW_LLM_BASE_URL at an OpenAI-compatible server, or KBFLOW_ANSWER_MODEL="
                "extractive to answer offline"
            )
        model = model_id or answers.llm_model or answers.answer_llm
        return AnthropicChat(key, model, client=client, attempts=attempts, timeout_s=timeout)
    model = model_id or answers.llm_model
    if not model:
        raise ConfigError(
            "the reading model is an OpenAI-compatible server but KBFLOW_LLM_MODEL is not set "
            "— set it to the model the server serves (e.g. qwen2.5:7b-instruct for Ollama)"
        )
    env = (answers.llm_api_key_env or "").strip()
    return OpenAIChat(
        model,
        base_url=answers.llm_base_url,
        api_key=os.environ.get(env, "") if env else "",
        client=client,
        json_mode=answers.llm_json_mode,
        attempts=attempts,
        timeout_s=timeout,
    )


def client_provider(client: Any) -> Provider:
    """The provider whose SDK made ``client`` (an ``anthropic.Anthropic`` or ``openai.OpenAI``)."""
    return "openai" if type(client).__module__.split(".")[0] == "openai" else "anthropic"


PROVIDERS = ("none", "anthropic", "openai")


def provider_settings(settings: Any, provider: str | None) -> Any:
    """``settings`` with ``provider`` reading (an eval's ``--provider``); None keeps them.

    Raises:
        ConfigError: ``provider`` is not one of `PROVIDERS`.
    """
    if provider is None:
        return settings
    if provider not in PROVIDERS:
        raise ConfigError(f"--provider must be one of {', '.join(PROVIDERS)}, not {provider!r}")
    model = "extractive" if provider == "none" else provider
    return settings.replace(llm_provider=provider, answer_model=model)


def reader_of(settings: Any) -> Provider:
    """Who reads answers under ``settings``: ``none`` (offline) or the provider's name."""
    choice = settings.answers.answer_model
    if choice == "extractive":
        return "none"
    return provider_of(settings, choice if choice != "auto" else None)
