"""Reranking: Cohere through the real SDK on an ``httpx.MockTransport`` (no network), a real
sentence-transformers cross-encoder on a tiny randomly initialised BERT built here, the choice
of reranker, and the fallback to the fused order when a reranker fails."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cohere
import httpx
import pytest

from core.errors import ConfigError, KbflowError
from core.models import SearchHit
from tasks.query.rerank import (
    CohereReranker,
    CrossEncoderReranker,
    RerankFailed,
    build_reranker,
    rerank_hits,
)

QUERY = "how do i reset my password"
TEXTS = (
    "the office kitchen is cleaned every friday",
    "open settings and choose reset password",
    "password reset links expire after one hour",
    "parking is free for visitors",
)
Handler = Callable[[httpx.Request], httpx.Response]


def make_hits(texts: Sequence[str] = TEXTS) -> list[SearchHit]:
    return [
        SearchHit(
            doc_id=f"d{i}",
            chunk_id=f"d{i}:0",
            title=f"Doc {i}",
            uri=f"test://acme/d{i}",
            heading_path=[],
            text=text,
            score=1.0 / (60 + i),
            collection="docs",
            scores={"hybrid": 1.0 / (60 + i)},
        )
        for i, text in enumerate(texts)
    ]


class FixedReranker:
    def __init__(self, scores: list[float]) -> None:
        self.name = "fixed"
        self._scores = scores

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        return list(self._scores)


class FailingReranker:
    name = "broken"

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        raise RerankFailed("broken rerank failed: it always does")


# --- rerank_hits ---------------------------------------------------------------------------


def test_rerank_hits_orders_by_score_keeps_ties_stable_and_records_the_score() -> None:
    hits = make_hits()
    ranked, failure = rerank_hits(QUERY, hits, FixedReranker([0.1, 0.7, 0.7, 0.9]), top_k=3)
    assert failure is None
    assert [h.doc_id for h in ranked] == ["d3", "d1", "d2"]  # d1 before d2: fused order on a tie
    assert [h.score for h in ranked] == [0.9, 0.7, 0.7]
    assert ranked[0].scores == {"hybrid": hits[3].scores["hybrid"], "rerank": 0.9}
    assert hits[3].score == 1.0 / 63 and "rerank" not in hits[3].scores  # inputs untouched


def test_rerank_hits_falls_back_to_the_fused_order_with_the_message() -> None:
    hits = make_hits()
    ranked, failure = rerank_hits(QUERY, hits, FailingReranker(), top_k=2)
    assert failure == "broken rerank failed: it always does"
    assert ranked == hits[:2]
    assert all("rerank" not in h.scores for h in ranked)


@pytest.mark.parametrize("scores", [[0.1, 0.2], [0.1, 0.2, float("nan"), 0.3]])
def test_a_reranker_that_breaks_the_protocol_falls_back(scores: list[float]) -> None:
    hits = make_hits()
    ranked, failure = rerank_hits(QUERY, hits, FixedReranker(scores), top_k=4)
    assert ranked == hits
    assert failure is not None and failure.startswith("fixed returned")


@pytest.mark.parametrize("top_k", [1, 2, 4, 10])
def test_rerank_hits_never_adds_a_hit_and_returns_at_most_top_k(top_k: int) -> None:
    hits = make_hits()
    for reranker in (FixedReranker([0.4, 0.3, 0.2, 0.1]), FailingReranker()):
        ranked, _ = rerank_hits(QUERY, hits, reranker, top_k=top_k)
        assert len(ranked) == min(top_k, len(hits))
        assert {h.chunk_id for h in ranked} <= {h.chunk_id for h in hits}
        assert len({h.chunk_id for h in ranked}) == len(ranked)


def test_rerank_hits_checks_top_k_and_skips_empty_input() -> None:
    with pytest.raises(ConfigError, match=r"greater than 0\. Currently the top_k is 0"):
        rerank_hits(QUERY, make_hits(), FixedReranker([1, 2, 3, 4]), top_k=0)
    assert rerank_hits(QUERY, [], FailingReranker(), top_k=3) == ([], None)


def test_rerank_failed_is_a_kbflow_runtime_error() -> None:
    assert issubclass(RerankFailed, KbflowError) and issubclass(RerankFailed, RuntimeError)


# --- Cohere through the real SDK ---------------------------------------------------------------


def cohere_client(handler: Handler) -> cohere.ClientV2:
    """The real SDK with its default retry settings: the reranker must switch retries off."""
    return cohere.ClientV2(
        api_key="k",
        httpx_client=httpx.Client(transport=httpx.MockTransport(handler)),
        log_warning_experimental_features=False,
    )


def rerank_reply(ranked: list[tuple[int, float]]) -> dict[str, Any]:
    return {
        "id": "07734bd2-2473-4f07-94e1-0d9f0e6843cf",
        "results": [{"index": i, "relevance_score": s} for i, s in ranked],
        "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
    }


def test_cohere_sends_the_request_and_maps_scores_back_to_input_order() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = json.loads(request.content)
        assert request.method == "POST" and request.url.path == "/v2/rerank"
        assert request.headers["authorization"] == "Bearer k"
        assert body == {
            "model": "rerank-v3.5",
            "query": QUERY,
            "documents": list(TEXTS),
            "top_n": 4,
        }
        # Cohere returns the results best first, by index into the documents sent.
        return httpx.Response(200, json=rerank_reply([(2, 0.9), (1, 0.6), (3, 0.05), (0, 0.01)]))

    reranker = CohereReranker("k", timeout_s=2.5, client=cohere_client(handler))
    assert reranker.name == "cohere:rerank-v3.5"
    assert reranker.scores(QUERY, TEXTS) == [0.01, 0.6, 0.9, 0.05]
    assert seen[0].extensions["timeout"]["read"] == 2.5  # the per-request timeout is applied

    ranked, failure = rerank_hits(QUERY, make_hits(), reranker, top_k=3)
    assert failure is None
    assert [h.doc_id for h in ranked] == ["d2", "d1", "d3"]
    assert [h.scores["rerank"] for h in ranked] == [0.9, 0.6, 0.05]


def test_cohere_is_not_called_for_no_texts() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request expected")

    assert CohereReranker("k", client=cohere_client(handler)).scores(QUERY, []) == []


def _status(code: int, body: dict[str, Any]) -> Handler:
    return lambda request: httpx.Response(code, json=body)


def _raise(exc: Exception) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


COHERE_FAILURES: dict[str, tuple[Handler, str]] = {
    "rate limited": (
        _status(429, {"message": "trial key rate limit exceeded"}),
        "HTTP 429 too many requests: trial key rate limit exceeded",
    ),
    "server error": (_status(500, {"message": "internal error"}), "HTTP 500 server error"),
    "unauthorized": (
        _status(401, {"message": "invalid api token"}),
        "HTTP 401 unauthorized: invalid api token — check COHERE_API_KEY",
    ),
    "unknown model": (
        _status(404, {"message": "model 'rerank-v9' not found"}),
        "HTTP 404: model 'rerank-v9' not found — check the rerank model name",
    ),
    "not json": (
        lambda request: httpx.Response(200, content=b"<html>gateway</html>"),
        "the reply is not valid JSON",
    ),
    "no results": (
        _status(200, {"id": "x", "meta": {}}),
        "unexpected reply: no 'results' list",
    ),
    "index out of range": (
        _status(200, rerank_reply([(0, 0.5), (1, 0.4), (2, 0.3), (7, 0.2)])),
        "unexpected reply: result index 7 is not one of the 4 documents sent",
    ),
    "a document missing": (
        _status(200, rerank_reply([(0, 0.5), (1, 0.4), (2, 0.3)])),
        "unexpected reply: 1 of 4 documents were not scored",
    ),
    "score not a number": (
        _status(200, {"results": [{"index": i, "relevance_score": "high"} for i in range(4)]}),
        "unexpected reply: result 0 has relevance_score 'high'",
    ),
    "connection refused": (
        _raise(httpx.ConnectError("[Errno 111] Connection refused")),
        "network error (ConnectError: [Errno 111] Connection refused)",
    ),
    "timeout": (_raise(httpx.ReadTimeout("timed out")), "no reply within 2.5s"),
}


@pytest.mark.parametrize("case", list(COHERE_FAILURES))
def test_cohere_failures_fall_back_to_the_fused_order(case: str) -> None:
    handler, cause = COHERE_FAILURES[case]
    calls: list[httpx.Request] = []

    def counting(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return handler(request)

    reranker = CohereReranker("k", timeout_s=2.5, client=cohere_client(counting))
    with pytest.raises(RerankFailed) as raised:
        reranker.scores(QUERY, TEXTS)
    message = str(raised.value)
    assert message.startswith("cohere rerank (rerank-v3.5) failed: ")
    assert cause in message
    assert message.endswith("search falls back to the fused order")
    assert "Bearer" not in message and TEXTS[1] not in message
    assert len(calls) == 1  # no SDK retries (they would sleep for seconds)

    hits = make_hits()
    ranked, failure = rerank_hits(QUERY, hits, reranker, top_k=3)
    assert ranked == hits[:3]
    assert failure == message


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"api_key": " "}, "COHERE_API_KEY"),
        ({"api_key": "k", "model": ""}, "model is empty"),
        ({"api_key": "k", "timeout_s": 0}, "Currently the timeout_s is 0"),
    ],
)
def test_cohere_settings_are_checked(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        CohereReranker(**kwargs)


# --- local cross-encoder on a tiny random BERT -------------------------------------------------


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised one-layer BERT cross-encoder (a few KB) with a vocabulary of the
    words these tests use: the real sentence-transformers code path without downloadable
    weights. Its scores are arbitrary but deterministic."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("cross-encoder")
    words = sorted({w for text in (QUERY, *TEXTS) for w in text.split()})
    (folder / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n", encoding="utf-8"
    )
    # transformers 5: BertTokenizer is the fast (tokenizers-backed) one; BertTokenizerFast is
    # only a runtime alias that type checkers cannot see.
    tokenizer = transformers.BertTokenizer(vocab=str(folder / "vocab.txt"), do_lower_case=True)
    config = transformers.BertConfig(
        vocab_size=len(words) + 5,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.5,  # spread the random logits so the texts' scores differ clearly
    )
    config.num_labels = 1  # one relevance logit: what CrossEncoder expects of a reranker
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
        model = transformers.BertForSequenceClassification(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_cross_encoder_scores_each_text_deterministically(tiny_cross_encoder: Path) -> None:
    reranker = CrossEncoderReranker(tiny_cross_encoder, batch_size=3)
    assert reranker.name == f"cross-encoder:{tiny_cross_encoder.resolve()}"
    first = reranker.scores(QUERY, TEXTS)
    assert len(first) == len(TEXTS) and all(type(s) is float for s in first)
    assert reranker.scores(QUERY, TEXTS) == first
    assert len(set(first)) == len(first)  # distinct, so the order below is the model's own
    assert reranker.scores(QUERY, []) == []

    hits = make_hits()
    ranked, failure = rerank_hits(QUERY, hits, reranker, top_k=4)
    assert failure is None
    expected = sorted(range(len(TEXTS)), key=lambda i: -first[i])
    assert [h.doc_id for h in ranked] == [f"d{i}" for i in expected]
    assert [h.score for h in ranked] == sorted(first, reverse=True)


def test_cross_encoder_matches_sentence_transformers_directly(tiny_cross_encoder: Path) -> None:
    from sentence_transformers import CrossEncoder

    direct = CrossEncoder(str(tiny_cross_encoder), device="cpu", local_files_only=True)
    expected = direct.predict([(QUERY, t) for t in TEXTS], show_progress_bar=False)
    got = CrossEncoderReranker(str(tiny_cross_encoder)).scores(QUERY, TEXTS)
    assert got == pytest.approx([float(s) for s in expected], abs=1e-6)


def test_cross_encoder_needs_an_existing_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KBFLOW_RERANK_MODEL") as raised:
        CrossEncoderReranker(tmp_path / "missing")
    assert "missing" in str(raised.value)
    with pytest.raises(ConfigError, match="batch_size must be greater than 0"):
        CrossEncoderReranker(tmp_path, batch_size=0)


def test_a_folder_that_is_not_a_model_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    reranker = CrossEncoderReranker(tmp_path)
    with pytest.raises(ConfigError, match="could not be loaded") as raised:
        reranker.load()
    assert "KBFLOW_RERANK_MODEL" in str(raised.value)


def test_a_model_error_while_scoring_falls_back(tiny_cross_encoder: Path) -> None:
    class Exploding:
        def predict(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("CUDA out of memory")

    reranker = CrossEncoderReranker(tiny_cross_encoder)
    reranker._model = Exploding()  # a model that fails at inference, which no tiny BERT does
    hits = make_hits()
    ranked, failure = rerank_hits(QUERY, hits, reranker, top_k=2)
    assert ranked == hits[:2]
    assert failure is not None
    assert failure.startswith(f"cross-encoder rerank ({tiny_cross_encoder.resolve()}) failed: ")
    assert "RuntimeError: CUDA out of memory" in failure


# --- choosing a reranker -----------------------------------------------------------------------


def test_build_reranker_choices(tiny_cross_encoder: Path) -> None:
    path = str(tiny_cross_encoder)
    assert build_reranker("none", cohere_api_key="k", cross_encoder_path=path) is None
    assert build_reranker("auto", cohere_api_key=None) is None
    assert build_reranker("auto", cohere_api_key="  ", cross_encoder_path="") is None

    cohere_one = build_reranker("cohere", cohere_api_key="k", cohere_model="rerank-v3.5")
    assert isinstance(cohere_one, CohereReranker) and cohere_one.name == "cohere:rerank-v3.5"
    auto_cohere = build_reranker("AUTO", cohere_api_key="k", cross_encoder_path=path)
    assert isinstance(auto_cohere, CohereReranker)

    local = build_reranker("cross-encoder", cohere_api_key=None, cross_encoder_path=path)
    assert isinstance(local, CrossEncoderReranker)
    auto_local = build_reranker("auto", cohere_api_key=None, cross_encoder_path=path)
    assert isinstance(auto_local, CrossEncoderReranker)


@pytest.mark.parametrize(
    ("kind", "key", "path", "error"),
    [
        ("cohere", None, None, "set COHERE_API_KEY"),
        ("cohere", " ", "/models/ce", "set COHERE_API_KEY"),
        ("cross-encoder", "k", None, "set KBFLOW_RERANK_MODEL"),
        ("cross-encoder", None, "/no/such/folder", "'/no/such/folder' does not exist"),
        ("bm25", None, None, "unknown reranker 'bm25': choose one of none, cohere, cross-encoder"),
    ],
)
def test_build_reranker_errors(kind: str, key: str | None, path: str | None, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        build_reranker(kind, cohere_api_key=key, cross_encoder_path=path)
