"""Turn one source file into an `ExtractedDocument`: its text, in sections that keep their
headings and where each passage came from (page, slide, sheet or time range).

The format comes from the file's bytes (`tasks.ingest.sniff`), never from its name alone. Docling
converts Markdown, HTML, Office files and CSV (`tasks.ingest.docling_convert`, then
`tasks.ingest.docling_sections`); OOXML passes a zip-bomb check first. PDFs have their own path
(`tasks.ingest.pdf`): text layers through Docling, pages without one through OCR. Images are
OCRed (`tasks.ingest.ocr`); audio and video are transcribed (`tasks.ingest.media`). Plain text is
read directly. The limits and engines are `tasks.ingest.extract_options.ExtractOptions`. Nothing
here touches the network, and every heavy library is imported on first use. Run it through
`tasks.ingest.isolate.ExtractionPool` to get hard time and memory limits per file.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from pathlib import Path
from typing import Any

from core.errors import ExtractionError, KbflowError, UnsupportedFormat
from core.models import ExtractedDocument, Section
from tasks.ingest.bullets import sections_bullets_to_markdown
from tasks.ingest.docling_convert import convert, convert_data, named_as, office_converter
from tasks.ingest.docling_sections import docling_to_sections
from tasks.ingest.extract_options import ExtractOptions
from tasks.ingest.media import AUDIO_FORMATS, VIDEO_FORMATS
from tasks.ingest.pages import sha12
from tasks.ingest.pdf import pdf_to_sections
from tasks.ingest.titles import document_title, metadata_title

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


def reads_in_memory(name: str, data: bytes) -> bool:
    """Whether `file_to_document` reads a file's bytes from memory (``data=``): a text format
    (Markdown, HTML, CSV, plain text), which gives the same document as the file named
    ``name``. Any other is read from a file (its parsers open a path), and so are bytes the
    sniffing refuses (the file's extraction then says why)."""
    from tasks.ingest.sniff import TEXT_FORMATS, detect_format

    try:
        return detect_format(Path(name), data).format in TEXT_FORMATS
    except KbflowError:
        return False


def file_to_document(
    path: Path,
    options: ExtractOptions | None = None,
    *,
    data: bytes | None = None,
    **overrides: Any,
) -> ExtractedDocument:
    """Extract the text of one file, keeping headings and where each passage came from.

    Args:
        path: The file to read. Its bytes decide the format; a name that disagrees is noted in
            ``meta["declared_format"]`` and otherwise ignored.
        options: Limits and engines (see `ExtractOptions`); defaults when omitted.
        data: The file's bytes, held in memory (a text format: `reads_in_memory`): read instead
            of ``path``, which then only names the file (its format's suffix, the title's
            fallback) and is the document's URI until its caller cites it.
        overrides: Individual `ExtractOptions` fields, e.g. ``max_bytes=100``.

    Returns:
        The document: title (`document_title`: the file's metadata title, else its first title
        or heading, else the file stem), `file://` URI, sections (heading path, text, location;
        tables as Markdown, list items as "- item", a bullet glyph opening a line as "- ":
        `tasks.ingest.bullets`),
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
    size = _file_size(path) if data is None else len(data)
    if size > opts.max_bytes:
        raise ExtractionError(
            f"{path.name} is {size:,} bytes ({size / 2**20:.1f} MiB), over the limit of "
            f"{opts.max_bytes:,} bytes ({opts.max_bytes / 2**20:.1f} MiB) — raise "
            "KBFLOW_MAX_FILE_MB or split the file"
        )
    if size == 0:
        raise ExtractionError(f"{path.name} is empty (0 bytes) — nothing to extract; remove it")

    detected = detect_format(path, data)
    fmt = detected.format
    if data is not None and fmt not in TEXT_FORMATS:
        raise UnsupportedFormat(
            f"{path.name} holds {fmt}, which kbflow reads from a file, not from memory — write "
            "it to a file and ingest that"
        )
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
    heading: str | None = None  # the first title or heading, where the format has them
    if fmt == "txt":
        sections = _txt_to_sections(path, data)
    elif fmt == "pdf":
        heading, sections, found = pdf_to_sections(path, opts)
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
        if data is not None:
            doc = convert_data(path, fmt, data, office_converter())
        else:
            with named_as(path, fmt) as readable:
                doc = convert(readable, office_converter(), shown=path)
        heading, sections = docling_to_sections(doc, unit="slide" if fmt == "pptx" else None)
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
            f"{path.name} (sha {sha12(path, data)}) contains no extractable text — check that the "
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
        title=document_title(path, metadata=metadata_title(path, fmt, data), heading=heading),
        uri=path.resolve().as_uri() if data is None else path.name,
        sections=tuple(s for s in sections_bullets_to_markdown(sections) if s.text.strip()),
        source_format=fmt,
        meta=meta,
    )


def _file_size(path: Path) -> int:
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
    return size


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
        opts.asr_engine,
        opts.whisper_model,
        download_root=opts.whisper_dir,
        model_dir=opts.asr_model_dir,
    )
    sections, meta = transcribe_media(
        path,
        transcriber=transcriber,
        language=opts.asr_language,
        max_duration_s=opts.max_media_s,
        timeout_s=opts.media_timeout_s,
    )
    meta = dict(meta)
    if sections:
        reason = low_confidence_reason(meta, opts.asr_min_confidence)
        if reason:
            meta["review_reason"] = reason
    return list(sections), meta


def low_confidence_reason(meta: dict[str, Any], threshold: float) -> str | None:
    """Why a transcript must be reviewed before it is served, or None when it may be.

    Args:
        meta: `transcribe_media`'s meta (``engine``, ``confidence``).
        threshold: KBFLOW_ASR_MIN_CONFIDENCE; a confidence below it, or none at all (an engine
            that cannot say, like pocketsphinx), needs review. 0 turns the rule off.
    """
    if threshold <= 0:
        return None
    confidence = meta.get("confidence")
    engine = meta.get("engine", "the speech engine")
    if confidence is None:
        return (
            f"speech transcribed by {engine}, which gives no confidence: check the transcript "
            "before approving it"
        )
    if confidence < threshold:
        return (
            f"speech transcribed by {engine} with confidence {confidence:.2f}, below "
            f"KBFLOW_ASR_MIN_CONFIDENCE={threshold:g}: check the transcript before approving it"
        )
    return None


# --- plain text ------------------------------------------------------------------------------


def _txt_to_sections(path: Path, data: bytes | None = None) -> list[Section]:
    if data is None:
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
