"""What extraction needs to know: size caps, the engines for OCR and speech, and their limits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.settings import Settings


DEFAULT_MAX_BYTES = 50 * 1024 * 1024


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
    asr_min_confidence: float = 0.35
    asr_model_dir: Path | None = None
    max_media_s: float = 4 * 3600.0
    media_timeout_s: float = 3600.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ExtractOptions:
        """The extraction group's values (same names where units match), the ingest file cap,
        and the speech model folders under ``<home>``."""
        ex = settings.extraction
        return cls(
            **ex.model_dump(include=_SAME_NAMES),
            max_bytes=int(settings.ingest.max_file_mb * 1024 * 1024),
            artifacts_path=ex.docling_artifacts_path,
            max_image_pixels=int(ex.max_image_megapixels * 1_000_000),
            ocr_timeout_s=min(ex.extract_timeout_s, 600.0),
            zip_max_total_bytes=int(ex.zip_max_total_mb * 1024 * 1024),
            whisper_dir=settings.whisper_dir.resolve(),
            asr_model_dir=settings.asr_model_dir.resolve(),
            max_media_s=ex.max_media_minutes * 60,
        )


_SAME_NAMES = {
    "max_pdf_pages",
    "ocr_engine",
    "ocr_language",
    "ocr_dpi",
    "zip_max_ratio",
    "zip_max_entries",
    "asr_engine",
    "whisper_model",
    "asr_language",
    "asr_min_confidence",
    "media_timeout_s",
}
"""The options that are an extraction setting of the same name and unit."""
