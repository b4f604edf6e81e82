"""A corpus of bad inputs, generated on the spot: each file breaks extraction in its own way.

`write_bad_corpus(folder)` returns {file name: a fragment its error message must contain}. The
PDF renamed ``.docx`` is not an error: it is read as the PDF it is, with a note.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import zipfile
import zlib
from pathlib import Path

OVERSIZE_CAP_MB = (
    4.0  # run the corpus with KBFLOW_MAX_FILE_MB set to this (the zip bomb is ~1.3 MB)
)


def text_pdf(path: Path, text: str, *, pages: int = 1) -> Path:
    from fpdf import FPDF

    pdf = FPDF()
    for page in range(pages):
        pdf.add_page()
        pdf.set_font("helvetica", size=12)
        pdf.multi_cell(0, 8, f"{text} (page {page + 1})")
    pdf.output(str(path))
    return path


def encrypted_pdf(path: Path) -> Path:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("helvetica", size=12)
    pdf.cell(0, 10, "Board minutes that need a password.")
    pdf.set_encryption(owner_password="owner-secret", user_password="user-secret")
    pdf.output(str(path))
    return path


def zip_bomb_docx(path: Path, *, inflated_mb: int = 300) -> Path:
    """A valid DOCX skeleton plus one entry of ``inflated_mb`` MiB of zeros (~1000:1)."""
    content_types = (
        '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/'
        'package/2006/content-types"><Default Extension="xml" ContentType="application/xml"/>'
        "</Types>"
    )
    document = (
        '<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="http://schemas.openxmlformats'
        '.org/wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>hello</w:t></w:r></w:p>'
        "</w:body></w:document>"
    )
    block = b"\0" * (1 << 20)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("[Content_Types].xml", content_types)
        zf.writestr("word/document.xml", document)
        with zf.open("word/media/padding.bin", "w", force_zip64=True) as entry:
            for _ in range(inflated_mb):
                entry.write(block)
    return path


def giant_png(path: Path, width: int = 30_000, height: int = 30_000) -> Path:
    """A real 1-bit PNG of width x height pixels, written row by row (a few hundred KB)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    row = b"\0" + b"\0" * ((width + 7) // 8)  # filter byte + packed bits
    packer = zlib.compressobj(9)
    with path.open("wb") as out:
        out.write(b"\x89PNG\r\n\x1a\n")
        out.write(chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)))
        data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
        out.write(chunk(b"IDAT", data))
        out.write(chunk(b"IEND", b""))
    return path


def silent_video_without_audio(path: Path) -> Path:
    """One second of black video with no audio stream (needs ffmpeg)."""
    subprocess.run(
        [
            "ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi",
            "-i", "color=c=black:s=64x64:d=1", "-c:v", "mpeg4", str(path),
        ],
        check=True,
        timeout=60,
    )  # fmt: skip
    return path


def write_bad_corpus(folder: Path) -> dict[str, str]:
    """Write the bad-input corpus; returns each file's expected error fragment."""
    folder.mkdir(parents=True, exist_ok=True)
    expected: dict[str, str] = {}

    (folder / "empty.md").write_bytes(b"")
    expected["empty.md"] = "is empty (0 bytes)"

    whole = text_pdf(folder / "whole.tmp", "A report that was cut short in transit.", pages=3)
    data = whole.read_bytes()
    (folder / "truncated.pdf").write_bytes(data[: len(data) // 2])
    whole.unlink()
    expected["truncated.pdf"] = "corrupt"

    encrypted_pdf(folder / "encrypted.pdf")
    expected["encrypted.pdf"] = "file is encrypted — supply an unlocked copy"

    zip_bomb_docx(folder / "zipbomb.docx")
    expected["zipbomb.docx"] = "KBFLOW_ZIP_MAX_RATIO"

    giant_png(folder / "giant.png")
    expected["giant.png"] = "900"

    rng = random.Random(7)
    (folder / "random.pdf").write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    expected["random.pdf"] = "match no format"

    (folder / "oversize.txt").write_bytes(b"word " * int(OVERSIZE_CAP_MB * 1024 * 1024 / 4))
    expected["oversize.txt"] = "KBFLOW_MAX_FILE_MB"

    if shutil.which("ffmpeg") and shutil.which("ffprobe"):
        silent_video_without_audio(folder / "no-audio.mp4")
        expected["no-audio.mp4"] = "no audio track"
    return expected


def write_renamed_pdf(folder: Path) -> Path:
    """A good PDF under a .docx name: read by content, with a note."""
    return text_pdf(folder / "quarterly-review.docx", "Renewals grew eleven percent in autumn.")


def assert_no_leftover_workers() -> None:
    """No extraction worker outlives its pool (checked via the process table) but the idle one
    parked for the next pool, which is stopped here first."""
    import psutil

    from tasks.ingest import isolate

    isolate.stop_parked_workers()
    me = psutil.Process(os.getpid())
    workers = [p for p in me.children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]
    assert not workers, workers
