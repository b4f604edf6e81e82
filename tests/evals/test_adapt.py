"""Adapting the embedder on a BEIR folder: passages as ingest makes them, pairs from the
training half only, max-passage document rankings and metrics by half."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import ConfigError
from evals.adapt import (
    corpus_passages,
    document_run,
    passage_rankings,
    per_query_means,
    scores_by_half,
    training_pairs,
)
from evals.beir import BeirDataset, load_beir
from tasks.text.finetune import split_by_position

LONG = " ".join(f"Sentence {n} about turbines." for n in range(40))  # 160 words: 2 chunks of 100


@pytest.fixture
def dataset(tmp_path: Path) -> BeirDataset:
    corpus = [
        {"_id": "d1", "title": "Turbines", "text": LONG},
        {"_id": "d2", "title": "Expenses", "text": "A line manager approves claims."},
        {"_id": "d3", "title": "Leave", "text": "Staff get 25 days of leave."},
        {"_id": "d4", "title": "", "text": "Timesheets are due on Fridays."},
    ]
    queries = [
        {"_id": "q0", "text": "turbine service"},
        {"_id": "q1", "text": "HELD OUT who approves claims"},
        {"_id": "q2", "text": "leave allowance"},
        {"_id": "q3", "text": "HELD OUT timesheets"},
    ]
    qrels = "query-id\tcorpus-id\tscore\nq0\td1\t1\nq1\td2\t1\nq2\td3\t1\nq2\td4\t1\nq3\td4\t1\n"
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(c) for c in corpus))
    (tmp_path / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries))
    (tmp_path / "qrels.tsv").write_text(qrels)
    return load_beir(tmp_path)


def test_passages_are_the_texts_the_index_embeds(dataset: BeirDataset) -> None:
    passages = corpus_passages(dataset, max_words=100, overlap_words=10)
    assert passages.of_doc == {"d1": [0, 1], "d2": [2], "d3": [3], "d4": [4]}
    assert passages.texts[0].startswith("Turbines\nSentence 0 about")
    assert passages.texts[1].startswith("Turbines\n") and "Sentence 39" in passages.texts[1]
    assert passages.texts[4] == "Timesheets are due on Fridays."  # no title, no heading


def test_pairs_come_from_the_training_half_only(dataset: BeirDataset) -> None:
    passages = corpus_passages(dataset, max_words=100, overlap_words=10)
    split = split_by_position(list(dataset.queries))
    assert split.held_out == ("q1", "q3")
    # the base model prefers d1's second chunk for q0
    ranking = {"q0": [1, 0, 2, 3, 4], "q2": [4, 3, 0, 1, 2]}
    pairs = training_pairs(dataset, split, passages, ranking=ranking)
    assert {p.query for p in pairs} == {"turbine service", "leave allowance"}
    assert not any("HELD OUT" in p.query for p in pairs)
    assert [p.positive for p in pairs if p.query == "turbine service"] == [passages.texts[1]]
    assert len([p for p in pairs if p.query == "leave allowance"]) == 2  # two judged documents
    every = training_pairs(dataset, split, passages, ranking=ranking, positives="all")
    assert [p.positive for p in every if p.query == "turbine service"] == list(passages.texts[:2])

    mined = {"q0": [0, 1, 2, 3, 4], "q2": [3, 4, 2, 1, 0]}
    hard = training_pairs(
        dataset, split, passages, ranking=ranking, negatives=mined, skip_top=0, pool=2
    )
    texts = passages.texts
    # judged chunks are never negatives: q0's candidates are 2, 3; q2's are 2, 1
    assert all(len(p.negatives) == 1 for p in hard)
    assert {p.negatives[0] for p in hard if p.query == "turbine service"} <= {texts[2], texts[3]}
    assert {p.negatives[0] for p in hard if p.query == "leave allowance"} <= {texts[2], texts[1]}
    assert hard == training_pairs(
        dataset, split, passages, ranking=ranking, negatives=mined, skip_top=0, pool=2
    )
    with pytest.raises(ConfigError, match="no base ranking for training query 'q2'"):
        training_pairs(dataset, split, passages, ranking={"q0": [0]})


def test_documents_rank_by_their_best_passage(dataset: BeirDataset) -> None:
    import numpy as np

    passages = corpus_passages(dataset, max_words=100, overlap_words=10)
    scores = np.array([[0.1, 0.9, 0.5, 0.2, 0.3], [0.8, 0.1, 0.2, 0.95, 0.0]])
    run = document_run(["q0", "q1"], scores, passages, depth=3)
    assert run == {"q0": ["d1", "d2", "d4"], "q1": ["d3", "d1", "d2"]}
    assert passage_rankings(scores, 2).tolist() == [[1, 2], [3, 0]]
    assert passage_rankings(scores).tolist()[0] == [1, 2, 4, 3, 0]


def test_metrics_are_reported_per_half(dataset: BeirDataset) -> None:
    split = split_by_position(list(dataset.queries))
    run = {"q0": ["d1"], "q1": ["d3", "d2"], "q2": ["d9"], "q3": ["d4"]}
    halves = scores_by_half(run, dataset.qrels, split)
    assert halves["train"]["queries"] == halves["held_out"]["queries"] == 2
    assert halves["train"]["mrr@10"] == pytest.approx(0.5)  # q0 first, q2 missed
    assert halves["held_out"]["mrr@10"] == pytest.approx(0.75)  # q1 second, q3 first
    assert halves["all"]["mrr@10"] == pytest.approx(0.625)

    rows = {"q0": {"mrr@10": 1.0}, "q1": {"mrr@10": 0.5}, "q2": {"mrr@10": 0.0}}
    with pytest.raises(ConfigError, match=r"no recorded metrics for 1 queries, e\.g\. 'q3'"):
        per_query_means(rows, split)
    rows["q3"] = {"mrr@10": 1.0}
    means = per_query_means(rows, split)
    assert means["held_out"] == {"mrr@10": 0.75, "queries": 2}
    assert means["train"] == {"mrr@10": 0.5, "queries": 2}
