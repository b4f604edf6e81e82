"""The ``finetune-embedder`` flow: train a candidate on a BEIR folder's training half -> score
the base and the candidate on the held-out half -> promote the candidate only if it wins.

The queries are split by position (`tasks.text.finetune.split_by_position`): even positions
train, odd positions are held out, so the decision rests on queries the model never saw. The
scores are a brute-force dense search over the corpus chunked as the index chunks it
(`evals.adapt`); the embeddings are cached in ``<KBFLOW_HOME>/cache/embeddings.sqlite``, so a
later ``kbflow eval run`` with ``KBFLOW_EMBEDDING_MODEL=<model folder>`` embeds nothing again.

Promotion writes ``<KBFLOW_HOME>/models/promoted.json``; nothing is re-indexed and no setting
changes here (that is the next step's design).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from core.settings import Settings
from evals.adapt import NegativesFrom, decide_and_promote, score_model, train_candidate
from tasks.text.finetune import FinetunedModel, FinetuneParams

THREADS = 2  # torch and ONNX Runtime threads: training shares the machine with the platform


@task(name="train-candidate", cache_policy=NO_CACHE)
def train_candidate_task(
    dataset: str, split: str | None, base: str, params: FinetuneParams, negatives: NegativesFrom
) -> FinetunedModel:
    return train_candidate(
        Settings(), Path(dataset), split, base=base, params=params,
        negatives=negatives,
        threads=THREADS,
    )  # fmt: skip


@task(name="score-model", cache_policy=NO_CACHE)
def score_model_task(dataset: str, split: str | None, model: str) -> dict[str, dict[str, Any]]:
    return score_model(Settings(), Path(dataset), model, split, threads=THREADS)


@task(name="promote-if-better", cache_policy=NO_CACHE)
def promote_task(
    candidate: FinetunedModel,
    base_scores: dict[str, dict[str, Any]],
    candidate_scores: dict[str, dict[str, Any]],
    min_gain: float,
) -> dict[str, Any]:
    return decide_and_promote(
        Settings().models_dir, candidate, base_scores, candidate_scores, min_gain=min_gain
    )


@flow(name="finetune-embedder")
def finetune_embedder_flow(
    dataset: str,
    split: str | None = None,
    base: str | None = None,
    params: FinetuneParams | None = None,
    negatives: NegativesFrom = "none",
    min_gain: float = 0.0,
) -> dict[str, Any]:
    """Fine-tune the embedding model on a BEIR folder's judged pairs and promote a winner.

    Args:
        dataset: A BEIR folder (corpus, queries, qrels).
        split: Its split (default: test, then dev, then none).
        base: The model to adapt (default: the configured embedding model).
        params: Training settings (default: `FinetuneParams()`).
        negatives: Hard negatives per pair mined from ``bm25`` or the base model (``dense``),
            or ``none`` (in-batch negatives only).
        min_gain: Held-out nDCG@10 the candidate must gain over the base to be promoted.
    """
    logger = get_run_logger()
    base = base or Settings().ingest.embedding_model
    candidate = train_candidate_task(dataset, split, base, params or FinetuneParams(), negatives)
    logger.info("candidate %s trained on %s pairs", candidate.model_id,
                candidate.manifest["data"]["pairs"])  # fmt: skip
    base_scores = score_model_task(dataset, split, base)
    candidate_scores = score_model_task(dataset, split, str(candidate.path))
    report = promote_task(candidate, base_scores, candidate_scores, min_gain)
    logger.info("%s: %s", "promoted" if report["promoted"] else "not promoted", report["reason"])
    return report
