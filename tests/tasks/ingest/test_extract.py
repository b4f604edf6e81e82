"""Tests for tasks.ingest.extract: real Docling on the shared real-docs set, plus generated edge
cases.

Runs offline: the autouse `_no_network` fixture in tests/conftest.py refuses outside connections.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ConfigError, ExtractionError, UnsupportedFormat
from evals.extraction import groundtruth_for, recall_row
from tasks.ingest.extract import file_to_document
from tasks.text.chunk import document_to_chunks
from tests.conftest import require_binaries

REPO_ROOT = Path(__file__).resolve().parents[3]
DATASETS = Path(
    os.environ.get("KBFLOW_DATASETS", REPO_ROOT.parent / "shared" / "datasets")
).resolve()
REAL_DOCS = DATASETS / "real-docs"
needs_real_docs = pytest.mark.skipif(
    not (REAL_DOCS / "sources").is_dir(),
    reason=f"real-docs dataset not found at {REAL_DOCS} (set KBFLOW_DATASETS to its parent)",
)

# Word-token recall of the reference (evals.extraction), measured with Docling 2.143, the native
# PDF pipeline and Tesseract 5: 1.000 for most files, 0.970 for 2305.03393v1-pg9.pdf (the
# reference spells out a formula the PDF draws), 0.982 for redp5110_sampled.pdf, 0.996 for
# wiki_duck.html. The bar is 0.90; the floor sits a little above it.
RECALL_FLOOR = 0.95
OCR_RECALL_FLOOR = 0.90
RECALL_CASES = [
    "mixed.md",
    "wiki.md",
    "example_03.html",
    "table_06.html",
    "wiki_duck.html",
    "lorem_ipsum.docx",
    "unit_test_headers.docx",
    "word_sample.docx",
    "powerpoint_sample.pptx",
    "csv-comma.csv",
    "2305.03393v1-pg9.pdf",
    "multi_page.pdf",
    "normal_4pages.pdf",
    "code_and_formula.pdf",
    "redp5110_sampled.pdf",
    "ocr_test.pdf",
]


# --- real documents --------------------------------------------------------------------------


@needs_real_docs
@pytest.mark.parametrize("name", RECALL_CASES)
def test_real_document_keeps_the_reference_text(name: str) -> None:
    if name == "ocr_test.pdf":
        require_binaries("tesseract")
    source = REAL_DOCS / "sources" / name
    doc = file_to_document(source)

    reference = groundtruth_for(source, REAL_DOCS / "groundtruth")
    assert reference is not None
    row = recall_row(source, reference, doc, 0.0)
    floor = OCR_RECALL_FLOOR if "OCR" in row.method else RECALL_FLOOR
    assert row.recall >= floor, f"{name}: recall {row.recall:.3f} < {floor} ({row.method})"
    assert doc.source_format == source.suffix[1:]
    assert doc.uri == source.resolve().as_uri()
    assert doc.title
    assert all(section.text.strip() for section in doc.sections)


@needs_real_docs
def test_pdf_pages_are_located_and_a_page_without_text_is_ocred() -> None:
    require_binaries("tesseract")
    doc = file_to_document(REAL_DOCS / "sources" / "redp5110_sampled.pdf")

    assert doc.meta["pages"] == 18
    # Page 17 has no text layer: it went through OCR, which found no text on it either.
    assert doc.meta["ocr_engine"] == "tesseract"
    assert doc.meta["pages_without_text"] == [17]
    pages = [s.location.page for s in doc.sections if s.location]
    assert pages == sorted(pages) and set(pages) == set(range(1, 19)) - {17}


@needs_real_docs
def test_pdf_lines_are_rejoined_into_paragraphs() -> None:
    doc = file_to_document(REAL_DOCS / "sources" / "multi_page.pdf")
    paragraphs = doc.text.split("\n\n")

    assert "The Evolution of the Word Processor" in paragraphs
    assert any(
        p.startswith("The origins of word processing") and p.endswith("than handwriting.")
        for p in paragraphs
    )


@needs_real_docs
def test_docling_headings_become_heading_paths() -> None:
    doc = file_to_document(REAL_DOCS / "sources" / "unit_test_headers.docx")
    by_path = {section.heading_path: section.text for section in doc.sections}

    assert doc.title == "Test Document"
    assert (
        "Paragraph 1.2.3.1"
        in by_path[("Test Document", "Section 1", "Section 1.2", "Section 1.2.3")]
    )


@needs_real_docs
@pytest.mark.parametrize("engine", ["tesseract", "rapidocr"])
def test_scanned_pdf_and_tiff_come_through_ocr(engine: str) -> None:
    if engine == "tesseract":
        require_binaries("tesseract")
    scanned = file_to_document(REAL_DOCS / "sources" / "ocr_test.pdf", ocr_engine=engine)
    assert scanned.meta["ocr_pages"] == [1] and scanned.meta["ocr_engine"] == engine
    assert [s.location.page for s in scanned.sections if s.location] == [1]
    assert "docling" in scanned.text.lower()

    tiff = file_to_document(REAL_DOCS / "sources" / "2206.01062.tif", ocr_engine=engine)
    assert tiff.source_format == "tiff" and tiff.meta["ocr_engine"] == engine
    assert "doclaynet" in tiff.text.lower()
    assert all(s.location and s.location.page for s in tiff.sections)


@needs_real_docs
def test_slides_carry_their_number_and_do_not_inherit_titles() -> None:
    doc = file_to_document(REAL_DOCS / "sources" / "powerpoint_sample.pptx")

    by_slide = {s.location.slide: s.heading_path for s in doc.sections if s.location}
    assert by_slide[1] == ("Test Table Slide",)
    assert by_slide[2] == ("Second slide title",)
    assert by_slide[3] == ()  # slide 3 has no title of its own
    assert doc.meta["slides"] == 3


# --- structure, on generated files -----------------------------------------------------------


def test_markdown_heading_paths_follow_nesting(tmp_path: Path) -> None:
    source = tmp_path / "guide.md"
    source.write_text(
        "# Guide\n\nIntro with **bold** words.\n\n## Install\n\nRun it.\n\n### Linux\n\n"
        "Use apt.\n\n- first step\n- second step\n\n## Usage\n\nCall it.\n",
        encoding="utf-8",
    )

    doc = file_to_document(source)

    assert doc.title == "Guide"
    assert [(s.heading_path, s.text) for s in doc.sections] == [
        (("Guide",), "Intro with bold words."),
        (("Guide", "Install"), "Run it."),
        (("Guide", "Install", "Linux"), "Use apt.\n\n- first step\n- second step"),
        (("Guide", "Usage"), "Call it."),
    ]
    assert doc.source_format == "md"


def test_docx_level_two_heading_sits_under_level_one(tmp_path: Path) -> None:
    import docx

    document = docx.Document()
    document.add_heading("Policies", level=1)
    document.add_paragraph("General rules.")
    document.add_heading("Travel", level=2)
    document.add_paragraph("Book economy class.")
    document.add_table(rows=2, cols=2).rows[0].cells[0].text = "Zone"
    source = tmp_path / "handbook.docx"
    document.save(str(source))

    doc = file_to_document(source)

    travel = next(s for s in doc.sections if s.heading_path == ("Policies", "Travel"))
    assert travel.text.startswith("Book economy class.")
    assert "| Zone" in travel.text  # tables come out as Markdown
    assert doc.title == "Policies"


def test_xlsx_sheets_come_out_as_markdown_tables(tmp_path: Path) -> None:
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["Region", "Revenue"])
    sheet.append(["North", 1200])
    source = tmp_path / "sales.xlsx"
    book.save(source)

    doc = file_to_document(source)

    assert "| Region" in doc.text
    assert "North" in doc.text
    assert doc.source_format == "xlsx"


def _workbook_with_chart(path: Path) -> None:
    """Two named sheets; the first holds a bar chart of two series over three quarters."""
    import openpyxl
    from openpyxl.chart import BarChart, Reference

    book = openpyxl.Workbook()
    sales = book.active
    sales.title = "Quarterly Sales"
    for row in [
        ("Quarter", "Gravel", "Touring"),
        ("Q1", 120, 45),
        ("Q2", 150, 52),
        ("Q3", 170, 61),
    ]:
        sales.append(row)
    chart = BarChart()
    chart.title = "Units by quarter"
    chart.add_data(
        Reference(sales, min_col=2, min_row=1, max_col=3, max_row=4), titles_from_data=True
    )
    chart.set_categories(Reference(sales, min_col=1, min_row=2, max_row=4))
    sales.add_chart(chart, "E2")
    staff = book.create_sheet("Workshop Staff")
    for row in [("Name", "Role"), ("Ada", "Mechanic"), ("Bo", "Sales")]:
        staff.append(row)
    book.save(path)


def test_xlsx_sheet_names_head_their_sections_and_chunks(tmp_path: Path) -> None:
    source = tmp_path / "range.xlsx"
    _workbook_with_chart(source)

    doc = file_to_document(source)
    chunks = document_to_chunks("d1", doc)

    assert [s.heading_path for s in doc.sections] == [("Quarterly Sales",), ("Workshop Staff",)]
    assert [s.location.sheet for s in doc.sections if s.location] == [
        "Quarterly Sales",
        "Workshop Staff",
    ]
    assert {c.heading_path for c in chunks} == {("Quarterly Sales",), ("Workshop Staff",)}
    mechanic = next(c for c in chunks if "Mechanic" in c.text)
    assert mechanic.heading_path == ("Workshop Staff",)
    assert mechanic.embed_text.startswith("Workshop Staff\n")  # both vectors see the name
    assert doc.title == "range"  # a sheet name does not name the whole workbook


def test_xlsx_chart_series_come_out_as_a_table(tmp_path: Path) -> None:
    source = tmp_path / "range.xlsx"
    _workbook_with_chart(source)

    doc = file_to_document(source)

    sales = doc.sections[0].text
    assert "Bar chart data" in sales
    # The chart's own table (categories as rows, one column per series), after its label.
    chart_table = sales.split("Bar chart data", 1)[1]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")] for line in chart_table.split("\n")
    ]
    assert ["", "Gravel", "Touring"] in rows
    assert ["Q1", "120", "45"] in rows
    assert ["Q3", "170", "61"] in rows


def test_text_file_splits_paragraphs_on_blank_lines(tmp_path: Path) -> None:
    source = tmp_path / "notes.txt"
    source.write_bytes(b"First line\r\nstill first.\r\n\r\n\r\nSecond \xff paragraph.\n")

    doc = file_to_document(source)

    assert doc.title == "notes"
    assert doc.sections[0].heading_path == ()
    assert doc.text == "First line\nstill first.\n\nSecond \ufffd paragraph."


def test_generated_pdf_paragraphs_are_rejoined(tmp_path: Path) -> None:
    from fpdf import FPDF

    first = " ".join(f"alpha{i}" for i in range(60))
    second = " ".join(f"beta{i}" for i in range(45))
    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("helvetica", size=11)
    pdf.multi_cell(0, 6, first)
    pdf.ln(6)
    pdf.multi_cell(0, 6, second)
    source = tmp_path / "memo.pdf"
    pdf.output(str(source))

    doc = file_to_document(source)

    assert doc.text.split("\n\n") == [first, second]
    assert doc.meta["pages"] == 1


def test_owner_password_only_pdf_still_extracts(tmp_path: Path) -> None:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("helvetica", size=12)
    pdf.cell(0, 10, "Printable but not editable.")
    pdf.set_encryption(owner_password="owner-secret")
    source = tmp_path / "locked-editing.pdf"
    pdf.output(str(source))

    assert file_to_document(source).text == "Printable but not editable."


def test_docling_is_not_imported_at_module_import() -> None:
    code = "import sys, tasks.ingest.extract; sys.exit('docling' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=False)

    assert result.returncode == 0


# --- errors ----------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ExtractionError, match="does not exist — check the path"):
        file_to_document(tmp_path / "nowhere.md")


def test_unknown_bytes_are_unsupported(tmp_path: Path) -> None:
    source = tmp_path / "blob.bin"
    source.write_bytes(bytes(range(256)) * 4)

    with pytest.raises(UnsupportedFormat, match=r"blob\.bin") as info:
        file_to_document(source)

    assert isinstance(info.value, ExtractionError)


def test_a_truncated_tiff_is_an_extraction_error(tmp_path: Path) -> None:
    source = tmp_path / "scan.tif"
    source.write_bytes(b"II*\x00" + b"\x00" * 12)

    with pytest.raises(ExtractionError, match=r"scan\.tif"):
        file_to_document(source)


def test_oversize_file_names_size_limit_and_remedy(tmp_path: Path) -> None:
    source = tmp_path / "big.md"
    source.write_text("# Big\n\n" + "word " * 100, encoding="utf-8")

    with pytest.raises(ExtractionError) as info:
        file_to_document(source, max_bytes=100)

    message = str(info.value)
    assert "big.md" in message
    assert "507 bytes" in message
    assert "100 bytes" in message
    assert "raise KBFLOW_MAX_FILE_MB or split the file" in message


def test_corrupt_pdf_names_file_hash_reason_and_remedy(tmp_path: Path) -> None:
    source = tmp_path / "broken.pdf"
    payload = b"%PDF-1.4\n" + bytes(range(256)) * 8
    source.write_bytes(payload)

    with pytest.raises(ExtractionError) as info:
        file_to_document(source)

    import hashlib

    message = str(info.value)
    assert "broken.pdf" in message
    assert hashlib.sha256(payload).hexdigest()[:12] in message
    assert "corrupt" in message
    assert "re-export" in message
    assert info.value.__cause__ is not None


def test_corrupt_docx_is_reported_as_corrupt(tmp_path: Path) -> None:
    source = tmp_path / "broken.docx"
    source.write_bytes(b"PK\x03\x04 this is not a real zip archive")

    with pytest.raises(ExtractionError, match=r"broken\.docx.*corrupt"):
        file_to_document(source)


def test_encrypted_pdf_asks_for_an_unlocked_copy(tmp_path: Path) -> None:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("helvetica", size=12)
    pdf.cell(0, 10, "Quarterly figures that must not leak into messages.")
    pdf.set_encryption(owner_password="owner-secret", user_password="user-secret")
    source = tmp_path / "locked.pdf"
    pdf.output(str(source))

    with pytest.raises(ExtractionError) as info:
        file_to_document(source)

    message = str(info.value)
    assert "locked.pdf" in message
    assert "file is encrypted — supply an unlocked copy" in message
    assert "Quarterly" not in message


def test_blank_pdf_is_not_called_scanned(tmp_path: Path) -> None:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    source = tmp_path / "blank.pdf"
    pdf.output(str(source))

    with pytest.raises(ExtractionError, match=r"blank\.pdf .*looks blank"):
        file_to_document(source)


@pytest.mark.parametrize("name", ["empty.md", "empty.pdf", "empty.txt"])
def test_zero_byte_file(tmp_path: Path, name: str) -> None:
    source = tmp_path / name
    source.write_bytes(b"")

    with pytest.raises(ExtractionError, match=rf"{re.escape(name)} is empty .*remove it"):
        file_to_document(source)


@pytest.mark.parametrize(
    ("name", "content"),
    [("blank.md", "\n\n   \n"), ("blank.txt", " \n\n\t\n"), ("blank.html", "<html></html>")],
)
def test_file_without_text(tmp_path: Path, name: str, content: str) -> None:
    source = tmp_path / name
    source.write_text(content, encoding="utf-8")

    with pytest.raises(ExtractionError, match=rf"{re.escape(name)} .*no extractable text"):
        file_to_document(source)


def test_missing_layout_models_are_a_config_error_not_a_corrupt_file(tmp_path: Path) -> None:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("helvetica", size=12)
    pdf.cell(0, 10, "Text layer present.")
    source = tmp_path / "fine.pdf"
    pdf.output(str(source))
    models = tmp_path / "no-models-here"
    models.mkdir()

    with pytest.raises(ConfigError, match="docling-layout-heron") as info:
        file_to_document(source, artifacts_path=models)

    assert str(models) in str(info.value)
    assert "leave artifacts_path unset" in str(info.value)


def test_a_markdown_files_citations_footer_is_kept_apart_from_its_chunks(tmp_path: Path) -> None:
    from tasks.text.citations import split_citation_footer

    source = tmp_path / "key-contacts.md"
    source.write_text(
        "# Key contacts\n\n## People\n\n- Ana Diaz, CEO [doc:3f2a]\n"
        "- Support page [url:https://acme.example/a]\n\n---\n## Citations\n"
        "- [doc:3f2a] Team sheet.xlsx\n- [url:https://acme.example/a] Acme page\n",
        encoding="utf-8",
    )
    document, refs = split_citation_footer(file_to_document(source))
    assert [(r.cite_id, r.title, r.uri) for r in refs] == [
        ("doc:3f2a", "Team sheet.xlsx", None),
        ("url:https://acme.example/a", "Acme page", "https://acme.example/a"),
    ]
    [chunk] = document_to_chunks("d", document)
    assert chunk.text == "- Ana Diaz, CEO [doc:3f2a]\n- Support page [url:https://acme.example/a]"
