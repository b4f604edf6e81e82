"""Second-stage reranking of gated search hits: Cohere's hosted reranker or a local cross-encoder.

Two implementations of the ``Reranker`` protocol (STYLE habit 4):

* :class:`CohereReranker` — one ``/v2/rerank`` request through the real ``cohere`` SDK. The
  search path does not wait for retries: the SDK gets ``max_retries=0`` and a short per-request
  timeout, and a failure falls back to the fused order.
* :class:`CrossEncoderReranker` — a sentence-transformers cross-encoder from a local folder,
  loaded lazily once per process, on the CPU. Works offline.

"No reranking" is not an implementation: :func:`build_reranker` returns ``None`` for it and the
caller keeps the fused order.

:func:`rerank_hits` only reorders hits it was given (they are already gated, so reranking can
never widen what a scope sees), and never raises :class:`RerankFailed`: it returns the fused
order with the failure message instead.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from core.errors import ConfigError, KbflowError
from core.models import SearchHit
from tasks.text.offline_hf import quiet_offline_hf

if TYPE_CHECKING:
    import cohere

    from core.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_COHERE_MODEL = "rerank-v3.5"
RERANKER_KINDS: tuple[str, ...] = ("none", "cohere", "cross-encoder", "auto")
_FALLBACK = "search falls back to the fused order"
_MAX_DETAIL = 200  # characters of a server's error message kept in ours


class RerankFailed(KbflowError, RuntimeError):
    """A reranker could not score the hits (network, auth, timeout, bad reply, model error)."""


class Reranker(Protocol):
    """Scores how relevant each text is to a query."""

    name: str

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        """One relevance score per text, in the order of ``texts`` (higher is more relevant).

        Raises:
            RerankFailed: on any failure, naming the reranker and the cause.
        """
        ...


# --- Cohere ----------------------------------------------------------------------------------


class CohereReranker:
    """Cohere's hosted reranker (``/v2/rerank``) through the ``cohere`` SDK.

    Args:
        api_key: the Cohere API key (``COHERE_API_KEY``).
        model: the rerank model id.
        timeout_s: seconds to wait for one rerank reply before falling back.
        client: a ready ``cohere.ClientV2`` (tests pass one on an ``httpx.MockTransport``);
            by default one is built from ``api_key``. Either way each request is sent with
            ``max_retries=0`` and ``timeout_s``.

    Raises:
        ConfigError: the key or model is empty, or ``timeout_s`` is not positive.
    """

    def __init__(
        self,
        api_key: str,
        model: str = DEFAULT_COHERE_MODEL,
        *,
        timeout_s: float = 10.0,
        client: cohere.ClientV2 | None = None,
    ) -> None:
        if not api_key.strip():
            raise ConfigError("The Cohere API key is empty. Set COHERE_API_KEY, or rerank=none.")
        if not model.strip():
            raise ConfigError("The Cohere rerank model is empty. Set it, e.g. 'rerank-v3.5'.")
        if not timeout_s > 0:
            raise ConfigError(
                f"timeout_s must be greater than 0. Currently the timeout_s is {timeout_s}."
            )
        self.model = model.strip()
        self.timeout_s = timeout_s
        self.name = f"cohere:{self.model}"
        if client is None:
            import cohere  # the SDK builds many models: load it only when Cohere is used

            client = cohere.ClientV2(
                api_key=api_key,
                timeout=timeout_s,
                max_retries=0,
                client_name="kbflow",
                log_warning_experimental_features=False,
            )
        self._client = client

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        started = time.perf_counter()
        try:
            reply = self._client.rerank(
                model=self.model,
                query=query,
                documents=list(texts),
                top_n=len(texts),
                # One retry layer: search must answer promptly, so no SDK retries (whose
                # backoff sleeps for seconds); a failure falls back to the fused order.
                request_options={"timeout": self.timeout_s, "max_retries": 0},
            )
            results = getattr(reply, "results", None)
        except Exception as exc:
            reason, todo = _cohere_reason(exc, self.timeout_s)
            raise RerankFailed(
                f"cohere rerank ({self.model}) failed: {reason} — {todo}; {_FALLBACK}"
            ) from exc
        scores = _scores_in_input_order(results, len(texts))
        if isinstance(scores, str):
            raise RerankFailed(
                f"cohere rerank ({self.model}) failed: unexpected reply: {scores} — check the "
                f"model name and that the API is /v2/rerank-compatible; {_FALLBACK}"
            )
        log.debug(
            "cohere rerank %s: %d texts in %.0f ms",
            self.model,
            len(texts),
            (time.perf_counter() - started) * 1000,
        )
        return scores


def _cohere_reason(exc: Exception, timeout_s: float) -> tuple[str, str]:
    """A short cause for ``exc`` and what to do about it. Never includes the key or documents."""
    from cohere.core.api_error import ApiError

    if isinstance(exc, ApiError):
        status = exc.status_code
        detail = _api_error_detail(exc.body)
        if status is not None and 200 <= status < 300:
            return f"the reply is not valid JSON ({detail})", "check CO_API_URL and the network"
        suffix = f": {detail}" if detail else ""
        if status in (401, 498):
            return f"HTTP {status} unauthorized{suffix}", "check COHERE_API_KEY"
        if status == 403:
            return f"HTTP 403 forbidden{suffix}", "check that COHERE_API_KEY may use this model"
        if status == 429:
            return (
                f"HTTP 429 too many requests{suffix}",
                "wait and retry, or use a key with a higher rate limit",
            )
        if status in (400, 404, 422):
            return f"HTTP {status}{suffix}", "check the rerank model name"
        if status is not None and status >= 500:
            return f"HTTP {status} server error{suffix}", "retry later (Cohere-side problem)"
        return f"HTTP {status}{suffix}", "check COHERE_API_KEY, the model name and the network"
    if isinstance(exc, httpx.TimeoutException):
        return f"no reply within {timeout_s:g}s", "check the network, or raise the rerank timeout"
    if isinstance(exc, httpx.HTTPError):
        return (
            f"network error ({type(exc).__name__}: {_short(str(exc))})",
            "check the network and CO_API_URL",
        )
    return (
        f"{type(exc).__name__}: {_short(str(exc))}",
        "check COHERE_API_KEY, the model name and the network",
    )


def _api_error_detail(body: Any) -> str:
    """The server's own message from an error body (``{"message": ...}``), shortened."""
    if isinstance(body, dict):
        body = body.get("message") or body.get("error") or body
    return _short(str(body)) if body not in (None, "", {}) else ""


def _scores_in_input_order(results: Any, count: int) -> list[float] | str:
    """Map Cohere's ranked ``(index, relevance_score)`` results back to input order.

    Returns the scores, or a description of what is wrong with the reply. The SDK does not
    validate replies (its models are constructed unchecked), so this does.
    """
    if not isinstance(results, list):
        return f"no 'results' list (got {type(results).__name__})"
    scores: list[float | None] = [None] * count
    for item in results:
        index = getattr(item, "index", None)
        score = getattr(item, "relevance_score", None)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            return f"result index {index!r} is not one of the {count} documents sent"
        if (
            isinstance(score, bool)
            or not isinstance(score, int | float)
            or not math.isfinite(score)
        ):
            return f"result {index} has relevance_score {score!r}, not a number"
        if scores[index] is not None:
            return f"document {index} is ranked twice"
        scores[index] = float(score)
    missing = [i for i, s in enumerate(scores) if s is None]
    if missing:
        return f"{len(missing)} of {count} documents were not scored (e.g. index {missing[0]})"
    return [s for s in scores if s is not None]


# --- local cross-encoder ---------------------------------------------------------------------


class CrossEncoderReranker:
    """A sentence-transformers cross-encoder from a local folder, on the CPU, loaded lazily.

    Args:
        model_path: a folder holding a cross-encoder (``KBFLOW_RERANK_MODEL``).
        batch_size: query/text pairs per forward pass.

    Raises:
        ConfigError: the folder does not exist, or ``batch_size`` is not positive. (A folder
            that does not load raises ConfigError from :meth:`load` or the first :meth:`scores`.)
    """

    def __init__(self, model_path: str | Path, *, batch_size: int = 32) -> None:
        path = Path(model_path).expanduser()
        if not path.is_dir():
            raise ConfigError(
                f"cross-encoder model folder {str(model_path)!r} does not exist. Set "
                f"KBFLOW_RERANK_MODEL to a local sentence-transformers cross-encoder folder, "
                f"or choose another reranker (cohere, none)."
            )
        if batch_size <= 0:
            raise ConfigError(
                f"batch_size must be greater than 0. Currently the batch_size is {batch_size}."
            )
        self.model_path = path.resolve()
        self.batch_size = batch_size
        self.name = f"cross-encoder:{self.model_path}"
        self._model: Any = None
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load the model now (e.g. at startup, to fail fast) instead of on first use.

        Raises:
            ConfigError: the folder does not hold a loadable cross-encoder.
        """
        with self._lock:
            if self._model is None:
                self._model = _load_cross_encoder(str(self.model_path))

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        self.load()
        try:
            raw = self._model.predict(
                [(query, text) for text in texts],
                batch_size=self.batch_size,
                show_progress_bar=False,
                convert_to_numpy=True,
            )
            scores = [float(s) for s in raw.reshape(len(texts), -1)[:, 0]]
        except Exception as exc:
            raise RerankFailed(
                f"cross-encoder rerank ({self.model_path}) failed: {type(exc).__name__}: "
                f"{_short(str(exc))} — check that KBFLOW_RERANK_MODEL is a cross-encoder "
                f"(one relevance label); {_FALLBACK}"
            ) from exc
        return scores


@cache
def _load_cross_encoder(path: str) -> Any:
    """Load a cross-encoder once per process, from local files only."""
    started = time.perf_counter()
    quiet_offline_hf()
    from sentence_transformers import CrossEncoder

    try:
        model = CrossEncoder(path, device="cpu", local_files_only=True)
    except Exception as exc:
        raise ConfigError(
            f"cross-encoder model folder {path!r} could not be loaded: {type(exc).__name__}: "
            f"{_short(str(exc))} — set KBFLOW_RERANK_MODEL to a sentence-transformers "
            f"cross-encoder folder (config.json, weights and tokenizer)"
        ) from exc
    log.info("loaded cross-encoder %s in %.1fs", path, time.perf_counter() - started)
    return model


# --- choosing and applying -------------------------------------------------------------------


def build_reranker(
    kind: str,
    *,
    cohere_api_key: str | None,
    cohere_model: str = DEFAULT_COHERE_MODEL,
    cross_encoder_path: str | None = None,
) -> Reranker | None:
    """The reranker ``kind`` names, or ``None`` for no reranking.

    Args:
        kind: ``none``; ``cohere`` (needs ``cohere_api_key``); ``cross-encoder`` (needs
            ``cross_encoder_path``); ``auto``: Cohere when a key is set, else the cross-encoder
            when a path is set, else none.
        cohere_api_key: the Cohere API key, if any.
        cohere_model: the Cohere rerank model id.
        cross_encoder_path: a local cross-encoder folder, if any.

    Raises:
        ConfigError: an unknown kind, or the key or path the kind needs is missing.
    """
    choice = kind.strip().lower()
    key = (cohere_api_key or "").strip()
    path = (cross_encoder_path or "").strip()
    if choice == "auto":
        choice = "cohere" if key else "cross-encoder" if path else "none"
    if choice == "none":
        return None
    if choice == "cohere":
        if not key:
            raise ConfigError(
                "reranker 'cohere' needs an API key: set COHERE_API_KEY, or choose "
                "'cross-encoder' or 'none'."
            )
        return CohereReranker(key, cohere_model)
    if choice == "cross-encoder":
        if not path:
            raise ConfigError(
                "reranker 'cross-encoder' needs a model folder: set KBFLOW_RERANK_MODEL, or "
                "choose 'cohere' or 'none'."
            )
        return CrossEncoderReranker(path)
    raise ConfigError(f"unknown reranker {kind!r}: choose one of {', '.join(RERANKER_KINDS)}.")


def rerank_hits(
    query: str, hits: list[SearchHit], reranker: Reranker, *, top_k: int
) -> tuple[list[SearchHit], str | None]:
    """Reorder gated ``hits`` by ``reranker`` and keep the best ``top_k``.

    Each returned hit is a copy whose ``score`` is the rerank score, also kept in
    ``scores["rerank"]`` beside the fused scores. Ties keep their fused order. Reranking never
    adds a hit: it only reorders and cuts the ones given.

    Returns:
        ``(hits, None)`` when reranked; ``(hits[:top_k] in fused order, unchanged, message)``
        when the reranker failed, so the caller can report the fallback.

    Raises:
        ConfigError: ``top_k`` is not positive, or a local model does not load.
    """
    if top_k <= 0:
        raise ConfigError(f"top_k must be greater than 0. Currently the top_k is {top_k}.")
    if not hits:
        return [], None
    started = time.perf_counter()
    try:
        scores = reranker.scores(query, [_rerank_text(hit) for hit in hits])
        _check_scores(reranker.name, scores, len(hits))
    except RerankFailed as exc:
        log.warning("rerank with %s failed for %d hits; fused order kept", reranker.name, len(hits))
        return hits[:top_k], str(exc)
    ranked = sorted(range(len(hits)), key=lambda i: -scores[i])  # sorted() is stable: ties
    reranked = [
        replace(hits[i], score=scores[i], scores={**hits[i].scores, "rerank": scores[i]})
        for i in ranked[:top_k]
    ]
    log.debug(
        "reranked %d hits with %s in %.0f ms",
        len(hits),
        reranker.name,
        (time.perf_counter() - started) * 1000,
    )
    return reranked, None


def _rerank_text(hit: SearchHit) -> str:
    """What the reranker reads: the heading path gives the chunk its context, as when indexed."""
    if not hit.heading_path:
        return hit.text
    return " > ".join(hit.heading_path) + "\n" + hit.text


def _check_scores(name: str, scores: Sequence[float], count: int) -> None:
    """A reranker that breaks the protocol fails like any other: the fused order is kept."""
    if len(scores) != count:
        raise RerankFailed(
            f"{name} returned {len(scores)} scores for {count} hits — fix the reranker; {_FALLBACK}"
        )
    bad = [s for s in scores if not isinstance(s, int | float) or not math.isfinite(s)]
    if bad:
        raise RerankFailed(
            f"{name} returned a score of {bad[0]!r} — fix the reranker or its model; {_FALLBACK}"
        )


def _short(text: str, limit: int = _MAX_DETAIL) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def reranker_from_settings(settings: Settings) -> Reranker | None:
    """The reranker the settings ask for (`KBFLOW_RERANK` and its keys), or None."""
    key = settings.retrieval.cohere_api_key
    return build_reranker(
        settings.retrieval.rerank,
        cohere_api_key=key.get_secret_value() if key else None,
        cohere_model=settings.retrieval.cohere_rerank_model,
        cross_encoder_path=settings.retrieval.rerank_model,
    )
