"""Tests for tasks.ingest.ocr: real Tesseract and RapidOCR on the real-docs scans, plus generated
images.

The real scans (../shared/datasets/real-docs) are skipped when absent; every other input is made
in tmp_path. Engines that are not installed skip their tests.
"""

from __future__ import annotations

import io
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

from core.errors import ConfigError, ExtractionError
from core.models import Location
from evals.extraction import token_recall
from tasks.ingest import ocr
from tasks.ingest.ocr import (
    OCR_ENGINES,
    check_image,
    ensure_ocr_engine,
    ocr_image,
    ocr_image_file,
    ocr_pdf_pages,
)
from tasks.ingest.pages import Box
from tests.bad_inputs import giant_png
from tests.conftest import datasets_dir

MAX_PIXELS = 150_000_000  # the KBFLOW_MAX_IMAGE_MEGAPIXELS default
# Word-token recall of ocr_test.pdf page 1 against its reference (groundtruth/ocr_test.md):
# 1.00 with both engines at 200 dpi. The floor leaves room for engine versions, not lost lines.
RECALL_FLOOR = {"tesseract": 0.9, "rapidocr": 0.8}
# Words printed on the two frames of 2206.01062.tif (checked by eye on the scan).
TIF_FRAME_WORDS = {
    1: ["DocLayNet", "Human-Annotated", "Pfitzmann", "Rueschlikon", "ABSTRACT", "PubLayNet"],
    2: ["Financial", "Distribution", "annotation", "campaign", "COCO", "Manuals"],
}


def _engine_available(engine: str) -> bool:
    try:
        ensure_ocr_engine(engine)
    except ConfigError:
        return False
    return True


ENGINES = [
    pytest.param(e, marks=pytest.mark.skipif(not _engine_available(e), reason=f"{e} missing"))
    for e in OCR_ENGINES
]
needs_tesseract = pytest.mark.skipif(
    not _engine_available("tesseract"), reason="tesseract CLI not installed"
)


def _real(name: str) -> Path:
    path = datasets_dir("real-docs", "sources") / name
    if not path.exists():
        pytest.skip(f"{name} not in the real-docs set")
    return path


def _text_image(lines: list[str], *, size: int = 40, width: int = 1000) -> Image.Image:
    font = ImageFont.load_default(size=size)
    image = Image.new("L", (width, 40 + int(size * 1.4) * len(lines)), 255)
    ImageDraw.Draw(image).text((30, 20), "\n".join(lines), font=font, fill=0, spacing=size // 3)
    return image


# --- engines ------------------------------------------------------------------------------------


def test_unknown_engine_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"unknown OCR engine 'abbyy'.*KBFLOW_OCR_ENGINE"):
        ensure_ocr_engine("abbyy")
    with pytest.raises(ConfigError, match="unknown OCR engine"):
        ocr_image(_text_image(["x"]), engine="abbyy")


def test_missing_tesseract_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="apt-get install tesseract-ocr tesseract-ocr-eng"):
        ensure_ocr_engine("tesseract")


def test_missing_rapidocr_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = ocr.importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "onnxruntime" else real_find_spec(name)

    monkeypatch.setattr(ocr.importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigError, match=r"needs the Python package.*onnxruntime.*pip install"):
        ensure_ocr_engine("rapidocr")


@needs_tesseract
def test_tesseract_timeout_is_an_extraction_error(tmp_path: Path) -> None:
    with pytest.raises(ExtractionError, match=r"ocr_test\.pdf page 1.*within 0\.01 s"):
        ocr_pdf_pages(
            _real("ocr_test.pdf"), [1], engine="tesseract", max_pixels=MAX_PIXELS, timeout_s=0.01
        )


@needs_tesseract
def test_tesseract_unknown_language_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"no language data for 'xyz'.*tesseract-ocr-xyz"):
        ocr_image(_text_image(["hello"]), engine="tesseract", language="xyz")


def test_rapidocr_refuses_a_language_its_model_lacks() -> None:
    with pytest.raises(ConfigError, match=r"'deu' is not covered.*KBFLOW_OCR_ENGINE=tesseract"):
        ocr_image(_text_image(["hallo"]), engine="rapidocr", language="deu")


# --- check_image --------------------------------------------------------------------------------


def test_huge_image_is_refused_from_its_header(tmp_path: Path) -> None:
    path = tmp_path / "poster.png"
    giant_png(path, 30_000, 30_000)
    assert path.stat().st_size < 1_000_000
    pil_limit = Image.MAX_IMAGE_PIXELS
    with pytest.raises(ExtractionError) as caught:
        check_image(path, max_pixels=MAX_PIXELS)
    message = str(caught.value)
    assert "poster.png is 30000x30000 pixels (900.0 megapixels)" in message
    assert "cap of 150.0 megapixels" in message and "KBFLOW_MAX_IMAGE_MEGAPIXELS" in message
    assert pil_limit == Image.MAX_IMAGE_PIXELS, "PIL's own limit must be restored"
    with pytest.raises(ExtractionError, match=r"900\.0 megapixels"):
        ocr_image_file(path, engine="tesseract", max_pixels=MAX_PIXELS)


def test_image_over_pils_limit_but_under_ours_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "wide.png"
    giant_png(path, 20_000, 10_000)  # 200 MP: PIL alone refuses it (> 2 x 89.5 MP)
    assert check_image(path, max_pixels=250_000_000) == (20_000, 10_000, 1)


def test_truncated_png_header_is_an_extraction_error(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    _text_image(["hello"]).save(buffer, format="PNG")
    path = tmp_path / "cut.png"
    path.write_bytes(buffer.getvalue()[:20])  # cut inside the IHDR chunk
    with pytest.raises(ExtractionError, match=r"cut\.png.*corrupt or truncated"):
        check_image(path, max_pixels=MAX_PIXELS)


@needs_tesseract
def test_truncated_png_body_is_an_extraction_error(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    _text_image(["hello world"] * 5).save(buffer, format="PNG")
    path = tmp_path / "half.png"
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    assert check_image(path, max_pixels=MAX_PIXELS)[2] == 1  # the header is intact
    with pytest.raises(ExtractionError, match=r"cannot decode half\.png.*corrupt or truncated"):
        ocr_image_file(path, engine="tesseract", max_pixels=MAX_PIXELS)


def test_not_an_image_is_an_extraction_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.png"
    path.write_text("just text")
    with pytest.raises(ExtractionError, match="not an image PIL can identify"):
        check_image(path, max_pixels=MAX_PIXELS)


def test_check_image_reads_the_real_tiff() -> None:
    assert check_image(_real("2206.01062.tif"), max_pixels=MAX_PIXELS) == (612, 792, 2)


def test_each_tiff_frame_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "pages.tif"
    small, big = Image.new("L", (100, 100), 255), Image.new("L", (3000, 2000), 255)
    small.save(path, save_all=True, append_images=[big])
    with pytest.raises(ExtractionError, match=r"pages.tif \(frame 2\) is 3000x2000"):
        check_image(path, max_pixels=5_000_000)


# --- OCR on real scans --------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("engine", ENGINES)
def test_ocr_pdf_page_without_text_layer(engine: str) -> None:
    reference = (datasets_dir("real-docs", "groundtruth") / "ocr_test.md").read_text()
    texts = ocr_pdf_pages(_real("ocr_test.pdf"), [1], engine=engine, max_pixels=MAX_PIXELS)
    assert list(texts) == [1]
    assert "Docling bundles PDF document conversion" in texts[1]
    recall = token_recall(reference, texts[1])
    print(f"ocr_test.pdf p.1 {engine}: recall {recall:.3f}")
    assert recall >= RECALL_FLOOR[engine]


@pytest.mark.integration
@pytest.mark.parametrize("engine", ENGINES)
def test_ocr_scanned_tiff_gives_one_section_per_frame(engine: str) -> None:
    sections = ocr_image_file(_real("2206.01062.tif"), engine=engine, max_pixels=MAX_PIXELS)
    assert [s.location for s in sections] == [Location(page=1), Location(page=2)]
    for section in sections:
        assert section.heading_path == ()
        assert section.location is not None and section.location.page is not None
        words = TIF_FRAME_WORDS[section.location.page]
        missing = [w for w in words if w not in section.text]
        assert not missing, f"{engine} frame {section.location.page} lacks {missing}"
        assert "\n\n" in section.text  # paragraphs kept apart


@needs_tesseract
def test_rendering_is_capped_by_max_pixels(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tasks.ingest.ocr")
    texts = ocr_pdf_pages(_real("ocr_test.pdf"), [1], engine="tesseract", max_pixels=1_500_000)
    assert "rendering at 124 dpi instead of 200" in caplog.text
    assert "Docling bundles" in texts[1]


@needs_tesseract
def test_page_out_of_range_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"page\(s\) \[0, 2\] out of range.*has 1 page"):
        ocr_pdf_pages(_real("ocr_test.pdf"), [0, 1, 2], engine="tesseract", max_pixels=MAX_PIXELS)


@needs_tesseract
def test_corrupt_pdf_is_an_extraction_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.pdf"
    path.write_bytes(b"%PDF-1.4\n" + bytes(100))
    with pytest.raises(ExtractionError, match=r"cannot read broken\.pdf .*corrupt"):
        ocr_pdf_pages(path, [1], engine="tesseract", max_pixels=MAX_PIXELS)


# --- generated images: modes, frames, layout ----------------------------------------------------

MODE_MAKERS: dict[str, Callable[[Image.Image], Image.Image]] = {
    "1": lambda im: im.convert("1"),
    "L": lambda im: im,
    "P": lambda im: im.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE),
    # Black text drawn only by alpha on a transparent black background: flattened onto white.
    "RGBA": lambda im: Image.merge(
        "RGBA", [im.point(lambda v: 0)] * 3 + [im.point(lambda v: 255 - v)]
    ),
    "CMYK": lambda im: im.convert("RGB").convert("CMYK"),
    # 12-bit scanner output (1000-4060): a plain convert("L") would clip it all to white.
    "I;16": lambda im: im.point(lambda v: v * 12 + 1000, mode="I").convert("I;16"),
}


@needs_tesseract
@pytest.mark.parametrize("mode", list(MODE_MAKERS))
def test_image_modes_are_converted_before_ocr(tmp_path: Path, mode: str) -> None:
    image = MODE_MAKERS[mode](_text_image(["Quarterly revenue grew", "across every region"]))
    assert image.mode == mode
    path = tmp_path / "scan.png" if mode != "CMYK" else tmp_path / "scan.tif"
    image.save(path)
    sections = ocr_image_file(path, engine="tesseract", max_pixels=MAX_PIXELS)
    assert len(sections) == 1
    assert "revenue grew across every region" in sections[0].text.lower()


@needs_tesseract
def test_multi_frame_tiff_pages_and_blank_frames(tmp_path: Path) -> None:
    first = _text_image(["Invoice number seven"])
    blank = Image.new("L", first.size, 255)
    last = _text_image(["Payment received today"])
    path = tmp_path / "fax.tif"
    first.save(path, save_all=True, append_images=[blank, last], compression="tiff_lzw")
    sections = ocr_image_file(path, engine="tesseract", max_pixels=MAX_PIXELS)
    assert [s.location for s in sections] == [Location(page=1), Location(page=3)]
    assert "Invoice number seven" in sections[0].text
    assert "Payment received today" in sections[1].text
    with pytest.raises(ExtractionError, match=r"3 frames.*over the limit of 2"):
        ocr_image_file(path, engine="tesseract", max_pixels=MAX_PIXELS, max_frames=2)


def test_paragraph_text_joins_lines_and_undoes_hyphenation() -> None:
    paragraphs = [
        ["The docu-", "ment was scanned", "on a well-", "Known device."],
        ["Second para-", "graph."],
    ]
    assert ocr._paragraphs_to_text(paragraphs) == (
        "The document was scanned on a well- Known device.\n\nSecond paragraph."
    )


def test_rapidocr_boxes_are_read_column_by_column() -> None:
    def box(left: float, top: float, text: str, width: float = 200) -> Box:
        return Box(left, top, left + width, top + 14, text)

    boxes = [
        box(50, 10, "A full-width title over both columns", width=450),
        box(50, 60, "left one"),
        box(300, 60, "right one"),
        box(50, 72, "left two"),
        box(300, 72, "right two"),
    ]
    paragraphs = ocr._boxes_to_paragraphs(list(reversed(boxes)))
    assert ocr._paragraphs_to_text(paragraphs) == (
        "A full-width title over both columns\n\nleft one left two\n\nright one right two"
    )


def test_no_text_gives_no_sections(tmp_path: Path) -> None:
    path = tmp_path / "blank.png"
    Image.new("RGB", (400, 300), "white").save(path)
    engine = "tesseract" if shutil.which("tesseract") else "rapidocr"
    if not _engine_available(engine):
        pytest.skip("no OCR engine installed")
    assert ocr_image_file(path, engine=engine, max_pixels=MAX_PIXELS) == []
