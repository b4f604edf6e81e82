"""Helpers the eval tests share (and the PostgreSQL warehouse test): eval records told apart by
their values, and the checks of a question set's answers against its documents' text."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

from evals.questions import Question
from evals.warehouse import EvalRecord

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
MODES = ("keyword", "dense")
QUERIES = ("q1", "q2", "q3")


def make_record(
    run_id: str,
    started_at: datetime,
    *,
    base: float,
    commit: str | None = "abc1234",
    dataset: str = "scifact-mini",
) -> EvalRecord:
    """Two modes x three queries; every value derives from ``base`` so runs are told apart."""
    per_query = {
        mode: {
            qid: {
                "mrr@10": base + 0.1 * m + 0.01 * q,
                "ndcg@10": base + 0.1 * m + 0.02 * q,
                "recall@100": min(1.0, base + 0.1 * m + 0.03 * q + 0.2),
            }
            for q, qid in enumerate(QUERIES)
        }
        for m, mode in enumerate(MODES)
    }
    modes = {
        mode: {
            metric: sum(values[metric] for values in by_query.values()) / len(by_query)
            for metric in ("mrr@10", "ndcg@10", "recall@100")
        }
        for mode, by_query in per_query.items()
    }
    return EvalRecord(
        run_id=run_id,
        dataset=dataset,
        started_at=started_at,
        commit=commit,
        settings={"rrf_k": 60, "embedding_model": "minilm"},
        modes=modes,
        per_query=per_query,
        seconds=12.5,
    )


OLD = make_record("run-old", T0, base=0.3, commit=None)
# Given in another zone: it is stored as UTC.
NEW = make_record(
    "run-new", (T0 + timedelta(days=1)).astimezone(timezone(timedelta(hours=2))), base=0.5
)


# Text formats Docling reads in about a second together: checked in the default run.
QUICK_SUFFIXES = frozenset({".csv", ".md", ".html", ".docx", ".pptx"})


def normalise(text: str) -> str:
    """Case-folded, with every run of whitespace one space (extraction pads table cells)."""
    return re.sub(r"\s+", " ", text).strip().casefold()


def check_answers(questions: list[Question], texts: dict[str, str]) -> None:
    """Each answer is in the extracted text of every relevant file held in ``texts``."""
    missing = [
        (q.id, name, q.answer)
        for q in questions
        if q.answerable
        for name in q.relevant
        if name in texts and normalise(q.answer or "") not in normalise(texts[name])
    ]
    assert not missing, f"answers not found in their documents: {missing}"


def check_not_copied(questions: list[Question], texts: dict[str, str]) -> None:
    """No question is a sentence of the corpus copied as it stands."""
    corpus = " ".join(normalise(t) for t in texts.values())
    copied = [q.id for q in questions if normalise(q.text).rstrip("?") in corpus]
    assert not copied, f"questions copied from the documents: {copied}"
