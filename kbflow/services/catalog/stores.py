"""Copy one org's points between vector stores (`kbflow store migrate`): the embedded Qdrant
Edge store of ``KBFLOW_HOME`` and a Qdrant server (or qdrant-client local mode) by URL; and
re-embed chunks with the configured embedding model (`kbflow store reembed`, see `reembed`).

A copy keeps every point as it is — the same id, both named vectors (``dense`` and the sparse
``bm25``) and the payload unchanged — so search answers the same on either side. It upserts
by point id, so running it again copies the same points onto themselves and leaves the counts
as they were. After copying it counts the org's points on both sides, in all and per review
status, and reports any difference instead of calling the copy done.

What the destination already holds for the org is kept unless ``replace``: points the source
no longer has (a document deleted since an earlier copy) then show up as a count mismatch, and
``replace`` deletes the org's points in the destination before copying, so the destination's
copy of the org is exactly the source's. The source is only read.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pydantic import Field, SecretStr

from core import ids
from core.contracts import Report
from core.errors import ConfigError, NotFound, StoreBusy, StoreError
from core.models import ChunkPayload
from core.settings import Settings

if TYPE_CHECKING:
    from tasks.ingest.reembed import ReembedReport

EMBEDDED = "embedded"
"""How a report names the embedded Edge store side (its folder follows in ``source``)."""


class MigrationReport(Report):
    """What `migrate_org` copied and how the two sides' counts compare."""

    org: str = Field(description="The org whose points were copied.")
    source: str = Field(description="Where the points came from (a URL, or the Edge folder).")
    destination: str = Field(description="Where they went (a URL, or the Edge folder).")
    collection: str | None = Field(description="The Qdrant collection on the URL side(s).")
    copied: int = Field(description="Points upserted into the destination.")
    replaced: int = Field(description="The org's points deleted in the destination first.")
    source_count: int = Field(description="The org's points in the source.")
    destination_count: int = Field(description="The org's points in the destination after.")
    source_by_status: dict[str, int] = Field(description="Source points per review status.")
    destination_by_status: dict[str, int] = Field(
        description="Destination points per review status, after the copy."
    )
    matched: bool = Field(description="Whether the counts agree, in all and per status.")
    problems: list[str] = Field(description="Each difference, with what to do about it.")
    seconds: float = Field(description="Wall-clock time of the copy and the check.")


def migrate_org(
    settings: Settings,
    org: str,
    *,
    to_url: str | None,
    from_url: str | None = None,
    collection: str | None = None,
    api_key: str | None = None,
    batch: int = 256,
    replace: bool = False,
    progress: Any = None,
) -> MigrationReport:
    """Copy ``org``'s points from one store to another and check the counts.

    A side given as None is the embedded Edge store of ``settings.home``, whatever
    ``KBFLOW_QDRANT_URL`` says; a URL side is a Qdrant server (``http://…``), ``:memory:`` or
    a qdrant-client local folder (``file:///path``), in ``collection`` (default
    ``settings.stores.qdrant_collection``). The embedded store is opened as its owner (the copy
    needs its export path, which a process sharing it cannot offer), so it must not be held by
    ``kbflow serve`` for the copy.

    Args:
        progress: called as ``(stage, done, total)`` after each batch.

    Returns:
        The report; ``matched`` is False (with ``problems``) when the counts differ.

    Raises:
        ConfigError: no URL side, the same store on both sides, or a batch below 1.
        NotFound: the source holds no point of ``org``.
        StoreError / StoreBusy: a side cannot be opened (nothing is written then).
    """
    ids.org_id(org)
    if batch < 1:
        raise ConfigError(f"--batch must be at least 1, got {batch}")
    if to_url is None and from_url is None:
        raise ConfigError(
            "give --to URL to copy from the embedded store to a Qdrant server, or --from URL "
            "to copy from a server into the embedded store (both for server to server)"
        )
    collection = collection or settings.stores.qdrant_collection
    if _same_place(from_url, to_url):
        raise ConfigError(
            f"the source and the destination are the same store ({to_url}, collection "
            f"{collection}): a copy onto itself changes nothing. Give a different --to or "
            "--from, or a different --collection on one of two servers."
        )
    started = time.perf_counter()
    with (
        _open_side(settings, from_url, collection, api_key) as source,
        _open_side(settings, to_url, collection, api_key) as destination,
    ):
        source_name = _describe(settings, from_url)
        source_count = source.count(org)
        if source_count == 0:
            raise NotFound(
                f"org {org!r} has no points in {source_name}: check the org id (`kbflow orgs "
                "list`) and the source (--from; the embedded store of KBFLOW_HOME when omitted)"
            )
        replaced = 0
        if replace:
            replaced = destination.count(org)
            if replaced:
                destination.delete_org(org)
        copied = 0
        source_by_status: Counter[str] = Counter()
        pending: list[Any] = []
        stage = f"copy {org}"
        for point in source.export_points(org, batch=batch):
            source_by_status[_status(point.payload)] += 1
            pending.append(point)
            if len(pending) >= batch:
                destination.upsert(pending)
                copied += len(pending)
                pending = []
                if progress is not None:
                    progress(stage, copied, source_count)
        if pending:
            destination.upsert(pending)
            copied += len(pending)
        if progress is not None:
            progress(stage, copied, source_count)
        destination_count = destination.count(org)
        destination_by_status = Counter(
            _status(hit.payload)
            for hit in destination.iter_payloads(["org_id", "status"])
            if hit.payload.get("org_id") == org
        )
    problems = _differences(
        org,
        source_count=source_count,
        destination_count=destination_count,
        copied=copied,
        source_by_status=source_by_status,
        destination_by_status=destination_by_status,
    )
    return MigrationReport(
        org=org,
        source=source_name,
        destination=_describe(settings, to_url),
        collection=collection,
        copied=copied,
        replaced=replaced,
        source_count=source_count,
        destination_count=destination_count,
        source_by_status=dict(sorted(source_by_status.items())),
        destination_by_status=dict(sorted(destination_by_status.items())),
        matched=not problems,
        problems=problems,
        seconds=round(time.perf_counter() - started, 3),
    )


def _status(payload: ChunkPayload) -> str:
    return str(payload.get("status") or "none")


def _differences(
    org: str,
    *,
    source_count: int,
    destination_count: int,
    copied: int,
    source_by_status: Counter[str],
    destination_by_status: Counter[str],
) -> list[str]:
    problems: list[str] = []
    if copied != source_count:
        problems.append(
            f"copied {copied} points of org {org!r} but the source counts {source_count} (it "
            "changed during the copy?): run the copy again"
        )
    if destination_count > source_count:
        problems.append(
            f"the destination holds {destination_count} points of org {org!r}, "
            f"{destination_count - source_count} more than the source's {source_count} (points "
            "the source no longer has, e.g. from an earlier copy): run again with --replace to "
            "make the destination's copy of the org exactly the source's"
        )
    elif destination_count < source_count:
        problems.append(
            f"the destination holds {destination_count} points of org {org!r}, "
            f"{source_count - destination_count} fewer than the source's {source_count}: run "
            "the copy again (it is safe to repeat)"
        )
    for status in sorted(set(source_by_status) | set(destination_by_status)):
        have, want = destination_by_status[status], source_by_status[status]
        if have != want:
            problems.append(
                f"status {status}: {want} points in the source, {have} in the destination"
            )
    return problems


def _same_place(from_url: str | None, to_url: str | None) -> bool:
    """Both sides the embedded store, or the same URL (collection is shared by both sides)."""
    if from_url is None or to_url is None:
        return from_url is None and to_url is None
    return _normal(from_url) == _normal(to_url) and from_url != ":memory:"


def _normal(url: str) -> str:
    from pathlib import Path

    from sinks.qdrant_server import local_path

    folder = local_path(url)
    if folder is not None:
        return f"file://{Path(folder).resolve()}"
    return url.rstrip("/").lower()


def _describe(settings: Settings, url: str | None) -> str:
    return url if url is not None else f"{EMBEDDED} store at {settings.vectors_dir}"


@contextmanager
def _open_side(
    settings: Settings, url: str | None, collection: str, api_key: str | None
) -> Iterator[Any]:
    """One side of a copy, through the normal open path (`sinks.connect.open_vector_store`)."""
    from sinks.connect import open_vector_store

    if url is None:
        side = settings.replace(qdrant_url=None)
    else:
        key = SecretStr(api_key) if api_key else settings.stores.qdrant_api_key
        side = settings.replace(qdrant_url=url, qdrant_collection=collection, qdrant_api_key=key)
    try:
        # share=False: the copy reads the embedded store's export path, which only its owner
        # has (a process sharing it through `kbflow serve` gets the search calls only).
        with open_vector_store(side, share=False) as store:
            if not hasattr(store, "export_points") or not hasattr(store, "delete_org"):
                raise StoreError(
                    f"the store at {_describe(settings, url)} cannot export points for a copy"
                )
            yield store
    except StoreBusy as exc:
        raise StoreBusy(
            f"{exc} A copy needs the embedded store to itself: stop `kbflow serve` (or the "
            "command holding it) for the copy."
        ) from exc


def reembed(
    settings: Settings,
    *,
    org: str | None = None,
    dry_run: bool = False,
    batch: int = 128,
    progress: Any = None,
) -> ReembedReport:
    """Re-embed every chunk (of ``org``, or of every org) that another embedding model made,
    with the configured one (`tasks.ingest.reembed`). Holds the embedded store while it runs,
    as ``kbflow reconcile`` does; safe to re-run, and a killed run is finished by the next.

    Raises:
        ConfigError: a bad org id or batch; ``KBFLOW_EMBEDDING_MODEL=promoted`` with nothing
            promoted.
        StoreBusy / StoreError: the vector store cannot be opened (nothing is written then).
    """
    from sinks.connect import open_registry, open_vector_store
    from tasks.ingest.reembed import reembed as reembed_points
    from tasks.text.embed import embedder_for

    if org is not None:
        ids.org_id(org)
    embedder = embedder_for(settings)
    with open_registry(settings) as registry, open_vector_store(settings) as store:
        return reembed_points(
            store,
            registry,
            embedder,
            org_id=org,
            dry_run=dry_run,
            batch=batch,
            progress=progress,
        )
