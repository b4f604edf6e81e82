# Over 500 lines: two OCR engines behind one interface and the rendering and limits they share.
"""OCR for images and for PDF pages that have no text layer.

Two engines: Tesseract (the Debian ``tesseract`` CLI, run as a subprocess with a time limit) and
RapidOCR (PyPI ``rapidocr`` on onnxruntime, with its models in the wheel, run in-process). Both
return plain text: paragraphs separated by a blank line, wrapped lines re-joined, end-of-line
hyphenation undone. Every image's size is checked from its header before any pixel is decoded,
and PDF pages are rendered no larger than the same pixel cap.

One module on purpose: both engines share the pixel caps and the paragraph rebuilding.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import logging
import math
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, ExtractionError
from core.models import Location, Section
from tasks.ingest.pages import Box, join_wrapped, open_pdf

if TYPE_CHECKING:
    from PIL import Image

logger = logging.getLogger(__name__)

OCR_ENGINES = ("tesseract", "rapidocr")

_INSTALL_TESSERACT = (
    "apt-get install tesseract-ocr tesseract-ocr-eng, or `make system-deps`, "
    "or set KBFLOW_OCR_ENGINE=rapidocr"
)
# Tesseract reads best at 20-30 px per x-height; page images smaller than this on their long
# side (a 72-dpi scan, a screenshot) are enlarged first. On a 612x792 scan, 2x took the share
# of RapidOCR's words that Tesseract also found from 0.24 to 0.91.
_TESSERACT_MIN_LONG_SIDE = 1600
_TESSERACT_MAX_UPSCALE = 4.0
# RapidOCR's bundled PP-OCR model reads Chinese and English (Latin script) only.
_RAPIDOCR_LANGUAGES = {"eng", "chi_sim"}
# PIL's own bomb check is off only while this module reads a header (see _pil_bomb_check_off).
_PIL_CHECK_LOCK = threading.Lock()


def ensure_ocr_engine(engine: str) -> None:
    """Fail early, with the fix, when an OCR engine cannot run here.

    Args:
        engine: One of `OCR_ENGINES`.

    Raises:
        ConfigError: The engine is unknown, or it is not installed.
    """
    if engine not in OCR_ENGINES:
        raise ConfigError(
            f"unknown OCR engine {engine!r} — set KBFLOW_OCR_ENGINE to one of "
            f"{', '.join(OCR_ENGINES)}"
        )
    if engine == "tesseract" and shutil.which("tesseract") is None:
        raise ConfigError(f"OCR engine 'tesseract' is not on PATH — {_INSTALL_TESSERACT}")
    if engine == "rapidocr":
        missing = [m for m in ("rapidocr", "onnxruntime") if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(
                f"OCR engine 'rapidocr' needs the Python package(s) {', '.join(missing)}, which "
                "are not installed — pip install rapidocr onnxruntime, or set "
                "KBFLOW_OCR_ENGINE=tesseract"
            )


def check_image(path: Path, *, max_pixels: int) -> tuple[int, int, int]:
    """Read an image's size from its header, and refuse one too large to decode safely.

    No pixel data is decoded: PIL opens files lazily. Each frame of a multi-frame file (a
    multi-page TIFF) is checked on its own.

    Args:
        path: The image file.
        max_pixels: Largest width x height allowed for any one frame
            (``KBFLOW_MAX_IMAGE_MEGAPIXELS`` x 1,000,000).

    Returns:
        (width, height, frames): the first frame's size and the number of frames.

    Raises:
        ExtractionError: The file is not an image PIL can identify, is corrupt, or a frame is
            over `max_pixels`.
    """
    path = Path(path)
    with _open_image(path) as image:
        frames = int(getattr(image, "n_frames", 1))
        first = image.size
        for index in range(frames):
            if index:
                _seek(path, image, index)
            _check_size(path, image.size, max_pixels, frame=index + 1 if frames > 1 else None)
    return first[0], first[1], frames


def ocr_image(
    image: Image.Image, *, engine: str, language: str = "eng", timeout_s: float = 120.0
) -> str:
    """Read the text in one image.

    Args:
        image: The image, in any mode; it is converted (and, for Tesseract, enlarged when small)
            on a copy.
        engine: ``tesseract`` or ``rapidocr``.
        language: Tesseract language code(s), e.g. ``eng`` or ``eng+deu``. RapidOCR's bundled
            model covers ``eng`` and ``chi_sim`` only.
        timeout_s: Time limit for Tesseract; RapidOCR runs in-process and cannot be stopped
            (the extraction worker's own time limit covers it).

    Returns:
        The text: paragraphs separated by a blank line, lines within a paragraph joined with
        spaces, end-of-line hyphenation undone. ``""`` when the image holds no text.

    Raises:
        ConfigError: Unknown engine, engine not installed, or language not available.
        ExtractionError: Tesseract failed or ran past `timeout_s`.
    """
    ensure_ocr_engine(engine)
    if engine == "tesseract":
        return _paragraphs_to_text(_tesseract_paragraphs(image, language, timeout_s))
    return _paragraphs_to_text(_rapidocr_paragraphs(image, language))


def ocr_image_file(
    path: Path,
    *,
    engine: str,
    language: str = "eng",
    max_pixels: int,
    max_frames: int = 500,
    timeout_s: float = 120.0,
) -> list[Section]:
    """OCR an image file; each frame of a multi-frame TIFF is a page.

    Args:
        path: A PNG, JPEG, TIFF, WebP (or other PIL-readable) image.
        engine: ``tesseract`` or ``rapidocr``.
        language: OCR language (see `ocr_image`).
        max_pixels: Largest frame allowed, in pixels (see `check_image`).
        max_frames: Most frames (pages) allowed in one file.
        timeout_s: Time limit per frame (see `ocr_image`).

    Returns:
        One section per frame that holds text: ``Section((), text, Location(page=i))``, i from 1.

    Raises:
        ConfigError: See `ocr_image`.
        ExtractionError: The image is too large, has too many frames, is corrupt or truncated,
            or OCR failed on a frame.
    """
    from PIL import ImageOps

    path = Path(path)
    ensure_ocr_engine(engine)
    _width, _height, frames = check_image(path, max_pixels=max_pixels)
    if frames > max_frames:
        raise ExtractionError(
            f"{path.name} has {frames:,} frames (pages), over the limit of {max_frames:,} — "
            "split it into smaller files"
        )
    sections: list[Section] = []
    with _open_image(path) as image:
        for index in range(frames):
            if index:
                _seek(path, image, index)
            started = time.perf_counter()
            try:
                # Decodes this frame only; a phone photo's EXIF rotation is applied so text is
                # upright for the OCR engine.
                frame = ImageOps.exif_transpose(image.copy())
            except (OSError, ValueError) as exc:
                raise ExtractionError(
                    f"cannot decode {path.name}{_frame_label(index, frames)}: {exc} — the file "
                    "is corrupt or truncated; re-export or re-scan it"
                ) from exc
            page = index + 1 if frames > 1 else None
            text = _ocr_page(path, page, frame, engine, language, timeout_s)
            logger.info(
                "ocr %s%s: engine=%s %dx%d chars=%d in %.2fs",
                path.name,
                _frame_label(index, frames),
                engine,
                frame.width,
                frame.height,
                len(text),
                time.perf_counter() - started,
            )
            if text.strip():
                sections.append(Section((), text, Location(page=index + 1)))
    return sections


def ocr_pdf_pages(
    path: Path,
    pages: Sequence[int],
    *,
    engine: str,
    language: str = "eng",
    dpi: int = 200,
    max_pixels: int,
    timeout_s: float = 120.0,
) -> dict[int, str]:
    """OCR some pages of a PDF (those without a text layer), rendered with pdfium.

    A page whose bitmap at `dpi` would exceed `max_pixels` is rendered at the highest
    resolution that fits instead (logged), never at full size.

    Args:
        path: The PDF.
        pages: 1-based page numbers.
        engine: ``tesseract`` or ``rapidocr``.
        language: OCR language (see `ocr_image`).
        dpi: Render resolution (``KBFLOW_OCR_DPI``).
        max_pixels: Largest rendered page, in pixels.
        timeout_s: Time limit per page (see `ocr_image`).

    Returns:
        ``{page: text}`` for every requested page; the text may be ``""``.

    Raises:
        ConfigError: A page number is out of range, or see `ocr_image`.
        ExtractionError: The PDF is encrypted or corrupt, or OCR failed on a page.
    """
    import pypdfium2 as pdfium

    path = Path(path)
    ensure_ocr_engine(engine)
    pdf = open_pdf(path)
    try:
        count = len(pdf)
        bad = [p for p in pages if not 1 <= p <= count]
        if bad:
            raise ConfigError(
                f"page(s) {bad} out of range for {path.name}, which has {count} page(s) — pass "
                f"1-based page numbers from 1 to {count}"
            )
        texts: dict[int, str] = {}
        for number in pages:
            started = time.perf_counter()
            page = pdf[number - 1]
            try:
                scale = _render_scale(path, number, page.get_size(), dpi, max_pixels)
                try:
                    image = page.render(scale=scale, grayscale=True).to_pil()
                except pdfium.PdfiumError as exc:
                    raise ExtractionError(
                        f"cannot render page {number} of {path.name}: {exc} — the file may be "
                        "corrupt; re-export it"
                    ) from exc
            finally:
                page.close()
            texts[number] = _ocr_page(path, number, image, engine, language, timeout_s)
            logger.info(
                "ocr %s p.%d: engine=%s %dx%d chars=%d in %.2fs",
                path.name,
                number,
                engine,
                image.width,
                image.height,
                len(texts[number]),
                time.perf_counter() - started,
            )
        return texts
    finally:
        pdf.close()


# --- images -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _pil_bomb_check_off() -> Iterator[None]:
    """Switch PIL's own decompression-bomb check off while this module reads image headers.

    PIL refuses images over twice its ``MAX_IMAGE_PIXELS`` with an error that names no kbflow
    setting (and, for an image our cap allows, refuses it wrongly); `check_image` applies
    kbflow's cap instead, with a message that says what to change. The check is off only for
    the duration of an open or seek, under a lock, so other PIL users in the process keep
    theirs; no pixels are decoded meanwhile.
    """
    from PIL import Image

    with _PIL_CHECK_LOCK:
        saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
        try:
            yield
        finally:
            Image.MAX_IMAGE_PIXELS = saved


@contextlib.contextmanager
def _open_image(path: Path) -> Iterator[Image.Image]:
    """Open an image lazily (header only); see `_pil_bomb_check_off`."""
    from PIL import Image, UnidentifiedImageError

    try:
        with _pil_bomb_check_off():
            image = Image.open(path)
    except FileNotFoundError as exc:
        raise ExtractionError(f"{path} does not exist — check the path and try again") from exc
    except UnidentifiedImageError as exc:
        raise ExtractionError(
            f"{path.name} is not an image PIL can identify (corrupt, truncated or another "
            "format) — check that it opens in an image viewer, re-export it and ingest the copy"
        ) from exc
    except (OSError, ValueError, SyntaxError) as exc:  # PIL raises SyntaxError for bad headers
        raise ExtractionError(
            f"cannot read image {path.name}: {exc} — the file is corrupt or truncated; re-export it"
        ) from exc
    with image:
        yield image


def _seek(path: Path, image: Image.Image, index: int) -> None:
    try:
        with _pil_bomb_check_off():
            image.seek(index)
    except (OSError, ValueError, EOFError) as exc:
        raise ExtractionError(
            f"cannot read frame {index + 1} of {path.name}: {exc} — the file is corrupt or "
            "truncated; re-export it"
        ) from exc


def _check_size(path: Path, size: tuple[int, int], max_pixels: int, *, frame: int | None) -> None:
    width, height = size
    if width * height > max_pixels:
        where = f" (frame {frame})" if frame else ""
        raise ExtractionError(
            f"{path.name}{where} is {width}x{height} pixels ({width * height / 1e6:,.1f} "
            f"megapixels), over the cap of {max_pixels / 1e6:,.1f} megapixels — downscale the "
            "image, or raise KBFLOW_MAX_IMAGE_MEGAPIXELS if the machine has the memory"
        )


def _frame_label(index: int, frames: int) -> str:
    return f" frame {index + 1}" if frames > 1 else ""


def _ocr_page(
    path: Path, page: int | None, image: Image.Image, engine: str, language: str, timeout_s: float
) -> str:
    """`ocr_image`, with the file and page it concerns put in front of any extraction error."""
    try:
        return ocr_image(image, engine=engine, language=language, timeout_s=timeout_s)
    except ExtractionError as exc:
        where = f" page {page}" if page else ""
        raise ExtractionError(f"OCR of {path.name}{where} failed: {exc}") from exc


def _to_ocr_mode(image: Image.Image) -> Image.Image:
    """An 8-bit grey or RGB copy: transparency flattened onto white, 16-bit and float scaled
    to 0-255 (a plain convert would clip them to white), CMYK and palettes converted."""
    from PIL import Image

    if image.mode in ("L", "RGB"):
        return image
    if image.mode == "1":
        return image.convert("L")
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        import numpy as np

        pixels = np.asarray(image, dtype=np.float64)
        low, high = float(pixels.min()), float(pixels.max())
        span = high - low or 1.0
        return Image.fromarray(((pixels - low) * (255.0 / span)).astype(np.uint8), mode="L")
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ("LA", "La", "PA", "RGBA", "RGBa"):
        rgba = image.convert("RGBA")
        white = Image.new("RGB", rgba.size, (255, 255, 255))
        white.paste(rgba, mask=rgba.getchannel("A"))
        return white
    return image.convert("RGB")


# --- Tesseract ----------------------------------------------------------------------------------


def _tesseract_paragraphs(image: Image.Image, language: str, timeout_s: float) -> list[list[str]]:
    from PIL import Image

    image = _to_ocr_mode(image)
    long_side = max(image.size)
    if 0 < long_side < _TESSERACT_MIN_LONG_SIDE:
        factor = min(_TESSERACT_MAX_UPSCALE, _TESSERACT_MIN_LONG_SIDE / long_side)
        size = (round(image.width * factor), round(image.height * factor))
        image = image.resize(size, Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)  # fast; tesseract decodes it anyway
    # OpenMP threads inside one tesseract run are a net loss on few cores (seen: 8 s vs 1.2 s on
    # 2 cores for one page); run one thread per process unless the caller chose otherwise.
    env = {**os.environ, "OMP_THREAD_LIMIT": os.environ.get("OMP_THREAD_LIMIT", "1")}
    command = ["tesseract", "stdin", "stdout", "-l", language, "--psm", "3"]
    try:
        done = subprocess.run(
            command, input=buffer.getvalue(), capture_output=True, timeout=timeout_s, env=env
        )
    except subprocess.TimeoutExpired as exc:
        raise ExtractionError(
            f"tesseract did not finish a {image.width}x{image.height} image within "
            f"{timeout_s:g} s — raise the OCR time limit (timeout_s), or lower KBFLOW_OCR_DPI "
            "for PDF pages"
        ) from exc
    except FileNotFoundError as exc:
        raise ConfigError(f"OCR engine 'tesseract' is not on PATH — {_INSTALL_TESSERACT}") from exc
    stderr = done.stderr.decode("utf-8", "replace")
    if "Failed loading language" in stderr or "Error opening data file" in stderr:
        raise ConfigError(
            f"tesseract has no language data for {language!r} — install it (e.g. apt-get install "
            f"tesseract-ocr-{language.split('+')[-1]}) or set KBFLOW_OCR_LANGUAGE to an "
            f"installed one (`tesseract --list-langs`)"
        )
    if done.returncode != 0:
        raise ExtractionError(
            f"tesseract exited with code {done.returncode}: {_last_line(stderr)} — check that "
            "the image opens in a viewer; re-export it if not"
        )
    text = done.stdout.decode("utf-8", "replace").replace("\f", "\n")
    # Tesseract separates paragraphs (blocks) with a blank line and keeps the printed lines.
    return [
        [line.strip() for line in block.splitlines() if line.strip()]
        for block in re.split(r"\n\s*\n", text)
        if block.strip()
    ]


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no message)"


# --- RapidOCR -----------------------------------------------------------------------------------


@functools.cache
def _rapidocr_engine() -> Any:
    """One RapidOCR engine per process: loading its three ONNX models takes ~1 s."""
    ensure_ocr_engine("rapidocr")
    from rapidocr import RapidOCR

    from tasks.text.ort import onnxruntime_without_telemetry

    onnxruntime_without_telemetry()  # RapidOCR runs its models on it

    return RapidOCR(params={"Global.log_level": "warning"})


def _rapidocr_paragraphs(image: Image.Image, language: str) -> list[list[str]]:
    unknown = set(language.split("+")) - _RAPIDOCR_LANGUAGES
    if unknown:
        raise ConfigError(
            f"OCR language {language!r} is not covered by RapidOCR's bundled model (it reads "
            f"{', '.join(sorted(_RAPIDOCR_LANGUAGES))}) — set KBFLOW_OCR_ENGINE=tesseract and "
            "install that language's tesseract data"
        )
    result = _rapidocr_engine()(_to_ocr_mode(image).convert("RGB"))
    if result.boxes is None or not result.txts:
        return []
    boxes = [
        Box(
            left=float(min(x for x, _ in quad)),
            top=float(min(y for _, y in quad)),
            right=float(max(x for x, _ in quad)),
            bottom=float(max(y for _, y in quad)),
            text=" ".join(str(text).split()),
        )
        for quad, text in zip(result.boxes, result.txts, strict=True)
        if str(text).strip()
    ]
    return _boxes_to_paragraphs(boxes)


def _boxes_to_paragraphs(boxes: list[Box]) -> list[list[str]]:
    """Put text boxes in reading order and group them into lines and paragraphs.

    Reading order comes from a recursive XY-cut: a region is split at its widest vertical
    gutter when it has one (columns, read left to right), else at its widest horizontal gap
    (read top to bottom); cutting one gap at a time keeps a full-width title from slicing two
    columns below it into interleaved strips. A region with no gap wider than about a line
    height is one block; its boxes are grouped into lines, and the block is split into
    paragraphs at indented first lines and after lines that stop short.
    """
    if not boxes:
        return []
    line_height = statistics.median(box.height for box in boxes)
    paragraphs: list[list[str]] = []
    for block in _xy_cut(boxes, min_gap=0.6 * line_height):
        paragraphs.extend(_block_paragraphs(block, line_height))
    return paragraphs


def _xy_cut(boxes: list[Box], *, min_gap: float) -> list[list[Box]]:
    blocks: list[list[Box]] = []
    pending = [boxes]  # a stack, so regions come out in reading order without recursion
    while pending:
        region = pending.pop()
        parts = _split_at_widest_gap(region, vertical=True, min_gap=min_gap * 1.5)
        if parts is None:
            parts = _split_at_widest_gap(region, vertical=False, min_gap=min_gap)
        if parts is None:
            blocks.append(region)
        else:
            pending.extend(reversed(parts))
    return blocks


def _split_at_widest_gap(
    boxes: list[Box], *, vertical: bool, min_gap: float
) -> tuple[list[Box], list[Box]] | None:
    """Split at the widest empty band (a gutter between columns when `vertical`, else a gap
    between rows) at least `min_gap` wide, or None if there is none."""

    def span(box: Box) -> tuple[float, float]:
        return (box.left, box.right) if vertical else (box.top, box.bottom)

    ordered = sorted(boxes, key=span)
    best_gap, best_at = min_gap, None
    reach = span(ordered[0])[1]
    for index in range(1, len(ordered)):
        start, end = span(ordered[index])
        if start - reach >= best_gap:
            best_gap, best_at = start - reach, index
        reach = max(reach, end)
    if best_at is None:
        return None
    return ordered[:best_at], ordered[best_at:]


def _block_paragraphs(block: list[Box], line_height: float) -> list[list[str]]:
    """Split one block's lines into paragraphs: a new one starts at an indented line after a
    flush one, and after a line that stopped short (the next line's first word would have
    fitted on it)."""
    lines = [(line, " ".join(box.text for box in line)) for line in _group_lines(block)]
    left = min(line[0].left for line, _ in lines)
    right = max(line[-1].right for line, _ in lines)

    def indented(line: list[Box]) -> bool:
        return line[0].left - left > 0.8 * line_height

    paragraphs: list[list[str]] = []
    for index, (line, text) in enumerate(lines):
        if index == 0:
            paragraphs.append([text])
            continue
        previous = lines[index - 1][0]
        char_width = (line[-1].right - line[0].left) / max(len(text), 1)
        first_word = text.split(" ", 1)[0]
        stopped_short = previous[-1].right + (len(first_word) + 2) * char_width < right
        if stopped_short or (indented(line) and not indented(previous)):
            paragraphs.append([text])
        else:
            paragraphs[-1].append(text)
    return paragraphs


def _group_lines(block: list[Box]) -> list[list[Box]]:
    """Boxes that overlap vertically by more than half the smaller height share a line."""
    lines: list[list[Box]] = []
    for box in sorted(block, key=lambda b: (b.top + b.bottom) / 2):
        if lines:
            line = lines[-1]
            top = min(b.top for b in line)
            bottom = max(b.bottom for b in line)
            overlap = min(bottom, box.bottom) - max(top, box.top)
            if overlap > 0.5 * min(bottom - top, box.height):
                line.append(box)
                continue
        lines.append([box])
    return [sorted(line, key=lambda b: b.left) for line in lines]


# --- text ---------------------------------------------------------------------------------------


def _paragraphs_to_text(paragraphs: list[list[str]]) -> str:
    """Paragraphs separated by a blank line; a paragraph's lines joined with spaces, undoing
    end-of-line hyphenation ("docu-" + "ment") when the next line starts lower-case."""
    out: list[str] = []
    for lines in paragraphs:
        text = ""
        for line in lines:
            text = join_wrapped(text, line)
        if text:
            out.append(text)
    return "\n\n".join(out)


# --- PDF ----------------------------------------------------------------------------------------


def _render_scale(
    path: Path, number: int, size_pt: tuple[float, float], dpi: int, max_pixels: int
) -> float:
    """Render scale (pixels per point) for `dpi`, lowered so the bitmap fits `max_pixels`."""
    width_pt, height_pt = size_pt
    scale = dpi / 72
    if math.ceil(width_pt * scale) * math.ceil(height_pt * scale) <= max_pixels:
        return scale
    # Largest scale whose (rounded-up) bitmap still fits; the 0.999 absorbs the rounding.
    fitted = math.sqrt(max_pixels / max(width_pt * height_pt, 1.0)) * 0.999
    logger.warning(
        "%s p.%d is %.0fx%.0f pt: rendering at %.0f dpi instead of %d to stay under %.1f "
        "megapixels (KBFLOW_MAX_IMAGE_MEGAPIXELS)",
        path.name,
        number,
        width_pt,
        height_pt,
        fitted * 72,
        dpi,
        max_pixels / 1e6,
    )
    return fitted
