"""Chat-model calls: one retry layer, strict JSON, one repair, a record — for every provider.

`ChatModel` is the Protocol; `RetryingChat` holds what every provider shares, and each real one
sends a single request: `AnthropicChat` (Claude's Messages API through the official SDK) and
`tasks.llm_openai.OpenAIChat` (any OpenAI-compatible Chat Completions endpoint through the
``openai`` SDK: Ollama, vLLM, llama.cpp's server, LM Studio, OpenAI, Azure OpenAI).
`tasks.llm_choice.chat_model` picks the configured one; `tasks.llm_sampling.SampledChat` is the
calling agent's own model over MCP sampling. The prompts and the JSON contracts are the callers'
and the same for every provider; a provider that can constrain its output to a JSON Schema is
given the contract's schema. Every call is appended to the caller's call log as an `LlmCall`,
failed ones included, with the number of requests it took, so the ledger sees exactly what was
sent and what came back.

Retries are for transient failures only (`is_transient`): HTTP 408, 409, 429 and 5xx (529
"overloaded" included), timeouts and connection errors/resets. Three attempts in all, with
exponential backoff, or the server's ``retry-after`` when it asks for longer. Anything else
(a 400, a bad key, an unknown model) fails at once. The SDK's typed errors decide
(``anthropic.APIStatusError.status_code``, ``APITimeoutError``, ``APIConnectionError``), never an
error's text: a message that merely mentions "503" or "timeout" is not transient.

tenacity runs the retries; the SDK's own are off (``max_retries=0``), so this is the one retry
layer, its delays are the caller's (``backoff_s``, an injectable ``sleep``) and the attempts it
made are known on success and on failure alike.

`complete_json` asks for a JSON object, parses it with the caller's validator and, when the
reply breaks the contract, sends ONE repair turn quoting the exact error; a second bad reply
raises `LlmReplyInvalid`, and the caller answers a safe "no".
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from core.errors import ConfigError, LlmError, LlmReplyInvalid
from core.models import LlmCall

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_ATTEMPTS = 3
_TRANSIENT_STATUS = frozenset({408, 409, 429})
_AUTH_STATUS = frozenset({401, 403})
_MAX_RETRY_AFTER_S = 60.0
REPAIR_INSTRUCTION = (
    "Your reply did not follow the required JSON format: {error}. Reply again with only the "
    "corrected JSON object, nothing before or after it."
)


class ChatModel(Protocol):
    """A chat model that answers one conversation, recording the call in ``calls``."""

    model_id: str

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
        """Return the reply text; raise `LlmError` (``transient``/``auth`` set) on failure.

        ``schema``: the JSON Schema of the reply, for providers that can constrain their output
        to it; every provider's reply is still checked by the caller."""
        ...


def _sdk_errors() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """The typed errors of the provider SDKs that are installed: (answered with a status,
    no answer came, an answer that did not parse). Both SDKs share one shape."""
    status: list[type] = []
    connection: list[type] = []
    invalid: list[type] = []
    for name in ("anthropic", "openai"):
        try:
            sdk = __import__(name)
        except ImportError:  # pragma: no cover - both are in the lock; a slim install may lack one
            continue
        status.append(sdk.APIStatusError)
        connection.append(sdk.APIConnectionError)
        invalid.append(sdk.APIResponseValidationError)
    return tuple(status), tuple(connection), tuple(invalid)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of the API's answer, or None when no answer came (timeout, network)."""
    status, _, invalid = _sdk_errors()
    if isinstance(exc, status + invalid):
        return int(exc.status_code)  # type: ignore[attr-defined]
    return None


def is_api_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a provider SDK's own error (an answer, or the lack of one)."""
    status, connection, invalid = _sdk_errors()
    return isinstance(exc, status + connection + invalid)


def is_auth_error(exc: BaseException) -> bool:
    """Whether the API refused the key (401) or the key's rights (403)."""
    return status_of(exc) in _AUTH_STATUS


def is_transient(exc: BaseException) -> bool:
    """Whether retrying ``exc`` later may succeed (see the module docstring).

    Transient: an HTTP 408, 409, 429 or 5xx answer; the SDKs' ``APITimeoutError`` and
    ``APIConnectionError`` (they wrap every transport failure in one of them); the built-in
    ``TimeoutError`` and ``ConnectionError`` (a proxy or a hand-made ``client`` may raise them).
    Everything else is permanent, whatever its message says.
    """
    status, connection, _ = _sdk_errors()
    if isinstance(exc, (*connection, TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, status):
        code = int(exc.status_code)  # type: ignore[attr-defined]
        return code in _TRANSIENT_STATUS or 500 <= code <= 599
    return False


def retry_after_s(exc: BaseException) -> float | None:
    """The server's ``retry-after`` in seconds (capped at a minute), when it sent one."""
    status, _, _ = _sdk_errors()
    if not isinstance(exc, status):
        return None
    value = exc.response.headers.get("retry-after")  # type: ignore[attr-defined]
    try:
        return min(float(value), _MAX_RETRY_AFTER_S) if value is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class ChatReply:
    """What one request brought back, whatever the provider."""

    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    truncated: bool = False
    """The model stopped at ``max_tokens`` (Anthropic ``max_tokens``, OpenAI ``length``)."""


class RetryingChat:
    """One retry layer and one call record for every provider; subclasses send one request.

    Args:
        model: the model id (``claude-haiku-4-5``; for a local server, the name it serves).
        attempts: requests per call in all (first try included), transient errors only.
        backoff_s: the first retry's delay; each later retry doubles it.
        timeout_s: per-request timeout.
        sleep: how to wait between retries (injected by tests).
    """

    provider = "llm"
    key_hint = "check the API key"

    def __init__(
        self,
        model: str,
        *,
        attempts: int = DEFAULT_ATTEMPTS,
        backoff_s: float = 1.0,
        timeout_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not model.strip():
            raise ConfigError(f"the {self.provider} model id is empty: name the model to use")
        if attempts < 1:
            raise ConfigError(f"attempts must be 1 or more. Currently it is {attempts}.")
        if backoff_s < 0 or timeout_s <= 0:
            raise ConfigError(
                f"backoff_s must be >= 0 and timeout_s > 0. Currently {backoff_s} and {timeout_s}."
            )
        self.model_id = model.strip()
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self._sleep = sleep

    def _request(
        self,
        system: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        schema: dict[str, Any] | None,
    ) -> ChatReply:  # pragma: no cover - every provider overrides it
        raise NotImplementedError

    def send(
        self,
        *,
        purpose: str,
        system: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        schema: dict[str, Any] | None = None,
    ) -> tuple[ChatReply, int]:
        """One request, transient errors retried: the reply and the attempts made.

        Raises:
            LlmError: the request failed (``transient``, ``auth`` and ``attempts`` set); the
                provider's error is its ``__cause__``.
        """
        retrying = Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=self._delay,
            retry=retry_if_exception(is_transient),
            sleep=self._sleep,
            before_sleep=lambda state: self._log_retry(purpose, state),
            reraise=True,
        )
        try:
            reply = retrying(lambda: self._request(system, messages, max_tokens, schema))
        except Exception as exc:  # classified below; never swallowed
            raise self._failure(purpose, exc, retrying.statistics["attempt_number"]) from exc
        return reply, retrying.statistics["attempt_number"]

    def _delay(self, state: RetryCallState) -> float:
        """Before retry n: ``backoff_s * 2**(n-1)``, or the server's ``retry-after`` if longer."""
        exc = state.outcome.exception() if state.outcome else None
        backoff = self.backoff_s * 2 ** (state.attempt_number - 1)
        return max(backoff, (retry_after_s(exc) if exc else None) or 0.0)

    def _log_retry(self, purpose: str, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        log.warning(
            "%s %s: transient %s; retry %d/%d in %.1fs",
            purpose, self.model_id, type(exc).__name__, state.attempt_number,
            self.attempts - 1, delay,
        )  # fmt: skip

    def _failure(self, purpose: str, exc: Exception, attempts: int) -> LlmError:
        """What a failed call raises: the provider's status, and whether a retry could help."""
        transient = is_transient(exc)
        auth = is_auth_error(exc)
        if auth:
            hint = self.key_hint
        elif transient and attempts > 1:
            hint = f"still failing after {attempts} attempts; try again later"
        elif transient:
            hint = "not retried here (attempts=1); a later retry may succeed"
        else:
            hint = "not retried: check the model id and the request"
        return LlmError(
            f"{self.model_id} {purpose} call failed (HTTP {status_of(exc)}): {exc} — {hint}",
            transient=transient,
            auth=auth,
            attempts=attempts,
        )

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
        started = time.perf_counter()
        try:
            reply, attempts = self.send(purpose=purpose, system=system, messages=messages,
                                        max_tokens=max_tokens, schema=schema)  # fmt: skip
        except LlmError as exc:
            cause = exc.__cause__
            error = f"{type(cause).__name__}: {cause}"
            calls.append(self._record(purpose, prompt_version, system, messages, None,
                                      error, exc.attempts, started))  # fmt: skip
            raise
        calls.append(
            self._record(purpose, prompt_version, system, messages, reply.text, None, attempts,
                         started, reply.input_tokens, reply.output_tokens)
        )  # fmt: skip
        return reply.text

    def _record(
        self,
        purpose: str,
        prompt_version: str,
        system: str,
        messages: list[dict[str, str]],
        reply: str | None,
        error: str | None,
        attempts: int,
        started: float,
        input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> LlmCall:
        return LlmCall(
            purpose=purpose,
            model=self.model_id,
            prompt_version=prompt_version,
            system=system,
            messages=tuple(dict(m) for m in messages),
            reply=reply,
            error=error,
            attempts=attempts,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            latency_ms=round((time.perf_counter() - started) * 1000, 1),
        )


class AnthropicChat(RetryingChat):
    """Claude through the Messages API; transient errors retried here, nowhere else.

    Args:
        api_key: the Anthropic key (unused when ``client`` is given).
        model: the model id, e.g. ``claude-haiku-4-5``.
        client: an ``anthropic.Anthropic`` to use instead of building one (tests, proxies).
        The rest: `RetryingChat`.
    """

    provider = "Anthropic"
    key_hint = "check ANTHROPIC_API_KEY"

    def __init__(
        self,
        api_key: str,
        model: str,
        *,
        client: Any | None = None,
        attempts: int = DEFAULT_ATTEMPTS,
        backoff_s: float = 1.0,
        timeout_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not model.strip():
            raise ConfigError("model must be a model id such as 'claude-haiku-4-5'. It is empty.")
        super().__init__(model, attempts=attempts, backoff_s=backoff_s, timeout_s=timeout_s,
                         sleep=sleep)  # fmt: skip
        if client is None and not api_key:
            raise ConfigError("the Anthropic API key is empty: set ANTHROPIC_API_KEY")
        self._api_key = api_key
        self._client = client.with_options(max_retries=0) if client is not None else None

    def _messages_api(self) -> Any:
        if self._client is None:
            import anthropic

            self._client = anthropic.Anthropic(api_key=self._api_key, max_retries=0)
        return self._client.messages

    def _request(
        self,
        system: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        schema: dict[str, Any] | None,
    ) -> ChatReply:
        # The JSON shape is asked for in the prompt and checked by the caller's validator.
        response = self._messages_api().create(
            model=self.model_id,
            max_tokens=max_tokens,
            system=system,
            messages=messages,
            timeout=self.timeout_s,
        )
        usage = response.usage
        return ChatReply(
            text="".join(b.text for b in response.content if getattr(b, "type", "") == "text"),
            input_tokens=int(usage.input_tokens or 0),
            output_tokens=int(usage.output_tokens or 0),
            truncated=response.stop_reason == "max_tokens",
        )


def parse_json_object(reply: str) -> dict[str, Any]:
    """The one JSON object in ``reply`` (a Markdown code fence around it is tolerated)."""
    text = reply.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    try:
        # strict=False: a raw line break inside a string (small models write them) is text
        value = json.loads(text, strict=False)
    except json.JSONDecodeError as exc:
        raise LlmReplyInvalid(
            f"the reply is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from exc
    if not isinstance(value, dict):
        raise LlmReplyInvalid(f"the reply must be a JSON object, not {type(value).__name__}")
    return value


def complete_json(
    model: ChatModel,
    *,
    purpose: str,
    prompt_version: str,
    system: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    calls: list[LlmCall],
    validate: Callable[[dict[str, Any]], T],
    schema: dict[str, Any] | None = None,
    lenient: Callable[[dict[str, Any]], T] | None = None,
) -> T:
    """Ask for a JSON object and validate it; one repair turn on a broken reply.

    ``lenient``: how the repair turn's reply is checked, when that differs (e.g. a quote not
    found in its passage sends the model back once, then is kept as unverified).

    Raises:
        LlmError: the call failed (after the transient retries).
        LlmReplyInvalid: the reply was still invalid after the repair turn.
    """
    reply = model.complete(purpose=purpose, prompt_version=prompt_version, system=system,
                           messages=messages, max_tokens=max_tokens, calls=calls,
                           schema=schema)  # fmt: skip
    if not getattr(model, "repairs", True):  # no second turn to ask for: as a repaired reply
        return (lenient or validate)(parse_json_object(reply))
    try:
        return validate(parse_json_object(reply))
    except LlmReplyInvalid as first:
        log.warning("%s reply invalid (%s); one repair turn", purpose, first)
        repair = [
            *messages,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": REPAIR_INSTRUCTION.format(error=first)},
        ]
        again = model.complete(purpose="repair", prompt_version=prompt_version, system=system,
                               messages=repair, max_tokens=max_tokens, calls=calls,
                               schema=schema)  # fmt: skip
        try:
            return (lenient or validate)(parse_json_object(again))
        except LlmReplyInvalid as second:
            raise LlmReplyInvalid(
                f"{purpose} reply invalid twice: first {first}; after the repair {second}"
            ) from second
