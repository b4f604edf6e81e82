"""Which synthesizer writes the drafts: the configured model (`tasks.llm_choice.provider_of`:
Claude with a key, an OpenAI-compatible server by URL), else the offline evidence packs. The
research flow's task and the research coverage bench choose through this one function."""

from __future__ import annotations

from typing import Any

from tasks.llm_choice import chat_model, provider_of
from tasks.research.claude import AnthropicSynthesizer, ChatSynthesizer
from tasks.research.extractive import ExtractiveSynthesizer
from tasks.research.synthesize import Synthesizer, resolve_model
from tasks.text.embed import embedder_for


def synthesizer_for(settings: Any, model: str | None = None) -> Synthesizer:
    """The synthesizer ``settings`` name, writing with ``model`` where one is asked for. A
    model's SDK does not retry on its own: the caller (the flow's task) is the retry layer.

    Raises:
        ConfigError: the provider is chosen but cannot be used (no key, no model).
    """
    provider = provider_of(settings)
    if provider == "anthropic":
        key = settings.answers.anthropic_api_key
        return AnthropicSynthesizer(key.get_secret_value() if key else "", resolve_model(model),
                                    max_retries=0)  # fmt: skip
    if provider == "openai":
        chat = chat_model(
            settings,
            provider="openai",
            model_id=model,
            attempts=1,
            timeout_s=max(settings.answers.llm_timeout_s, 600.0),
        )
        assert chat is not None  # a provider was named
        return ChatSynthesizer(chat)
    return ExtractiveSynthesizer(embedder_for(settings))
