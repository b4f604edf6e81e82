"""Find what to ingest: files, directories, globs and JSONL corpora, each with a content hash."""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kbflow.errors import ConfigError, ExtractionError
from kbflow.models import ExtractedDocument, Section
from tasks.chunk import markdown_to_sections

log = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson")


@dataclass(frozen=True)
class Source:
    """One document to ingest: a file, or one record of a JSONL corpus.

    ``source_key`` identifies the document across runs (its versions share it); ``content_hash``
    decides whether it changed.
    """

    source_key: str
    uri: str
    content_hash: str
    path: Path
    record: tuple[str, str] | None = None  # (title, text) for corpus records
    markdown: bool = False  # the record's text is Markdown: split it at its headings

    @property
    def name(self) -> str:
        return self.path.name if self.record is None else self.source_key.rsplit("#", 1)[-1]


def is_jsonl(path: Path) -> bool:
    return path.name.lower().endswith(JSONL_SUFFIXES)


def discover_sources(inputs: list[str], supported_suffixes: frozenset[str]) -> list[Source]:
    """Expand paths, directories (recursively) and globs into sources, in a stable order.

    Raises:
        ConfigError: an input matches nothing.
    """
    files: dict[Path, None] = {}
    for item in inputs:
        matched = _expand(item, supported_suffixes)
        if not matched:
            raise ConfigError(
                f"{item!r} matches no file kbflow can ingest. Give a file, a directory or a "
                f"glob; supported: {', '.join(sorted(supported_suffixes | set(JSONL_SUFFIXES)))}."
            )
        for path in matched:
            files[path] = None
    sources: list[Source] = []
    for path in files:
        if is_jsonl(path):
            sources.extend(jsonl_sources(path))
        else:
            sources.append(
                Source(
                    source_key=path.as_uri(),
                    uri=path.as_uri(),
                    content_hash=file_sha256(path),
                    path=path,
                )
            )
    return sources


def _expand(item: str, supported: frozenset[str]) -> list[Path]:
    def wanted(p: Path) -> bool:
        return p.is_file() and (p.suffix.lower() in supported or is_jsonl(p))

    path = Path(item).expanduser()
    if path.is_dir():
        return sorted(p.resolve() for p in path.rglob("*") if wanted(p))
    if path.is_file():
        return [path.resolve()]  # an explicit file is always tried (errors are reported per file)
    return sorted(Path(p).resolve() for p in glob.glob(item, recursive=True) if wanted(Path(p)))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def jsonl_sources(path: Path) -> Iterator[Source]:
    """One source per record of a BEIR-style corpus: ``{"_id", "title", "text"}`` per line."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    base = path.resolve().as_uri()
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    rid = str(row.get("_id") or row.get("id"))
                    title = str(row.get("title") or "").strip()
                    text = str(row.get("text") or "").strip()
                except (json.JSONDecodeError, AttributeError) as exc:
                    raise ExtractionError(
                        f"{path.name} line {lineno} is not a JSON object ({exc}); fix or remove "
                        "the line and re-run."
                    ) from exc
                canonical = json.dumps([title, text], ensure_ascii=False)
                yield Source(
                    source_key=f"{base}#{rid}",
                    uri=f"{base}#{rid}",
                    content_hash=hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
                    path=path,
                    record=(title, text),
                )
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ExtractionError(
            f"could not read the corpus {path.name}: {exc}. Check the file is complete "
            "(re-download it) and UTF-8 JSON lines."
        ) from exc


def record_to_document(source: Source) -> ExtractedDocument:
    """A corpus record as a document: its title is the heading of its one section."""
    assert source.record is not None
    title, text = source.record
    if not text and not title:
        raise ExtractionError(f"record {source.name} in {source.path.name} has no title or text.")
    if source.markdown:
        return ExtractedDocument(
            title=title or source.name,
            uri=source.uri,
            sections=tuple(markdown_to_sections(text, title=title or source.name)),
            source_format="md",
        )
    heading = (title,) if title else ()
    return ExtractedDocument(
        title=title or source.name,
        uri=source.uri,
        sections=(Section(heading, text or title),),
        source_format="jsonl",
    )
