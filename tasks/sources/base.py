"""What a source connector gives the sync: the items of one source, each new, changed,
unchanged (known without reading its content) or failed.

A connector (`tasks.sources.filesystem`, `website`, `sql`, `rest`) walks its whole source once
per sync and yields one `Item` per item it finds, in any order. It is handed what the previous
sync recorded of each item (`Prior`: the version token and the connector's own ``meta``), so it
can tell an unchanged item without reading it (an object's ETag, a file's mtime and size, an
HTTP 304 to a conditional request, a row's updated-at column).

The sync (`tasks.sources.sync`) decides everything else: content hashes, new versions,
withdrawals of items no longer listed. It applies withdrawals only when the walk was complete:
a connector raises `SourceError` when it could not list its source (nothing is withdrawn then)
and sets ``complete = False`` when a cap stopped it early.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.errors import KbflowError


class SourceError(KbflowError, RuntimeError):
    """The source could not be listed at all (unreachable, refused, misconfigured): the sync
    stops, withdraws nothing and records the message."""


@dataclass(frozen=True)
class Prior:
    """What the last sync recorded of one item."""

    version: str | None
    content_hash: str | None
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Item:
    """One item of a source as this sync found it.

    Attributes:
        key: The item's stable id in its source (a path, a URL, a primary key). Its documents'
            versions share it.
        uri: Where a reader finds it (``s3://bucket/a.pdf``, ``https://site/page``); cited.
        name: A file name whose suffix decides the extractor (``a.pdf``, ``page.html``,
            ``row-17.md``).
        version: A token that changes when the item changes (ETag, ``mtime:size``, a row's
            updated-at), or None when only the content tells.
        data: The item's bytes; None when ``unchanged`` or ``error``.
        unchanged: The connector knows, without reading, that it is as last synced.
        error: Why this item could not be read (reported; the rest of the source syncs).
        meta: Anything the connector wants back next sync in `Prior.meta` (ETag, links).
    """

    key: str
    uri: str
    name: str
    version: str | None = None
    data: bytes | None = None
    unchanged: bool = False
    error: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)


class Connector(Protocol):
    """One kind of source. ``complete`` is read after the walk."""

    complete: bool

    def items(self, prior: Mapping[str, Prior]) -> Iterator[Item]: ...


@dataclass(frozen=True)
class Limits:
    """A source's caps and patterns, shared by every kind.

    ``include``/``exclude`` are glob patterns (``fnmatch``, ``*`` crosses ``/``) matched
    against an item's key; an empty ``include`` takes everything.
    """

    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    max_items: int = 10_000
    max_item_bytes: int = 50_000_000

    def wanted(self, key: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(key, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(key, p) for p in self.exclude)


def too_big(item_key: str, size: int, limits: Limits) -> str:
    """The error of an item over ``max_item_bytes``."""
    return (
        f"{item_key} is {size:,} bytes, over this source's max_item_bytes "
        f"({limits.max_item_bytes:,}); raise it with `kbflow sources update NAME "
        "--max-item-bytes N` or exclude the item"
    )
