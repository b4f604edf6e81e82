"""BEIR-format retrieval benchmarks: a corpus, queries and graded judgements (qrels) on disk.

A BEIR folder holds ``corpus.jsonl`` (or ``corpus.jsonl.gz``) of ``{"_id", "title", "text"}``
lines, ``queries.jsonl`` of ``{"_id", "text"}`` lines and tab-separated qrels
``query-id, corpus-id, score``. Downloads lay these out in a few ways; `load_beir` accepts
(first match wins, per split):

=================  =======================================  ====================================
split              queries                                  qrels
=================  =======================================  ====================================
``<split>``        ``<split>/queries.jsonl``,               ``<split>/qrels.tsv``,
                   ``queries.jsonl``                        ``qrels/<split>.tsv``
none               ``queries.jsonl``                        ``qrels.tsv``
=================  =======================================  ====================================

The corpus is streamed, never held: SciFact's is small, but BEIR's larger sets are not.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from evals.metrics import Qrels

logger = logging.getLogger(__name__)

CORPUS_FILES: tuple[str, ...] = ("corpus.jsonl", "corpus.jsonl.gz")
SPLITS_TO_TRY: tuple[str | None, ...] = ("test", "dev", None)
"""The order `load_beir` tries when no split is named; ``None`` is the unsplit layout."""
UNANSWERABLE_FILE = "unanswerable.jsonl"
"""Questions nothing in the corpus answers, one ``{"_id", "text"}`` object per line."""


@dataclass(frozen=True)
class CorpusDoc:
    """One document of a BEIR corpus."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class BeirDataset:
    """A benchmark's queries and qrels, and where to stream its corpus from."""

    name: str
    """The folder's name, plus ``/<split>`` when a split was used (``scifact/dev``)."""
    folder: Path
    corpus_path: Path
    """``corpus.jsonl`` or ``corpus.jsonl.gz`` inside `folder`."""
    queries: dict[str, str]
    """Query id -> text: only queries with at least one relevant judgement (grade > 0)."""
    qrels: Qrels
    """Query id -> {doc id: grade}, for exactly the queries of `queries`."""
    unanswerable: dict[str, str] = field(default_factory=dict)
    """Query id -> text of questions nothing in the corpus answers, from the folder's
    ``unanswerable.jsonl`` (a kbflow extension BEIR readers ignore; absent: none). The refusal
    metric scores them (`evals.refusal`); retrieval metrics never see them."""

    def corpus(self) -> Iterator[CorpusDoc]:
        """Stream the corpus, one document at a time, in file order.

        Raises:
            ConfigError: A line is not a JSON object with ``_id`` and ``text``.
        """
        for line_no, record in _jsonl(self.corpus_path):
            doc_id, text = _id_and_text(record, self.corpus_path, line_no)
            yield CorpusDoc(id=doc_id, title=str(record.get("title") or ""), text=text)


def load_beir(folder: Path, split: str | None = None) -> BeirDataset:
    """Load a BEIR-format benchmark's queries and qrels, and locate its corpus.

    Args:
        folder: The benchmark's folder (e.g. ``../shared/datasets/scifact``).
        split: The split to load (``"test"``, ``"dev"``...). ``None`` tries ``test``, then
            ``dev``, then the unsplit layout, and takes the first with both queries and qrels.

    Returns:
        The dataset; its queries are those with a relevant judgement, its qrels those queries'.

    Raises:
        ConfigError: The folder, its corpus, or its queries or qrels for the split are missing,
            or a file is malformed (the message names the file and line).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(
            f"BEIR dataset folder {str(folder)!r} does not exist or is not a folder — give the "
            "folder that holds corpus.jsonl(.gz), queries.jsonl and the qrels"
        )
    if split is not None and (not split or "/" in split or "\\" in split):
        raise ConfigError(
            f"split {split!r} is not a split name — give a name such as 'test' or 'dev', or "
            "None to find one"
        )
    # Absolute, but symbolic links kept: the paths this returns and names in errors are the
    # ones the caller gave, and the dataset's name (its eval home, warehouse rows, baselines)
    # does not change with where a link points. The corpus records' keys are resolved where
    # they are made (tasks.ingest.discover.jsonl_sources), so both spellings index the same records.
    folder = Path(os.path.abspath(folder))
    corpus_path = _corpus_path(folder)

    found, queries_path, qrels_path = _locate(folder, split)
    queries = _read_queries(queries_path)
    qrels = _read_qrels(qrels_path)
    orphans = [qid for qid in qrels if qid not in queries]
    if orphans:
        rows = sum(len(qrels[qid]) for qid in orphans)
        logger.warning(
            "%s: dropped %d qrels rows of %d queries that %s has no text for",
            qrels_path,
            rows,
            len(orphans),
            queries_path.name,
        )
    kept_qrels = {
        qid: judged
        for qid, judged in qrels.items()
        if qid in queries and any(grade > 0 for grade in judged.values())
    }
    kept_queries = {qid: text for qid, text in queries.items() if qid in kept_qrels}
    if len(kept_queries) < len(queries):
        logger.info(
            "%s: %d of %d queries have no relevant judgement and are left out",
            queries_path,
            len(queries) - len(kept_queries),
            len(queries),
        )
    if not kept_queries:
        raise ConfigError(
            f"no query of {queries_path} has a relevant judgement (grade > 0) in {qrels_path} — "
            "check that the two files belong to the same split and that the qrels' query ids "
            "match the queries' _id"
        )
    name = folder.name + (f"/{found}" if found is not None else "")
    logger.info("loaded %s: %d queries, corpus %s", name, len(kept_queries), corpus_path.name)
    unanswerable_path = folder / UNANSWERABLE_FILE
    unanswerable = _read_queries(unanswerable_path) if unanswerable_path.is_file() else {}
    clash = sorted(set(unanswerable) & set(queries))
    if clash:
        raise ConfigError(
            f"{unanswerable_path} reuses query ids of {queries_path.name}: {clash[:5]} — give "
            "each unanswerable question an id of its own"
        )
    return BeirDataset(
        name=name,
        folder=folder,
        corpus_path=corpus_path,
        queries=kept_queries,
        qrels=kept_qrels,
        unanswerable=unanswerable,
    )


def _locate(folder: Path, split: str | None) -> tuple[str | None, Path, Path]:
    """The split used and its queries and qrels files: the first candidate that has both."""
    tried: list[Path] = []
    for candidate in (split,) if split is not None else SPLITS_TO_TRY:
        queries_path = _first_existing(_queries_candidates(folder, candidate), tried)
        qrels_path = _first_existing(_qrels_candidates(folder, candidate), tried)
        if queries_path is not None and qrels_path is not None:
            return candidate, queries_path, qrels_path
    wanted = f"split {split!r}" if split is not None else "any split (test, dev or none)"
    raise ConfigError(
        f"no queries and qrels for {wanted} in {str(folder)!r}: tried "
        f"{', '.join(str(p) for p in dict.fromkeys(tried))} — a BEIR folder needs a "
        "queries.jsonl and a qrels .tsv in one of these places"
    )


def _corpus_path(folder: Path) -> Path:
    for filename in CORPUS_FILES:
        if (folder / filename).is_file():
            return folder / filename
    raise ConfigError(
        f"no corpus in BEIR dataset folder {str(folder)!r}: expected "
        f"{' or '.join(CORPUS_FILES)} there"
    )


def _queries_candidates(folder: Path, split: str | None) -> list[Path]:
    if split is None:
        return [folder / "queries.jsonl"]
    return [folder / split / "queries.jsonl", folder / "queries.jsonl"]


def _qrels_candidates(folder: Path, split: str | None) -> list[Path]:
    # An unsplit qrels.tsv is not offered for a named split: it would label its judgements
    # with a split they may not belong to.
    if split is None:
        return [folder / "qrels.tsv"]
    return [folder / split / "qrels.tsv", folder / "qrels" / f"{split}.tsv"]


def _first_existing(paths: list[Path], tried: list[Path]) -> Path | None:
    for path in paths:
        tried.append(path)
        if path.is_file():
            return path
    return None


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of a JSON-lines file, gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            for line_no, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(
                        f"{path} line {line_no} is not valid JSON ({exc.msg} at column "
                        f"{exc.colno}): {line.strip()[:80]!r} — each line must be one JSON object"
                    ) from exc
                if not isinstance(record, dict):
                    raise ConfigError(
                        f"{path} line {line_no} is a JSON {type(record).__name__}, not an object: "
                        f"{line.strip()[:80]!r} — each line must be one JSON object"
                    )
                yield line_no, record
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read {path}: {exc} — give a readable UTF-8 JSON-lines file"
            + (" (gzip-compressed, as its name says)" if path.suffix == ".gz" else "")
        ) from exc


def _id_and_text(record: dict[str, Any], path: Path, line_no: int) -> tuple[str, str]:
    """A record's ``_id`` (a string, or a number as some exports write it) and ``text``."""
    doc_id, text = record.get("_id"), record.get("text")
    if isinstance(doc_id, bool) or not isinstance(doc_id, str | int) or not isinstance(text, str):
        raise ConfigError(
            f"{path} line {line_no} needs a string '_id' and 'text'; it has _id={doc_id!r}, "
            f"text of type {type(text).__name__} (keys: {', '.join(sorted(record)) or 'none'}) "
            "— fix or remove the line"
        )
    return str(doc_id), text


def _read_queries(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    for line_no, record in _jsonl(path):
        qid, text = _id_and_text(record, path, line_no)
        queries[qid] = text
    return queries


def _read_qrels(path: Path) -> Qrels:
    """``query-id corpus-id score`` rows (tabs or spaces); a non-numeric first row is a header."""
    qrels: Qrels = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read qrels {path}: {exc} — give a readable UTF-8 file") from exc
    first = True
    for line_no, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 3:
            raise ConfigError(
                f"{path} line {line_no} has {len(fields)} field(s), not 3: {line[:80]!r} — each "
                "qrels line must be 'query-id<TAB>corpus-id<TAB>score'"
            )
        qid, doc_id, score = fields
        if first:
            first = False
            if not _is_int(score):
                continue  # the header, e.g. "query-id corpus-id score"
        if not _is_int(score):
            raise ConfigError(
                f"{path} line {line_no} has score {score!r}, not an integer grade — the third "
                "field of a qrels line is the relevance grade (0, 1, 2...)"
            )
        qrels.setdefault(qid, {})[doc_id] = int(score)
    return qrels


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
