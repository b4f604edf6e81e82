"""The calling agent's own model as a chat model, reached through MCP sampling (`SampledChat`):
kbflow asks the agent to read a prompt (`SamplingNeeded`), and runs the turn again with what
its model replied (`Sampled`). The MCP server's side: `kbflow.api.mcp`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from core.models import LlmCall


class SamplingNeeded(Exception):
    """This prompt must be read by the calling agent's own model first (MCP sampling): the
    caller asks the agent for it and runs the turn again with the reply (`SampledChat`).
    Nothing of the turn is recorded before then."""

    def __init__(
        self,
        key: str,
        system: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        schema: dict[str, Any] | None,
    ) -> None:
        super().__init__(f"the agent's model must read prompt {key[:12]} first")
        self.key = key
        self.system = system
        self.messages = messages
        self.max_tokens = max_tokens
        self.schema = schema


@dataclass(frozen=True)
class Sampled:
    """What the agent's model replied to one prompt (by `SampledChat.key`)."""

    text: str
    model: str


class SampledChat:
    """The calling agent's own model, reached through MCP sampling: one prompt per round trip.

    ``replies`` holds what the agent's model has replied so far, by prompt key. A prompt with
    no reply raises `SamplingNeeded`; the MCP tool sends it to the agent and calls again. The
    reply is the agent's and untrusted like any model's: the caller checks every quote against
    the gated passages. A broken reply gets no repair round trip (`repairs`): the turn hands
    over the passages' own text instead ("maybe").
    """

    provider = "MCP sampling"
    repairs = False
    """`complete_json` asks no repair turn of it: its first reply is checked as a repaired one."""

    def __init__(self, replies: dict[str, Sampled] | None = None) -> None:
        self.replies = dict(replies or {})
        models = sorted({r.model for r in self.replies.values()})
        self.model_id = "mcp-sampling" + (f":{models[0]}" if len(models) == 1 else "")

    @staticmethod
    def key(system: str, messages: list[dict[str, str]], max_tokens: int) -> str:
        """The prompt's identity: what a reply must answer, exactly."""
        canonical = json.dumps([system, messages, max_tokens], sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def complete(
        self,
        *,
        purpose: str,
        prompt_version: str,
        system: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        calls: list[LlmCall],
        schema: dict[str, Any] | None = None,
    ) -> str:
        key = self.key(system, messages, max_tokens)
        got = self.replies.get(key)
        if got is None:
            raise SamplingNeeded(key, system, messages, max_tokens, schema)
        calls.append(
            LlmCall(
                purpose=purpose,
                model=f"mcp-sampling:{got.model}",
                prompt_version=prompt_version,
                system=system,
                messages=tuple(dict(m) for m in messages),
                reply=got.text,
                error=None,
                attempts=1,
            )
        )
        return got.text
