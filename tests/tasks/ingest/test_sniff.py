"""Tests for tasks.ingest.sniff: format detection from bytes, and the OOXML zip-bomb guard.

Real files come from ../shared/datasets/real-docs (skipped when absent); everything else is made
in tmp_path: magic-number headers, renamed files, corrupt and hostile ZIPs.
"""

from __future__ import annotations

import random
import shutil
import struct
import time
import zipfile
from pathlib import Path

import pytest

from core.errors import ExtractionError, UnsupportedFormat
from tasks.ingest.sniff import FORMATS, Detected, check_zip_safety, declared_format, detect_format
from tests.bad_inputs import zip_bomb_docx
from tests.conftest import datasets_dir
from tests.tasks.ingest.support import MAGIC_CASES

# What each real file's bytes are, by its suffix (written out, not derived from the code).
EXPECTED_BY_SUFFIX = {
    ".pdf": "pdf",
    ".docx": "docx",
    ".pptx": "pptx",
    ".html": "html",
    ".md": "md",
    ".csv": "csv",
    ".tif": "tiff",
    ".mp3": "mp3",
    ".mp4": "mp4",
    ".wav": "wav",
}
CONTENT_TYPES = (
    '<?xml version="1.0" encoding="UTF-8"?>'
    '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"/>'
)


def _sources() -> Path:
    return datasets_dir("real-docs", "sources")


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _real(name: str) -> Path:
    path = _sources() / name
    if not path.exists():
        pytest.skip(f"{name} not in the real-docs set")
    return path


# --- real files ---------------------------------------------------------------------------------


def test_every_real_source_is_detected_as_its_suffix_says() -> None:
    files = sorted(p for p in _sources().iterdir() if p.is_file())
    assert files
    for path in files:
        found = detect_format(path)
        assert found == Detected(EXPECTED_BY_SUFFIX[path.suffix], declared_format(path)), path
        assert found.format in FORMATS
        assert not found.mismatch, path


def test_pdf_renamed_docx_is_a_pdf_with_a_mismatch(tmp_path: Path) -> None:
    renamed = tmp_path / "report.docx"
    shutil.copyfile(_real("multi_page.pdf"), renamed)
    found = detect_format(renamed)
    assert (found.format, found.declared, found.mismatch) == ("pdf", "docx", True)


def test_truncated_docx_is_corrupt_not_unsupported(tmp_path: Path) -> None:
    data = _real("word_sample.docx").read_bytes()
    half = _write(tmp_path, "half.docx", data[: len(data) // 2])
    with pytest.raises(ExtractionError, match="corrupt or truncated") as caught:
        detect_format(half)
    assert not isinstance(caught.value, UnsupportedFormat)
    assert "half.docx" in str(caught.value)


# --- unsupported and empty ----------------------------------------------------------------------


def test_random_bytes_named_pdf_are_unsupported(tmp_path: Path) -> None:
    junk = _write(tmp_path, "scan.pdf", random.Random(20240611).randbytes(64 * 1024))
    with pytest.raises(UnsupportedFormat) as caught:
        detect_format(junk)
    message = str(caught.value)
    assert "scan.pdf" in message and "(named .pdf)" in message and "supported: " in message


def test_empty_file_is_an_extraction_error(tmp_path: Path) -> None:
    empty = _write(tmp_path, "notes.md", b"")
    with pytest.raises(ExtractionError, match=r"notes\.md is empty \(0 bytes\)"):
        detect_format(empty)


def test_plain_zip_is_unsupported(tmp_path: Path) -> None:
    path = tmp_path / "bundle.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.txt", "hello")
        archive.writestr("b/c.csv", "x,y\n1,2\n")
    with pytest.raises(UnsupportedFormat, match="not a Word, PowerPoint or Excel file — unzip"):
        detect_format(path)


def test_opendocument_is_unsupported_with_advice(tmp_path: Path) -> None:
    path = tmp_path / "letter.odt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("mimetype", "application/vnd.oasis.opendocument.text")
        archive.writestr("content.xml", "<office:document-content/>")
    with pytest.raises(UnsupportedFormat, match=r"opendocument\.text.*save it as \.docx"):
        detect_format(path)


def test_ole_compound_file_is_unsupported_with_advice(tmp_path: Path) -> None:
    path = _write(tmp_path, "old.doc", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(600))
    with pytest.raises(UnsupportedFormat, match=r"legacy \.doc"):
        detect_format(path)


def test_heic_image_is_unsupported(tmp_path: Path) -> None:
    path = _write(tmp_path, "photo.heic", b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic")
    with pytest.raises(UnsupportedFormat, match="HEIF/AVIF"):
        detect_format(path)


def test_missing_file_is_an_extraction_error(tmp_path: Path) -> None:
    with pytest.raises(ExtractionError, match="does not exist"):
        detect_format(tmp_path / "nope.pdf")


# --- magic numbers ------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "data", "expected"), MAGIC_CASES, ids=[c[0] for c in MAGIC_CASES])
def test_magic_numbers(tmp_path: Path, name: str, data: bytes, expected: str) -> None:
    found = detect_format(_write(tmp_path, name, data))
    assert found.format == expected
    assert not found.mismatch


def test_bytes_that_only_look_like_an_mpeg_sync_are_not_mp3(tmp_path: Path) -> None:
    # A valid first frame header followed by junk where the second frame should start.
    data = b"\xff\xfb\x90\x00" + random.Random(7).randbytes(2000).replace(b"\xff", b"\x00")
    with pytest.raises(UnsupportedFormat):
        detect_format(_write(tmp_path, "noise.mp3", data))


# --- text ---------------------------------------------------------------------------------------


def test_text_named_md_is_md_and_no_suffix_is_txt(tmp_path: Path) -> None:
    text = "# Title\n\nSome *markdown* text, café.\n".encode()
    assert detect_format(_write(tmp_path, "notes.md", text)) == Detected("md", "md")
    assert detect_format(_write(tmp_path, "notes.markdown", text)) == Detected("md", "md")
    assert detect_format(_write(tmp_path, "README", text)) == Detected("txt", "")
    assert detect_format(_write(tmp_path, "data.json", b'{"a": 1}')) == Detected("txt", "json")


def test_html_named_txt_is_html(tmp_path: Path) -> None:
    page = b"\xef\xbb\xbf  <!-- saved page -->\n<!DOCTYPE html>\n<html><body>Hi</body></html>"
    found = detect_format(_write(tmp_path, "page.txt", page))
    assert (found.format, found.declared, found.mismatch) == ("html", "txt", True)
    fragment = b'<meta charset="utf-8">\n<title>x</title>\n<body><p>Hi</p></body>'
    assert detect_format(_write(tmp_path, "frag.htm", fragment)) == Detected("html", "html")


def test_markdown_that_mentions_html_or_pdf_stays_markdown(tmp_path: Path) -> None:
    text = b"# Notes\n\nA PDF starts with %PDF-1.7 and a page with <html> and <body>.\n"
    assert detect_format(_write(tmp_path, "notes.md", text)).format == "md"


def test_utf16_with_bom_is_text(tmp_path: Path) -> None:
    csv = "name,city\nZoë,Köln\n" * 50
    assert detect_format(_write(tmp_path, "le.csv", b"\xff\xfe" + csv.encode("utf-16-le"))) == (
        Detected("csv", "csv")
    )
    assert detect_format(_write(tmp_path, "be.txt", b"\xfe\xff" + csv.encode("utf-16-be"))) == (
        Detected("txt", "txt")
    )
    # FF FE also reads as an MPEG audio frame sync; a short UTF-16 text is still text.
    assert detect_format(_write(tmp_path, "a", b"\xff\xfe" + "ab".encode("utf-16-le"))) == (
        Detected("txt", "")
    )


def test_multibyte_character_cut_at_the_end_of_the_head_is_still_text(tmp_path: Path) -> None:
    # 16 KiB is read: "é" (2 bytes) straddles the boundary, and the file goes on after it.
    text = b"a" * (16 * 1024 - 1) + "é and more text".encode()
    assert detect_format(_write(tmp_path, "long.txt", text)).format == "txt"


def test_legacy_8bit_text_named_csv_is_csv(tmp_path: Path) -> None:
    cp1252 = "name;price\nCafé crème;3,50 €\n".encode("cp1252")
    assert detect_format(_write(tmp_path, "export.csv", cp1252)) == Detected("csv", "csv")


def test_binary_with_nul_bytes_named_txt_is_unsupported(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedFormat, match=r"\(named \.txt\)"):
        detect_format(_write(tmp_path, "blob.txt", b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"))


# --- zip guard ----------------------------------------------------------------------------------


def _docx_skeleton(path: Path, extra: dict[str, bytes] | None = None) -> zipfile.ZipFile:
    archive = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
    archive.writestr("[Content_Types].xml", CONTENT_TYPES)
    archive.writestr("word/document.xml", "<w:document><w:body/></w:document>")
    for name, data in (extra or {}).items():
        archive.writestr(name, data)
    return archive


def test_zip_bomb_docx_is_refused_for_its_ratio(tmp_path: Path) -> None:
    started = time.perf_counter()
    path = zip_bomb_docx(tmp_path / "bomb.docx")  # 300 MiB of zeros, deflated while streaming
    built_s = time.perf_counter() - started
    assert path.stat().st_size < 2 * 2**20, "the bomb should be small on disk"
    assert detect_format(path).format == "docx"  # it is a well-formed docx skeleton
    with pytest.raises(ExtractionError) as caught:
        check_zip_safety(path)
    message = str(caught.value)
    assert "compression ratio" in message and "word/media/padding.bin" in message
    assert "200:1" in message and "KBFLOW_ZIP_MAX_RATIO" in message
    print(f"bomb built in {built_s:.2f}s, {path.stat().st_size:,} bytes")


def test_too_many_entries_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "many.docx"
    with _docx_skeleton(path, {f"word/media/p{i}.xml": b"<p/>" for i in range(30)}):
        pass
    with pytest.raises(ExtractionError, match=r"32 ZIP entries, over the limit of 20.*ENTRIES"):
        check_zip_safety(path, max_entries=20)
    check_zip_safety(path, max_entries=32)


def test_too_large_total_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.xlsx"
    data = random.Random(3).randbytes(3 * 2**20)  # incompressible: the ratio stays ~1
    with _docx_skeleton(path, {"xl/media/blob.bin": data}):
        pass
    with pytest.raises(ExtractionError, match=r"3\.0 MB, over the limit of 2\.0 MB.*TOTAL_MB"):
        check_zip_safety(path, max_total_bytes=2 * 2**20)
    check_zip_safety(path)


def test_small_entries_may_compress_well(tmp_path: Path) -> None:
    # 512 KiB of identical XML compresses ~1000:1; under 1 MiB that is no sign of a bomb.
    path = tmp_path / "dense.docx"
    with _docx_skeleton(path, {"word/styles.xml": b"<w:style/>" * 52_000}):
        pass
    check_zip_safety(path)


@pytest.mark.parametrize("name", ["../evil.xml", "/etc/passwd", "word/../../x.xml", "C:/x.xml"])
def test_unsafe_entry_names_are_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / "evil.docx"
    with _docx_skeleton(path, {name: b"x"}):
        pass
    with pytest.raises(ExtractionError, match="unsafe name"):
        check_zip_safety(path)


def test_corrupt_zip_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "broken.pptx", b"PK\x03\x04" + bytes(200))
    with pytest.raises(ExtractionError, match="corrupt or truncated"):
        check_zip_safety(path)


def test_real_office_files_pass_the_zip_guard() -> None:
    office = [p for p in _sources().iterdir() if p.suffix in (".docx", ".pptx", ".xlsx")]
    assert office
    for path in office:
        check_zip_safety(path)


def test_zip_declared_sizes_are_what_is_checked(tmp_path: Path) -> None:
    # The guard reads the central directory only: a forged entry size is what it sees.
    path = tmp_path / "forged.docx"
    with _docx_skeleton(path, {"word/media/a.bin": b"x" * 100}):
        pass
    data = bytearray(path.read_bytes())
    at = data.rfind(b"PK\x01\x02")  # the last central-directory record is a.bin's
    struct.pack_into("<I", data, at + 24, 3 * 2**30)  # its uncompressed size: 3 GiB
    path.write_bytes(bytes(data))
    with pytest.raises(ExtractionError, match="KBFLOW_ZIP_MAX_TOTAL_MB"):
        check_zip_safety(path)
