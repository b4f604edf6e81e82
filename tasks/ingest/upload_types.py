"""What an upload may be, and whether it is what it says.

An upload says what it is three times: its declared type (the part's ``Content-Type``), its
file name and its bytes. `upload_kind` maps the declared type to one of the formats kbflow reads
(`tasks.ingest.sniff.FORMATS`) and refuses a name that claims another one, before a byte is
stored; `check_upload_bytes` then refuses bytes that show another format, so a PDF declared as
audio never reaches the media pipeline. Every refusal is an `UnsupportedMediaType` (HTTP 415)
that lists the accepted types.
"""

from __future__ import annotations

from pathlib import Path

from core.errors import UnsupportedFormat, UnsupportedMediaType
from tasks.ingest.sniff import TEXT_FORMATS, declared_format, detect_format

ACCEPTED_TYPES: dict[str, str] = {
    "application/pdf": "pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": "pptx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
    "text/html": "html",
    "application/xhtml+xml": "html",
    "text/markdown": "md",
    "text/x-markdown": "md",
    "text/csv": "csv",
    "text/plain": "txt",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/tiff": "tiff",
    "image/webp": "webp",
    "audio/mpeg": "mp3",
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/wave": "wav",
    "audio/flac": "flac",
    "audio/x-flac": "flac",
    "audio/mp4": "m4a",
    "audio/x-m4a": "m4a",
    "audio/aac": "aac",
    "audio/ogg": "ogg",
    "video/mp4": "mp4",
    "video/quicktime": "mov",
    "video/x-msvideo": "avi",
    "video/x-matroska": "mkv",
    "video/webm": "webm",
}
"""Declared type (lower case, without parameters) → the format kbflow reads it as."""

UNDECLARED_TYPES = frozenset({"", "application/octet-stream"})
"""No real declaration (what curl sends for a .docx): the file's name decides, its bytes must
agree."""

# Formats one file's bytes cannot always tell apart: plain-text kinds (text/plain is declared
# for Markdown and CSV too), and the ISO-BMFF family (an .m4a may carry an mp4 brand).
_SAME_BYTES = (frozenset(TEXT_FORMATS - {"html"}), frozenset({"mp4", "m4a", "mov"}))


def accepted_types() -> list[str]:
    """The declared types an upload may carry, sorted."""
    return sorted(ACCEPTED_TYPES)


def upload_kind(filename: str, content_type: str | None) -> str:
    """The format an upload is read as, from its declared type and name (before its bytes).

    Args:
        filename: The upload's (already safe) file name.
        content_type: Its declared ``Content-Type``; parameters (``; charset=…``) are ignored.

    Raises:
        UnsupportedMediaType: the declared type is not accepted, or the name's extension is a
            format kbflow knows and not the declared one (``report.pdf`` sent as ``audio/mpeg``).
    """
    declared = (content_type or "").split(";", 1)[0].strip().lower()
    named = declared_format(Path(filename))
    known_name = named if named in _known() else ""
    if declared in UNDECLARED_TYPES:
        if not known_name:
            raise UnsupportedMediaType(
                f"{filename!r} declares no type ({declared or 'none'}) and its name has no "
                f"extension kbflow reads: send the file's Content-Type, one of {_listed()}"
            )
        return known_name
    kind = ACCEPTED_TYPES.get(declared)
    if kind is None:
        raise UnsupportedMediaType(
            f"{filename!r} is declared as {declared!r}, which kbflow does not ingest; "
            f"accepted types: {_listed()}"
        )
    if declared == "text/plain" and known_name in _SAME_BYTES[0]:
        return known_name  # a Markdown or CSV file sent as plain text
    if known_name and known_name != kind:
        raise UnsupportedMediaType(
            f"{filename!r} is named as .{known_name} but declared as {declared!r} ({kind}): "
            f"send the type that matches the file; accepted types: {_listed()}"
        )
    return kind


def stored_name(filename: str, kind: str) -> str:
    """The name to store an upload under: its own, with ``.kind`` appended when its extension
    is not the kind's (ingest picks files by their extension)."""
    if declared_format(Path(filename)) == kind:
        return filename
    return f"{filename}.{kind}"


def check_upload_bytes(path: Path, kind: str) -> None:
    """Refuse a stored upload whose bytes show another format than the one it was sent as.

    Raises:
        UnsupportedMediaType: its bytes show another format, or none kbflow reads.
        ExtractionError: it is empty or unreadable.
    """
    try:
        found = detect_format(path).format
    except UnsupportedFormat as exc:
        raise UnsupportedMediaType(
            f"{path.name}: its bytes are no format kbflow reads, though it was sent as {kind}; "
            f"accepted types: {_listed()}"
        ) from exc
    if found == kind or any(found in group and kind in group for group in _SAME_BYTES):
        return
    raise UnsupportedMediaType(
        f"{path.name} was sent as {kind}, but its bytes are {found}: send the type that "
        f"matches the file; accepted types: {_listed()}"
    )


def _known() -> frozenset[str]:
    return frozenset(ACCEPTED_TYPES.values())


def _listed() -> str:
    return ", ".join(accepted_types())
