"""The embedding model on ONNX Runtime: built once, offline, from the model's own weights.

A sentence-transformers model of the MiniLM kind (a BERT encoder, mean pooling, L2
normalisation) is exported with its pooling and normalisation inside the graph, fused by ONNX
Runtime's transformer optimizer, and checked against sentence-transformers on texts short, long
and padded before it is used: the vectors agree to about 1e-7, so an index built by either
backend serves the other. A single query runs in about a third of the time it takes in torch,
and a process that only searches never imports torch or sentence-transformers.

The built model is cached per machine (``$XDG_CACHE_HOME/kbflow/onnx`` or
``~/.cache/kbflow/onnx``; ``KBFLOW_ONNX_CACHE`` overrides), keyed by the weights and the
versions that built it, so it is built once (~10 s) and a second process waits for the first.
A build that fails, or whose vectors disagree, is remembered with its reason; callers then use
torch (`OnnxUnavailable`).

An int8 form (``built_model(model_dir, "int8")``) is made from the checked fp32 graph by ONNX
Runtime's dynamic quantisation (weights int8 per output channel, activations quantised per
call), kept beside it under the same lock, and checked before use: every check text's vector
must have a cosine similarity of at least `MIN_INT8_COSINE` with the fp32 one. Its vectors
are close to, not equal to, the fp32 ones, so it has its own model id (`int8_model_id`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from core.machine_cache import exclusive, kbflow_cache
from tasks.text.offline_hf import quiet_offline_hf
from tasks.text.ort import onnxruntime_without_telemetry

log = logging.getLogger(__name__)

BUILD_VERSION = 1  # bump when the export changes, so caches rebuild
MAX_DIFFERENCE = 1e-4  # largest element-wise gap to sentence-transformers a build may have
PRECISIONS = ("fp32", "int8")
INT8_VERSION = 1  # bump when the quantisation recipe changes: new file, new model id
# Lowest cosine similarity an int8 vector may have with its fp32 one on each int8 check text.
# Measured with the recipe in `_quantize`: 1,625 SciFact chunks min 0.9937 (mean 0.996), 809
# SciFact claims min 0.9885 (1st percentile 0.991, mean 0.995), the check texts 0.9916-0.9971;
# texts of one token or none are the worst (0.980-0.993), so they are not check texts. Weights
# quantised per tensor instead of per channel gave 0.90 (mean 0.94): a broken build is far below.
MIN_INT8_COSINE = 0.99
_FINGERPRINT_FILES = (
    "config.json",
    "model.safetensors",
    "pytorch_model.bin",
    "tokenizer.json",
    "modules.json",
    "sentence_bert_config.json",
    "tokenizer_config.json",  # sentence-transformers 6 keeps the window here
    "1_Pooling/config.json",
)
_CHECK_TEXTS = (
    "expense deadline",
    "What is the price of Arctic Breakfast?",
    "ALDH1 expression is associated with poorer prognosis for breast cancer primary tumors.",
    # longer than the model's window, so truncation is checked too
    " ".join(["Knowledge bases answer agents with approved, cited passages."] * 60),
    "",
)
# The int8 check: the texts above that have words, and passages of the length ingest embeds
# (a chunk is at most 180 words).
_INT8_CHECK_TEXTS = (
    *(text for text in _CHECK_TEXTS if text),
    "Expense reports must be filed within 30 days of travel. Receipts above 25 EUR are "
    "required; the finance team approves claims weekly and reimburses them with the next "
    "payroll. Late claims need a manager's written approval and a reason.",
    "Microstructural development of human newborn cerebral white matter assessed in vivo by "
    "diffusion tensor magnetic resonance imaging. Alterations of architecture of cerebral "
    "white matter in the developing human brain can affect cortical development and result "
    "in functional disabilities. A line scan diffusion-weighted magnetic resonance imaging "
    "sequence with diffusion tensor analysis was applied to measure the apparent diffusion "
    "coefficient, to calculate relative anisotropy, and to delineate three-dimensional fiber "
    "architecture in cerebral white matter in preterm and full-term infants.",
    "Der Zug nach München fährt um 7:45 Uhr ab; Fahrkarten gibt es am Automaten. 東京 ✓",
)


class OnnxUnavailable(RuntimeError):
    """This model cannot run on ONNX Runtime here; the message says why."""


def cache_root() -> Path:
    return kbflow_cache("onnx", "KBFLOW_ONNX_CACHE")


def _mean_pooled(model_dir: Path) -> int:
    """The model's max sequence length if it is a mean-pooled, normalised encoder; else raise.

    Reads both folder formats: sentence-transformers before 6 writes
    ``pooling_mode_mean_tokens`` and ``max_seq_length`` (``sentence_bert_config.json``); 6
    writes ``"pooling_mode": "mean"`` and keeps the window as the tokenizer's
    ``model_max_length`` (``tokenizer_config.json``), which is what a model fine-tuned here
    has.
    """
    try:
        modules = json.loads((model_dir / "modules.json").read_text())
        kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
        pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
        window = json.loads((model_dir / "sentence_bert_config.json").read_text())
        tokenizer_path = model_dir / "tokenizer_config.json"
        tokenizer = json.loads(tokenizer_path.read_text()) if tokenizer_path.is_file() else {}
    except (OSError, ValueError, AttributeError) as exc:
        raise OnnxUnavailable(f"{model_dir} is not a sentence-transformers folder: {exc}") from exc
    mean = pooling.get("pooling_mode_mean_tokens") or pooling.get("pooling_mode") == "mean"
    if kinds != ["Transformer", "Pooling", "Normalize"] or not mean:
        raise OnnxUnavailable(
            f"{model_dir} is not a mean-pooled, normalised encoder (modules {kinds})"
        )
    if "max_seq_length" in window:
        return int(window["max_seq_length"] or 256)
    return int(tokenizer.get("model_max_length") or 256)


def _fingerprint(model_dir: Path) -> str:
    """A key for the built graph: the model's files (name, size, modification time) and the
    versions that build and run it. Read from metadata, so no heavy import happens here."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        tools = [version(name) for name in ("onnxruntime", "onnx", "torch", "transformers")]
    except PackageNotFoundError as exc:
        raise OnnxUnavailable(f"cannot build an ONNX model: {exc} is not installed") from exc
    digest = hashlib.sha256(f"{BUILD_VERSION}|{'|'.join(tools)}".encode())
    for name in _FINGERPRINT_FILES:
        path = model_dir / name
        if path.is_file():
            stat = path.stat()
            digest.update(f"{name}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


def int8_model_id(model: str) -> str:
    """The model id of ``model``'s int8 form: its vectors differ slightly from the fp32 ones,
    so caches and indexes keyed by model id must keep them apart."""
    return f"{model}#int8v{INT8_VERSION}"


def built_model(model_dir: Path, precision: str = "fp32") -> Path:
    """The path of this model's checked ONNX graph (``fp32`` or ``int8``), building it first
    if needed. Raises `OnnxUnavailable` with the reason when that form cannot be used here."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    _mean_pooled(model_dir)
    key = _fingerprint(model_dir)
    if precision == "fp32":
        return _cached(key, "", "the ONNX model", lambda target: _build(model_dir, target))
    fp32 = built_model(model_dir)  # its own lock, released before the int8 one is taken
    return _cached(
        key,
        f".int8v{INT8_VERSION}",
        "the int8 ONNX model",
        lambda target: _quantize(fp32, model_dir, target),
    )


def _cached(key: str, suffix: str, what: str, build: Callable[[Path], dict[str, Any]]) -> Path:
    """``model{suffix}.onnx`` in the key's folder, built once per machine under the key's lock;
    a failed build is remembered (``failed{suffix}.json``) so no process tries it again."""
    folder = cache_root() / key
    model = folder / f"model{suffix}.onnx"
    failed = folder / f"failed{suffix}.json"
    if model.is_file():
        return model
    with exclusive(cache_root() / f"{key}.lock"):  # a second process waits for the build
        if model.is_file():
            return model
        if failed.is_file():
            reason = json.loads(failed.read_text()).get("reason", "an earlier build failed")
            raise OnnxUnavailable(f"{reason} (delete {failed} to try the build again)")
        folder.mkdir(parents=True, exist_ok=True)
        try:
            report = build(model)
        except Exception as exc:  # any failure means the fallback; remember why, once
            reason = f"building {what} failed: {type(exc).__name__}: {exc}"
            failed.write_text(json.dumps({"reason": reason}))
            raise OnnxUnavailable(reason) from exc
        (folder / f"build{suffix}.json").write_text(json.dumps(report, indent=2))
    return model


def _build(model_dir: Path, target: Path) -> dict[str, Any]:
    started = time.perf_counter()
    log.info("building the ONNX form of %s once (about 10 s)", model_dir)
    quiet_offline_hf()
    onnxruntime_without_telemetry()  # the optimizer below opens sessions of its own
    import numpy as np
    import torch
    from onnxruntime.transformers import optimizer
    from sentence_transformers import SentenceTransformer
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(str(model_dir))
    # eager attention exports as plain matmuls, which the optimizer fuses into one Attention op
    encoder = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    class Pooled(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, ids: Any, mask: Any, types: Any) -> Any:
            hidden = self.inner(input_ids=ids, attention_mask=mask, token_type_ids=types)[0]
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2, dim=1)

    sample = torch.ones((2, 8), dtype=torch.int64)
    axes = {0: "batch", 1: "tokens"}
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        raw = Path(scratch) / "raw.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                Pooled(encoder),
                (sample, sample, torch.zeros_like(sample)),
                str(raw),
                input_names=list(_INPUTS),
                output_names=["embedding"],
                dynamic_axes={**{name: axes for name in _INPUTS}, "embedding": {0: "batch"}},
                opset_version=17,
                dynamo=False,
            )
        fused = optimizer.optimize_model(
            str(raw),
            model_type="bert",
            num_heads=int(config.num_attention_heads),
            hidden_size=int(config.hidden_size),
            opt_level=1,
        )
        staged = Path(scratch) / "model.onnx"
        fused.save_model_to_file(str(staged))
        reference = SentenceTransformer(str(model_dir), device="cpu")
        expected = reference.encode(
            list(_CHECK_TEXTS),
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        got = OnnxEncoder(staged, model_dir, streams=1).encode(list(_CHECK_TEXTS), 2)
        difference = float(np.abs(expected - got).max())
        if not difference <= MAX_DIFFERENCE:
            raise OnnxUnavailable(
                f"its vectors differ from sentence-transformers' by {difference:.2e} "
                f"(more than {MAX_DIFFERENCE:.0e})"
            )
        os.replace(staged, target)
    seconds = time.perf_counter() - started
    log.info("built %s in %.1fs (largest difference %.1e)", target, seconds, difference)
    return {"source": str(model_dir), "max_difference": difference, "seconds": round(seconds, 2)}


def _quantize(fp32: Path, model_dir: Path, target: Path) -> dict[str, Any]:
    """Quantise the checked fp32 graph to int8 and check it against that graph."""
    started = time.perf_counter()
    log.info("building the int8 form of %s once (a few seconds)", fp32)
    import numpy as np
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        staged = Path(scratch) / target.name
        with _quiet_quantiser():
            quantize_dynamic(
                str(fp32),
                str(staged),
                # Only the MatMuls: the fused Attention op quantised as well lowers the worst
                # cosine to 0.990 for no speed gained. Per-channel weights keep the FFN's
                # outlier channels from flattening the rest (per-tensor: 0.90 worst).
                op_types_to_quantize=["MatMul"],
                per_channel=True,
                weight_type=QuantType.QInt8,
                # The fused graph's contrib ops defeat ONNX shape inference; every float
                # tensor in it is float32.
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        texts = list(_INT8_CHECK_TEXTS)
        expected = OnnxEncoder(fp32, model_dir, streams=1).encode(texts, 4)
        got = OnnxEncoder(staged, model_dir, streams=1).encode(texts, 4)
        cosines = (expected * got).sum(axis=1)  # both unit length
        worst = float(cosines.min())
        if not worst >= MIN_INT8_COSINE:
            raise OnnxUnavailable(
                f"its vectors are too far from the fp32 ones: cosine {worst:.4f} on "
                f"{texts[int(np.argmin(cosines))][:40]!r} (the floor is {MIN_INT8_COSINE})"
            )
        os.replace(staged, target)
    seconds = time.perf_counter() - started
    log.info("built %s in %.1fs (lowest cosine to fp32 %.4f)", target, seconds, worst)
    return {
        "source": str(fp32),
        "min_cosine": worst,
        "mean_cosine": float(cosines.mean()),
        "seconds": round(seconds, 2),
    }


class _QuantiserChatter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from_quantiser = f"onnxruntime{os.sep}quantization" in record.pathname
        return not from_quantiser or record.levelno >= logging.ERROR


@contextlib.contextmanager
def _quiet_quantiser() -> Iterator[None]:
    """ONNX Runtime's quantiser logs to the root logger: a line per tensor, and advice meant
    for static quantisation on every dynamic run. None of it is about this build; errors still
    pass."""
    chatter = _QuantiserChatter()
    logging.root.addFilter(chatter)
    try:
        yield
    finally:
        logging.root.removeFilter(chatter)


_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


# Padded tokens per forward pass in the length buckets: 4 texts of the model's 256-token window,
# 16 of 64 tokens. On this project's 2-core machine a 64-text batch of ingest chunks cost 46
# (int8) and 62 (fp32) CPU ms per text, 4-8-text batches 25-29 and 44-48 ms: a small batch's
# activations stay in the CPU's caches. See docs/BENCHMARKS.md.
TOKENS_PER_BATCH = 1024


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class OnnxEncoder:
    """Runs a built graph: tokenise, group texts of similar length, pad each group, run.

    A call of one batch (a query) runs it on ``threads`` intra-op threads. A call of several
    batches (ingest, evals) runs them side by side, one batch per thread, each on a session
    of its own single thread: no thread waits for another at every operator, which on a
    shared machine costs more than it gains (docs/BENCHMARKS.md).

    Args:
        path: the ONNX file `built_model` made.
        model_dir: the model folder (its tokenizer and window).
        threads: CPU threads per call; 0: one per usable core.
        streams: batches run at once in a call of several; default ``threads`` (0: one per
            usable core); 1 runs them one after another on the intra-op threads.
    """

    def __init__(
        self, path: Path, model_dir: Path, threads: int = 0, streams: int | None = None
    ) -> None:
        from tokenizers import Tokenizer

        window = _mean_pooled(model_dir)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(window)
        self.pad_id = self.tokenizer.token_to_id("[PAD]") or 0
        self.path = path
        self.streams = streams if streams is not None else (threads or usable_cores())
        if self.streams <= 0:
            raise ValueError(f"streams must be greater than 0, got {self.streams}")
        self.session = _session(path, threads)
        self._single: Any = None  # the one-thread session the streams share, made on need
        self._pool: Any = None
        self._lock = threading.Lock()

    def encode(
        self,
        texts: Sequence[str],
        batch_size: int,
        *,
        bucket: bool = True,
        max_tokens: int | None = TOKENS_PER_BATCH,
    ) -> Any:
        """Unit vectors for ``texts``, in their order (a float32 array, one row per text).

        With ``bucket`` (the default) texts of similar token length share a batch, so a short
        text is not padded to the longest text of a random batch, and a batch holds at most
        ``batch_size`` texts and ``max_tokens`` padded tokens (None: no token cap);
        ``bucket=False`` batches ``batch_size`` texts in the order given (the benchmarks
        measure the difference).
        """
        import numpy as np

        encodings = self.tokenizer.encode_batch(list(texts))
        lengths = [len(e.ids) for e in encodings]
        batches = length_buckets(
            lengths, batch_size, bucket=bucket, max_tokens=max_tokens if bucket else None
        )

        def run(session: Any, members: list[int]) -> Any:
            width = max(lengths[i] for i in members)
            ids = np.full((len(members), width), self.pad_id, dtype=np.int64)
            mask = np.zeros((len(members), width), dtype=np.int64)
            for row, i in enumerate(members):
                ids[row, : lengths[i]] = encodings[i].ids
                mask[row, : lengths[i]] = 1
            (vectors,) = session.run(
                None,
                {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
            )
            return vectors

        if len(batches) > 1 and self.streams > 1:
            single, pool = self._streams()
            results = list(pool.map(lambda members: run(single, members), batches))
        else:
            results = [run(self.session, members) for members in batches]
        out = np.empty((len(encodings), results[0].shape[1] if results else 0), dtype=np.float32)
        for members, vectors in zip(batches, results, strict=True):
            out[members] = vectors
        return out

    def _streams(self) -> tuple[Any, Any]:
        with self._lock:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                # one session serves every stream: ONNX Runtime's run() is thread-safe, and
                # each call runs on the thread that makes it
                self._single = _session(self.path, 1)
                self._pool = ThreadPoolExecutor(self.streams, thread_name_prefix="onnx-embed")
        return self._single, self._pool


def _session(path: Path, threads: int) -> Any:
    onnxruntime = onnxruntime_without_telemetry()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def length_buckets(
    lengths: Sequence[int],
    batch_size: int,
    *,
    bucket: bool = True,
    max_tokens: int | None = None,
) -> list[list[int]]:
    """Batches of indices into ``lengths``: by length (a stable sort, so equal lengths keep
    their order), or in the given order when ``bucket`` is false. A batch holds at most
    ``batch_size`` indices and, with ``max_tokens``, at most that many tokens once padded to
    its longest member (a text longer than that on its own gets a batch of its own). Every
    index appears once; the caller writes each batch's rows back at these indices, which
    restores the order."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be greater than 0, got {batch_size}")
    if max_tokens is not None and max_tokens <= 0:
        raise ValueError(f"max_tokens must be greater than 0, got {max_tokens}")
    order = list(range(len(lengths)))
    if bucket:
        order.sort(key=lengths.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        wider = max(width, lengths[i])
        full = len(current) >= batch_size
        if current and (
            full or (max_tokens is not None and wider * (len(current) + 1) > max_tokens)
        ):
            batches.append(current)
            current, wider = [], lengths[i]
        current.append(i)
        width = wider
    if current:
        batches.append(current)
    return batches
