"""Tests for the Larkspur Cycles demo corpus: formats, byte-stable output and sample queries."""

from __future__ import annotations

import csv
import hashlib
import re
import time
from pathlib import Path

import docx
import pypdfium2
import pytest

from evals.demo_corpus import (
    CONTACTS_HEADER,
    PRICING_DRAFT_FILE,
    DemoCorpus,
    write_demo_corpus,
)

EXPECTED_FILES = {
    "handbook.md": ".md",
    "product-sheet.html": ".html",
    "returns-policy.docx": ".docx",
    "security-whitepaper.pdf": ".pdf",
    "contacts.csv": ".csv",
    "pricing-2027-draft.md": ".md",
}


@pytest.fixture
def corpus(tmp_path: Path) -> DemoCorpus:
    return write_demo_corpus(tmp_path / "corpus")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _by_name(corpus: DemoCorpus) -> dict[str, Path]:
    return {path.name: path for path in corpus.files}


def _squash(text: str) -> str:
    """Collapses whitespace so phrases match across the PDF text layer's line breaks."""
    return re.sub(r"\s+", " ", text)


def _pdf_page_texts(path: Path) -> list[str]:
    pdf = pypdfium2.PdfDocument(path)
    try:
        return [_squash(pdf[i].get_textpage().get_text_range()) for i in range(len(pdf))]
    finally:
        pdf.close()


def _docx_text(path: Path) -> str:
    return "\n".join(paragraph.text for paragraph in docx.Document(str(path)).paragraphs)


def test_writes_every_file_with_its_suffix(corpus: DemoCorpus) -> None:
    files = _by_name(corpus)

    assert set(files) == set(EXPECTED_FILES)
    for name, path in files.items():
        assert path.is_file(), name
        assert path.suffix == EXPECTED_FILES[name]
        assert path.stat().st_size > 0, name
    assert corpus.pending_file == files[PRICING_DRAFT_FILE]


def test_writing_twice_gives_identical_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = write_demo_corpus(tmp_path / "first")
    # A later clock must not leak into the bytes (ZIP member times, PDF and DOCX dates).
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 86_400)
    second = write_demo_corpus(tmp_path / "second")

    assert [p.name for p in first.files] == [p.name for p in second.files]
    for a, b in zip(first.files, second.files, strict=True):
        assert _sha256(a) == _sha256(b), a.name


def test_rewriting_the_same_folder_leaves_files_untouched(tmp_path: Path) -> None:
    first = write_demo_corpus(tmp_path)
    before = {p.name: (_sha256(p), p.stat().st_mtime_ns) for p in first.files}

    second = write_demo_corpus(tmp_path)

    assert {p.name: (_sha256(p), p.stat().st_mtime_ns) for p in second.files} == before


def test_handbook_has_nested_headings_and_sensible_length(corpus: DemoCorpus) -> None:
    text = _by_name(corpus)["handbook.md"].read_text(encoding="utf-8")

    assert re.search(r"^# ", text, re.MULTILINE)
    assert re.search(r"^## Leave$", text, re.MULTILINE)
    assert re.search(r"^### Annual leave$", text, re.MULTILINE)
    assert "27 days of paid annual leave" in _squash(text)
    assert 600 <= len(text.split()) <= 900


def test_product_sheet_has_spec_table_for_three_bikes(corpus: DemoCorpus) -> None:
    page = _by_name(corpus)["product-sheet.html"].read_text(encoding="utf-8")

    assert "<table>" in page
    assert len(re.findall(r"<tr><td>", page)) == 3
    assert "<td>9.4 kg</td>" in page
    for heading in ("<h1>", "<h2>", "<h3>"):
        assert heading in page


def test_docx_opens_and_uses_heading_styles(corpus: DemoCorpus) -> None:
    document = docx.Document(str(_by_name(corpus)["returns-policy.docx"]))
    styles = {paragraph.style.name for paragraph in document.paragraphs}

    assert {"Heading 1", "Heading 2", "List Bullet"} <= styles
    assert "800 full charge cycles" in _docx_text(_by_name(corpus)["returns-policy.docx"])


def test_pdf_has_two_pages_with_a_text_layer(corpus: DemoCorpus) -> None:
    pages = _pdf_page_texts(_by_name(corpus)["security-whitepaper.pdf"])

    assert len(pages) == 2
    assert "encrypts all customer data at rest with AES-256" in pages[0]
    assert "notify affected customers within 48 hours" in pages[1]


def test_contacts_csv_parses_with_expected_header(corpus: DemoCorpus) -> None:
    with _by_name(corpus)["contacts.csv"].open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)

    assert reader.fieldnames == list(CONTACTS_HEADER)
    assert len(rows) == 12
    assert all(row["email"].endswith("@larkspur-cycles.example") for row in rows)
    ghent_manager = [
        r for r in rows if r["office"] == "Ghent Store" and r["role"] == "Store Manager"
    ]
    assert [r["phone"] for r in ghent_manager] == ["+32 9 555 0301"]


def test_queries_name_written_files_and_one_hidden_draft(corpus: DemoCorpus) -> None:
    names = set(_by_name(corpus))
    expected = [query.expect_in for query in corpus.queries]

    assert 5 <= len(corpus.queries) <= 7
    assert expected.count(None) == 1
    assert all(name in names for name in expected if name is not None)
    assert PRICING_DRAFT_FILE not in expected
    draft_question = next(q.question for q in corpus.queries if q.expect_in is None)
    assert "2027" in draft_question


def test_draft_figures_appear_only_in_the_pending_document(corpus: DemoCorpus) -> None:
    files = _by_name(corpus)
    texts = {
        name: path.read_text(encoding="utf-8")
        for name, path in files.items()
        if path.suffix in {".md", ".html", ".csv"}
    }
    texts["returns-policy.docx"] = _docx_text(files["returns-policy.docx"])
    texts["security-whitepaper.pdf"] = " ".join(_pdf_page_texts(files["security-whitepaper.pdf"]))

    assert "rises to 3,450 EUR" in _squash(texts[PRICING_DRAFT_FILE])
    assert [name for name, text in texts.items() if "3,450" in text] == [PRICING_DRAFT_FILE]
