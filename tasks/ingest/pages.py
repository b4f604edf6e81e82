"""What PDF text and OCR share: text boxes on a page, re-joining wrapped lines, opening PDFs."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ExtractionError
from tasks.ingest.discover import file_sha256

# A line ending in a hyphen (or soft hyphen) right after a letter: "docu-".
_HYPHEN_END_RE = re.compile(r"(?<=[^\W\d_])[-\u00ad]$")


@dataclass(frozen=True)
class Box:
    """A run of text on a page, in top-left coordinates (y grows downwards)."""

    left: float
    top: float
    right: float
    bottom: float
    text: str

    @property
    def height(self) -> float:
        return self.bottom - self.top


def join_wrapped(text: str, continuation: str) -> str:
    """Join a wrapped line to the text before it, undoing end-of-line hyphenation
    ("docu-" + "ment") when the continuation starts lower-case."""
    if not text:
        return continuation
    if _HYPHEN_END_RE.search(text) and continuation[:1].islower():
        return text[:-1] + continuation
    return f"{text} {continuation}"


def sha12(path: Path, data: bytes | None = None) -> str:
    """The first 12 hex digits of the file's SHA-256, to tell copies of a bad file apart
    (``data``: its bytes, held in memory)."""
    if data is not None:
        return hashlib.sha256(data).hexdigest()[:12]
    try:
        return file_sha256(path)[:12]
    except OSError:
        return "unreadable"


def open_pdf(path: Path) -> Any:
    """Open a PDF with pdfium; an encrypted or unreadable file is an `ExtractionError`."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    try:
        return pdfium.PdfDocument(path)
    except FileNotFoundError as exc:
        raise ExtractionError(f"{path} does not exist — check the path and try again") from exc
    except pdfium.PdfiumError as exc:
        if getattr(exc, "err_code", None) == pdfium_c.FPDF_ERR_PASSWORD:
            raise ExtractionError(
                f"cannot read {path.name} (sha {sha12(path)}): file is encrypted — supply an "
                "unlocked copy"
            ) from exc
        raise ExtractionError(
            f"cannot read {path.name} (sha {sha12(path)}): {exc} — the file looks corrupt; "
            "check that it opens in a PDF viewer, and re-export it if not"
        ) from exc
