"""Tests for tasks.ingest.titles (issue 44): a document's title comes from the document — its
metadata title, else its first heading — before its file name, and junk metadata is ignored.

The files are generated the way their tools write them: python-docx and python-pptx core
properties, fpdf2's PDF ``Title``, an HTML page's ``<title>``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tasks.ingest.extract import file_to_document
from tasks.ingest.titles import MAX_TITLE_CHARS, document_title, usable_title

REPO_ROOT = Path(__file__).resolve().parents[3]
DATASETS = Path(
    os.environ.get("KBFLOW_DATASETS", REPO_ROOT.parent / "shared" / "datasets")
).resolve()
REAL_DOCS = DATASETS / "real-docs"

POLICY_TITLE = "Larkspur Cycles Travel and Expense Policy"
BULLETS = (
    "Rail: book second class for trips under four hours.",
    "Hotels: up to EUR 140 a night in capital cities.",
    "Receipts: keep them for seven years.",
)


def _policy_docx(path: Path, core_title: str) -> Path:
    import docx

    document = docx.Document()
    document.core_properties.title = core_title
    document.add_heading("Scope", level=1)
    document.add_paragraph("This policy covers every trip staff make for Larkspur Cycles.")
    for text in BULLETS:
        document.add_paragraph(text, style="List Bullet")
    document.add_heading("Approval", level=1)
    document.add_paragraph("Trips over EUR 1,000 need the finance director's approval.")
    document.save(str(path))
    return path


def _policy_pdf(path: Path, title: str | None) -> Path:
    from fpdf import FPDF

    pdf = FPDF()
    if title is not None:
        pdf.set_title(title)
    pdf.add_page()
    pdf.set_font("helvetica", size=11)
    pdf.multi_cell(0, 6, "This policy covers every trip staff make for Larkspur Cycles.")
    pdf.ln(4)
    for text in BULLETS:
        pdf.multi_cell(0, 6, f"- {text}", new_x="LMARGIN", new_y="NEXT")
    pdf.output(str(path))
    return path


def test_docx_core_title_comes_before_its_first_heading(tmp_path: Path) -> None:
    doc = file_to_document(_policy_docx(tmp_path / "tep_v3_final.docx", POLICY_TITLE))

    assert doc.title == POLICY_TITLE
    assert doc.sections[0].heading_path == ("Scope",)  # headings are untouched


def test_docx_junk_core_title_falls_back_to_the_first_heading(tmp_path: Path) -> None:
    source = _policy_docx(tmp_path / "tep.docx", "Microsoft Word - tep_v3_final.docx")

    assert file_to_document(source).title == "Scope"


def test_pdf_title_metadata_comes_before_the_file_name(tmp_path: Path) -> None:
    doc = file_to_document(_policy_pdf(tmp_path / "scan_0042.pdf", POLICY_TITLE))

    assert doc.title == POLICY_TITLE
    assert [p for p in doc.text.split("\n\n") if p.startswith("- ")] == [
        f"- {text}" for text in BULLETS
    ]


@pytest.mark.parametrize("title", [None, "", "   ", "Untitled", "scan_0042", "0042"])
def test_pdf_without_a_usable_title_is_named_by_its_file(tmp_path: Path, title: str | None) -> None:
    assert file_to_document(_policy_pdf(tmp_path / "scan_0042.pdf", title)).title == "scan_0042"


def test_pptx_core_title_comes_before_the_first_slide_title(tmp_path: Path) -> None:
    from pptx import Presentation

    deck = Presentation()
    deck.core_properties.title = "Larkspur Cycles Q3 Dealer Briefing"
    for heading, body in [("Agenda", "Sales, service, spring range."), ("Sales", "Up 12%.")]:
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = heading
        slide.placeholders[1].text = body
    source = tmp_path / "briefing.pptx"
    deck.save(str(source))

    assert file_to_document(source).title == "Larkspur Cycles Q3 Dealer Briefing"


@pytest.mark.parametrize("in_memory", [False, True])
def test_html_title_comes_before_its_first_heading(tmp_path: Path, in_memory: bool) -> None:
    page = (
        b"<html><head><meta charset='utf-8'><title>\n  Larkspur Cycles returns policy\n"
        b"</title></head><body><h1>Returns</h1><p>Return any bike within 30 days.</p>"
        b"<ul><li>Keep the receipt.</li><li>Bring the frame number.</li></ul></body></html>"
    )
    source = tmp_path / "returns.html"
    source.write_bytes(page)

    doc = file_to_document(source, data=page if in_memory else None)

    assert doc.title == "Larkspur Cycles returns policy"


def test_html_title_that_is_the_heading_plus_the_site_name_gives_the_heading(
    tmp_path: Path,
) -> None:
    source = tmp_path / "duck.html"
    source.write_text(
        "<html><head><title>Duck - Wikipedia</title></head>"
        "<body><h1>Duck</h1><p>Duck is the common name for many species.</p></body></html>",
        encoding="utf-8",
    )

    assert file_to_document(source).title == "Duck"


def test_markdown_without_metadata_keeps_its_first_heading(tmp_path: Path) -> None:
    source = tmp_path / "guide.md"
    source.write_text("# Fitting guide\n\nMeasure the inseam first.\n", encoding="utf-8")

    assert file_to_document(source).title == "Fitting guide"


@pytest.mark.parametrize(
    "candidate",
    [
        None,
        "",
        " \t\n",
        "Untitled",
        "untitled document",
        "Document1",
        "PowerPoint Presentation",
        "Microsoft Word - tep_v3_final.docx",
        "Microsoft PowerPoint - deck",
        "tep_v3_final",
        "TEP_V3_FINAL.DOCX",
        "C:\\Users\\am\\Desktop\\policy.pdf",
        "policy-2024.pdf",
        "2024",
        "12.05.2024",
        "x" * (MAX_TITLE_CHARS + 1),
    ],
)
def test_junk_titles_are_not_used(candidate: str | None) -> None:
    assert usable_title(candidate, Path("/kb/tep_v3_final.docx")) is None


def test_a_usable_title_has_its_whitespace_collapsed() -> None:
    assert usable_title("  Returns\n\tpolicy\x00 ", Path("a.pdf")) == "Returns policy"
    assert usable_title("2024 price list", Path("a.pdf")) == "2024 price list"


def test_order_of_preference_is_metadata_heading_then_file_stem() -> None:
    path = Path("/kb/notes_v2.pdf")

    assert document_title(path, metadata="Price list", heading="Prices") == "Price list"
    assert document_title(path, metadata="Untitled", heading="Prices") == "Prices"
    assert document_title(path, metadata=None, heading=None) == "notes_v2"
    assert document_title(path, metadata="Prices | Larkspur", heading="Prices") == "Prices"
    # A subtitle is part of the title, not a site's name.
    assert document_title(path, metadata="Prices: 2025", heading="Prices") == "Prices: 2025"


@pytest.mark.skipif(
    not (REAL_DOCS / "sources").is_dir(), reason=f"real-docs dataset not found at {REAL_DOCS}"
)
def test_real_pdf_title_metadata_names_the_document() -> None:
    doc = file_to_document(REAL_DOCS / "sources" / "normal_4pages.pdf")

    assert doc.title == "코로나-19 관련 보험약관상 재해보험금 지급문제 및 개선과제"
