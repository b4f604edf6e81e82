"""Misbehaving extractors for the isolation tests, importable by the spawned worker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from core.errors import ExtractionError
from core.models import ExtractedDocument, Section


def echo(path: Path, **_: Any) -> ExtractedDocument:
    """A well-behaved extractor: the file's text as one section, and the worker's pid."""
    return ExtractedDocument(
        title=path.stem,
        uri=path.as_uri(),
        sections=(Section((), path.read_text()),),
        source_format="txt",
        meta={"pid": os.getpid()},
    )


def hang(path: Path, **_: Any) -> ExtractedDocument:
    """Hangs on files whose name says so, like a parser stuck in a loop."""
    if "hang" in path.name:
        while True:
            time.sleep(1)
    return echo(path)


def segfault(path: Path, **_: Any) -> ExtractedDocument:
    """Dies the way a native parser crash does."""
    if "crash" in path.name:
        os.kill(os.getpid(), signal.SIGSEGV)
    return echo(path)


def balloon(path: Path, **_: Any) -> ExtractedDocument:
    """Allocates memory without end, like a decompression bomb."""
    if "bomb" in path.name:
        hoard = []
        while True:
            hoard.append(bytearray(32 * 1024 * 1024))
            time.sleep(0.02)
    return echo(path)


def refuse(path: Path, **_: Any) -> ExtractionError:
    raise ExtractionError(f"{path.name} is refused on purpose")


def bug(path: Path, **_: Any) -> ExtractedDocument:
    raise KeyError("a parser bug")
