"""A model writes the drafts: the prompts, the request (one retry layer: `tasks.llm.RetryingChat`,
or the Prefect task), parsing the JSON reply, and one repair turn. `ChatSynthesizer` takes any
provider's chat (`tasks.llm.chat_model`); `AnthropicSynthesizer` builds Claude's."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError, LlmError, SynthesisFailed, SynthesisInvalid
from core.models import DraftDocument, ResearchCorpus, SynthesisResult
from tasks.llm import AnthropicChat, RetryingChat, is_api_error, status_of
from tasks.research.steering import PROMPT_SOURCE
from tasks.research.synthesize import (
    BRAND_VOICE,
    COMPLIANCE,
    CONTACTS,
    DEFAULT_MODEL,
    DOC_TITLES,
    PRODUCT,
    short,
    validate_drafts,
)

log = logging.getLogger(__name__)

SYSTEM_PROMPT = f"""\
You write the first draft of a client's knowledge base, which AI agents will use when they \
speak for the client. Using only the research corpus in the user message, write exactly four \
Markdown documents:

1. {BRAND_VOICE} — how the client talks to customers: tone, style, words to use and avoid. \
It must have a "## Golden examples" section (copy to imitate) and a "## Anti-examples" section \
(phrasing to avoid). Every list item in those sections is an example taken from the corpus and \
ends with its citation.
2. {PRODUCT} — the products and services, prices or plans where stated, the target audience, \
and the current status and availability.
3. {COMPLIANCE} — only the risk topics the corpus itself raises (privacy, legal, regulatory, \
safety, warranty, claims). Never add a risk, law or advice the corpus does not mention; if it \
mentions none, say so in one sentence citing the closest entry.
4. {CONTACTS} — the people the corpus names, with roles, contact details and escalation \
paths exactly as stated. Never invent a name, e-mail address or phone number.

Rules:
- Cite every claim with the id of the corpus entry it comes from, in square brackets exactly as \
listed, e.g. [doc:abc123]. Use only the listed ids; never invent or alter one.
- Every document cites at least once. If the corpus has nothing for a document, say so in one \
sentence citing the closest entry.
- End every document with this footer, and nothing after it:
---
## Citations
- [<id>] <entry title>
with one line for each id the document cites.
- Reply with ONE JSON object and nothing else (no prose, no code fence):
{{"documents": [{{"filename": "...", "title": "...", "content": "..."}}]}}
with the four filenames above, in that order; "content" is the whole Markdown document.
"""


REPAIR_PROMPT = """\
Your reply could not be used: {error}
Reply with the corrected JSON object only — all four documents, every problem fixed — and \
nothing else."""


def user_message(corpus: ResearchCorpus) -> str:
    """The user turn: the account manager's instructions (their prompts, which steer and are
    never cited), the allowed citation ids, then the rendered corpus of every other entry."""
    prompts = [e for e in corpus.entries if e.source == PROMPT_SOURCE]
    sources = ResearchCorpus(
        corpus.client_name, tuple(e for e in corpus.entries if e.source != PROMPT_SOURCE)
    )
    ids = "\n".join(f"- {e.citation} {short(e.title, 200)}" for e in sources.entries)
    steer = ""
    if prompts:
        text = "\n\n".join(e.text.strip() for e in prompts)
        steer = (
            "The account manager's instructions (what to focus on, leave out, and who the "
            "audience is). Follow them; they are not facts: never quote or cite them.\n"
            f"<instructions>\n{text}\n</instructions>\n\n"
        )
    return (
        f"Client: {corpus.client_name}\n\n{steer}"
        f"Citation ids you may use:\n{ids}\n\n"
        f"Research corpus (each entry starts with its citation id):\n"
        f"<corpus>\n{sources.render()}\n</corpus>"
    )


def parse_drafts(reply: str) -> list[DraftDocument]:
    """The documents in a model reply: one JSON object, optionally inside a ```json fence.

    Raises:
        SynthesisInvalid: the reply is not that JSON object, or an item lacks a field.
    """
    text = reply.strip()
    fence = re.search(r"```(?:json)?\s*\n(.*?)\n?```", text, re.S)
    if fence:
        text = fence.group(1).strip()
    if not text.startswith("{") and "{" in text:  # tolerate a sentence before/after the object
        text = text[text.find("{") : text.rfind("}") + 1]
    try:
        data = json.loads(text, strict=False)  # a raw line break inside a string is text
    except json.JSONDecodeError as exc:
        raise SynthesisInvalid(
            f"the reply is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from exc
    items = data.get("documents") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise SynthesisInvalid(
            'the reply must be a JSON object with a "documents" list; '
            f"got {type(data).__name__} with keys {sorted(data) if isinstance(data, dict) else []}"
        )
    docs = []
    for n, item in enumerate(items):
        if not isinstance(item, dict) or not all(
            isinstance(item.get(key), str) for key in ("filename", "content")
        ):
            raise SynthesisInvalid(
                f'documents[{n}] must be an object with string "filename", "title" and "content"'
            )
        filename = item["filename"].strip()
        title = item.get("title")
        if not isinstance(title, str) or not title.strip():
            title = DOC_TITLES.get(filename, filename)
        docs.append(DraftDocument(filename=filename, title=title.strip(), content=item["content"]))
    return docs


DRAFTS_SCHEMA: dict[str, Any] = {
    "title": "drafts",
    "type": "object",
    "properties": {
        "documents": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "filename": {"type": "string"},
                    "title": {"type": "string"},
                    "content": {"type": "string"},
                },
                "required": ["filename", "title", "content"],
            },
        }
    },
    "required": ["documents"],
}
"""The reply's JSON Schema, for providers that constrain their output to one."""


@dataclass(frozen=True)
class _Reply:
    text: str
    tokens: int  # input + output, from the response's usage
    truncated: bool  # stopped at max_tokens


class ChatSynthesizer:
    """A chat model writes the drafts: one request, and at most one repair request.

    Transient failures (429, 408/409, 5xx incl. 529 overloaded, connection errors and timeouts)
    are retried with exponential backoff by the chat's one retry layer (`tasks.llm.RetryingChat`;
    the SDKs' own retries are switched off). A reply that is not valid JSON or breaks
    :func:`validate_drafts` gets one repair request carrying the exact error; a second failure
    raises :class:`SynthesisFailed`.
    """

    def __init__(self, chat: RetryingChat) -> None:
        self._chat = chat
        self.model_id = chat.model_id

    def _call(self, messages: list[dict[str, str]], max_output_tokens: int) -> _Reply:
        """One request; transient errors are retried by `RetryingChat.send`."""
        started = time.perf_counter()
        try:
            reply, _ = self._chat.send(
                purpose="synthesis",
                system=SYSTEM_PROMPT,
                messages=messages,
                max_tokens=max_output_tokens,
                schema=DRAFTS_SCHEMA,
            )
        except LlmError as exc:
            cause = exc.__cause__
            if not is_api_error(cause):
                raise (cause or exc) from None  # not the API's answer: a bug, raised as it came
            provider = self._chat.provider
            if not exc.transient:
                raise SynthesisFailed(
                    f"{provider} rejected the synthesis request for model {self.model_id!r} "
                    f"(HTTP {status_of(cause) if cause else None}): {cause} — check the API "
                    "key, the model id and max_output_tokens; this error is not retried"
                ) from cause
            raise SynthesisFailed(
                f"{provider} still failing after {exc.attempts} attempt(s) "
                f"(model {self.model_id!r}): {cause} — try again later",
                transient=True,
            ) from cause
        log.info(
            "%s %s: %d tokens in, %d out, truncated=%s, %.1fs",
            self._chat.provider,
            self.model_id,
            reply.input_tokens,
            reply.output_tokens,
            reply.truncated,
            time.perf_counter() - started,
        )
        return _Reply(
            text=reply.text,
            tokens=reply.input_tokens + reply.output_tokens,
            truncated=reply.truncated,
        )

    def _drafts(
        self, reply: _Reply, corpus: ResearchCorpus, max_output_tokens: int
    ) -> tuple[DraftDocument, ...]:
        try:
            return validate_drafts(parse_drafts(reply.text), corpus)
        except SynthesisInvalid as exc:
            if reply.truncated:
                raise SynthesisInvalid(
                    f"{exc} (the reply was cut off at max_tokens={max_output_tokens}: "
                    "write shorter documents)"
                ) from exc
            raise

    def synthesize(self, corpus: ResearchCorpus, *, max_output_tokens: int) -> SynthesisResult:
        if max_output_tokens <= 0:
            raise ConfigError(
                f"max_output_tokens must be greater than 0. Currently it is {max_output_tokens}."
            )
        messages = [{"role": "user", "content": user_message(corpus)}]
        reply = self._call(messages, max_output_tokens)
        consumed = reply.tokens
        try:
            docs = self._drafts(reply, corpus, max_output_tokens)
        except SynthesisInvalid as first:
            log.warning("synthesis reply invalid; sending one repair request")
            messages += [
                {"role": "assistant", "content": reply.text},
                {"role": "user", "content": REPAIR_PROMPT.format(error=first)},
            ]
            repaired = self._call(messages, max_output_tokens)
            consumed += repaired.tokens
            try:
                docs = self._drafts(repaired, corpus, max_output_tokens)
            except SynthesisInvalid as second:
                raise SynthesisFailed(
                    f"{self.model_id} wrote invalid KB drafts for {corpus.client_name!r} twice "
                    f"({consumed} tokens spent). First reply: {first}. After repair: {second}"
                ) from second
        return SynthesisResult(documents=docs, consumed_tokens=consumed, model=self.model_id)


class AnthropicSynthesizer(ChatSynthesizer):
    """Claude writes the drafts (`ChatSynthesizer` over `tasks.llm.AnthropicChat`).

    Args:
        api_key: the Anthropic API key (unused when ``client`` is given).
        model: the model id; resolve overrides with :func:`resolve_model`.
        client: an ``anthropic.Anthropic`` to use instead of building one (tests, proxies).
        max_retries: retries per request after the first attempt, for transient errors only.
        backoff_s: the first retry's delay; each later retry doubles it.
        sleep: how to wait between retries (injected by tests).
        timeout_s: per-request timeout (explicit, so large ``max_output_tokens`` is allowed
            without streaming).
    """

    def __init__(
        self,
        api_key: str,
        model: str = DEFAULT_MODEL,
        *,
        client: Any | None = None,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        timeout_s: float = 600.0,
    ) -> None:
        if not model.strip():
            raise ConfigError("model must be a model id such as 'claude-haiku-4-5'. It is empty.")
        if max_retries < 0:
            raise ConfigError(f"max_retries must be 0 or more. Currently it is {max_retries}.")
        if backoff_s < 0:
            raise ConfigError(f"backoff_s must be 0 or more. Currently it is {backoff_s}.")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be greater than 0. Currently it is {timeout_s}.")
        if client is None and not api_key:
            raise ConfigError(
                "the Anthropic API key is empty: set ANTHROPIC_API_KEY, or use the extractive "
                "synthesizer to work offline."
            )
        super().__init__(
            AnthropicChat(
                api_key,
                model.strip(),
                client=client,
                attempts=max_retries + 1,
                backoff_s=backoff_s,
                timeout_s=timeout_s,
                sleep=sleep,
            )
        )
