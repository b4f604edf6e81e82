"""Tests for tasks.ingest.bullets (issue 44): bullet glyphs that open a list item — "•", "▪",
private-use symbol-font glyphs, and the "∞" Docling reads out of a Symbol-font bullet — come
through as Markdown's "- ", or go where Docling already made a list item; the same characters
inside a sentence stay.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.models import Location, Section
from tasks.ingest.bullets import (
    bullets_to_markdown,
    sections_bullets_to_markdown,
    strip_bullet,
)
from tasks.ingest.extract import file_to_document

REPO_ROOT = Path(__file__).resolve().parents[3]
DATASETS = Path(
    os.environ.get("KBFLOW_DATASETS", REPO_ROOT.parent / "shared" / "datasets")
).resolve()
REAL_DOCS = DATASETS / "real-docs"

MATHS = "As n grows the backlog tends to ∞ unless claims are filed on time."
ITEMS = (
    "Rail travel: book second class for trips under four hours.",
    "Hotels: up to EUR 140 a night in capital cities.",
    "Receipts: keep them for seven years.",
    "Mileage: EUR 0.23 per kilometre.",
)


def _policy_pdf(path: Path) -> Path:
    """A PDF shaped like a Word export: a paragraph with "∞" mid-sentence, two "•" items, and
    two items whose bullet is drawn in the Symbol font (code 0xA5, which Symbol's encoding
    reads as "∞": what Docling makes of macOS Word's bullets)."""
    import matplotlib
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    pdf.add_font("dejavu", fname=str(font))
    pdf.set_font("dejavu", size=11)
    pdf.multi_cell(0, 6, MATHS, new_x="LMARGIN", new_y="NEXT")
    pdf.ln(4)
    for item in ITEMS[:2]:
        pdf.multi_cell(0, 6, f"• {item}", new_x="LMARGIN", new_y="NEXT")
    for item in ITEMS[2:]:
        pdf.set_font("symbol", size=11)
        pdf.cell(5, 6, "\xa5")
        pdf.set_font("dejavu", size=11)
        pdf.multi_cell(0, 6, f" {item}", new_x="LMARGIN", new_y="NEXT")
    pdf.output(str(path))
    return path


def test_pdf_bullet_glyphs_become_markdown_list_items(tmp_path: Path) -> None:
    doc = file_to_document(_policy_pdf(tmp_path / "travel.pdf"))

    assert doc.text.split("\n\n") == [MATHS, *(f"- {item}" for item in ITEMS)]


def test_docx_bullets_typed_or_pasted_into_the_text_are_normalised(tmp_path: Path) -> None:
    import docx

    document = docx.Document()
    document.add_heading("Travel", level=1)
    document.add_paragraph("Costs rise towards ∞ when nobody checks them.")
    # List items whose text still starts with a glyph: the list marker already says it.
    document.add_paragraph(f"• {ITEMS[0]}", style="List Bullet")
    document.add_paragraph(f"▪ {ITEMS[1]}", style="List Bullet")
    # Plain paragraphs opened by Symbol/Wingdings private-use glyphs (U+F0B7, U+F0A7).
    document.add_paragraph(f"\uf0b7\t{ITEMS[2]}")
    document.add_paragraph(f"\uf0a7 {ITEMS[3]}")
    source = tmp_path / "travel.docx"
    document.save(str(source))

    doc = file_to_document(source)

    assert doc.text.split("\n\n") == [
        "Costs rise towards ∞ when nobody checks them.",
        f"- {ITEMS[0]}\n- {ITEMS[1]}",
        f"- {ITEMS[2]}",
        f"- {ITEMS[3]}",
    ]


def test_glyphs_open_lines_as_markdown_and_stay_inside_sentences() -> None:
    prose = ["the limit is ∞ here", "cost • time", "U코드 ◦ 대상질병"]
    listed = ["• Rail", "  ▪ Hotels", "● Meals", "◦ Taxis", "∙ Tolls"]
    private_use = ["\uf0b7 Receipts", "\uf0a7 Mileage", "\uf0d8 Parking", "\uf0fcFerries"]

    assert bullets_to_markdown([*listed, *private_use, *prose]) == [
        "- Rail", "  - Hotels", "- Meals", "- Taxis", "- Tolls",
        "- Receipts", "- Mileage", "- Parking", "- Ferries", *prose,
    ]  # fmt: skip


@pytest.mark.parametrize("glyph", ["∞", "·"])
def test_an_ambiguous_glyph_is_a_bullet_only_in_a_list(glyph: str) -> None:
    listed = [f"{glyph} Rail travel.", "Some prose.", f"{glyph} Hotels."]
    assert bullets_to_markdown(listed) == ["- Rail travel.", "Some prose.", "- Hotels."]
    # One line alone, or lines that go on in lower case, are maths wrapped onto a new line.
    assert bullets_to_markdown([f"{glyph} Rail travel."]) == [f"{glyph} Rail travel."]
    wrapped = [f"{glyph} as n grows,", f"{glyph} and so on.", f"{glyph} Rail."]
    assert bullets_to_markdown(wrapped) == wrapped


def test_a_list_counts_across_sections() -> None:
    sections = [
        Section((), "Intro.\n\n∞ Rail travel.", Location(page=1)),
        Section((), "∞ Hotels.\n\nTends to ∞ fast.", Location(page=2)),
    ]

    assert [s.text for s in sections_bullets_to_markdown(sections)] == [
        "Intro.\n\n- Rail travel.",
        "- Hotels.\n\nTends to ∞ fast.",
    ]
    assert [s.location for s in sections_bullets_to_markdown(sections)] == [
        Location(page=1),
        Location(page=2),
    ]


def test_strip_bullet_drops_a_glyph_in_front_of_a_list_item() -> None:
    assert strip_bullet("∞ Rail") == "Rail"
    assert strip_bullet("\uf0b7\tRail") == "Rail"
    assert strip_bullet("Rail ∞ Hotels") == "Rail ∞ Hotels"
    assert strip_bullet("•") == "•"  # nothing after it: a glyph alone is left as it is


@pytest.mark.skipif(
    not (REAL_DOCS / "sources").is_dir(), reason=f"real-docs dataset not found at {REAL_DOCS}"
)
def test_real_word_export_bullets_are_markdown_list_items() -> None:
    # multi_page.pdf: macOS Word's bullets (SymbolMT 0xA5 under MacRoman), which Docling
    # reads as "∞"; the reference text has "- " list items.
    doc = file_to_document(REAL_DOCS / "sources" / "multi_page.pdf")
    paragraphs = doc.text.split("\n\n")

    assert "∞" not in doc.text
    items = [p for p in paragraphs if p.startswith("- ")]
    assert len(items) == 16
    assert items[0].startswith("- IBM MT/ST (Magnetic Tape/Selectric Typewriter):")
