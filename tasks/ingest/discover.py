"""Find what to ingest: files, directories, globs and JSONL corpora, each with a content hash."""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import ConfigError, ExtractionError
from core.models import ExtractedDocument, Section
from sinks.snapshot import sha256_file as file_sha256  # one way to hash a file (re-exported)
from tasks.text.chunk import markdown_to_sections

log = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson")


@dataclass(frozen=True)
class Source:
    """One document to ingest: a file, one record of a JSONL corpus, or a file's bytes held in
    memory (``data``: a synced item, its format one that extraction reads from memory, see
    `tasks.ingest.extract.reads_in_memory`; ``path`` then only names it, and its document
    cites ``uri``).

    ``source_key`` identifies the document across runs (its versions share it); ``content_hash``
    decides whether it changed.
    """

    source_key: str
    uri: str
    content_hash: str
    path: Path
    record: tuple[str, str] | None = None  # (title, text) for corpus records
    markdown: bool = False  # the record's text is Markdown: split it at its headings
    data: bytes | None = field(default=None, repr=False)  # the file's bytes, held in memory
    review_note: str | None = None  # said to the reviewer only, never chunked (a draft's banner)

    @property
    def name(self) -> str:
        return self.path.name if self.record is None else self.source_key.rsplit("#", 1)[-1]


def is_jsonl(path: Path) -> bool:
    return path.name.lower().endswith(JSONL_SUFFIXES)


@dataclass
class Discovery:
    """What discovery found: the sources, and the paths it could not or would not take, each
    with its reason (reported per path in the ingest report; the rest is ingested)."""

    sources: list[Source] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (path, note): links not followed


def discover(inputs: list[str], supported_suffixes: frozenset[str]) -> Discovery:
    """Expand paths, directories (recursively) and globs into sources, in a stable order.

    Symbolic links are never followed: one named on the command line is refused (name its
    target instead), and one met inside a directory or matched by a glob is skipped with a
    note, so nothing outside the tree you named is read. A file or folder that cannot be read
    is skipped with its reason; the rest is ingested.

    Raises:
        ConfigError: an input is empty, or names nothing that exists or that kbflow can ingest.
    """
    found = Discovery()
    files: dict[Path, None] = {}
    for item in inputs:
        if not item or not item.strip():
            raise ConfigError(
                "an empty path was given. Name the files or folders to ingest (use '.' for the "
                "current folder, explicitly)."
            )
        before = (len(found.skipped), len(found.notes))
        matched = _expand(item, supported_suffixes, found)
        if not matched and (len(found.skipped), len(found.notes)) == before:
            raise ConfigError(
                f"{item!r} matches no file kbflow can ingest. Give a file, a directory or a "
                f"glob; supported: {', '.join(sorted(supported_suffixes | set(JSONL_SUFFIXES)))}."
            )
        for path in matched:
            files[path] = None
    for path in files:
        try:
            if is_jsonl(path):
                found.sources.extend(list(jsonl_sources(path)))
            else:
                digest = file_sha256(path)
                found.sources.append(
                    Source(source_key=path.as_uri(), uri=path.as_uri(), content_hash=digest,
                           path=path)
                )  # fmt: skip
        except (OSError, ExtractionError) as exc:
            found.skipped.append((str(path), _unreadable(exc)))
            log.warning("skipped %s: %s", path, exc)
    return found


def _unreadable(exc: BaseException) -> str:
    if isinstance(exc, PermissionError):
        return "cannot be read: permission denied. Grant read access and re-run."
    if isinstance(exc, OSError):
        return f"cannot be read: {exc.strerror or exc}. Check the file and re-run."
    return str(exc)


def _link_target(path: Path) -> str:
    try:
        return str(path.readlink())
    except OSError:
        return "?"


def _expand(item: str, supported: frozenset[str], found: Discovery) -> list[Path]:
    def wanted(p: Path) -> bool:
        return p.suffix.lower() in supported or is_jsonl(p)

    path = Path(item).expanduser()
    if path.is_symlink():
        found.skipped.append(
            (
                str(path),
                f"is a symbolic link (to {_link_target(path)}): kbflow never follows links; "
                "name the file or folder it points to instead.",
            )
        )
        return []
    if path.is_dir():
        root = path.resolve()
        return sorted(p.resolve() for p in _walk(path, root, wanted, found))
    if path.exists():
        if not path.is_file():
            found.skipped.append((str(path), "is not a regular file (a device, pipe or socket)."))
            return []
        return [path.resolve()]  # an explicit file is always tried (errors are reported per file)
    out: list[Path] = []
    for name in sorted(glob.glob(item, recursive=True)):
        match = Path(name)
        if match.is_symlink():
            found.notes.append(
                (str(match), f"symbolic link (to {_link_target(match)}) not followed")
            )
        elif match.is_file() and wanted(match):
            out.append(match.resolve())
    return out


def _walk(
    folder: Path, root: Path, wanted: Callable[[Path], bool], found: Discovery
) -> Iterator[Path]:
    """Regular files under ``folder``, depth first; links and unreadable folders are reported,
    never followed or fatal."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        found.skipped.append((str(folder), f"folder {_unreadable(exc)}"))
        log.warning("skipped folder %s: %s", folder, exc)
        return
    for entry in entries:
        child = Path(entry.path)
        if entry.is_symlink():
            target = _link_target(child)
            inside = _inside(child, root)
            where = (
                "inside the folder (its target is ingested on its own)"
                if inside
                else ("out of the folder")
            )
            found.notes.append(
                (str(child), f"symbolic link (to {target}) not followed: it points {where}")
            )
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from _walk(child, root, wanted, found)
            elif entry.is_file(follow_symlinks=False) and wanted(child):
                yield child
        except OSError as exc:
            found.skipped.append((str(child), _unreadable(exc)))


def _inside(link: Path, root: Path) -> bool:
    try:
        return link.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a loop, or a dangling chain
        return False


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
