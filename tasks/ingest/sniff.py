"""Tell a file's real format from its bytes, and guard Office files against zip bombs.

`detect_format` reads only the head of a file (plus, for a ZIP, its central directory) and
matches it against a small table of magic numbers; text is told apart from binary by whether it
decodes. The suffix a file was given is kept beside the answer, so callers can see a renamed
file (a PDF saved as ``.docx``) instead of handing it to the wrong parser.

`check_zip_safety` inspects an Office file's central directory, without decompressing anything,
before any parser opens it.
"""

from __future__ import annotations

import codecs
import io
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from core.errors import ExtractionError, UnsupportedFormat

FORMATS: frozenset[str] = frozenset(
    {
        *("pdf", "docx", "pptx", "xlsx", "html", "md", "csv", "txt"),
        *("png", "jpeg", "tiff", "webp"),
        *("mp3", "wav", "flac", "m4a", "aac", "ogg"),
        *("mp4", "mov", "avi", "mkv", "webm"),
    }
)
TEXT_FORMATS: frozenset[str] = frozenset({"html", "md", "csv", "txt"})

_SUFFIX_ALIASES = {"htm": "html", "markdown": "md", "jpg": "jpeg", "tif": "tiff"}
_HEAD_BYTES = 16 * 1024
# PDF readers accept junk before "%PDF-" (e.g. a stray HTTP header); so do we, up to 1 KiB.
_PDF_JUNK_BYTES = 1024
_TAIL_BYTES = 2048
_OOXML_PARTS = {
    "word/document.xml": "docx",
    "ppt/presentation.xml": "pptx",
    "xl/workbook.xml": "xlsx",
}
# ISO-BMFF major brands: audio-only MPEG-4, QuickTime, and still-image brands we do not read.
_M4A_BRANDS = {b"M4A ", b"M4B ", b"M4P "}
_IMAGE_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"mif1", b"msf1", b"avif", b"avis"}
# Old QuickTime files start with one of these atoms instead of an "ftyp" box.
_QUICKTIME_ATOMS = {b"moov", b"mdat", b"wide", b"free", b"skip", b"pnot"}
_HTML_START_RE = re.compile(r"<(?:!doctype\s+html|html[\s>])", re.IGNORECASE)
_HTML_TAG_RE = re.compile(r"<(?:html|head|body)[\s>]", re.IGNORECASE)
_LEADING_COMMENTS_RE = re.compile(r"^(?:\s|<!--.*?-->|<\?xml[^>]*\?>)*", re.DOTALL)
_CONTROL_CHARS_RE = re.compile(r"[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f]")


@dataclass(frozen=True)
class Detected:
    """What a file is, by its bytes, next to what its name claims.

    Attributes:
        format: the format its bytes show, one of `FORMATS`.
        declared: its lower-case suffix without the dot, with aliases folded (``htm`` → ``html``,
            ``markdown`` → ``md``, ``jpg`` → ``jpeg``, ``tif`` → ``tiff``); ``""`` if it has none.
    """

    format: str
    declared: str

    @property
    def mismatch(self) -> bool:
        """True when the name claims a format kbflow knows and the bytes show another one."""
        return self.declared in FORMATS and self.declared != self.format


def declared_format(path: Path) -> str:
    """The format a file's suffix claims: lower-case, without the dot, aliases folded."""
    suffix = path.suffix.lower().removeprefix(".")
    return _SUFFIX_ALIASES.get(suffix, suffix)


def detect_format(path: Path, data: bytes | None = None) -> Detected:
    """Find out what a file really is from its first bytes.

    Args:
        path: The file to look at. Only its head is read (and a ZIP's central directory).
        data: The file's bytes, when they are held in memory: looked at instead of the file,
            ``path`` only naming it.

    Returns:
        The detected format beside the declared one; see `Detected.mismatch`.

    Raises:
        ExtractionError: The file is missing, unreadable, empty, or a ZIP that is corrupt or
            truncated.
        UnsupportedFormat: Its bytes match no format kbflow reads (including a ZIP that is not
            a Word, PowerPoint or Excel file).
    """
    path = Path(path)
    declared = declared_format(path)
    head = _read_head(path) if data is None else data[:_HEAD_BYTES]
    if not head:
        raise ExtractionError(f"{path.name} is empty (0 bytes) — nothing to extract; remove it")
    found = _binary_format(path, head, declared, data)
    if found is None:
        found = _text_format(head, declared, whole_file=len(head) < _HEAD_BYTES)
    if found is None:
        raise UnsupportedFormat(
            f"{path.name}: its bytes match no format kbflow reads"
            f"{f' (named .{declared})' if declared else ''} — check the file is what its name "
            f"says; supported: {', '.join(sorted(FORMATS))}"
        )
    return Detected(format=found, declared=declared)


def check_zip_safety(
    path: Path,
    *,
    max_ratio: float = 200.0,
    max_total_bytes: int = 1 << 30,
    max_entries: int = 10_000,
) -> None:
    """Refuse an Office (OOXML) file that would unpack into far more than it looks like.

    Only the central directory is read; nothing is decompressed. Python's zipfile never yields
    more than an entry's declared size, so the declared sizes are the ones that matter.

    Args:
        path: The .docx, .pptx or .xlsx file (any ZIP works).
        max_ratio: Largest allowed ratio of uncompressed to compressed size, per entry of at
            least 1 MiB and for the whole archive (``KBFLOW_ZIP_MAX_RATIO``).
        max_total_bytes: Largest allowed total uncompressed size (``KBFLOW_ZIP_MAX_TOTAL_MB``).
        max_entries: Most entries allowed (``KBFLOW_ZIP_MAX_ENTRIES``).

    Raises:
        ExtractionError: A limit is exceeded, an entry name is absolute or climbs out with
            ``..``, or the ZIP is corrupt.
    """
    path = Path(path)
    infos = _zip_infolist(path)
    if len(infos) > max_entries:
        raise ExtractionError(
            f"{path.name} holds {len(infos):,} ZIP entries, over the limit of {max_entries:,} "
            "(possible zip bomb) — if the file is genuine, raise KBFLOW_ZIP_MAX_ENTRIES"
        )
    for info in infos:
        if _unsafe_name(info.filename):
            raise ExtractionError(
                f"{path.name} holds a ZIP entry with an unsafe name {info.filename!r} (absolute, "
                "or climbing out with '..') — a genuine Office file never does; re-save it in "
                "its own application"
            )
    total = sum(info.file_size for info in infos)
    if total > max_total_bytes:
        raise ExtractionError(
            f"{path.name} would unpack to {_mb(total)} MB, over the limit of "
            f"{_mb(max_total_bytes)} MB (possible zip bomb) — if the file is genuine, raise "
            "KBFLOW_ZIP_MAX_TOTAL_MB"
        )
    # Small entries compress at any ratio (a run of identical XML) and are harmless.
    min_bytes = 1 << 20
    for info in infos:
        if info.file_size >= min_bytes and _ratio(info.file_size, info.compress_size) > max_ratio:
            raise ExtractionError(
                f"{path.name}: ZIP entry {info.filename!r} has compression ratio "
                f"{_ratio(info.file_size, info.compress_size):,.0f}:1 ({_mb(info.file_size)} MB "
                f"from {info.compress_size:,} bytes), over the limit of {max_ratio:,.0f}:1 "
                "(possible zip bomb) — if the file is genuine, raise KBFLOW_ZIP_MAX_RATIO"
            )
    packed = sum(info.compress_size for info in infos)
    if total >= min_bytes and _ratio(total, packed) > max_ratio:
        raise ExtractionError(
            f"{path.name} has overall compression ratio {_ratio(total, packed):,.0f}:1 "
            f"({_mb(total)} MB from {packed:,} bytes), over the limit of {max_ratio:,.0f}:1 "
            "(possible zip bomb) — if the file is genuine, raise KBFLOW_ZIP_MAX_RATIO"
        )


# --- binary formats ---------------------------------------------------------------------------


def _binary_format(path: Path, head: bytes, declared: str, data: bytes | None) -> str | None:
    """The format whose magic number `head` carries, or None if it has none we know (``data``:
    the file's bytes, when held in memory)."""
    if head.startswith(b"%PDF-"):
        return "pdf"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):  # classic and BigTIFF
        return "tiff"
    if head.startswith(b"RIFF"):
        return {b"WEBP": "webp", b"WAVE": "wav", b"AVI ": "avi"}.get(head[8:12])
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"OggS"):
        return "ogg"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "webm" if _ebml_doctype(head) == b"webm" else "mkv"
    if head[4:8] == b"ftyp":
        return _iso_bmff_format(path, head[8:12])
    if head[4:8] in _QUICKTIME_ATOMS and 8 <= int.from_bytes(head[:4], "big") <= _size(path, data):
        # Legacy QuickTime layout; MP4 and M4A can start the same way, so trust such a name.
        return declared if declared in ("mp4", "m4a") else "mov"
    if head.startswith(b"ID3") and _valid_id3_header(head):
        return _after_id3(path, head, data)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return _zip_format(path, head, data)
    if head.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"):
        raise UnsupportedFormat(
            f"{path.name}: an OLE compound file (a legacy .doc/.xls/.ppt, or a password-protected "
            "Office file) — save it as .docx, .pptx or .xlsx without a password and ingest that"
        )
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):  # a UTF-16 BOM, not an audio frame sync
        return None
    audio = _audio_frame_format(head)
    if audio is not None:
        return audio
    return _pdf_after_junk(path, head, data)


def _pdf_after_junk(path: Path, head: bytes, data: bytes | None) -> str | None:
    """A PDF with junk before its header, as readers accept; its end must look like a PDF too,
    so a text that merely mentions "%PDF-" near its top is not taken for one."""
    if b"%PDF-" not in head[: _PDF_JUNK_BYTES + 5]:
        return None
    with _open(path, data) as fh:
        fh.seek(max(0, _size(path, data) - _TAIL_BYTES))
        tail = fh.read()
    return "pdf" if b"%%EOF" in tail or b"startxref" in tail else None


def _ebml_doctype(head: bytes) -> bytes:
    """The DocType ("matroska" or "webm") from a Matroska EBML header."""
    at = head.find(b"\x42\x82", 4, 64)
    if at < 0 or at + 2 >= len(head):
        return b""
    size_byte = head[at + 2]
    if not size_byte & 0x80:  # only the one-byte size form is used for this short string
        return b""
    size = size_byte & 0x7F
    return head[at + 3 : at + 3 + size]


def _iso_bmff_format(path: Path, brand: bytes) -> str:
    if brand in _M4A_BRANDS:
        return "m4a"
    if brand == b"qt  ":
        return "mov"
    if brand in _IMAGE_BRANDS:
        raise UnsupportedFormat(
            f"{path.name}: a HEIF/AVIF image (brand {brand.decode('latin-1').strip()!r}), which "
            "kbflow does not read — convert it to PNG or JPEG and ingest that"
        )
    return "mp4"


def _valid_id3_header(head: bytes) -> bool:
    """ID3v2.2-2.4: version 2-4, and a size of four 7-bit bytes ("ID3 tags…" in a text is not)."""
    return len(head) >= 10 and head[3] in (2, 3, 4) and all(b < 0x80 for b in head[6:10])


def _after_id3(path: Path, head: bytes, data: bytes | None) -> str:
    """An ID3v2 tag can precede MP3, AAC or FLAC data: look past it."""
    size = 0
    for byte in head[6:10]:  # a "syncsafe" integer: 7 bits per byte
        size = (size << 7) | (byte & 0x7F)
    end = 10 + size + (10 if head[5] & 0x10 else 0)  # flag 0x10: a footer follows
    with _open(path, data) as fh:
        fh.seek(end)
        after = fh.read(4096)
    if after.startswith(b"fLaC"):
        return "flac"
    return _audio_frame_format(after) or "mp3"


# MPEG audio frame header tables: bitrates in kbit/s by (MPEG-1?, layer), sample rates by version.
_BITRATES = {
    (True, 1): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 3): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_SAMPLE_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def _audio_frame_format(data: bytes) -> str | None:
    """The audio format of a raw frame header: ADTS is AAC, an MPEG audio frame is MP3.

    An MPEG frame is checked against the next one when the data holds it, so random bytes that
    happen to start 0xFFE… are not taken for audio.
    """
    if len(data) < 4 or data[0] != 0xFF:
        return None
    if data[1] in (0xF1, 0xF9):
        return "aac"
    length = _mpeg_frame_length(data[:4])
    if length is None:
        return None
    if len(data) >= length + 4 and _mpeg_frame_length(data[length : length + 4]) is None:
        return None
    return "mp3"


def _mpeg_frame_length(header: bytes) -> int | None:
    """The byte length of the MPEG audio frame this header starts, or None if it is not a valid
    header (free-format bitrate, which is rare and gives no length, counts as not valid)."""
    if len(header) < 4 or header[0] != 0xFF or header[1] & 0xE0 != 0xE0:
        return None
    version = (header[1] >> 3) & 0b11  # 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5, 1: reserved
    layer = 4 - ((header[1] >> 1) & 0b11)  # bits 11/10/01 are layers I/II/III; 00 reserved
    bitrate_index = header[2] >> 4
    rate_index = (header[2] >> 2) & 0b11
    if version == 1 or layer == 4 or bitrate_index in (0, 15) or rate_index == 3:
        return None
    bitrate = _BITRATES[(version == 3, layer)][bitrate_index] * 1000
    sample_rate = _SAMPLE_RATES[version][rate_index]
    padding = (header[2] >> 1) & 1
    if layer == 1:
        return (12 * bitrate // sample_rate + padding) * 4
    samples_per_byte = 72 if layer == 3 and version != 3 else 144
    return samples_per_byte * bitrate // sample_rate + padding


# --- ZIP ---------------------------------------------------------------------------------------


def _zip_format(path: Path, head: bytes, data: bytes | None) -> str:
    names = {info.filename for info in _zip_infolist(path, data)}
    for part, fmt in _OOXML_PARTS.items():
        if part in names:
            return fmt
    if head[30:38] == b"mimetype":  # OpenDocument and EPUB store their type first, uncompressed
        start = 38 + int.from_bytes(head[28:30], "little")  # after the local header's extra field
        length = min(int.from_bytes(head[18:22], "little"), 100)
        mimetype = head[start : start + length].decode("ascii", "replace")
        raise UnsupportedFormat(
            f"{path.name}: a ZIP-based {mimetype!r} file (OpenDocument or EPUB), which kbflow "
            "does not read — save it as .docx, .pptx or .xlsx (or export to PDF) and ingest that"
        )
    raise UnsupportedFormat(
        f"{path.name}: a ZIP archive that is not a Word, PowerPoint or Excel file — unzip it "
        "and ingest its files"
    )


def _zip_infolist(path: Path, data: bytes | None = None) -> list[zipfile.ZipInfo]:
    try:
        with zipfile.ZipFile(path if data is None else io.BytesIO(data)) as archive:
            return archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise ExtractionError(
            f"{path.name} starts like a ZIP (Office) file but its central directory cannot be "
            f"read ({exc}) — it is corrupt or truncated; re-download or re-export it"
        ) from exc
    except OSError as exc:
        raise ExtractionError(
            f"cannot read {path.name}: {exc.strerror or exc} — check the file and its permissions"
        ) from exc


def _unsafe_name(name: str) -> bool:
    name = name.replace("\\", "/")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return True
    return ".." in PurePosixPath(name).parts


def _ratio(uncompressed: int, compressed: int) -> float:
    return uncompressed / compressed if compressed > 0 else float("inf")


def _mb(size: int) -> str:
    return f"{size / 2**20:,.1f}"


# --- text --------------------------------------------------------------------------------------


def _text_format(head: bytes, declared: str, *, whole_file: bool) -> str | None:
    """The text format of `head`, or None if it is not text.

    UTF-8 (a multi-byte character cut off at the end of the head is fine) and UTF-16 with a BOM
    count as text. So does a file named as text in a legacy 8-bit encoding (cp1252 CSV exports
    are common): no NUL bytes and few control characters.
    """
    text = _decode(head, whole_file=whole_file)
    if text is None:
        if declared not in TEXT_FORMATS or b"\x00" in head:
            return None
        text = head.decode("latin-1")
    if len(_CONTROL_CHARS_RE.findall(text)) > max(1, len(text) // 100):
        return None
    if _looks_like_html(text):
        return "html"
    return declared if declared in TEXT_FORMATS else "txt"


def _decode(head: bytes, *, whole_file: bool) -> str | None:
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16-le" if head[0] == 0xFF else "utf-16-be"
        data = head[2:]
    else:
        encoding = "utf-8-sig"
        data = head
    try:
        # An incremental decoder leaves a character cut off by the head's end pending, not wrong.
        text = codecs.getincrementaldecoder(encoding)().decode(data, final=whole_file)
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def _looks_like_html(text: str) -> bool:
    """HTML starts (after whitespace, comments or an XML prolog) with a doctype or <html>, or
    starts with some tag and has <html>, <head> or <body> near its top."""
    leading = _LEADING_COMMENTS_RE.match(text)
    rest = text[leading.end() :] if leading else text
    if _HTML_START_RE.match(rest):
        return True
    return rest.startswith("<") and _HTML_TAG_RE.search(rest[:1024]) is not None


def _size(path: Path, data: bytes | None = None) -> int:
    return path.stat().st_size if data is None else len(data)


def _open(path: Path, data: bytes | None) -> BinaryIO:
    return path.open("rb") if data is None else io.BytesIO(data)


def _read_head(path: Path) -> bytes:
    try:
        with path.open("rb") as fh:
            return fh.read(_HEAD_BYTES)
    except FileNotFoundError as exc:
        raise ExtractionError(f"{path} does not exist — check the path and try again") from exc
    except IsADirectoryError as exc:
        raise ExtractionError(f"{path} is a folder — pass a file") from exc
    except OSError as exc:
        raise ExtractionError(
            f"cannot read {path}: {exc.strerror or exc} — check the path and its permissions"
        ) from exc
