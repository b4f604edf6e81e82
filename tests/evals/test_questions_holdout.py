"""The held-out questions (``evals/questions/holdout.jsonl``): their shape, their answers in the
extracted documents, and that no calibration reads them.

Demo and real-docs text formats run by default; real-docs PDFs (the Korean one included) in the
slow run, like tests/evals/test_questions.py.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from evals.demo_corpus import PRICING_DRAFT_FILE
from evals.questions import (
    CORPORA,
    HOLDOUT_FILE,
    QUESTIONS_FILE,
    load_holdout,
    load_questions,
    sources_for,
)
from tasks.ingest.extract import file_to_document
from tests.evals.support import QUICK_SUFFIXES, check_answers, check_not_copied

REPO = Path(__file__).resolve().parents[2]
NEW_KINDS = ("table-cell", "superlative", "total", "non-english")


def test_the_holdout_parses_with_its_own_ids_and_kinds() -> None:
    held = load_holdout()
    assert len(held) >= 30
    assert [q.id for q in held] == [f"q-hold-{i:03d}" for i in range(1, len(held) + 1)]
    assert not {q.id for q in held} & {q.id for q in load_questions()}
    assert set(CORPORA) == {q.corpus for q in held}
    kinds = Counter(q.kind for q in held)
    assert all(kinds[k] >= 2 for k in NEW_KINDS), kinds
    assert kinds["near-miss"] >= 10
    assert all(q.answerable == (q.kind != "near-miss") for q in held)
    assert not [q.id for q in held if PRICING_DRAFT_FILE in q.relevant]


def test_no_holdout_question_repeats_one_of_the_set() -> None:
    def words(text: str) -> str:
        return re.sub(r"\W+", " ", text).strip().casefold()

    asked = {words(q.text) for q in load_questions()}
    assert not [q.id for q in load_holdout() if words(q.text) in asked]


def test_no_calibration_reads_the_holdout() -> None:
    """Only the answer eval may ask the held-out questions: a bench or eval that chooses a
    weight or a threshold must never see them."""
    allowed = {REPO / "evals" / "answers.py", REPO / "evals" / "questions" / "__init__.py"}
    readers = [
        str(path.relative_to(REPO))
        for folder in ("bench", "evals", "tasks", "kbflow", "flows")
        for path in (REPO / folder).rglob("*.py")
        if path not in allowed
        and re.search(r"load_holdout|HOLDOUT_FILE|holdout\.jsonl", path.read_text("utf-8"))
    ]
    assert not readers, f"the held-out questions are read by {readers}"
    assert HOLDOUT_FILE != QUESTIONS_FILE


def test_every_demo_holdout_answer_is_in_its_extracted_document(tmp_path: Path) -> None:
    held = load_holdout("demo")
    sources = sources_for("demo", demo_folder=tmp_path)
    wanted = {name for q in held for name in q.relevant}
    texts = {p.name: file_to_document(p).text for p in sources if p.name in wanted}
    assert wanted <= set(texts)
    check_answers(held, texts)
    check_not_copied(held, texts)


def test_real_docs_holdout_answers_in_the_text_formats(real_sources: list[Path]) -> None:
    held = load_holdout("real-docs")
    assert {n for q in held for n in q.relevant} <= {p.name for p in real_sources}
    texts = {p.name: file_to_document(p).text for p in real_sources if p.suffix in QUICK_SUFFIXES}
    checked = [q for q in held if q.answerable and set(q.relevant) <= set(texts)]
    assert len(checked) >= 8
    check_answers(checked, texts)
    check_not_copied(held, texts)


@pytest.mark.slow
def test_every_real_docs_holdout_answer_is_in_its_document(real_sources: list[Path]) -> None:
    held = load_holdout("real-docs")
    wanted = {name for q in held for name in q.relevant}
    texts = {p.name: file_to_document(p).text for p in real_sources if p.name in wanted}
    check_answers(held, texts)
    check_not_copied(held, texts)
