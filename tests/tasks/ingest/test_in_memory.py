"""A file's bytes held in memory (`Source.data`: a synced record, a page) read as the file would
be: the same format detected, the same document extracted, in the isolated worker too, and
cited by the source's URI. Formats whose parsers open a path are refused in memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.errors import ExtractionError, UnsupportedFormat
from core.settings import Settings
from tasks.ingest import isolate
from tasks.ingest.discover import Source
from tasks.ingest.extract import file_to_document, reads_in_memory
from tasks.ingest.isolate import isolated_extractor
from tasks.ingest.sniff import detect_format
from tests.conftest import datasets_dir
from tests.tasks.ingest.support import MAGIC_CASES

# A record as a template renders it (CRLF line ends, bold, a link, a table); Markdown that is
# HTML; plain text; a CSV.
MADE = {
    "ticket.md": b"# Ticket 17\r\n\r\n- **status:** open\r\n- **owner:** Ana\r\n\r\n## body\r\n\r\n"
    b"The printer jams *every* morning; see [the log](http://x/y).\r\n\r\n| a | b |\r\n"
    b"|---|---|\r\n| 1 | 2 |\r\n",
    "page.md": b"<html><body><h1>Canteen</h1><p>Lunch is served from noon.</p></body></html>",
    "notes.txt": b"plain text\n\nsecond paragraph\n",
    "rows.csv": b"grade,days\nA,25\nB,28\n",
    "no-suffix": "Ünïcode text, no suffix at all.\n".encode(),
}
REAL_TEXTS = ("mixed.md", "wiki.md", "example_03.html", "table_06.html", "wiki_duck.html",
              "csv-comma.csv")  # fmt: skip


@pytest.fixture(autouse=True)
def _no_parked_workers() -> Iterator[None]:
    isolate.stop_parked_workers()
    yield
    isolate.stop_parked_workers()


def _cases(tmp_path: Path) -> list[Path]:
    paths = []
    for name, data in MADE.items():
        (tmp_path / name).write_bytes(data)
        paths.append(tmp_path / name)
    return paths


@pytest.mark.parametrize(("name", "data", "expected"), MAGIC_CASES, ids=[c[0] for c in MAGIC_CASES])
def test_bytes_in_memory_are_detected_as_their_file(
    tmp_path: Path, name: str, data: bytes, expected: str
) -> None:
    (tmp_path / name).write_bytes(data)
    assert detect_format(Path(name), data) == detect_format(tmp_path / name)
    assert not reads_in_memory(name, data)  # binary: a parser reads it from a file


def test_text_in_memory_is_extracted_as_its_file(tmp_path: Path) -> None:
    for path in _cases(tmp_path):
        data = path.read_bytes()
        assert reads_in_memory(path.name, data), path.name
        from_file = file_to_document(path)
        in_memory = file_to_document(Path(path.name), data=data)
        assert in_memory == dataclasses.replace(from_file, uri=path.name), path.name


def test_real_text_documents_in_memory_are_extracted_as_their_files() -> None:
    sources = datasets_dir("real-docs", "sources")
    for name in REAL_TEXTS:
        path = sources / name
        data = path.read_bytes()
        assert reads_in_memory(name, data), name
        assert file_to_document(Path(name), data=data) == dataclasses.replace(
            file_to_document(path), uri=name
        ), name


def test_in_memory_refusals_are_the_files(tmp_path: Path) -> None:
    for name, data in (("blank.md", b"  \n\n"), ("fake.pdf", b"just text\n")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ExtractionError) as from_file:
            file_to_document(tmp_path / name)
        with pytest.raises(ExtractionError) as in_memory:
            file_to_document(Path(name), data=data)
        assert (type(in_memory.value), str(in_memory.value)) == (
            type(from_file.value), str(from_file.value)
        )  # fmt: skip
    assert not reads_in_memory("empty.md", b"")  # read from a file, which says it is empty


def test_a_binary_format_is_not_read_from_memory() -> None:
    pdf = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n%%EOF\n"
    with pytest.raises(UnsupportedFormat, match="reads from a file, not from memory"):
        file_to_document(Path("a.pdf"), data=pdf)


def test_the_isolated_worker_reads_a_source_in_memory_and_cites_its_uri(tmp_path: Path) -> None:
    path = _cases(tmp_path)[0]
    data = path.read_bytes()
    held = Source(source_key="k", uri="https://crm.example/tickets/17", content_hash="h",
                  path=Path(path.name), data=data)  # fmt: skip
    with isolated_extractor(Settings(home=tmp_path / "home")) as extract:
        doc = extract(held)
        staged = extract(Source(source_key="k", uri="u", content_hash="h", path=path))
    assert doc == dataclasses.replace(staged, uri="https://crm.example/tickets/17")
    assert "data" not in repr(held)  # the bytes stay out of logs
