"""PDFs: text-layer pages through Docling, pages without a text layer through OCR.

Docling's model-free native pipeline yields one item per printed line; the lines are re-joined
here into paragraphs from their positions on the page, and pages without a text layer are OCRed
(`tasks.ingest.ocr`). When local layout-model artifacts are supplied, PDFs use Docling's standard
pipeline instead (`tasks.ingest.docling_sections` turns its output into sections).
"""

from __future__ import annotations

import itertools
import logging
import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, ExtractionError
from core.models import Location, Section
from tasks.ingest.bullets import BULLET_GLYPHS
from tasks.ingest.docling_convert import convert, named_as, pdf_converter
from tasks.ingest.docling_sections import docling_to_sections
from tasks.ingest.extract_options import ExtractOptions
from tasks.ingest.pages import Box, join_wrapped, open_pdf, sha12

if TYPE_CHECKING:
    from docling_core.types.doc import DoclingDocument

logger = logging.getLogger(__name__)


# Line starts that open a new list item in PDF text (bullet glyphs, "1.", "(a)", "iv)").
_BULLET_RE = re.compile(
    rf"^\s*(?:[{BULLET_GLYPHS}□\-–—*]\s|\(?(?:\d{{1,3}}|[a-z]|[ivx]{{1,4}})[.)]\s)"
)


def _pdf_page_count(path: Path) -> int:
    """Open the PDF with pdfium first: docling reports encrypted and corrupt files alike."""
    pdf = open_pdf(path)
    try:
        return len(pdf)
    finally:
        pdf.close()


def pdf_to_sections(
    path: Path, opts: ExtractOptions
) -> tuple[str | None, list[Section], dict[str, Any]]:
    """Text-layer pages through Docling, pages without a text layer through OCR."""
    pages = _pdf_page_count(path)
    if pages > opts.max_pdf_pages:
        raise ExtractionError(
            f"{path.name} has {pages:,} pages, over the limit of {opts.max_pdf_pages:,} — split "
            "it, or raise KBFLOW_MAX_PDF_PAGES"
        )
    with named_as(path, "pdf") as readable:
        doc = convert(readable, pdf_converter(opts.artifacts_path), shown=path)
    meta: dict[str, Any] = {"pages": pages}
    title: str | None = None
    if opts.artifacts_path is not None:
        title, sections = docling_to_sections(doc, unit="page")
        meta["pdf_pipeline"] = "standard"
    else:
        sections = _pdf_paragraph_sections(list(_pdf_lines(doc)))
        meta["pdf_pipeline"] = "native"
    with_text = {s.location.page for s in sections if s.location and s.text.strip()}
    missing = [page for page in range(1, pages + 1) if page not in with_text]
    if missing:
        sections = _ocr_missing_pages(path, sections, missing, pages, opts, meta)
    if not any(s.text.strip() for s in sections):
        raise _no_text(path, pages, doc)
    return title, sections, meta


def _ocr_missing_pages(
    path: Path,
    sections: list[Section],
    missing: list[int],
    pages: int,
    opts: ExtractOptions,
    meta: dict[str, Any],
) -> list[Section]:
    """OCR the pages that have no text layer and merge them in page order."""
    from tasks.ingest.ocr import ensure_ocr_engine, ocr_pdf_pages

    try:
        ensure_ocr_engine(opts.ocr_engine)
    except ConfigError as exc:
        if len(missing) == pages:
            raise ExtractionError(
                f"{path.name} (sha {sha12(path)}) has no text layer on any of its {pages} "
                f"page(s): it looks scanned, and OCR is unavailable: {exc}"
            ) from exc
        logger.warning("%s: %d page(s) without text left out: %s", path.name, len(missing), exc)
        meta["pages_without_text"] = missing
        return sections
    texts = ocr_pdf_pages(
        path,
        missing,
        engine=opts.ocr_engine,
        language=opts.ocr_language,
        dpi=opts.ocr_dpi,
        max_pixels=opts.max_image_pixels,
        timeout_s=opts.ocr_timeout_s,
    )
    ocred = [
        Section((), text.strip(), Location(page=p)) for p, text in texts.items() if text.strip()
    ]
    meta["ocr_pages"] = sorted(p for p, text in texts.items() if text.strip())
    meta["ocr_engine"] = opts.ocr_engine
    blank = sorted(set(missing) - set(meta["ocr_pages"]))
    if blank:
        meta["pages_without_text"] = blank
    merged = sections + ocred
    merged.sort(key=lambda s: s.location.page if s.location and s.location.page else 0)
    return merged


def _no_text(path: Path, pages: int, doc: DoclingDocument) -> ExtractionError:
    """The error for a PDF that yields no text even after OCR."""
    from docling_core.types.doc import PictureItem

    if any(isinstance(item, PictureItem) for item, _level in doc.iterate_items()):
        return ExtractionError(
            f"{path.name} (sha {sha12(path)}): none of its {pages} page(s) has a text layer "
            "and OCR found no text in its images — check the scan is readable (at least "
            "~200 dpi) or supply a PDF with a text layer"
        )
    return ExtractionError(
        f"{path.name} (sha {sha12(path)}) has neither text nor images on its {pages} page(s) "
        "— it looks blank; check the export and supply a copy with content"
    )


@dataclass(frozen=True)
class _Line(Box):
    """One printed line of a PDF page."""

    page: int


def _pdf_paragraph_sections(lines: list[_Line]) -> list[Section]:
    """One section per page, holding that page's re-joined paragraphs."""
    if not lines:
        return []
    by_page: dict[int, list[str]] = {}
    for page, paragraph in _lines_to_paragraphs(lines):
        by_page.setdefault(page, []).append(paragraph)
    return [Section((), "\n\n".join(paras), Location(page=page)) for page, paras in by_page.items()]


def _pdf_lines(doc: DoclingDocument) -> Iterator[_Line]:
    from docling_core.types.doc import TextItem

    for item, _level in doc.iterate_items():
        if not isinstance(item, TextItem) or not item.text.strip() or not item.prov:
            continue
        prov = item.prov[0]
        height = doc.pages[prov.page_no].size.height
        box = prov.bbox.to_top_left_origin(page_height=height)
        text = " ".join(item.text.split())
        yield _Line(left=box.l, top=box.t, right=box.r, bottom=box.b, text=text, page=prov.page_no)


def _lines_to_paragraphs(lines: list[_Line]) -> list[tuple[int, str]]:
    """Re-join the native pipeline's one-item-per-line output into (page, paragraph) pairs.

    A new paragraph starts on a new page or column, after a vertical gap clearly wider than the
    document's usual line spacing, at a bullet, or after a line that stopped short (the next
    line's first word would have fitted on it). Lines on the same row are joined with a space.
    """
    gaps = [
        cur.top - prev.bottom
        for prev, cur in itertools.pairwise(lines)
        if cur.page == prev.page and cur.top >= prev.bottom - 0.5 * prev.height
    ]
    usual_gap = statistics.median(gaps) if gaps else 0.0
    line_height = statistics.median(line.height for line in lines)

    paragraphs: list[tuple[int, str]] = []
    page, current = lines[0].page, lines[0].text
    for prev, cur in itertools.pairwise(lines):
        if _same_row(prev, cur):
            current += " " + cur.text
        elif _starts_paragraph(prev, cur, usual_gap, line_height):
            paragraphs.append((page, current))
            page, current = cur.page, cur.text
        else:
            current = join_wrapped(current, cur.text)
    paragraphs.append((page, current))
    return paragraphs


def _same_row(prev: _Line, cur: _Line) -> bool:
    overlap = min(prev.bottom, cur.bottom) - max(prev.top, cur.top)
    return (
        cur.page == prev.page
        and overlap > 0.5 * min(prev.height, cur.height)
        and cur.left >= prev.right - 1.0
    )


def _starts_paragraph(prev: _Line, cur: _Line, usual_gap: float, line_height: float) -> bool:
    if cur.page != prev.page or cur.top < prev.top:  # new page, or back up to a new column
        return True
    if cur.top - prev.bottom > usual_gap + 0.5 * line_height:
        return True
    if _BULLET_RE.match(cur.text):
        return True
    # Would the next line's first word have fitted on the previous line? Then it ended early.
    char_width = (cur.right - cur.left) / max(len(cur.text), 1)
    first_word = cur.text.split(" ", 1)[0]
    right_margin = max(prev.right, cur.right)
    return prev.right + (len(first_word) + 2) * char_width < right_margin
