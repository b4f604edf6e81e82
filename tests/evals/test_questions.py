"""The hand-written question set: its shape, its answers against the extracted documents, and
its BEIR folders read back by the loader.

The demo side runs by default (its documents are generated). Real-docs skips without
../shared/datasets; its text-format files are checked by default, and the full set (PDFs and the
TIFF scan, OCR included: about a minute on two cores) only in the slow run.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from core.errors import ConfigError
from evals.beir import load_beir
from evals.demo_corpus import PRICING_DRAFT_FILE
from evals.questions import (
    CORPORA,
    QUESTIONS_FILE,
    Question,
    load_questions,
    sources_for,
    write_question_set,
)
from tasks.ingest.extract import file_to_document
from tests.conftest import DATASETS, require_binaries
from tests.evals.support import QUICK_SUFFIXES, check_answers, check_not_copied


def check_beir_folder(folder: Path, questions: list[Question], sources: list[Path]) -> None:
    """The folder loads through `load_beir` with every answerable question and judgement."""
    dataset = load_beir(folder)
    answerable = [q for q in questions if q.answerable]
    assert dataset.queries == {q.id: q.text for q in answerable}
    assert dataset.qrels == {q.id: dict.fromkeys(q.relevant, 1) for q in answerable}
    assert [doc.id for doc in dataset.corpus()] == [p.name for p in sources]
    header = (folder / "qrels.tsv").read_text(encoding="utf-8").splitlines()[0]
    assert header == "query-id\tcorpus-id\tscore"


# --- the file ----------------------------------------------------------------------------------


def test_the_set_parses_with_unique_ids_and_meets_the_floors() -> None:
    questions = load_questions()
    assert len({q.id for q in questions}) == len(questions) >= 70
    assert sum(q.answerable for q in questions) >= 40
    assert sum(not q.answerable for q in questions) >= 25
    by_corpus = Counter(q.corpus for q in questions)
    assert set(by_corpus) == set(CORPORA)
    assert all(n >= 20 for n in by_corpus.values())
    for corpus in CORPORA:
        kinds = Counter(q.kind for q in load_questions(corpus))
        assert kinds["paraphrase"] >= 10 and kinds["near-miss"] >= 10, (corpus, kinds)
    assert all(q.id.startswith("q-demo-" if q.corpus == "demo" else "q-real-") for q in questions)


def test_answerable_questions_cite_files_and_unanswerable_ones_cite_nothing() -> None:
    for q in load_questions():
        if q.answerable:
            assert q.relevant and q.answer and q.kind in ("direct", "paraphrase"), q
        else:
            assert q.relevant == () and q.answer is None and q.kind == "near-miss", q


def test_no_demo_question_cites_the_draft() -> None:
    assert not [q.id for q in load_questions("demo") if PRICING_DRAFT_FILE in q.relevant]


BAD_LINES = {
    "not json": ("{", "not valid JSON"),
    "missing field": ('{"_id": "x"}', "want exactly the fields"),
    "bad kind": (
        '{"_id": "x", "corpus": "demo", "text": "Q?", "answerable": true, '
        '"relevant": ["a.md"], "answer": "a", "kind": "guess"}',
        "kind 'guess'",
    ),
    "answerable without answer": (
        '{"_id": "x", "corpus": "demo", "text": "Q?", "answerable": true, '
        '"relevant": ["a.md"], "answer": null, "kind": "direct"}',
        "needs relevant files and answer",
    ),
    "unanswerable with relevant": (
        '{"_id": "x", "corpus": "demo", "text": "Q?", "answerable": false, '
        '"relevant": ["a.md"], "answer": null, "kind": "near-miss"}',
        "has no relevant or answer",
    ),
    "unknown corpus": (
        '{"_id": "x", "corpus": "web", "text": "Q?", "answerable": false, '
        '"relevant": [], "answer": null, "kind": "near-miss"}',
        "corpus 'web'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_a_malformed_line_is_refused_with_its_place(case: str, tmp_path: Path) -> None:
    line, message = BAD_LINES[case]
    path = tmp_path / "questions.jsonl"
    path.write_text(QUESTIONS_FILE.read_text(encoding="utf-8").splitlines()[0] + "\n" + line)
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_questions(path=path)
    assert f"{path}:2" in str(err.value)


def test_a_duplicate_id_is_refused(tmp_path: Path) -> None:
    first = QUESTIONS_FILE.read_text(encoding="utf-8").splitlines()[0]
    path = tmp_path / "questions.jsonl"
    path.write_text(f"{first}\n{first}\n")
    with pytest.raises(ConfigError, match="duplicate _id"):
        load_questions(path=path)


def test_an_unknown_corpus_is_refused() -> None:
    with pytest.raises(ConfigError, match="corpus 'web'"):
        load_questions("web")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="give demo_folder"):
        sources_for("demo")


# --- the demo corpus ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_question_set(tmp_path_factory.mktemp("questions-demo"), corpus="demo")


def test_the_demo_set_round_trips_and_leaves_the_draft_out(demo_set: Path) -> None:
    sources = sources_for("demo", demo_folder=demo_set / "sources")
    assert PRICING_DRAFT_FILE not in {p.name for p in sources}
    assert len(sources) == 5
    check_beir_folder(demo_set, load_questions("demo"), sources)


def test_every_demo_answer_is_in_its_extracted_documents(demo_set: Path) -> None:
    texts = {}
    for line in (demo_set / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        texts[record["_id"]] = record["text"]
    questions = load_questions("demo")
    assert {name for q in questions for name in q.relevant} <= set(texts)
    check_answers(questions, texts)
    check_not_copied(questions, texts)


# --- real-docs ---------------------------------------------------------------------------------


def test_real_docs_sources_hold_every_relevant_file_and_no_media(real_sources: list[Path]) -> None:
    names = {p.name for p in real_sources}
    relevant = {name for q in load_questions("real-docs") for name in q.relevant}
    assert relevant <= names, sorted(relevant - names)
    assert not {p.suffix for p in real_sources} & {".mp3", ".mp4", ".wav"}
    assert real_sources == sorted(real_sources)


def test_real_docs_answers_in_the_text_formats(real_sources: list[Path]) -> None:
    texts = {p.name: file_to_document(p).text for p in real_sources if p.suffix in QUICK_SUFFIXES}
    questions = load_questions("real-docs")
    checked = [q for q in questions if q.answerable and set(q.relevant) <= set(texts)]
    assert len(checked) >= 10
    check_answers(checked, texts)


def test_real_docs_default_to_the_shared_datasets(real_sources: list[Path]) -> None:
    assert sources_for("real-docs") == sources_for("real-docs", DATASETS)


def test_real_docs_missing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="real-docs sources not found"):
        sources_for("real-docs", tmp_path)


@pytest.mark.slow
def test_the_real_docs_set_round_trips_with_every_answer(
    real_sources: list[Path], tmp_path: Path
) -> None:
    require_binaries("tesseract")
    folder = write_question_set(
        tmp_path / "questions-real-docs", corpus="real-docs", datasets=real_sources[0].parents[2]
    )
    questions = load_questions("real-docs")
    check_beir_folder(folder, questions, real_sources)
    texts = {}
    for line in (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        texts[record["_id"]] = record["text"]
    check_answers(questions, texts)
    check_not_copied(questions, texts)
