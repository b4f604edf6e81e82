"""Adapt the embedding model to judged relevance: fine-tune a sentence-transformers folder on
(query, passage) pairs, offline, on the CPU, the same way every time for a seed.

The loss is sentence-transformers' ``MultipleNegativesRankingLoss``: each query's positive
passage must outscore every other passage in its batch (in-batch negatives) and the pair's own
hard negatives, if it has any. Batches never hold the same query or passage twice, because a
duplicate would be scored as a negative of itself.

The result is an ordinary sentence-transformers folder (so ``KBFLOW_EMBEDDING_MODEL=<folder>``
embeds with it, on torch or ONNX Runtime) plus a manifest, ``kbflow-model.json``: base model,
data fingerprint, parameters, seed, pair count, training time and, once the caller records
them, held-out metrics. Its id is derived from what it was trained from (the base weights, the
pairs and the parameters), ``minilm-ft-<hash>``, so the same inputs name the same model and a
second request returns the folder already trained; the default home is
``<KBFLOW_HOME>/models/<id>/``.

Example:
    >>> pairs = [RelevancePair("what lowers blood pressure?", "Salt > Diet\\nLess salt ...")]
    >>> model = finetune_embedder(pairs, models_dir=Path(".kbflow/models"))  # doctest: +SKIP
    >>> MiniLMEmbedder(str(model.path)).embed_query("hypertension")  # doctest: +SKIP
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from core.errors import ConfigError
from core.settings import PACKAGED_MINILM
from tasks.text.embed import PROMOTED_FILE, model_folder
from tasks.text.offline_hf import quiet_offline_hf

log = logging.getLogger(__name__)

MANIFEST = "kbflow-model.json"
PROMOTED = PROMOTED_FILE  # in the models folder: the model that won its held-out evaluation
ID_PREFIX = "minilm-ft-"
FORMAT_VERSION = 1  # bump when training changes in a way the parameters do not show
# Files that make a model what it is: its weights, architecture, tokenizer and pooling.
_IDENTITY_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "config.json",
    "tokenizer.json",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)


@dataclass(frozen=True)
class RelevancePair:
    """A query, a passage that answers it and, optionally, passages that look close but do not.

    Passages are what the index embeds (`core.models.Chunk.embed_text`: heading path, newline,
    chunk text), so the model learns on the texts it will later be asked to rank.
    """

    query: str
    positive: str
    negatives: tuple[str, ...] = ()


@dataclass(frozen=True)
class QuerySplit:
    """Query ids to train on and ids held out for evaluation; no id is in both."""

    train: tuple[str, ...]
    held_out: tuple[str, ...]


def split_by_position(query_ids: Sequence[str]) -> QuerySplit:
    """Train on the queries at even positions (0, 2, 4, ...), hold out those at odd ones.

    Position, not id, decides, so the split is fixed by the query file's order and needs no
    random seed; interleaving keeps both halves alike when the file is sorted by topic or id.

    Raises:
        ConfigError: An id appears twice (a query would land in both halves).
    """
    ids = list(query_ids)
    if len(set(ids)) != len(ids):
        twice = sorted({q for q in ids if ids.count(q) > 1})[:5]
        raise ConfigError(f"query ids must be unique to split them; repeated: {twice}")
    return QuerySplit(train=tuple(ids[0::2]), held_out=tuple(ids[1::2]))


class FinetuneParams(BaseModel):
    """How to fine-tune. Every field is part of the model id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epochs: int = Field(1, ge=1, description="Passes over the pairs.")
    batch_size: int = Field(
        32, ge=2, description="Pairs per step; each query's in-batch negatives are the others'."
    )
    learning_rate: float = Field(2e-5, gt=0, description="AdamW's peak learning rate.")
    warmup_ratio: float = Field(
        0.1, ge=0, lt=1, description="Share of steps with a linear warm-up, then linear decay."
    )
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay.")
    max_seq_length: int = Field(
        256, ge=8, le=512, description="Tokens per text in training (the index truncates too)."
    )
    scale: float = Field(
        20.0, gt=0, description="Multiplier on cosine similarity before the softmax."
    )
    max_steps: int | None = Field(
        None, ge=1, description="Stop after this many steps (tests); None: every epoch."
    )
    seed: int = Field(0, description="Seeds batch order, dropout and initial state.")


@dataclass(frozen=True)
class FinetunedModel:
    """A trained model folder and its manifest."""

    model_id: str
    path: Path
    manifest: dict[str, Any]


def pairs_fingerprint(pairs: Sequence[RelevancePair]) -> str:
    """SHA-256 of the pairs, in order (order changes batches, so it changes the model)."""
    digest = hashlib.sha256()
    for pair in pairs:
        digest.update(json.dumps([pair.query, pair.positive, list(pair.negatives)]).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def model_digest(model_dir: Path) -> str:
    """SHA-256 over the files that make a model what it is (weights, config, tokenizer)."""
    digest = hashlib.sha256()
    for name in _IDENTITY_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\0")
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def model_id_for(base_digest: str, data_fingerprint: str, params: FinetuneParams) -> str:
    """``minilm-ft-<12 hex>``: the same base, pairs and parameters always give the same id."""
    key = json.dumps(
        [FORMAT_VERSION, base_digest, data_fingerprint, params.model_dump(mode="json")],
        sort_keys=True,
    )
    return ID_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:12]


def finetune_embedder(
    pairs: Sequence[RelevancePair],
    *,
    models_dir: Path,
    base: str = PACKAGED_MINILM,
    params: FinetuneParams | None = None,
    source: dict[str, Any] | None = None,
    threads: int = 2,
) -> FinetunedModel:
    """Fine-tune ``base`` on ``pairs`` into ``models_dir/<model id>/``; reuse it if there.

    Args:
        pairs: Training pairs; every pair must have the same number of negatives.
        models_dir: Where model folders live (``<KBFLOW_HOME>/models``).
        base: The model to start from: a sentence-transformers folder, or the packaged MiniLM.
        params: Training settings; the defaults if None.
        source: Where the pairs came from (dataset, split, how positives and negatives were
            chosen), recorded in the manifest as given.
        threads: CPU threads for torch (a process-wide setting).

    Returns:
        The model's id, folder and manifest.

    Raises:
        ConfigError: No pairs, pairs with different numbers of negatives, or fewer distinct
            queries than a batch needs.
    """
    params = params or FinetuneParams()
    _check_pairs(pairs, params)
    base_dir = Path(model_folder(base))
    base_sha = model_digest(base_dir)
    data_fp = pairs_fingerprint(pairs)
    model_id = model_id_for(base_sha, data_fp, params)
    target = models_dir / model_id
    if (target / MANIFEST).is_file():
        log.info("model %s is already trained: %s", model_id, target)
        return FinetunedModel(model_id, target, read_manifest(target))

    models_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{model_id}-", dir=models_dir))
    try:
        started = time.perf_counter()
        stats = _train(pairs, base_dir, params, scratch, threads)
        seconds = time.perf_counter() - started
        manifest = {
            "model_id": model_id,
            "kind": "sentence-transformers",
            "format_version": FORMAT_VERSION,
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "base": {"model": base, "sha256": base_sha},
            "data": {
                "fingerprint": data_fp,
                "pairs": len(pairs),
                "queries": len({p.query for p in pairs}),
                "negatives_per_pair": len(pairs[0].negatives),
                "source": source or {},
            },
            "params": params.model_dump(mode="json"),
            "seed": params.seed,
            "training": {**stats, "seconds": round(seconds, 1), "threads": threads},
            "weights_sha256": model_digest(scratch),
            "versions": _versions(),
            "evaluation": {},
        }
        _write_json(scratch / MANIFEST, manifest)
        try:
            os.replace(scratch, target)
        except OSError:  # another process finished the same model first: keep theirs
            if not (target / MANIFEST).is_file():
                raise
            shutil.rmtree(scratch, ignore_errors=True)
            return FinetunedModel(model_id, target, read_manifest(target))
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    log.info("trained %s on %d pairs in %.0fs: %s", model_id, len(pairs), seconds, target)
    return FinetunedModel(model_id, target, manifest)


def _check_pairs(pairs: Sequence[RelevancePair], params: FinetuneParams) -> None:
    if not pairs:
        raise ConfigError("no relevance pairs to fine-tune on — give at least two (query, passage)")
    widths = {len(p.negatives) for p in pairs}
    if len(widths) > 1:
        raise ConfigError(
            f"every pair needs the same number of negatives; these pairs have {sorted(widths)} — "
            "mine the same count for each query"
        )
    if len({p.query for p in pairs}) < 2:
        raise ConfigError(
            "fine-tuning with in-batch negatives needs at least two distinct queries; got "
            f"{len(pairs)} pair(s) of one query"
        )


def batches_for(
    pairs: Sequence[RelevancePair], batch_size: int, seed: int, epoch: int
) -> list[list[int]]:
    """Pair indices, shuffled by (seed, epoch), cut into batches in which no query or positive
    passage appears twice: a duplicate would be scored as a negative of itself.

    Each pair joins the first batch with room that holds neither its query nor its passage. A
    batch left with one pair has no in-batch negative, so that pair joins a batch it does not
    clash with, even a full one; it is dropped only when there is none and it has no hard
    negatives of its own.
    """
    order = list(range(len(pairs)))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    batches: list[list[int]] = []
    seen: list[set[str]] = []

    def texts(i: int) -> set[str]:
        return {"q:" + pairs[i].query, "p:" + pairs[i].positive}

    for i in order:
        for batch, held in zip(batches, seen, strict=True):
            if len(batch) < batch_size and not texts(i) & held:
                batch.append(i)
                held |= texts(i)
                break
        else:
            batches.append([i])
            seen.append(texts(i))
    for n in [n for n, batch in enumerate(batches) if len(batch) == 1]:
        (i,) = batches[n]
        home = next(
            (m for m, batch in enumerate(batches) if len(batch) > 1 and not texts(i) & seen[m]),
            None,
        )
        if home is not None:
            batches[home].append(i)
            seen[home] |= texts(i)
            batches[n] = []
        elif not pairs[i].negatives:
            batches[n] = []
    return [batch for batch in batches if batch]


def _train(
    pairs: Sequence[RelevancePair],
    base_dir: Path,
    params: FinetuneParams,
    out: Path,
    threads: int,
) -> dict[str, Any]:
    quiet_offline_hf()
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    torch.set_num_threads(threads)
    random.seed(params.seed)
    np.random.seed(params.seed)
    torch.manual_seed(params.seed)
    model = SentenceTransformer(str(base_dir), device="cpu")
    model.max_seq_length = params.max_seq_length
    loss_fn = MultipleNegativesRankingLoss(model, scale=params.scale)

    schedule = [b for epoch in range(params.epochs) for b in batches_for(
        pairs, params.batch_size, params.seed, epoch
    )]  # fmt: skip
    if params.max_steps is not None:
        schedule = schedule[: params.max_steps]
    steps = len(schedule)
    warmup = int(steps * params.warmup_ratio)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=params.learning_rate, weight_decay=params.weight_decay
    )

    def rate(step: int) -> float:  # linear warm-up, then linear decay to 0
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (steps - step) / max(1, steps - warmup))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    # sentence-transformers 6 renamed `tokenize` to `preprocess` (the old name warns)
    preprocess = getattr(model, "preprocess", None) or model.tokenize
    losses: list[float] = []
    model.train()
    for batch in schedule:
        chosen = [pairs[i] for i in batch]
        columns = [[p.query for p in chosen], [p.positive for p in chosen]]
        columns += [[p.negatives[n] for p in chosen] for n in range(len(chosen[0].negatives))]
        features = [preprocess(column) for column in columns]
        loss = loss_fn(features, torch.empty(0))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    model.eval()
    model.save(str(out), create_model_card=False)
    last_epoch = losses[-max(1, steps // params.epochs) :]
    return {
        "steps": steps,
        "loss_first": round(losses[0], 4) if losses else None,
        "loss_last": round(losses[-1], 4) if losses else None,
        "loss_mean_last_epoch": round(float(np.mean(last_epoch)), 4) if losses else None,
    }


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str] = {}
    for name in ("torch", "sentence-transformers", "transformers"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def read_manifest(model_dir: Path) -> dict[str, Any]:
    """The manifest of a fine-tuned model folder.

    Raises:
        ConfigError: The folder has no readable manifest.
    """
    path = model_dir / MANIFEST
    try:
        manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{model_dir} has no readable {MANIFEST} ({exc}) — it was not made by "
            "finetune_embedder, or its training did not finish"
        ) from exc
    return manifest


def record_evaluation(model_dir: Path, evaluation: dict[str, Any]) -> dict[str, Any]:
    """Merge ``evaluation`` (e.g. ``{"held_out": {...}, "train_half": {...}}``) into the
    manifest's ``evaluation`` and return the manifest. The model id does not change: it names
    what the model was trained from, not how it scored."""
    manifest = read_manifest(model_dir)
    manifest["evaluation"] = {**manifest.get("evaluation", {}), **evaluation}
    _write_json(model_dir / MANIFEST, manifest)
    return manifest


def promote(models_dir: Path, model: FinetunedModel, evidence: dict[str, Any]) -> Path:
    """Record ``model`` as the promoted one (``<models_dir>/promoted.json``) with the
    ``evidence`` that it won; returns the file. Nothing re-indexes here: the model is used
    with ``KBFLOW_EMBEDDING_MODEL=promoted`` (`tasks.text.embed.resolve_model`) and
    ``kbflow store reembed``."""
    record = {
        "model_id": model.model_id,
        "path": str(model.path),
        "base": model.manifest.get("base", {}),
        "promoted_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "evidence": evidence,
    }
    path = models_dir / PROMOTED
    _write_json(path, record)
    log.info("promoted %s: %s", model.model_id, evidence.get("reason", ""))
    return path


def promoted_model(models_dir: Path) -> dict[str, Any] | None:
    """The promotion record, or None when no model has been promoted."""
    path = models_dir / PROMOTED
    if not path.is_file():
        return None
    try:
        record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path} is not readable JSON ({exc}) — delete it and promote again"
        ) from exc
    return record


def list_models(models_dir: Path) -> list[dict[str, Any]]:
    """Manifests of the fine-tuned models under ``models_dir``, oldest first."""
    if not models_dir.is_dir():
        return []
    found = [
        read_manifest(child)
        for child in sorted(models_dir.iterdir())
        if child.is_dir() and (child / MANIFEST).is_file()
    ]
    return sorted(found, key=lambda m: (str(m.get("created_at", "")), str(m.get("model_id"))))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(staged, path)
