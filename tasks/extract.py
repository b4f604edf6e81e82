"""Turn one source file into an `ExtractedDocument`: its text, split into sections under headings.

Docling converts Markdown, HTML, Office files and CSV. Text-layer PDFs go through Docling's
model-free native pipeline, which yields one item per printed line; the lines are re-joined here
into paragraphs from their positions on the page. When local layout-model artifacts are supplied,
PDFs use Docling's standard pipeline instead (headings and tables, no OCR). Plain text is read
directly. Nothing here touches the network, and Docling is imported and set up only on first use.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kbflow.errors import ConfigError, ExtractionError, UnsupportedFormat
from kbflow.models import ExtractedDocument, Section

if TYPE_CHECKING:
    from docling.document_converter import DocumentConverter
    from docling_core.types.doc import DoclingDocument, NodeItem

logger = logging.getLogger(__name__)

SUPPORTED_SUFFIXES: frozenset[str] = frozenset(
    {".md", ".markdown", ".html", ".htm", ".docx", ".pptx", ".xlsx", ".csv", ".pdf", ".txt"}
)
DEFAULT_MAX_BYTES = 50 * 1024 * 1024

_CORRUPT_ADVICE = (
    "check that it opens in its own application; if it does, re-export or re-save it and ingest "
    "the new copy"
)
# Line starts that open a new list item in PDF text (bullet glyphs, "1.", "(a)", "iv)").
_BULLET_RE = re.compile(r"^\s*(?:[•◦▪▫●○■□‣⁃∞∙·\-–—*]\s|\(?(?:\d{1,3}|[a-z]|[ivx]{1,4})[.)]\s)")
_HASH_RE = re.compile(r"\b[0-9a-f]{64}\b")


def file_to_document(
    path: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    artifacts_path: Path | None = None,
) -> ExtractedDocument:
    """Extract the text of one file, keeping the headings each run of text sits under.

    Args:
        path: The file to read. Its suffix picks the extractor (see `SUPPORTED_SUFFIXES`).
        max_bytes: Files larger than this are refused before anything is parsed.
        artifacts_path: A folder holding Docling's layout models. When given, PDFs use Docling's
            standard pipeline (better headings and tables); otherwise the model-free native one.

    Returns:
        The document: title (first title or heading, else the file stem), `file://` URI,
        sections (heading path and text; tables as Markdown, list items as "- item"),
        source format (the suffix without its dot) and meta (e.g. ``{"pages": 4}`` for a PDF).

    Raises:
        UnsupportedFormat: The suffix is not one of `SUPPORTED_SUFFIXES`.
        ExtractionError: The file is missing, too large, empty, encrypted, corrupt, a scanned
            PDF without a text layer, or yields no text at all.
        ConfigError: `artifacts_path` does not hold Docling's layout models.
    """
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

    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise UnsupportedFormat(
            f"{path.name}: format {suffix or '(no suffix)'!r} is not supported — convert it to "
            f"one of {', '.join(sorted(SUPPORTED_SUFFIXES))}"
        )
    if size > max_bytes:
        raise ExtractionError(
            f"{path.name} is {size:,} bytes ({size / 2**20:.1f} MiB), over the limit of "
            f"{max_bytes:,} bytes ({max_bytes / 2**20:.1f} MiB) — raise KBFLOW_MAX_FILE_MB "
            "or split the file"
        )
    if size == 0:
        raise ExtractionError(f"{path.name} is empty (0 bytes) — nothing to extract; remove it")

    started = time.perf_counter()
    if suffix == ".txt":
        title, sections, meta = _txt_to_sections(path)
    elif suffix == ".pdf" and artifacts_path is not None:
        title, sections, meta = _standard_pdf_to_sections(path, Path(artifacts_path))
    elif suffix == ".pdf":
        title, sections, meta = _native_pdf_to_sections(path)
    else:
        doc = _convert(path, _office_converter())
        title, sections = _docling_to_sections(doc)
        meta = {"pages": len(doc.pages)} if doc.pages else {}

    if not any(s.text.strip() for s in sections):
        raise ExtractionError(
            f"{path.name} (sha {_sha12(path)}) contains no extractable text — check that the "
            "file is not blank or image-only"
        )
    logger.info(
        "extracted %s: format=%s sections=%d chars=%d in %.2fs",
        path.name,
        suffix[1:],
        len(sections),
        sum(len(s.text) for s in sections),
        time.perf_counter() - started,
    )
    return ExtractedDocument(
        title=title or path.stem,
        uri=path.resolve().as_uri(),
        sections=tuple(sections),
        source_format=suffix[1:],
        meta=meta,
    )


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

        # OCR is off on purpose: it needs more models, and scanned files get a clear error.
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


def _convert(path: Path, converter: DocumentConverter) -> DoclingDocument:
    try:
        result = converter.convert(path, raises_on_error=True)
    except Exception as exc:  # any failure inside docling or its backends means "unreadable"
        raise _corrupt(path, _reason(exc)) from exc
    return result.document


# --- plain text ------------------------------------------------------------------------------


def _txt_to_sections(path: Path) -> tuple[str | None, list[Section], dict[str, Any]]:
    try:
        raw = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ExtractionError(
            f"cannot read {path.name}: {exc.strerror} — check the file's permissions"
        ) from exc
    raw = raw.replace("\r\n", "\n").replace("\r", "\n")
    paragraphs = [p.strip() for p in re.split(r"\n[ \t]*\n", raw) if p.strip()]
    return None, [Section((), "\n\n".join(paragraphs))], {}


# --- PDF -------------------------------------------------------------------------------------


def _pdf_page_count(path: Path) -> int:
    """Open the PDF with pdfium first: docling reports encrypted and corrupt files alike."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    try:
        pdf = pdfium.PdfDocument(path)
    except pdfium.PdfiumError as exc:
        if getattr(exc, "err_code", None) == pdfium_c.FPDF_ERR_PASSWORD:
            raise ExtractionError(
                f"cannot read {path.name} (sha {_sha12(path)}): file is encrypted — supply an "
                "unlocked copy"
            ) from exc
        raise _corrupt(path, _reason(exc)) from exc
    try:
        return len(pdf)
    finally:
        pdf.close()


def _no_text(path: Path, pages: int, doc: DoclingDocument) -> ExtractionError:
    """The error for a PDF without text: scanned if it holds images, else blank."""
    from docling_core.types.doc import PictureItem

    if any(isinstance(item, PictureItem) for item, _level in doc.iterate_items()):
        return ExtractionError(
            f"{path.name} (sha {_sha12(path)}) has no text layer on any of its {pages} page(s): "
            "it looks scanned, and OCR support is not enabled yet — supply a PDF with a text "
            "layer (e.g. run it through OCR first)"
        )
    return ExtractionError(
        f"{path.name} (sha {_sha12(path)}) has neither text nor images on its {pages} page(s) "
        "— it looks blank; check the export and supply a copy with content"
    )


def _standard_pdf_to_sections(
    path: Path, artifacts_path: Path
) -> tuple[str | None, list[Section], dict[str, Any]]:
    pages = _pdf_page_count(path)
    doc = _convert(path, _pdf_converter(artifacts_path))
    title, sections = _docling_to_sections(doc)
    if not sections:
        raise _no_text(path, pages, doc)
    return title, sections, {"pages": pages, "pdf_pipeline": "standard"}


@dataclass(frozen=True)
class _Line:
    """One printed line of a PDF page, in top-left coordinates (y grows downwards)."""

    page: int
    left: float
    top: float
    right: float
    bottom: float
    text: str

    @property
    def height(self) -> float:
        return self.bottom - self.top


def _native_pdf_to_sections(path: Path) -> tuple[str | None, list[Section], dict[str, Any]]:
    pages = _pdf_page_count(path)
    doc = _convert(path, _pdf_converter(None))
    lines = list(_pdf_lines(doc))
    if not lines:
        raise _no_text(path, pages, doc)
    meta: dict[str, Any] = {"pages": pages, "pdf_pipeline": "native"}
    empty_pages = sorted(set(range(1, pages + 1)) - {line.page for line in lines})
    if empty_pages:
        # Usually scanned pages inside an otherwise digital PDF; their text is missing.
        logger.warning(
            "%s: %d of %d pages have no text layer (pages %s)",
            path.name,
            len(empty_pages),
            pages,
            empty_pages[:20],
        )
        meta["pages_without_text"] = empty_pages
    paragraphs = _lines_to_paragraphs(lines)
    return None, [Section((), "\n\n".join(paragraphs))], meta


def _pdf_lines(doc: DoclingDocument) -> Iterator[_Line]:
    from docling_core.types.doc import TextItem

    for item, _level in doc.iterate_items():
        if not isinstance(item, TextItem) or not item.text.strip() or not item.prov:
            continue
        prov = item.prov[0]
        height = doc.pages[prov.page_no].size.height
        box = prov.bbox.to_top_left_origin(page_height=height)
        yield _Line(prov.page_no, box.l, box.t, box.r, box.b, " ".join(item.text.split()))


def _lines_to_paragraphs(lines: list[_Line]) -> list[str]:
    """Re-join the native pipeline's one-item-per-line output into paragraphs.

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

    paragraphs: list[str] = []
    current = lines[0].text
    for prev, cur in itertools.pairwise(lines):
        if _same_row(prev, cur):
            current += " " + cur.text
        elif _starts_paragraph(prev, cur, usual_gap, line_height):
            paragraphs.append(current)
            current = cur.text
        else:
            current = _join_wrapped(current, cur.text)
    paragraphs.append(current)
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


def _join_wrapped(text: str, continuation: str) -> str:
    """Join a wrapped line, undoing end-of-line hyphenation ("docu-" + "ment")."""
    if len(text) > 1 and text.endswith("-") and text[-2].isalpha() and continuation[:1].islower():
        return text[:-1] + continuation
    return text + " " + continuation


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

    def heading(self, level: int, text: str) -> None:
        self._flush()
        if self._heading_is_bare and level <= self._stack[-1][0]:
            # A heading with neither text nor sub-headings: keep its words searchable.
            self.sections.append(Section(self._path(), self._stack[-1][1]))
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
            self.sections.append(Section(self._path(), self._stack[-1][1]))
            self._heading_is_bare = False
        return self.sections

    def _path(self) -> tuple[str, ...]:
        return tuple(text for _level, text in self._stack)

    def _flush(self) -> None:
        if self._blocks:
            self.sections.append(Section(self._path(), "\n\n".join(self._blocks)))
            self._blocks = []
            self._heading_is_bare = False


def _docling_to_sections(doc: DoclingDocument) -> tuple[str | None, list[Section]]:
    """Walk the document body in reading order, cutting a section at every title or heading."""
    builder = _SectionBuilder()
    _walk(doc, doc.body, builder)
    return builder.title, builder.finish()


def _walk(doc: DoclingDocument, node: NodeItem, builder: _SectionBuilder) -> None:
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
            # Text drawn inside a picture is noise without layout; keep only its captions.
            for ref_in in child.children:
                inner = ref_in.resolve(doc)
                if getattr(inner, "label", None) in (DocItemLabel.CAPTION, DocItemLabel.FOOTNOTE):
                    builder.block(getattr(inner, "text", ""))
            continue
        elif isinstance(child, TextItem):
            builder.block(child.text)
        _walk(doc, child, builder)


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


def _sha12(path: Path) -> str:
    """The first 12 hex digits of the file's SHA-256, to tell copies of a bad file apart."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return "unreadable"
    return digest.hexdigest()[:12]


def _reason(exc: BaseException) -> str:
    """A short, single-line reason from a parser exception (hashes elided, length capped)."""
    lines = str(exc).strip().splitlines()
    message = _HASH_RE.sub("…", lines[0] if lines else "")
    if len(message) > 160:
        message = message[:157] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _corrupt(path: Path, reason: str) -> ExtractionError:
    return ExtractionError(
        f"docling could not read {path.name} (sha {_sha12(path)}): {reason} — the file looks "
        f"corrupt; {_CORRUPT_ADVICE}"
    )
