"""Turn one source file into an `ExtractedDocument`: its text, in sections that keep their
headings and where each passage came from (page, slide, sheet or time range).

The format comes from the file's bytes (`tasks.ingest.sniff`), never from its name alone. Docling
converts Markdown, HTML, Office files and CSV; OOXML passes a zip-bomb check first. Text-layer
PDFs go through Docling's model-free native pipeline, which yields one item per printed line;
the lines are re-joined here into paragraphs from their positions on the page, and pages without
a text layer are OCRed (`tasks.ingest.ocr`). When local layout-model artifacts are supplied, PDFs
use
Docling's standard pipeline instead. Images are OCRed; audio and video are transcribed
(`tasks.ingest.media`). Plain text is read directly. Nothing here touches the network, and every
heavy
library is imported on first use. Run it through `tasks.ingest.isolate.ExtractionPool` to get hard
time
and memory limits per file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import re
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, ExtractionError, KbflowError, UnsupportedFormat
from core.models import ExtractedDocument, Location, Section
from tasks.ingest.media import AUDIO_FORMATS, VIDEO_FORMATS
from tasks.ingest.pages import Box, join_wrapped, open_pdf, sha12

if TYPE_CHECKING:
    from docling.document_converter import DocumentConverter
    from docling_core.types.doc import DoclingDocument, NodeItem, PictureItem

    from core.settings import Settings

logger = logging.getLogger(__name__)

IMAGE_FORMATS: frozenset[str] = frozenset({"png", "jpeg", "tiff", "webp"})
MEDIA_FORMATS: frozenset[str] = AUDIO_FORMATS | VIDEO_FORMATS
OOXML_FORMATS: frozenset[str] = frozenset({"docx", "pptx", "xlsx"})
_DOCLING_FORMATS: frozenset[str] = frozenset({"md", "html", "csv"}) | OOXML_FORMATS

SUPPORTED_SUFFIXES: frozenset[str] = frozenset(
    {".md", ".markdown", ".html", ".htm", ".docx", ".pptx", ".xlsx", ".csv", ".pdf", ".txt"}
    | {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp"}
    | {f".{fmt}" for fmt in MEDIA_FORMATS}
)
DEFAULT_MAX_BYTES = 50 * 1024 * 1024

_CORRUPT_ADVICE = (
    "check that it opens in its own application; if it does, re-export or re-save it and ingest "
    "the new copy"
)
# Line starts that open a new list item in PDF text (bullet glyphs, "1.", "(a)", "iv)").
_BULLET_RE = re.compile(r"^\s*(?:[•◦▪▫●○■□‣⁃∞∙·\-–—*]\s|\(?(?:\d{1,3}|[a-z]|[ivx]{1,4})[.)]\s)")
_HASH_RE = re.compile(r"\b[0-9a-f]{64}\b")


@dataclass(frozen=True)
class ExtractOptions:
    """Everything extraction needs to know, picklable so it can travel to a worker process.

    Built from `Settings` with `from_settings`; the defaults match the settings' defaults.
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    artifacts_path: Path | None = None
    max_pdf_pages: int = 2000
    max_image_pixels: int = 150_000_000
    ocr_engine: str = "tesseract"
    ocr_language: str = "eng"
    ocr_dpi: int = 200
    ocr_timeout_s: float = 120.0
    zip_max_ratio: float = 200.0
    zip_max_total_bytes: int = 1 << 30
    zip_max_entries: int = 10_000
    asr_engine: str = "auto"
    whisper_model: str = "base"
    whisper_dir: Path | None = None
    asr_language: str | None = None
    max_media_s: float = 4 * 3600.0
    media_timeout_s: float = 3600.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ExtractOptions:
        return cls(
            max_bytes=int(settings.max_file_mb * 1024 * 1024),
            artifacts_path=settings.docling_artifacts_path,
            max_pdf_pages=settings.max_pdf_pages,
            max_image_pixels=int(settings.max_image_megapixels * 1_000_000),
            ocr_engine=settings.ocr_engine,
            ocr_language=settings.ocr_language,
            ocr_dpi=settings.ocr_dpi,
            ocr_timeout_s=min(settings.extract_timeout_s, 600.0),
            zip_max_ratio=settings.zip_max_ratio,
            zip_max_total_bytes=int(settings.zip_max_total_mb * 1024 * 1024),
            zip_max_entries=settings.zip_max_entries,
            asr_engine=settings.asr_engine,
            whisper_model=settings.whisper_model,
            whisper_dir=settings.whisper_dir.resolve(),
            asr_language=settings.asr_language,
            max_media_s=settings.max_media_minutes * 60,
            media_timeout_s=settings.media_timeout_s,
        )


def file_to_document(
    path: Path, options: ExtractOptions | None = None, **overrides: Any
) -> ExtractedDocument:
    """Extract the text of one file, keeping headings and where each passage came from.

    Args:
        path: The file to read. Its bytes decide the format; a name that disagrees is noted in
            ``meta["declared_format"]`` and otherwise ignored.
        options: Limits and engines (see `ExtractOptions`); defaults when omitted.
        overrides: Individual `ExtractOptions` fields, e.g. ``max_bytes=100``.

    Returns:
        The document: title (first title or heading, else the file stem), `file://` URI,
        sections (heading path, text, location; tables as Markdown, list items as "- item"),
        source format (what the bytes are) and meta (e.g. ``{"pages": 4}`` for a PDF). Audio
        or video without speech gives a document with no sections and ``meta["empty_reason"]``.

    Raises:
        UnsupportedFormat: The bytes are no format kbflow reads.
        ExtractionError: The file is missing, too large, empty, encrypted, corrupt, over a cap
            (pages, pixels, duration, zip ratio), or yields no text at all.
        ConfigError: an engine the file needs (layout models, OCR, speech) is not available.
    """
    from tasks.ingest.sniff import TEXT_FORMATS, detect_format

    opts = dataclasses.replace(options or ExtractOptions(), **overrides)
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError as exc:
        raise ExtractionError(f"{path} does not exist — check the path and try again") from exc
    except OSError as exc:
        raise ExtractionError(
            f"cannot read {path}: {exc.strerror} — check the path and its permissions"
        ) from exc
    if not path.is_file():
        raise ExtractionError(f"{path} is not a regular file — pass a file, not a folder")
    if size > opts.max_bytes:
        raise ExtractionError(
            f"{path.name} is {size:,} bytes ({size / 2**20:.1f} MiB), over the limit of "
            f"{opts.max_bytes:,} bytes ({opts.max_bytes / 2**20:.1f} MiB) — raise "
            "KBFLOW_MAX_FILE_MB or split the file"
        )
    if size == 0:
        raise ExtractionError(f"{path.name} is empty (0 bytes) — nothing to extract; remove it")

    detected = detect_format(path)
    fmt = detected.format
    meta: dict[str, Any] = {}
    if detected.mismatch and fmt in TEXT_FORMATS and detected.declared not in TEXT_FORMATS:
        # Magic numbers are proof, "decodes as text" is not: a .pdf of plain text is a mistake.
        raise UnsupportedFormat(
            f"{path.name} is named .{detected.declared} but holds plain text, not a "
            f"{detected.declared.upper()} file — re-export it, or rename it .txt if it is text"
        )
    if detected.mismatch:
        logger.warning("%s is named .%s but its bytes are %s", path.name, detected.declared, fmt)
        meta["declared_format"] = detected.declared

    started = time.perf_counter()
    title: str | None = None
    if fmt == "txt":
        sections = _txt_to_sections(path)
    elif fmt == "pdf":
        title, sections, found = _pdf_to_sections(path, opts)
        meta.update(found)
    elif fmt in IMAGE_FORMATS:
        sections, found = _image_to_sections(path, opts)
        meta.update(found)
    elif fmt in MEDIA_FORMATS:
        sections, found = _media_to_sections(path, opts)
        meta.update(found)
    elif fmt in _DOCLING_FORMATS:
        if fmt in OOXML_FORMATS:
            from tasks.ingest.sniff import check_zip_safety

            check_zip_safety(
                path,
                max_ratio=opts.zip_max_ratio,
                max_total_bytes=opts.zip_max_total_bytes,
                max_entries=opts.zip_max_entries,
            )
        with _named_as(path, fmt) as readable:
            doc = _convert(readable, _office_converter(), shown=path)
        title, sections = _docling_to_sections(doc, unit="slide" if fmt == "pptx" else None)
        if doc.pages and fmt == "pptx":
            meta["slides"] = len(doc.pages)
        elif doc.pages and fmt == "xlsx":
            meta["sheets"] = len(doc.pages)
    else:  # a format sniff knows but nothing here reads
        raise UnsupportedFormat(
            f"{path.name}: {fmt} files are not supported — convert it to one of "
            f"{', '.join(sorted(SUPPORTED_SUFFIXES))}"
        )

    if not any(s.text.strip() for s in sections) and "empty_reason" not in meta:
        raise ExtractionError(
            f"{path.name} (sha {sha12(path)}) contains no extractable text — check that the "
            "file is not blank or image-only"
        )
    logger.info(
        "extracted %s: format=%s sections=%d chars=%d in %.2fs",
        path.name,
        fmt,
        len(sections),
        sum(len(s.text) for s in sections),
        time.perf_counter() - started,
    )
    return ExtractedDocument(
        title=title or path.stem,
        uri=path.resolve().as_uri(),
        sections=tuple(s for s in sections if s.text.strip()),
        source_format=fmt,
        meta=meta,
    )


def is_media(path: Path) -> bool:
    """Audio or video by its bytes; False when unreadable (extraction reports that)."""
    from tasks.ingest.sniff import detect_format

    try:
        return detect_format(Path(path)).format in MEDIA_FORMATS
    except (OSError, KbflowError):
        return False


def runs_long(path: Path, threshold_bytes: int) -> bool:
    """Audio, video, and any file over ``threshold_bytes``: worth a background job."""
    try:
        if Path(path).stat().st_size > threshold_bytes:
            return True
    except OSError:
        return False  # unreadable: reported by the normal run
    return is_media(path)


@contextlib.contextmanager
def _named_as(path: Path, fmt: str) -> Iterator[Path]:
    """The file under a name whose suffix matches its real format (Docling goes by suffix)."""
    wanted = {"md": {".md", ".markdown"}, "html": {".html", ".htm"}}.get(fmt, {f".{fmt}"})
    if path.suffix.lower() in wanted:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="kbflow-named-") as tmp:
        alias = Path(tmp) / f"{path.stem or 'file'}.{fmt}"
        alias.symlink_to(path.resolve())
        yield alias


# --- images, audio and video -----------------------------------------------------------------


def _image_to_sections(path: Path, opts: ExtractOptions) -> tuple[list[Section], dict[str, Any]]:
    from tasks.ingest.ocr import check_image, ensure_ocr_engine, ocr_image_file

    check_image(path, max_pixels=opts.max_image_pixels)  # caps first: cheap, header only
    ensure_ocr_engine(opts.ocr_engine)
    sections = ocr_image_file(
        path,
        engine=opts.ocr_engine,
        language=opts.ocr_language,
        max_pixels=opts.max_image_pixels,
        timeout_s=opts.ocr_timeout_s,
    )
    if not sections:
        raise ExtractionError(
            f"{path.name} (sha {sha12(path)}): OCR ({opts.ocr_engine}) found no text in the "
            "image — check it is a readable scan (at least ~200 dpi, not blank)"
        )
    return sections, {"ocr_engine": opts.ocr_engine, "pages": len(sections)}


def _media_to_sections(path: Path, opts: ExtractOptions) -> tuple[list[Section], dict[str, Any]]:
    from tasks.ingest.media import get_transcriber, transcribe_media

    transcriber = get_transcriber(
        opts.asr_engine, opts.whisper_model, download_root=opts.whisper_dir
    )
    sections, meta = transcribe_media(
        path,
        transcriber=transcriber,
        language=opts.asr_language,
        max_duration_s=opts.max_media_s,
        timeout_s=opts.media_timeout_s,
    )
    return list(sections), dict(meta)


# --- converters (built once per process, on first use) -------------------------------------


@functools.cache
def _office_converter() -> DocumentConverter:
    """Docling for everything but PDF; PDF is left out so nothing can reach a model download."""
    from docling.datamodel.base_models import InputFormat
    from docling.document_converter import DocumentConverter

    formats = [
        InputFormat.MD,
        InputFormat.HTML,
        InputFormat.DOCX,
        InputFormat.PPTX,
        InputFormat.XLSX,
        InputFormat.CSV,
    ]
    return DocumentConverter(allowed_formats=formats)


@functools.cache
def _pdf_converter(artifacts_path: Path | None) -> DocumentConverter:
    """Docling for PDF: the native pipeline, or the standard one on local artifacts."""
    from docling.datamodel.base_models import InputFormat
    from docling.document_converter import DocumentConverter

    if artifacts_path is None:
        from docling.datamodel.pipeline_options import NativePdfPipelineOptions
        from docling.document_converter import NativePdfFormatOption

        native = NativePdfPipelineOptions(generate_page_images=False, generate_picture_images=False)
        option: Any = NativePdfFormatOption(pipeline_options=native)
    else:
        from docling.datamodel.pipeline_options import PdfPipelineOptions
        from docling.document_converter import PdfFormatOption

        # Docling's OCR needs more models; pages without a text layer go through ours instead.
        standard = PdfPipelineOptions(artifacts_path=artifacts_path, do_ocr=False)
        option = PdfFormatOption(pipeline_options=standard)
    converter = DocumentConverter(
        allowed_formats=[InputFormat.PDF], format_options={InputFormat.PDF: option}
    )
    if artifacts_path is not None:
        # Load the models now, so a bad folder is reported as such and not as a corrupt file.
        try:
            converter.initialize_pipeline(InputFormat.PDF)
        except Exception as exc:  # docling raises FileNotFoundError, RuntimeError, ...
            raise ConfigError(
                f"cannot load Docling's layout models from artifacts_path {artifacts_path}: "
                f"{_reason(exc)} — download them there (`docling-tools models download`) or "
                "leave artifacts_path unset to use the model-free PDF pipeline"
            ) from exc
    return converter


def _convert(
    path: Path, converter: DocumentConverter, *, shown: Path | None = None
) -> DoclingDocument:
    try:
        result = converter.convert(path, raises_on_error=True)
    except Exception as exc:  # any failure inside docling or its backends means "unreadable"
        raise _corrupt(shown or path, _reason(exc)) from exc
    return result.document


# --- plain text ------------------------------------------------------------------------------


def _txt_to_sections(path: Path) -> list[Section]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ExtractionError(
            f"cannot read {path.name}: {exc.strerror} — check the file's permissions"
        ) from exc
    encoding = "utf-16" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig"
    raw = data.decode(encoding, errors="replace")
    raw = raw.replace("\r\n", "\n").replace("\r", "\n")
    paragraphs = [p.strip() for p in re.split(r"\n[ \t]*\n", raw) if p.strip()]
    return [Section((), "\n\n".join(paragraphs))]


# --- PDF -------------------------------------------------------------------------------------


def _pdf_page_count(path: Path) -> int:
    """Open the PDF with pdfium first: docling reports encrypted and corrupt files alike."""
    pdf = open_pdf(path)
    try:
        return len(pdf)
    finally:
        pdf.close()


def _pdf_to_sections(
    path: Path, opts: ExtractOptions
) -> tuple[str | None, list[Section], dict[str, Any]]:
    """Text-layer pages through Docling, pages without a text layer through OCR."""
    pages = _pdf_page_count(path)
    if pages > opts.max_pdf_pages:
        raise ExtractionError(
            f"{path.name} has {pages:,} pages, over the limit of {opts.max_pdf_pages:,} — split "
            "it, or raise KBFLOW_MAX_PDF_PAGES"
        )
    with _named_as(path, "pdf") as readable:
        doc = _convert(readable, _pdf_converter(opts.artifacts_path), shown=path)
    meta: dict[str, Any] = {"pages": pages}
    title: str | None = None
    if opts.artifacts_path is not None:
        title, sections = _docling_to_sections(doc, unit="page")
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


# --- Docling document → sections -------------------------------------------------------------


class _SectionBuilder:
    """Collects text blocks under the current heading path and cuts a section at each heading."""

    def __init__(self) -> None:
        self.sections: list[Section] = []
        self._first_title: str | None = None
        self._first_heading: str | None = None
        self._stack: list[tuple[int, str]] = []  # (level, heading text); a title is level 0
        self._blocks: list[str] = []
        self._heading_is_bare = False  # the innermost heading has no text (yet)
        self._location: Location | None = None

    def locate(self, location: Location | None) -> None:
        """Later blocks come from ``location`` (a new page, slide or sheet cuts a section)."""
        if location is not None and location != self._location:
            self._flush()
            if location.slide is not None or location.sheet is not None:
                # A slide or sheet stands alone: it does not sit under the previous one's title.
                if self._heading_is_bare:
                    self.sections.append(Section(self._path(), self._stack[-1][1], self._location))
                    self._heading_is_bare = False
                self._stack = []
            if location.sheet is not None:
                # The sheet's name heads everything on it, below any title (level -1), so its
                # chunks carry it in their heading path. It never names the whole workbook, and
                # an empty sheet yields no section (its name alone is not content).
                self._stack = [(-1, location.sheet)]
            self._location = location

    def heading(self, level: int, text: str) -> None:
        self._flush()
        if self._heading_is_bare and level <= self._stack[-1][0]:
            # A heading with neither text nor sub-headings: keep its words searchable.
            self.sections.append(Section(self._path(), self._stack[-1][1], self._location))
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        self._stack.append((level, text))
        self._heading_is_bare = True
        if level == 0 and self._first_title is None:
            self._first_title = text
        if self._first_heading is None:
            self._first_heading = text

    @property
    def title(self) -> str | None:
        """The first title item; failing that, the first heading of any level."""
        return self._first_title or self._first_heading

    def block(self, text: str) -> None:
        if text.strip():
            self._blocks.append(text.strip())

    def finish(self) -> list[Section]:
        self._flush()
        if self._heading_is_bare:
            self.sections.append(Section(self._path(), self._stack[-1][1], self._location))
            self._heading_is_bare = False
        return self.sections

    def _path(self) -> tuple[str, ...]:
        return tuple(text for _level, text in self._stack)

    def _flush(self) -> None:
        if self._blocks:
            self.sections.append(Section(self._path(), "\n\n".join(self._blocks), self._location))
            self._blocks = []
            self._heading_is_bare = False


def _docling_to_sections(
    doc: DoclingDocument, *, unit: str | None = None
) -> tuple[str | None, list[Section]]:
    """Walk the document body in reading order, cutting a section at every title or heading.

    ``unit`` says what an item's page number means: ``"page"`` (PDF), ``"slide"`` (PPTX) or
    None (no pages). Spreadsheet sheets are found from their groups.
    """
    builder = _SectionBuilder()
    _walk(doc, doc.body, builder, unit)
    return builder.title, builder.finish()


def _walk(doc: DoclingDocument, node: NodeItem, builder: _SectionBuilder, unit: str | None) -> None:
    from docling_core.types.doc import (
        ContentLayer,
        DocItemLabel,
        GroupLabel,
        ListItem,
        PictureItem,
        SectionHeaderItem,
        TableItem,
        TextItem,
        TitleItem,
    )

    for ref in node.children:
        child = ref.resolve(doc)
        if getattr(child, "content_layer", ContentLayer.BODY) != ContentLayer.BODY:
            continue
        builder.locate(_location_of(child, unit))
        if isinstance(child, TitleItem):
            if child.text.strip():
                builder.heading(0, child.text.strip())
        elif isinstance(child, SectionHeaderItem):
            if child.text.strip():
                builder.heading(max(child.level, 1), child.text.strip())
        elif _is_group(child, GroupLabel.LIST, GroupLabel.ORDERED_LIST) or isinstance(
            child, ListItem
        ):
            builder.block("\n".join(_list_lines(doc, child, depth=0)))
            continue  # _list_lines has consumed the children
        elif _is_group(child, GroupLabel.INLINE):
            builder.block(_inline_text(doc, child))
            continue
        elif isinstance(child, TableItem):
            builder.block(child.export_to_markdown(doc=doc))  # then its caption, if a child
        elif isinstance(child, PictureItem):
            # Text drawn inside a picture is noise without layout; keep only its captions, and
            # a chart's data series (Docling reads them from XLSX, PPTX and DOCX charts).
            for ref_in in child.children:
                inner = ref_in.resolve(doc)
                if getattr(inner, "label", None) in (DocItemLabel.CAPTION, DocItemLabel.FOOTNOTE):
                    builder.block(getattr(inner, "text", ""))
            for block in _chart_blocks(child):
                builder.block(block)
            continue
        elif isinstance(child, TextItem):
            builder.block(child.text)
        _walk(doc, child, builder, unit)


def _chart_blocks(picture: PictureItem) -> list[str]:
    """A chart's data as a label ("Bar chart data: Sales") and a Markdown table, if it has any.

    The table has one column per series (named in the header row) and one row per category.
    """
    from docling_core.types.doc import DoclingDocument

    meta = picture.meta
    chart = meta.tabular_chart if meta is not None else None
    if chart is None or not chart.chart_data.table_cells:
        return []
    scratch = DoclingDocument(name="chart")
    table = scratch.add_table(data=chart.chart_data).export_to_markdown(doc=scratch).strip()
    if not table:
        return []
    kind = "chart"
    if meta is not None and meta.classification is not None and meta.classification.predictions:
        kind = meta.classification.get_main_prediction().class_name.replace("_", " ")
        if not kind.endswith("chart"):
            kind += " chart"
    label = f"{kind[0].upper()}{kind[1:]} data" + (f": {chart.title}" if chart.title else "")
    return [label, table]


def _location_of(item: NodeItem, unit: str | None) -> Location | None:
    """The page, slide or sheet an item sits on, if the format has such units."""
    from docling_core.types.doc import GroupItem

    if isinstance(item, GroupItem) and item.label == "sheet":
        return Location(sheet=item.name)
    prov = getattr(item, "prov", None)
    if unit is None or not prov:
        return None
    return Location(page=prov[0].page_no) if unit == "page" else Location(slide=prov[0].page_no)


def _list_lines(doc: DoclingDocument, node: NodeItem, depth: int, number: int = 1) -> list[str]:
    """Render a list (group or single item) as "- item" / "1. item" lines, nested by indent."""
    from docling_core.types.doc import GroupLabel, ListItem

    if isinstance(node, ListItem):
        own = node.text.strip()
        nested: list[str] = []
        for ref in node.children:
            child = ref.resolve(doc)
            if _is_group(child, GroupLabel.INLINE):
                own = (own + " " + _inline_text(doc, child)).strip()
            else:
                nested.extend(_list_lines(doc, child, depth + 1))
        marker = (node.marker.strip() or f"{number}.") if node.enumerated else "-"
        head = [f"{'  ' * depth}{marker} {own}"] if own else []
        return head + nested
    if _is_group(node, GroupLabel.LIST, GroupLabel.ORDERED_LIST):
        lines: list[str] = []
        for number, ref in enumerate(node.children, start=1):
            lines.extend(_list_lines(doc, ref.resolve(doc), depth, number))
        return lines
    text = getattr(node, "text", "") or _inline_text(doc, node)
    return [f"{'  ' * depth}{text.strip()}"] if text.strip() else []


def _is_group(node: NodeItem, *labels: Any) -> bool:
    from docling_core.types.doc import GroupItem

    return isinstance(node, GroupItem) and node.label in labels


def _inline_text(doc: DoclingDocument, node: NodeItem) -> str:
    """Join the pieces of an inline group (text split by bold, links, code spans)."""
    parts: list[str] = []
    for ref in node.children:
        child = ref.resolve(doc)
        text = getattr(child, "text", "")
        parts.append(text.strip() if text else _inline_text(doc, child))
    return " ".join(p for p in parts if p)


# --- errors ----------------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    """A short, single-line reason from a parser exception (hashes elided, length capped)."""
    lines = str(exc).strip().splitlines()
    message = _HASH_RE.sub("…", lines[0] if lines else "")
    if len(message) > 160:
        message = message[:157] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _corrupt(path: Path, reason: str) -> ExtractionError:
    return ExtractionError(
        f"docling could not read {path.name} (sha {sha12(path)}): {reason} — the file looks "
        f"corrupt; {_CORRUPT_ADVICE}"
    )
