"""Retrieval metrics: hand-computed cases, and congruence with trec_eval (via pytrec_eval)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence

import pytest

from core.errors import ConfigError
from evals.beir import load_beir
from evals.metrics import METRICS, Qrels, Run, evaluate, mrr_at_k, ndcg_at_k, recall_at_k
from tests.conftest import datasets_dir

# --- MRR@k ---------------------------------------------------------------------------------


def test_mrr_is_the_reciprocal_rank_of_the_first_relevant_doc() -> None:
    assert mrr_at_k(["a", "b", "c"], {"b": 1, "c": 2}) == 0.5
    assert mrr_at_k(["a", "b", "c"], {"a": 1}) == 1.0


def test_mrr_ignores_grade_zero() -> None:
    assert mrr_at_k(["a", "b", "c"], {"a": 0, "b": 0, "c": 1}) == pytest.approx(1 / 3)


def test_mrr_is_zero_when_the_first_relevant_doc_is_past_the_cutoff() -> None:
    ranked = [f"d{i}" for i in range(1, 12)]  # d11 at rank 11
    assert mrr_at_k(ranked, {"d11": 1}, k=10) == 0.0
    assert mrr_at_k(ranked, {"d11": 1}, k=11) == pytest.approx(1 / 11)


def test_mrr_of_an_empty_ranking_or_no_relevant_doc_is_zero() -> None:
    assert mrr_at_k([], {"a": 1}) == 0.0
    assert mrr_at_k(["a"], {}) == 0.0


def test_mrr_counts_a_repeated_doc_at_its_first_rank() -> None:
    # Deduped: x, a -> a is at rank 2, not 3; and the repeats do not push it past k.
    assert mrr_at_k(["x", "x", "a"], {"a": 1}) == 0.5
    assert mrr_at_k(["x", "x", "x", "a"], {"a": 1}, k=2) == 0.5


# --- nDCG@k --------------------------------------------------------------------------------


def test_ndcg_uses_the_grade_as_gain() -> None:
    # DCG = 1/log2(2) + 2/log2(4) = 2; ideal: grades 2, 1 -> 2/log2(2) + 1/log2(3).
    ndcg = ndcg_at_k(["a", "b", "c"], {"a": 1, "c": 2})
    assert ndcg == pytest.approx(2 / (2 + 1 / math.log2(3)), abs=1e-12)
    assert ndcg == pytest.approx(0.760_19, abs=1e-5)


def test_ndcg_is_one_for_the_ideal_order() -> None:
    assert ndcg_at_k(["c", "a", "b"], {"a": 1, "c": 2, "b": 0}) == pytest.approx(1.0)


def test_ndcg_ideal_counts_relevant_docs_the_run_missed() -> None:
    assert ndcg_at_k(["a"], {"a": 1, "b": 1}) == pytest.approx(1 / (1 + 1 / math.log2(3)))


def test_ndcg_ideal_is_cut_at_k() -> None:
    # Three relevant docs but k=2: two hits at the top is already ideal.
    assert ndcg_at_k(["a", "b", "c"], {"a": 1, "b": 1, "c": 1}, k=2) == pytest.approx(1.0)
    # A hit below the cutoff gains nothing.
    assert ndcg_at_k(["x", "y", "a"], {"a": 2}, k=2) == 0.0


def test_ndcg_of_an_empty_ranking_or_no_relevant_doc_is_zero() -> None:
    assert ndcg_at_k([], {"a": 2}) == 0.0
    assert ndcg_at_k(["a"], {"a": 0}) == 0.0


def test_ndcg_counts_a_repeated_doc_once() -> None:
    # Counted twice, "a" would push DCG past the ideal (nDCG > 1).
    assert ndcg_at_k(["a", "a", "b"], {"a": 1, "b": 1}) == pytest.approx(1.0)
    assert ndcg_at_k(["a", "a", "a"], {"a": 2, "b": 2}) == pytest.approx(1 / (1 + 1 / math.log2(3)))


# --- Recall@k ------------------------------------------------------------------------------


def test_recall_is_the_share_of_relevant_docs_in_the_top_k() -> None:
    relevant = {"a": 1, "c": 1, "d": 2, "e": 0}  # three relevant: a, c, d
    assert recall_at_k(["a", "b", "c"], relevant, k=2) == pytest.approx(1 / 3)
    assert recall_at_k(["a", "b", "c"], relevant) == pytest.approx(2 / 3)
    assert recall_at_k(["e", "b"], relevant) == 0.0


def test_recall_of_an_empty_ranking_or_no_relevant_doc_is_zero() -> None:
    assert recall_at_k([], {"a": 1}) == 0.0
    assert recall_at_k(["a"], {"a": 0}) == 0.0


def test_recall_counts_a_repeated_doc_once() -> None:
    assert recall_at_k(["a", "a", "a"], {"a": 1, "b": 1}) == 0.5
    assert recall_at_k(["a", "a", "b"], {"a": 1, "b": 1}, k=2) == 1.0


@pytest.mark.parametrize("metric", [mrr_at_k, ndcg_at_k, recall_at_k])
def test_a_cutoff_below_one_is_refused(
    metric: Callable[[Sequence[str], Mapping[str, int], int], float],
) -> None:
    with pytest.raises(ConfigError, match=r"k must be at least 1\. Currently, k is 0"):
        metric(["a"], {"a": 1}, 0)


# --- evaluate ------------------------------------------------------------------------------


def test_evaluate_scores_each_query_and_averages() -> None:
    qrels: Qrels = {"q1": {"a": 1}, "q2": {"b": 2, "c": 1}}
    run: Run = {"q1": ["a"], "q2": ["x", "b"]}
    scores = evaluate(run, qrels)
    assert scores.queries == 2
    assert scores.per_query["q1"] == {"mrr@10": 1.0, "ndcg@10": 1.0, "recall@100": 1.0}
    q2 = scores.per_query["q2"]
    assert q2["mrr@10"] == 0.5
    assert q2["ndcg@10"] == pytest.approx((2 / math.log2(3)) / (2 + 1 / math.log2(3)))
    assert q2["recall@100"] == 0.5
    assert set(scores.mean) == set(METRICS)
    for metric in METRICS:
        assert scores.mean[metric] == pytest.approx((1.0 + q2[metric]) / 2)


def test_a_query_missing_from_the_run_scores_zero_and_counts() -> None:
    scores = evaluate({"q1": ["a"]}, {"q1": {"a": 1}, "q2": {"b": 1}})
    assert scores.queries == 2
    assert scores.per_query["q2"] == dict.fromkeys(METRICS, 0.0)
    assert scores.mean == dict.fromkeys(METRICS, 0.5)


def test_an_empty_run_scores_zero() -> None:
    scores = evaluate({}, {"q1": {"a": 1}, "q2": {"b": 2}})
    assert scores.queries == 2
    assert scores.mean == dict.fromkeys(METRICS, 0.0)
    assert evaluate({"q1": []}, {"q1": {"a": 1}}).mean == dict.fromkeys(METRICS, 0.0)


def test_unjudged_run_queries_and_queries_without_relevant_docs_are_left_out() -> None:
    qrels: Qrels = {"q1": {"a": 1}, "q0": {"a": 0, "b": 0}, "q-empty": {}}
    run: Run = {"q1": ["a"], "q0": ["a"], "stray": ["a", "b"]}
    scores = evaluate(run, qrels)
    assert scores.queries == 1
    assert set(scores.per_query) == {"q1"}
    assert scores.mean == dict.fromkeys(METRICS, 1.0)


def test_evaluate_dedupes_ranked_lists() -> None:
    scores = evaluate({"q1": ["x", "x", "a", "a", "b"]}, {"q1": {"a": 1, "b": 1}})
    assert scores.per_query["q1"]["mrr@10"] == 0.5
    assert scores.per_query["q1"]["recall@100"] == 1.0
    ideal = 1 + 1 / math.log2(3)
    assert scores.per_query["q1"]["ndcg@10"] == pytest.approx(
        (1 / math.log2(3) + 1 / math.log2(4)) / ideal
    )


def test_evaluate_refuses_qrels_without_any_relevant_doc() -> None:
    with pytest.raises(ConfigError, match=r"no query of the qrels \(2 queries\) has a relevant"):
        evaluate({"q1": ["a"]}, {"q1": {"a": 0}, "q2": {}})


# --- congruence with trec_eval ---------------------------------------------------------------


def assert_matches_trec_eval(run: Run, qrels: Qrels) -> None:
    """`evaluate` equals pytrec_eval's recip_rank, ndcg_cut_10 and recall_100, to 1e-9."""
    pytrec_eval = pytest.importorskip("pytrec_eval")

    def as_trec_run(ranks: Run, cutoff: int | None = None) -> dict[str, dict[str, float]]:
        # trec_eval ranks by score: give descending floats, first occurrence of a repeated id
        # wins (as in `evaluate`). An empty list is left out, as trec_eval would not see it.
        trec: dict[str, dict[str, float]] = {}
        for qid, ranked in ranks.items():
            docs = list(dict.fromkeys(ranked))[:cutoff]
            if docs:
                trec[qid] = {doc: float(len(docs) - i) for i, doc in enumerate(docs)}
        return trec

    full = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(
        as_trec_run(run)
    )
    # trec_eval's recip_rank has no cutoff (a first hit at rank 50 scores 1/50): scoring the run
    # cut to its top 10 gives MRR@10.
    mrr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(as_trec_run(run, 10))
    reference = {
        qid: {
            "mrr@10": mrr[qid]["recip_rank"],
            "ndcg@10": full[qid]["ndcg_cut_10"],
            "recall@100": full[qid]["recall_100"],
        }
        for qid in full
    }

    scores = evaluate(run, qrels)
    evaluated = {qid for qid, judged in qrels.items() if any(g > 0 for g in judged.values())}
    assert set(scores.per_query) == evaluated
    # pytrec_eval omits queries the run lacks; `evaluate` scores them 0 and counts them.
    missing = evaluated - set(reference)
    for qid in missing:
        assert scores.per_query[qid] == dict.fromkeys(METRICS, 0.0), qid
    for qid in evaluated - missing:
        for metric in METRICS:
            assert scores.per_query[qid][metric] == pytest.approx(
                reference[qid][metric], abs=1e-9
            ), (qid, metric)
    for metric in METRICS:
        expected = math.fsum(reference[q][metric] for q in evaluated - missing) / len(evaluated)
        assert scores.mean[metric] == pytest.approx(expected, abs=1e-9), metric


def random_run_and_qrels(seed: int, queries: int = 200) -> tuple[Run, Qrels]:
    """Graded 0-2 qrels and runs of 0-150 docs, with every case the comparison must survive:
    queries missing from the run, unjudged run queries, all-zero qrels, repeated doc ids."""
    rng = random.Random(seed)
    pool = [f"d{i}" for i in range(400)]
    qrels: Qrels = {}
    run: Run = {}
    for q in range(queries):
        qid = f"q{q}"
        judged = rng.sample(pool, rng.randint(1, 12))
        qrels[qid] = {doc: rng.choice((0, 0, 1, 1, 2)) for doc in judged}
        if rng.random() < 0.1:
            continue  # not in the run
        length = rng.randint(0, 150)
        # Mix judged docs into the ranking so that hits land at every depth.
        candidates = list(dict.fromkeys(rng.sample(pool, length) + judged))
        rng.shuffle(candidates)
        ranked = candidates[:length]
        if ranked and rng.random() < 0.2:
            ranked.insert(rng.randint(0, len(ranked)), rng.choice(ranked))
        run[qid] = ranked
    for q in range(20):
        run[f"stray{q}"] = rng.sample(pool, 10)
    return run, qrels


def test_random_runs_match_trec_eval() -> None:
    run, qrels = random_run_and_qrels(seed=20240607)
    # The data must reach the cases the comparison is about.
    assert any(qid not in run for qid in qrels)
    assert any(qid in run and not run[qid] for qid in qrels)
    assert any(not any(judged.values()) for judged in qrels.values())
    assert any(len(ranked) != len(set(ranked)) for ranked in run.values())
    assert any(2 in judged.values() for judged in qrels.values())
    scores = evaluate(run, qrels)
    assert 0 < scores.mean["mrr@10"] < 1
    assert any(0 < s["mrr@10"] < 1 for s in scores.per_query.values())
    assert any(0 < s["ndcg@10"] < 1 for s in scores.per_query.values())
    assert any(0 < s["recall@100"] < 1 for s in scores.per_query.values())
    assert_matches_trec_eval(run, qrels)


def test_a_bm25_run_on_scifact_dev_matches_trec_eval() -> None:
    bm25s = pytest.importorskip("bm25s")
    from tasks.text.sparse import analyze

    dataset = load_beir(datasets_dir("scifact"))
    docs = list(dataset.corpus())
    # bm25s scores (it ranks 5k documents in-process, fast); the terms are kbflow's own
    # analyser's, as on every keyword path, not bm25s's tokenizer.
    retriever = bm25s.BM25()
    retriever.index([analyze(f"{d.title} {d.text}") for d in docs], show_progress=False)
    qids = list(dataset.queries)
    hits, _ = retriever.retrieve(
        [analyze(dataset.queries[q]) for q in qids], k=100, show_progress=False
    )
    run: Run = {qid: [docs[i].id for i in row] for qid, row in zip(qids, hits, strict=True)}

    assert_matches_trec_eval(run, dataset.qrels)
    scores = evaluate(run, dataset.qrels)
    assert scores.queries == len(dataset.queries)
    # A sanity bound, not a benchmark: BM25 finds something on SciFact, and not everything.
    assert 0.3 < scores.mean["ndcg@10"] < 0.95
