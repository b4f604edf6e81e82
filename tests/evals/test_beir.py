"""BEIR loader: the real SciFact folder, each accepted layout, and each refusal."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError
from evals.beir import CorpusDoc, load_beir
from tasks.ingest.discover import jsonl_sources
from tests.conftest import datasets_dir

# --- the real dataset ----------------------------------------------------------------------


def test_scifact_loads_its_dev_split() -> None:
    folder = datasets_dir("scifact")
    dataset = load_beir(folder)
    assert dataset.name == "scifact/dev"
    assert dataset.corpus_path == folder / "corpus.jsonl.gz"
    # All 809 dev claims have a relevant judgement; 919 judgements, every one grade 1.
    assert len(dataset.queries) == 809
    assert set(dataset.qrels) == set(dataset.queries)
    assert sum(len(judged) for judged in dataset.qrels.values()) == 919
    assert {g for judged in dataset.qrels.values() for g in judged.values()} == {1}
    assert dataset.queries["0"] == "0-dimensional biomaterials lack inductive properties."
    assert dataset.qrels["0"] == {"31715818": 1}
    assert load_beir(folder, split="dev") == dataset


def test_scifact_corpus_streams_every_document() -> None:
    dataset = load_beir(datasets_dir("scifact"))
    count = 0
    ids: set[str] = set()
    for doc in dataset.corpus():
        assert isinstance(doc, CorpusDoc)
        assert doc.id and doc.text
        ids.add(doc.id)
        count += 1
    assert count == len(ids) == 5183
    judged = {doc_id for judged in dataset.qrels.values() for doc_id in judged}
    assert judged <= ids


def test_scifact_has_no_test_split_here() -> None:
    folder = datasets_dir("scifact")
    with pytest.raises(ConfigError, match="no queries and qrels for split 'test'") as err:
        load_beir(folder, split="test")
    assert str(folder / "test" / "queries.jsonl") in str(err.value)
    assert str(folder / "qrels" / "test.tsv") in str(err.value)


# --- generated layouts ---------------------------------------------------------------------

CORPUS: list[dict[str, Any]] = [
    {"_id": "d1", "title": "Aspirin", "text": "Aspirin thins the blood."},
    {"_id": "d2", "title": "", "text": "Coffee keeps people awake."},
    {"_id": "d3", "text": "A document without a title."},
]
QUERIES: list[dict[str, Any]] = [
    {"_id": "q1", "text": "Does aspirin thin blood?"},
    {"_id": "q2", "text": "Why are people awake?", "metadata": {}},
    {"_id": "q3", "text": "A query without judgements."},
]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r) + "\n" for r in records)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(lines.encode()))
    else:
        path.write_text(lines, encoding="utf-8")
    return path


def write_qrels(path: Path, rows: list[tuple[str, str, int]], header: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["query-id\tcorpus-id\tscore"] if header else []
    lines += [f"{q}\t{d}\t{s}" for q, d, s in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


ROWS = [("q1", "d1", 2), ("q1", "d2", 0), ("q2", "d2", 1)]


def beir_folder(root: Path, corpus: str = "corpus.jsonl.gz") -> Path:
    write_jsonl(root / corpus, CORPUS)
    return root


def test_beir_download_layout_with_qrels_per_split(tmp_path: Path) -> None:
    # As BEIR ships it: queries.jsonl beside qrels/test.tsv and qrels/dev.tsv, headers included.
    folder = beir_folder(tmp_path / "toy", corpus="corpus.jsonl")
    write_jsonl(folder / "queries.jsonl", QUERIES)
    write_qrels(folder / "qrels" / "test.tsv", ROWS)
    write_qrels(folder / "qrels" / "dev.tsv", [("q3", "d3", 1)])

    test = load_beir(folder)
    assert test.name == "toy/test"
    assert test.corpus_path == folder / "corpus.jsonl"
    assert test.queries == {"q1": "Does aspirin thin blood?", "q2": "Why are people awake?"}
    assert test.qrels == {"q1": {"d1": 2, "d2": 0}, "q2": {"d2": 1}}
    assert list(test.corpus()) == [
        CorpusDoc("d1", "Aspirin", "Aspirin thins the blood."),
        CorpusDoc("d2", "", "Coffee keeps people awake."),
        CorpusDoc("d3", "", "A document without a title."),
    ]

    dev = load_beir(folder, split="dev")
    assert dev.name == "toy/dev"
    assert dev.queries == {"q3": "A query without judgements."}


def test_split_folders_without_qrels_header(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "toy")
    write_jsonl(folder / "dev" / "queries.jsonl", QUERIES)
    write_qrels(folder / "dev" / "qrels.tsv", ROWS, header=False)
    dataset = load_beir(folder)
    assert dataset.name == "toy/dev"
    assert dataset.qrels == {"q1": {"d1": 2, "d2": 0}, "q2": {"d2": 1}}
    assert [d.id for d in dataset.corpus()] == ["d1", "d2", "d3"]


def test_unsplit_layout_with_space_separated_qrels(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "toy")
    write_jsonl(folder / "queries.jsonl", QUERIES)
    (folder / "qrels.tsv").write_text("q1 d1 1\n\nq2  d2\t1\n", encoding="utf-8")
    dataset = load_beir(folder)
    assert dataset.name == "toy"
    assert dataset.qrels == {"q1": {"d1": 1}, "q2": {"d2": 1}}


def test_test_split_wins_over_dev_and_unsplit(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "toy")
    write_jsonl(folder / "queries.jsonl", QUERIES)
    write_qrels(folder / "qrels.tsv", [("q3", "d3", 1)])
    write_qrels(folder / "dev" / "qrels.tsv", [("q2", "d2", 1)])
    write_qrels(folder / "test" / "qrels.tsv", [("q1", "d1", 1)])
    assert load_beir(folder).name == "toy/test"
    (folder / "test" / "qrels.tsv").unlink()
    assert load_beir(folder).name == "toy/dev"
    (folder / "dev" / "qrels.tsv").unlink()
    assert load_beir(folder).name == "toy"


def test_split_queries_win_over_shared_queries(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "toy")
    write_jsonl(folder / "queries.jsonl", [{"_id": "q1", "text": "shared"}])
    write_jsonl(folder / "test" / "queries.jsonl", [{"_id": "q1", "text": "split's own"}])
    write_qrels(folder / "test" / "qrels.tsv", [("q1", "d1", 1)])
    assert load_beir(folder).queries == {"q1": "split's own"}


def test_a_split_with_queries_but_no_qrels_is_passed_over(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "toy")
    write_jsonl(folder / "test" / "queries.jsonl", QUERIES)
    write_jsonl(folder / "dev" / "queries.jsonl", QUERIES)
    write_qrels(folder / "dev" / "qrels.tsv", ROWS)
    assert load_beir(folder).name == "toy/dev"


def test_numeric_ids_are_read_as_strings(tmp_path: Path) -> None:
    folder = tmp_path / "toy"
    write_jsonl(folder / "corpus.jsonl", [{"_id": 7, "title": None, "text": "seven"}])
    write_jsonl(folder / "queries.jsonl", [{"_id": 1, "text": "one"}])
    write_qrels(folder / "qrels.tsv", [("1", "7", 1)])
    dataset = load_beir(folder)
    assert dataset.queries == {"1": "one"}
    assert list(dataset.corpus()) == [CorpusDoc("7", "", "seven")]


def test_only_queries_with_a_relevant_judgement_are_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = beir_folder(tmp_path / "toy")
    write_jsonl(folder / "queries.jsonl", QUERIES)
    rows = [("q1", "d1", 1), ("q2", "d2", 0), ("ghost", "d1", 1), ("ghost", "d2", 1)]
    write_qrels(folder / "qrels.tsv", rows)
    with caplog.at_level(logging.INFO, logger="evals.beir"):
        dataset = load_beir(folder)
    # q2 is judged only non-relevant, q3 not at all; "ghost" has judgements but no text.
    assert dataset.queries == {"q1": "Does aspirin thin blood?"}
    assert dataset.qrels == {"q1": {"d1": 1}}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "dropped 2 qrels rows of 1 queries" in warnings[0]
    assert "2 of 3 queries have no relevant judgement" in caplog.text


# --- symbolic links ------------------------------------------------------------------------


def symlinked_checkout(tmp_path: Path) -> tuple[Path, Path]:
    """A BEIR folder under a real ``store/shared``, and the same folder through a link to
    ``shared`` (as a clone with ``ln -s .../shared ../shared`` lays it out)."""
    real = beir_folder(tmp_path / "store" / "shared" / "datasets" / "toy")
    write_jsonl(real / "queries.jsonl", QUERIES)
    write_qrels(real / "qrels" / "test.tsv", ROWS)
    (tmp_path / "clone").mkdir()
    (tmp_path / "clone" / "shared").symlink_to(tmp_path / "store" / "shared")
    return real, tmp_path / "clone" / "shared" / "datasets" / "toy"


def test_paths_through_a_linked_parent_read_as_given(tmp_path: Path) -> None:
    _real, linked = symlinked_checkout(tmp_path)

    dataset = load_beir(linked)

    assert dataset.folder == linked
    assert dataset.corpus_path == linked / "corpus.jsonl.gz"
    assert dataset.name == "toy/test"
    with pytest.raises(ConfigError, match="no queries and qrels for split 'dev'") as err:
        load_beir(linked, split="dev")
    assert str(linked / "dev" / "queries.jsonl") in str(err.value)
    assert str(linked / "qrels" / "dev.tsv") in str(err.value)


def test_a_linked_dataset_folder_keeps_its_own_name(tmp_path: Path) -> None:
    # The name keys the eval home, the warehouse rows and the baselines: where the link points
    # (a versioned download folder) must not rename the dataset.
    real, _linked = symlinked_checkout(tmp_path)
    (tmp_path / "scifact").symlink_to(real)

    assert load_beir(tmp_path / "scifact").name == "scifact/test"


def test_both_spellings_key_the_same_corpus_records(tmp_path: Path) -> None:
    real, linked = symlinked_checkout(tmp_path)

    def keys(folder: Path) -> list[str]:
        return [s.source_key for s in jsonl_sources(load_beir(folder).corpus_path)]

    assert keys(linked) == keys(real)
    assert keys(real)[0] == f"{(real / 'corpus.jsonl.gz').as_uri()}#d1"


# --- refusals ------------------------------------------------------------------------------


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist or is not a folder") as err:
        load_beir(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(err.value)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ConfigError, match="is not a folder"):
        load_beir(tmp_path / "a-file")


def test_missing_corpus(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "queries.jsonl", QUERIES)
    write_qrels(tmp_path / "qrels.tsv", ROWS)
    with pytest.raises(ConfigError, match=r"no corpus .* expected corpus.jsonl or corpus.jsonl.gz"):
        load_beir(tmp_path)


def test_missing_queries_or_qrels_lists_every_path_tried(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "toy")
    write_jsonl(folder / "queries.jsonl", QUERIES)  # queries but no qrels anywhere
    with pytest.raises(ConfigError, match=r"any split \(test, dev or none\)") as err:
        load_beir(folder)
    message = str(err.value)
    for tried in (
        "test/queries.jsonl",
        "test/qrels.tsv",
        "qrels/test.tsv",
        "dev/queries.jsonl",
        "dev/qrels.tsv",
        "qrels/dev.tsv",
        "toy/queries.jsonl",
        "toy/qrels.tsv",
    ):
        assert str(folder / tried.removeprefix("toy/")) in message, tried
    assert message.count(str(folder / "queries.jsonl")) == 1


def test_a_named_split_does_not_fall_back_to_unsplit_qrels(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "toy")
    write_jsonl(folder / "queries.jsonl", QUERIES)
    write_qrels(folder / "qrels.tsv", ROWS)
    with pytest.raises(ConfigError, match="no queries and qrels for split 'test'"):
        load_beir(folder, split="test")


@pytest.mark.parametrize("split", ["", "../dev", "a/b"])
def test_a_split_must_be_a_plain_name(tmp_path: Path, split: str) -> None:
    folder = beir_folder(tmp_path / "toy")
    with pytest.raises(ConfigError, match=f"split {split!r} is not a split name"):
        load_beir(folder, split=split)


def test_malformed_query_line_names_file_and_line(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "toy")
    queries = folder / "queries.jsonl"
    queries.write_text('{"_id": "q1", "text": "ok"}\n\n{"_id": "q2", "text": \n', encoding="utf-8")
    write_qrels(folder / "qrels.tsv", ROWS)
    with pytest.raises(ConfigError, match=rf"{queries} line 3 is not valid JSON"):
        load_beir(folder)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('["q1", "text"]', "is a JSON list, not an object"),
        ('{"id": "q1", "text": "x"}', "needs a string '_id' and 'text'; it has _id=None"),
        ('{"_id": "q1", "text": null}', "text of type NoneType"),
    ],
)
def test_query_line_without_id_and_text(tmp_path: Path, line: str, problem: str) -> None:
    folder = beir_folder(tmp_path / "toy")
    (folder / "queries.jsonl").write_text(line + "\n", encoding="utf-8")
    write_qrels(folder / "qrels.tsv", ROWS)
    with pytest.raises(ConfigError, match="line 1") as err:
        load_beir(folder)
    assert problem in str(err.value)


def test_malformed_corpus_line_fails_when_streamed(tmp_path: Path) -> None:
    folder = tmp_path / "toy"
    folder.mkdir()
    corpus = folder / "corpus.jsonl.gz"
    corpus.write_bytes(gzip.compress(b'{"_id": "d1", "text": "ok"}\n{"_id": "d2", "text": oops}\n'))
    write_jsonl(folder / "queries.jsonl", QUERIES)
    write_qrels(folder / "qrels.tsv", ROWS)
    dataset = load_beir(folder)  # the corpus is only read when streamed
    docs = dataset.corpus()
    assert next(docs).id == "d1"
    with pytest.raises(ConfigError, match=rf"{corpus} line 2 is not valid JSON"):
        next(docs)


def test_corpus_that_is_not_gzip(tmp_path: Path) -> None:
    folder = tmp_path / "toy"
    write_jsonl(folder / "corpus.jsonl", CORPUS)
    (folder / "corpus.jsonl").rename(folder / "corpus.jsonl.gz")
    write_jsonl(folder / "queries.jsonl", QUERIES)
    write_qrels(folder / "qrels.tsv", ROWS)
    with pytest.raises(ConfigError, match=r"cannot read .*corpus.jsonl.gz.*gzip-compressed"):
        list(load_beir(folder).corpus())


@pytest.mark.parametrize(
    ("content", "line_no", "problem"),
    [
        ("query-id\tcorpus-id\tscore\nq1\td1\n", 2, "has 2 field(s), not 3"),
        ("q1\td1\t1\nq2\td2\t1\textra\n", 2, "has 4 field(s), not 3"),
        ("q1\td1\t1\nq2\td2\trelevant\n", 2, "has score 'relevant', not an integer grade"),
        ("query-id\tcorpus-id\tscore\nq1\td1\t0.5\n", 2, "has score '0.5'"),
    ],
)
def test_malformed_qrels_line_names_file_and_line(
    tmp_path: Path, content: str, line_no: int, problem: str
) -> None:
    folder = beir_folder(tmp_path / "toy")
    write_jsonl(folder / "queries.jsonl", QUERIES)
    qrels = folder / "qrels.tsv"
    qrels.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{qrels} line {line_no} ") as err:
        load_beir(folder)
    assert problem in str(err.value)


def test_no_query_with_a_relevant_judgement(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "toy")
    write_jsonl(folder / "queries.jsonl", QUERIES)
    write_qrels(folder / "qrels.tsv", [("q1", "d1", 0), ("other", "d1", 1)])
    with pytest.raises(ConfigError, match="has a relevant judgement"):
        load_beir(folder)


def test_unanswerable_questions_are_read_beside_the_judged_ones(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "toy")
    write_jsonl(folder / "queries.jsonl", QUERIES)
    write_qrels(folder / "qrels.tsv", ROWS)
    assert load_beir(folder).unanswerable == {}  # none without the file
    write_jsonl(folder / "unanswerable.jsonl", [{"_id": "n1", "text": "What does d4 say?"}])
    dataset = load_beir(folder)
    assert dataset.unanswerable == {"n1": "What does d4 say?"}
    assert "n1" not in dataset.queries and "n1" not in dataset.qrels  # never scored as retrieval


def test_an_unanswerable_question_may_not_reuse_a_query_id(tmp_path: Path) -> None:
    folder = beir_folder(tmp_path / "toy")
    write_jsonl(folder / "queries.jsonl", QUERIES)
    write_qrels(folder / "qrels.tsv", ROWS)
    write_jsonl(folder / "unanswerable.jsonl", [{"_id": "q3", "text": "Reused id."}])
    with pytest.raises(ConfigError, match=r"reuses query ids.*q3"):
        load_beir(folder)
