"""The refusal metric's arithmetic (the end-to-end run is in test_retrieval_eval.py)."""

from __future__ import annotations

import itertools
import random

import pytest

from evals.refusal import RefusalSupports, roc_auc


def brute_auc(pos: list[float], neg: list[float]) -> float:
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_roc_auc_matches_the_pairwise_definition_with_ties() -> None:
    rng = random.Random(7)
    for _ in range(50):
        pos = [round(rng.random(), 1) for _ in range(rng.randint(1, 12))]
        neg = [round(rng.random(), 1) for _ in range(rng.randint(1, 12))]
        assert roc_auc(pos, neg) == pytest.approx(brute_auc(pos, neg))
    assert roc_auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert roc_auc([0.1], [0.9]) == 0.0
    assert roc_auc([0.5], [0.5]) == 0.5
    with pytest.raises(ValueError, match="at least one"):
        roc_auc([], [0.1])


def test_metrics_at_the_threshold_and_per_query_rows() -> None:
    supports = RefusalSupports(
        answerable={"q1": 0.8, "q2": 0.5},
        unanswerable={"q1": 0.4, "q2": 0.6, "n1": 0.3},
    )
    got = supports.metrics(threshold=0.55)
    assert got["answered"] == 0.5  # q1 only
    assert got["refused"] == pytest.approx(2 / 3)  # q1 without, n1; not q2 without (0.6)
    assert got["refusal_auc"] == pytest.approx(brute_auc([0.8, 0.5], [0.4, 0.6, 0.3]))
    assert supports.per_query() == {
        "q1": {"support_answerable": 0.8, "support_unanswerable": 0.4},
        "q2": {"support_answerable": 0.5, "support_unanswerable": 0.6},
        "n1": {"support_unanswerable": 0.3},
    }
    assert RefusalSupports(answerable={"q1": 0.9}).metrics(0.5) == {}
