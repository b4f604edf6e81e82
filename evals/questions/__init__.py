"""Hand-written questions over two corpora, for retrieval and refusal evals.

``questions.jsonl`` (beside this file) holds one question per line, written by reading the
documents: answerable ones phrased the way a user asks (many of them paraphrases that avoid the
document's own wording, "price" for a figure given in EUR), and unanswerable near-misses that
name the corpus's own entities but ask for a fact no approved document holds (a store that does
not exist, an attribute never stated, a year not covered, a figure only in the draft memo).

The two corpora:

- ``demo``: the Larkspur Cycles documents of `evals.demo_corpus`, without the draft
  ``pricing-2027-draft.md`` (pending review: agents must never see it). Questions answered only
  by the draft are near-misses.
- ``real-docs``: the files under ``<datasets>/real-docs/sources`` except audio and video.
  ``<datasets>`` is ``KBFLOW_DATASETS``, else ``../shared/datasets`` beside the repository;
  nothing of it is copied here.

`write_question_set` lays a corpus out as a BEIR folder (`evals.beir.load_beir` reads it, so
``kbflow eval run --dataset`` does too); `sources_for` gives the files to ingest into an org
for the refusal bench. Corpus ids are the source file names.

Example::

    folder = write_question_set(Path("/tmp/questions-demo"), corpus="demo")
    dataset = load_beir(folder)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

from core.errors import ConfigError
from evals.beir import UNANSWERABLE_FILE
from evals.demo_corpus import PRICING_DRAFT_FILE, write_demo_corpus
from tasks.ingest.extract import file_to_document, is_media

Corpus = Literal["demo", "real-docs"]
Kind = Literal[
    "direct",
    "paraphrase",
    "near-miss",
    # the held-out set's kinds (``holdout.jsonl``): a table cell asked by row and column, the
    # row a comparison over a table picks, a total the document states, a question in the
    # document's own language (not English)
    "table-cell",
    "superlative",
    "total",
    "non-english",
]
CORPORA: tuple[Corpus, ...] = get_args(Corpus)
KINDS: tuple[Kind, ...] = get_args(Kind)

QUESTIONS_FILE = Path(__file__).resolve().with_name("questions.jsonl")
HOLDOUT_FILE = Path(__file__).resolve().with_name("holdout.jsonl")
"""Held-out questions (ids ``q-hold-…``): measured by `evals.answers` only, never used to choose
a weight or a threshold, so that they stay a fair test of what calibration chose."""
REPO = Path(__file__).resolve().parents[2]
DEMO_LEFT_OUT: frozenset[str] = frozenset({PRICING_DRAFT_FILE})
"""Demo files never put in the set: the draft is pending review."""

_FIELDS = frozenset({"_id", "corpus", "text", "answerable", "relevant", "answer", "kind"})


@dataclass(frozen=True)
class Question:
    """One hand-written question.

    Attributes:
        id: Unique id (``q-demo-001``, ``q-real-001``...).
        corpus: The corpus it is asked of.
        text: The question as a user would type it.
        answerable: Whether an approved document of the corpus answers it.
        relevant: Source file names that answer it; empty when unanswerable.
        answer: A short string found in the extracted text of each relevant file; None when
            unanswerable.
        kind: ``direct`` (uses the document's wording), ``paraphrase`` (avoids it) or
            ``near-miss`` (unanswerable, on the corpus's own topic and entities); the held-out
            set adds ``table-cell``, ``superlative``, ``total`` and ``non-english``.
    """

    id: str
    corpus: Corpus
    text: str
    answerable: bool
    relevant: tuple[str, ...]
    answer: str | None
    kind: Kind


def load_questions(corpus: Corpus | None = None, path: Path = QUESTIONS_FILE) -> list[Question]:
    """Read and check the question set, in file order.

    Args:
        corpus: Only this corpus's questions; None for all.
        path: The JSONL file; the shipped set by default.

    Raises:
        ConfigError: ``corpus`` is unknown, or a line is malformed or inconsistent (the message
            names the file and line).
    """
    if corpus is not None and corpus not in CORPORA:
        raise ConfigError(f"corpus {corpus!r} is not one of {', '.join(CORPORA)}")
    questions: list[Question] = []
    seen: set[str] = set()
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from exc
        question = _question(record, f"{path}:{line_no}")
        if question.id in seen:
            raise ConfigError(f"{path}:{line_no}: duplicate _id {question.id!r}")
        seen.add(question.id)
        if corpus is None or question.corpus == corpus:
            questions.append(question)
    return questions


def load_holdout(corpus: Corpus | None = None, path: Path = HOLDOUT_FILE) -> list[Question]:
    """Read and check the held-out questions (``holdout.jsonl``), in file order.

    Same schema and checks as `load_questions`. No calibration may read them (a test checks
    that only `evals.answers` does): they measure answers on questions nothing was tuned to.

    Raises:
        ConfigError: As `load_questions`.
    """
    return load_questions(corpus, path=path)


def _question(record: Any, where: str) -> Question:
    """Build a `Question` from one parsed line, or say what is wrong with it."""
    if not isinstance(record, dict) or set(record) != _FIELDS:
        got = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ConfigError(f"{where}: want exactly the fields {sorted(_FIELDS)}, got {got}")
    qid, text, answerable = record["_id"], record["text"], record["answerable"]
    relevant, answer, kind, corpus = (
        record["relevant"],
        record["answer"],
        record["kind"],
        record["corpus"],
    )
    if not isinstance(qid, str) or not qid or not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where}: _id and text must be non-empty strings")
    if corpus not in CORPORA:
        raise ConfigError(f"{where}: corpus {corpus!r} is not one of {', '.join(CORPORA)}")
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
    if not isinstance(answerable, bool):
        raise ConfigError(f"{where}: answerable must be true or false, got {answerable!r}")
    if not isinstance(relevant, list) or not all(isinstance(r, str) and r for r in relevant):
        raise ConfigError(f"{where}: relevant must be a list of file names, got {relevant!r}")
    if answerable:
        if not relevant or not isinstance(answer, str) or not answer.strip():
            raise ConfigError(f"{where}: an answerable question needs relevant files and answer")
        if kind == "near-miss":
            raise ConfigError(f"{where}: a near-miss is unanswerable — set answerable to false")
    else:
        if relevant or answer is not None:
            raise ConfigError(f"{where}: an unanswerable question has no relevant or answer")
        if kind != "near-miss":
            raise ConfigError(f"{where}: an unanswerable question is a near-miss, got {kind!r}")
    return Question(
        id=qid,
        corpus=cast(Corpus, corpus),
        text=text,
        answerable=answerable,
        relevant=tuple(relevant),
        answer=answer,
        kind=cast(Kind, kind),
    )


def datasets_folder(datasets: Path | None = None) -> Path:
    """The shared datasets folder: ``datasets``, else ``KBFLOW_DATASETS``, else
    ``../shared/datasets`` beside the repository."""
    if datasets is not None:
        return Path(datasets)
    return Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))


def sources_for(
    corpus: Corpus, datasets: Path | None = None, *, demo_folder: Path | None = None
) -> list[Path]:
    """The files of a corpus to ingest, sorted by name; corpus ids are their names.

    Args:
        corpus: ``demo`` or ``real-docs``.
        datasets: The shared datasets folder (see `datasets_folder`); real-docs only.
        demo_folder: Where to write the demo documents; required for ``demo``. The draft is
            written too (the demo writer makes all six) but never returned.

    Raises:
        ConfigError: An unknown corpus, no ``demo_folder`` for the demo, or no real-docs
            sources folder.
    """
    if corpus == "demo":
        if demo_folder is None:
            raise ConfigError("the demo corpus is written on demand — give demo_folder")
        written = write_demo_corpus(Path(demo_folder)).files
        return sorted((p for p in written if p.name not in DEMO_LEFT_OUT), key=lambda p: p.name)
    if corpus == "real-docs":
        folder = datasets_folder(datasets) / "real-docs" / "sources"
        if not folder.is_dir():
            raise ConfigError(
                f"real-docs sources not found at {folder} — set KBFLOW_DATASETS to the folder "
                "that holds real-docs/"
            )
        # Audio and video (by their bytes) are left out: no question is asked of them.
        return sorted(p for p in folder.iterdir() if p.is_file() and not is_media(p))
    raise ConfigError(f"corpus {corpus!r} is not one of {', '.join(CORPORA)}")


def write_question_set(folder: Path, *, corpus: Corpus, datasets: Path | None = None) -> Path:
    """Write one corpus's questions as a BEIR folder: ``corpus.jsonl``, ``queries.jsonl`` (the
    answerable questions), ``qrels.tsv`` (each relevant file, grade 1) and
    ``unanswerable.jsonl`` (the near-misses, which the eval's refusal metric scores).

    Every source is extracted the way ingest extracts it (`file_to_document`); an extraction
    failure is raised, not skipped, because a corpus missing a judged document would score
    wrongly. Real-docs includes a TIFF scan, so OCR (tesseract) must be installed; it takes
    tens of seconds. The demo documents are written under ``folder/sources``.

    Args:
        folder: The BEIR folder to write; created if missing.
        corpus: ``demo`` or ``real-docs``.
        datasets: The shared datasets folder, for real-docs (see `datasets_folder`).

    Returns:
        ``folder``.

    Raises:
        ConfigError: As `sources_for`, or a question names a file that is not a source.
        ExtractionError: A source could not be read.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sources = sources_for(corpus, datasets, demo_folder=folder / "sources")
    names = {p.name for p in sources}
    answerable = [q for q in load_questions(corpus) if q.answerable]
    for q in answerable:
        unknown = sorted(set(q.relevant) - names)
        if unknown:
            raise ConfigError(f"question {q.id} names {unknown}, not sources of {corpus}")
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as out:
        for path in sources:
            doc = file_to_document(path)
            record = {"_id": path.name, "title": doc.title, "text": doc.text}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    with (folder / "queries.jsonl").open("w", encoding="utf-8") as out:
        for q in answerable:
            out.write(json.dumps({"_id": q.id, "text": q.text}, ensure_ascii=False) + "\n")
    with (folder / UNANSWERABLE_FILE).open("w", encoding="utf-8") as out:
        for q in load_questions(corpus):
            if not q.answerable:
                out.write(json.dumps({"_id": q.id, "text": q.text}, ensure_ascii=False) + "\n")
    with (folder / "qrels.tsv").open("w", encoding="utf-8") as out:
        out.write("query-id\tcorpus-id\tscore\n")
        for q in answerable:
            for name in q.relevant:
                out.write(f"{q.id}\t{name}\t1\n")
    return folder
