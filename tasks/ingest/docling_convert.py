"""Running Docling: its converters (built once per process, on first use), the file under a name
Docling accepts, and a failed conversion reported as a corrupt file."""

from __future__ import annotations

import contextlib
import functools
import io
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, ExtractionError
from tasks.ingest.pages import sha12

if TYPE_CHECKING:
    from docling.document_converter import DocumentConverter
    from docling_core.types.doc import DoclingDocument


_CORRUPT_ADVICE = (
    "check that it opens in its own application; if it does, re-export or re-save it and ingest "
    "the new copy"
)


_HASH_RE = re.compile(r"\b[0-9a-f]{64}\b")


@contextlib.contextmanager
def named_as(path: Path, fmt: str) -> Iterator[Path]:
    """The file under a name whose suffix matches its real format (Docling goes by suffix)."""
    name = _named(path, fmt)
    if name == path.name:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="kbflow-named-") as tmp:
        alias = Path(tmp) / name
        alias.symlink_to(path.resolve())
        yield alias


def _named(path: Path, fmt: str) -> str:
    """``path``'s name if its suffix is ``fmt``'s, else its stem with that suffix."""
    wanted = {"md": {".md", ".markdown"}, "html": {".html", ".htm"}}.get(fmt, {f".{fmt}"})
    return path.name if path.suffix.lower() in wanted else f"{path.stem or 'file'}.{fmt}"


# --- converters (built once per process, on first use) -------------------------------------


@functools.cache
def office_converter() -> DocumentConverter:
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
def pdf_converter(artifacts_path: Path | None) -> DocumentConverter:
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


def convert(
    path: Path, converter: DocumentConverter, *, shown: Path | None = None
) -> DoclingDocument:
    try:
        result = converter.convert(path, raises_on_error=True)
    except Exception as exc:  # any failure inside docling or its backends means "unreadable"
        raise _corrupt(shown or path, _reason(exc)) from exc
    return result.document


def convert_data(
    path: Path, fmt: str, data: bytes, converter: DocumentConverter
) -> DoclingDocument:
    """`convert` for a file's bytes held in memory (``path`` names it), read as ``fmt``: the
    document Docling makes of the file itself (it reads a stream as it reads a path)."""
    from docling.datamodel.base_models import DocumentStream

    stream = DocumentStream(name=_named(path, fmt), stream=io.BytesIO(data))
    try:
        result = converter.convert(stream, raises_on_error=True)
    except Exception as exc:  # as `convert`: any failure inside docling means "unreadable"
        raise _corrupt(path, _reason(exc), data) from exc
    return result.document


# --- errors ----------------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    """A short, single-line reason from a parser exception (hashes elided, length capped)."""
    lines = str(exc).strip().splitlines()
    message = _HASH_RE.sub("…", lines[0] if lines else "")
    if len(message) > 160:
        message = message[:157] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _corrupt(path: Path, reason: str, data: bytes | None = None) -> ExtractionError:
    return ExtractionError(
        f"docling could not read {path.name} (sha {sha12(path, data)}): {reason} — the file looks "
        f"corrupt; {_CORRUPT_ADVICE}"
    )
