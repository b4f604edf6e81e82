"""Helpers the ingest tests share (and the review crash test): the real MiniLM with its vectors
remembered across runs, and files that start with each format's magic number."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class MemoEmbedder:
    """The real MiniLM, with its vectors remembered across the test's many runs."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_id = inner.model_id  # its vectors are the real model's
        self.dim = inner.dim
        self.memo: dict[str, list[float]] = {}

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.memo]
        if missing:
            self.memo.update(zip(missing, self.inner.embed_documents(missing), strict=True))
        return [self.memo[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.inner.embed_query(text)  # type: ignore[no-any-return]


# --- magic numbers ------------------------------------------------------------------------------


def _mp3_frames(count: int) -> bytes:
    # MPEG-1 Layer III, 128 kbit/s, 44.1 kHz, no padding: 144 * 128000 // 44100 = 417 bytes.
    return (b"\xff\xfb\x90\x00" + bytes(413)) * count


def _ebml(doctype: bytes) -> bytes:
    body = b"\x42\x86\x81\x01" + b"\x42\x82" + bytes([0x80 | len(doctype)]) + doctype
    return b"\x1a\x45\xdf\xa3" + bytes([0x80 | len(body)]) + body + bytes(64)


def _id3(payload: bytes) -> bytes:
    size = 300  # a tag of 300 bytes, as four 7-bit bytes
    syncsafe = bytes([(size >> 21) & 0x7F, (size >> 14) & 0x7F, (size >> 7) & 0x7F, size & 0x7F])
    return b"ID3\x04\x00\x00" + syncsafe + bytes(size) + payload


MAGIC_CASES = [
    ("a.png", b"\x89PNG\r\n\x1a\n" + bytes(32), "png"),
    ("a.jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(32), "jpeg"),
    ("a.tiff", b"MM\x00*\x00\x00\x00\x08" + bytes(32), "tiff"),
    ("a.webp", b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(32), "webp"),
    ("a.wav", b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(32), "wav"),
    ("a.avi", b"RIFF\x24\x00\x00\x00AVI LIST" + bytes(32), "avi"),
    ("a.flac", b"fLaC\x00\x00\x00\x22" + bytes(40), "flac"),
    ("a.ogg", b"OggS\x00\x02" + bytes(40), "ogg"),
    ("a.mkv", _ebml(b"matroska"), "mkv"),
    ("a.webm", _ebml(b"webm"), "webm"),
    ("a.m4a", b"\x00\x00\x00\x20ftypM4A \x00\x00\x00\x00M4A isom" + bytes(40), "m4a"),
    ("a.mov", b"\x00\x00\x00\x14ftypqt  \x00\x00\x00\x00qt  " + bytes(40), "mov"),
    ("a.mp4", b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00isomiso2mp41" + bytes(40), "mp4"),
    ("a.aac", b"\xff\xf1\x50\x80\x02\x1f\xfc" + bytes(64), "aac"),
    ("a.mp3", _mp3_frames(3), "mp3"),
    ("tagged.mp3", _id3(_mp3_frames(2)), "mp3"),
    ("tagged.flac", _id3(b"fLaC\x00\x00\x00\x22" + bytes(40)), "flac"),
    ("a.pdf", b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n%%EOF\n", "pdf"),
    # Readers accept junk before the header (here a stray HTTP header) when the end is a PDF's.
    (
        "b.pdf",
        b"HTTP/1.1 200 OK\r\n\r\n%PDF-1.4\n1 0 obj\n<<>>\nendobj\nstartxref\n9\n%%EOF",
        "pdf",
    ),
]
