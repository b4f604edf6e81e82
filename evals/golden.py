"""A small golden set over the demo corpus, in BEIR form: a fast, offline eval for CI and the
nightly smoke run.

The corpus is the demo client's documents (`evals.demo_corpus`), each extracted the way ingest
extracts it; the queries are the demo's questions whose answer is in an approved document, each
judged relevant to that document. The draft memo is left out: agents must never see it.
"""

from __future__ import annotations

import json
from pathlib import Path

from evals.demo_corpus import DEMO_QUERIES, write_demo_corpus
from tasks.ingest.extract import file_to_document


def write_golden_set(folder: Path) -> Path:
    """Write ``corpus.jsonl``, ``queries.jsonl`` and ``qrels.tsv`` under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = write_demo_corpus(folder / "sources")
    wanted = {q.expect_in for q in DEMO_QUERIES if q.expect_in}
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as out:
        for path in corpus.files:
            if path.name not in wanted:
                continue
            doc = file_to_document(path)
            out.write(json.dumps({"_id": path.name, "title": doc.title, "text": doc.text}) + "\n")
    answerable = [q for q in DEMO_QUERIES if q.expect_in]
    with (folder / "queries.jsonl").open("w", encoding="utf-8") as out:
        for n, q in enumerate(answerable, start=1):
            out.write(json.dumps({"_id": f"g{n}", "text": q.question}) + "\n")
    with (folder / "qrels.tsv").open("w", encoding="utf-8") as out:
        out.write("query-id\tcorpus-id\tscore\n")
        for n, q in enumerate(answerable, start=1):
            out.write(f"g{n}\t{q.expect_in}\t1\n")
    return folder
