"""Retrieval quality: MRR@10, nDCG@10 and Recall@100 of a ranked run against graded judgements.

The definitions follow trec_eval (the reference BEIR reports with), so figures compare with
published ones: a document is relevant when its grade is above 0; nDCG uses the grade itself as
the gain (linear, as trec_eval's ``ndcg_cut``) with a ``log2(rank + 1)`` discount, and its ideal
ranking is the judged grades sorted best first. Two choices differ from a bare trec_eval call and
are made on purpose:

- A query that has relevant documents but is missing from the run scores 0 and counts in the
  mean (trec_eval silently leaves it out, which flatters a system that fails on hard queries).
- A document repeated in a ranked list counts once, at its first rank, so a repeat cannot
  earn gain or recall twice (trec_eval's input has one score per doc id, so it never sees one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.errors import ConfigError

Qrels = dict[str, dict[str, int]]
"""Query id -> {doc id: relevance grade}; a grade above 0 means relevant."""

Run = dict[str, list[str]]
"""Query id -> doc ids, best first."""

METRICS: tuple[str, ...] = ("mrr@10", "ndcg@10", "recall@100")


def _check_k(k: int) -> None:
    if k < 1:
        raise ConfigError(f"the metric cutoff k must be at least 1. Currently, k is {k}.")


def _top_k(ranked: Sequence[str], k: int) -> list[str]:
    """The first ``k`` distinct doc ids, in order: a repeated id keeps its first rank only."""
    top: dict[str, None] = {}
    for doc_id in ranked:
        if len(top) == k:
            break
        top.setdefault(doc_id, None)
    return list(top)


def mrr_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 10) -> float:
    """Reciprocal rank of the first relevant document within the top ``k``.

    Args:
        ranked: Doc ids, best first; a repeated id counts at its first rank only.
        relevant: Doc id -> grade; grades above 0 are relevant.
        k: Cutoff; a first hit below rank ``k`` scores 0.

    Returns:
        ``1 / rank`` of the first relevant document in the top ``k``, else 0.

    Raises:
        ConfigError: ``k`` is below 1.
    """
    _check_k(k)
    for rank, doc_id in enumerate(_top_k(ranked, k), start=1):
        if relevant.get(doc_id, 0) > 0:
            return 1.0 / rank
    return 0.0


def ndcg_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 10) -> float:
    """Normalised discounted cumulative gain of the top ``k``, as trec_eval's ``ndcg_cut``.

    The gain of a document is its grade (grades of 0 or below gain nothing), discounted by
    ``log2(rank + 1)``; the ideal is the judged grades sorted best first, cut at ``k``.

    Args:
        ranked: Doc ids, best first; a repeated id counts at its first rank only.
        relevant: Doc id -> grade.
        k: Cutoff.

    Returns:
        DCG / ideal DCG, in [0, 1]; 0 when no document is relevant.

    Raises:
        ConfigError: ``k`` is below 1.
    """
    _check_k(k)
    dcg = math.fsum(
        grade / math.log2(rank + 1)
        for rank, doc_id in enumerate(_top_k(ranked, k), start=1)
        if (grade := relevant.get(doc_id, 0)) > 0
    )
    ideal_grades = sorted((g for g in relevant.values() if g > 0), reverse=True)[:k]
    ideal = math.fsum(g / math.log2(rank + 1) for rank, g in enumerate(ideal_grades, start=1))
    return dcg / ideal if ideal > 0 else 0.0


def recall_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 100) -> float:
    """Share of the relevant documents (grade above 0) that the top ``k`` retrieved.

    Args:
        ranked: Doc ids, best first; a repeated id counts once.
        relevant: Doc id -> grade.
        k: Cutoff.

    Returns:
        ``|relevant in top k| / |relevant|``; 0 when no document is relevant.

    Raises:
        ConfigError: ``k`` is below 1.
    """
    _check_k(k)
    wanted = {doc_id for doc_id, grade in relevant.items() if grade > 0}
    if not wanted:
        return 0.0
    return len(wanted.intersection(_top_k(ranked, k))) / len(wanted)


@dataclass(frozen=True)
class Scores:
    """The metrics of one run: the mean over the evaluated queries, and each query's values."""

    mean: dict[str, float]
    """Metric name (one of `METRICS`) -> mean over the evaluated queries."""
    per_query: dict[str, dict[str, float]]
    """Query id -> metric name -> value."""
    queries: int
    """How many queries were evaluated: those of the qrels with a relevant document."""


def evaluate(run: Run, qrels: Qrels) -> Scores:
    """Score a run with every metric of `METRICS`.

    Every query of ``qrels`` with at least one relevant document (grade above 0) is evaluated;
    one the run lacks scores 0 on every metric and still counts in the mean. Queries of the run
    that the qrels do not judge are ignored.

    Args:
        run: Query id -> doc ids, best first.
        qrels: Query id -> {doc id: grade}.

    Returns:
        The mean and per-query scores.

    Raises:
        ConfigError: No query of ``qrels`` has a relevant document, so there is nothing to score.
    """
    per_query: dict[str, dict[str, float]] = {}
    for qid, judged in qrels.items():
        if not any(grade > 0 for grade in judged.values()):
            continue
        ranked = run.get(qid, [])
        per_query[qid] = {
            "mrr@10": mrr_at_k(ranked, judged, 10),
            "ndcg@10": ndcg_at_k(ranked, judged, 10),
            "recall@100": recall_at_k(ranked, judged, 100),
        }
    if not per_query:
        raise ConfigError(
            f"no query of the qrels ({len(qrels)} queries) has a relevant document (grade > 0), "
            "so there is nothing to evaluate — check that the qrels file is the right one and "
            "that its third column holds the relevance grades"
        )
    mean = {m: math.fsum(s[m] for s in per_query.values()) / len(per_query) for m in METRICS}
    return Scores(mean=mean, per_query=per_query, queries=len(per_query))
