"""Re-embed an org's chunks with the configured model (`kbflow store reembed`).

Each point whose payload names another embedding model (or none: written before ids were
recorded) gets a new dense vector from the chunk's own text (the payload keeps it, heading
path included), under the same id. Only the vectors and the payload's ``embedding_model`` are
written (`VectorStore.set_vectors`): review status and every gate field are never rewritten, so
a decision taken meanwhile (through ``kbflow serve``, or on a Qdrant server, where nothing
holds a lock) stays, and a point deleted meanwhile is not re-created. The vectors are written
before the id that names them: a point whose id is the new model's holds the new vectors. The
registry's ``chunks.embedding_model`` follows each batch. The store is scanned again after the
pass (points another process wrote meanwhile with another model get another pass), and once
every point of the org is the new model's, the org's remaining registry rows (older content
versions of edited documents, which have no vectors) are relabelled too, so search and ingest
accept the org again.

A killed run leaves each point old, new, or (killed between its two writes) new vectors under
the old id, which the re-run embeds again; the registry never says new before the store does.
A re-run skips the new points and finishes; a run with nothing to do changes nothing. Search
refuses the org while its registry holds both models.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import cast

from pydantic import Field

from core.contracts import Report
from core.errors import ConfigError
from core.models import Chunk, ChunkPayload, ChunkPoint
from sinks.registry import SqlRegistry
from sinks.vectors import VectorStore
from tasks.text.embed import Embedder
from tasks.text.points import EMBEDDING_MODEL
from tasks.text.sparse import document_sparse_vector

log = logging.getLogger(__name__)

UNRECORDED = "(not recorded)"
"""How a report names the model of chunks written before model ids were recorded."""

Progress = Callable[[str, int, int], None]

_PASSES = 3  # store scans at most: the first, and re-checks for points written meanwhile


class OrgReembed(Report):
    """One org's part of a re-embed."""

    org: str = Field(description="The org.")
    points: int = Field(description="The org's points in the vector store.")
    before: dict[str, int] = Field(
        description="Points per recorded embedding model before the run "
        f"({UNRECORDED!r}: written before model ids were recorded)."
    )
    reembedded: int = Field(description="Points given a new vector (dry run: that would be).")
    registry_rows: int = Field(
        description="Registry chunk rows whose recorded model was set to the configured one "
        "(dry run: rows that record another model or none)."
    )
    skipped: list[str] = Field(
        description="Point ids that could not be re-embedded (no text in their payload)."
    )


class ReembedReport(Report):
    """What `reembed` did (or, in a dry run, would do)."""

    model: str = Field(description="The configured embedding model's id: what the chunks get.")
    dry_run: bool = Field(description="Whether nothing was changed.")
    orgs: list[OrgReembed] = Field(description="Per org, in id order.")
    reembedded: int = Field(description="Points re-embedded in all.")
    seconds: float = Field(description="Wall-clock time.")


def reembed(
    store: VectorStore,
    registry: SqlRegistry,
    embedder: Embedder,
    *,
    org_id: str | None = None,
    dry_run: bool = False,
    batch: int = 128,
    progress: Progress | None = None,
) -> ReembedReport:
    """Give every chunk (of ``org_id``, or of every org) that another model embedded a vector
    from ``embedder``; see the module doc for the guarantees.

    Args:
        batch: points embedded and written at a time (one flush each).
        progress: called as ``(stage, done, total)`` after each batch.

    Raises:
        ConfigError: ``batch`` below 1.
    """
    if batch < 1:
        raise ConfigError(f"batch must be at least 1, got {batch}")
    started = time.perf_counter()
    model = embedder.model_id
    counts, todo = _scan(store, org_id, model)
    orgs = (
        [org_id] if org_id is not None else sorted(set(counts) | set(registry.chunks.chunk_orgs()))
    )
    results: list[OrgReembed] = []
    if dry_run:
        for org in orgs:
            stale = sum(n for m, n in registry.chunks.embedding_models(org).items() if m != model)
            results.append(_org_report(org, counts, len(todo.get(org, [])), stale, []))
    else:
        done: Counter[str] = Counter()
        rows: Counter[str] = Counter()
        skipped: dict[str, list[str]] = {}
        for _ in range(_PASSES):
            for org, ids in sorted(todo.items()):
                d, r, s = _reembed_org(org, ids, store, registry, embedder, model, batch, progress)
                done[org] += d
                rows[org] += r
                skipped.setdefault(org, []).extend(s)
            # Points another process wrote meanwhile with another model (on a Qdrant server,
            # where nothing holds a lock) are caught by the next pass.
            _, left = _scan(store, org_id, model)
            todo = {
                org: [i for i in ids if i not in set(skipped.get(org, ()))]
                for org, ids in left.items()
            }
            todo = {org: ids for org, ids in todo.items() if ids}
            if not todo:
                break
        for org in orgs:
            # Only when every point is the new model's: the registry must not claim vectors
            # that a skipped (or still unfinished) point does not have.
            whole = not skipped.get(org) and org not in todo
            relabelled = rows[org] + (
                registry.chunks.relabel_org_chunks(org, model) if whole else 0
            )
            results.append(_org_report(org, counts, done[org], relabelled, skipped.get(org, [])))
            log.info("re-embedded %d points of org %s with %s", done[org], org, model)
    return ReembedReport(
        model=model,
        dry_run=dry_run,
        orgs=results,
        reembedded=sum(r.reembedded for r in results),
        seconds=round(time.perf_counter() - started, 3),
    )


def _scan(
    store: VectorStore, org_id: str | None, model: str
) -> tuple[dict[str, Counter[str]], dict[str, list[str]]]:
    """Points per org and recorded model, and the ids of those another model made, by org."""
    counts: dict[str, Counter[str]] = {}
    todo: dict[str, list[str]] = {}
    for hit in store.iter_payloads(["org_id", EMBEDDING_MODEL]):
        org = str(hit.payload.get("org_id") or "")
        if not org or (org_id is not None and org != org_id):
            continue
        recorded = hit.payload.get(EMBEDDING_MODEL)
        counts.setdefault(org, Counter())[str(recorded or UNRECORDED)] += 1
        if recorded != model:
            todo.setdefault(org, []).append(hit.point_id)
    return counts, todo


def _reembed_org(
    org: str,
    ids: list[str],
    store: VectorStore,
    registry: SqlRegistry,
    embedder: Embedder,
    model: str,
    batch: int,
    progress: Progress | None,
) -> tuple[int, int, list[str]]:
    """Re-embed ``ids`` (points of ``org``) batch by batch; returns how many, how many
    registry rows followed, and the ids skipped for want of text. Each batch: vectors, one
    write of them and their id (flushed), then the registry."""
    done = rows = 0
    skipped: list[str] = []
    stage = f"re-embed {org}"
    for start in range(0, len(ids), batch):
        payloads = store.payloads(ids[start : start + batch])
        points: list[ChunkPoint] = []
        texts: list[str] = []
        for point_id, payload in payloads.items():
            text = payload.get("text")
            if not isinstance(text, str):
                skipped.append(point_id)
                continue
            texts.append(_embed_text(payload, text))
            points.append(ChunkPoint(point_id, [], document_sparse_vector(texts[-1]), payload))
        vectors = embedder.embed_documents(texts)
        store.set_vectors(
            [
                # set_vectors writes no point's own payload: none is sent.
                ChunkPoint(p.point_id, vector, p.sparse, cast(ChunkPayload, {}))
                for p, vector in zip(points, vectors, strict=True)
            ],
            {EMBEDDING_MODEL: model},
        )
        rows += registry.chunks.set_chunk_embedding_model(
            (str(p.payload.get("chunk_id")) for p in points if p.payload.get("chunk_id")), model
        )
        done += len(points)
        if progress is not None:
            progress(stage, min(start + batch, len(ids)), len(ids))
    if skipped:
        log.warning("org %s: %d points have no text to re-embed: %s", org, len(skipped), skipped)
    return done, rows, skipped


def _embed_text(payload: ChunkPayload, text: str) -> str:
    """What ingest embedded for this chunk: its heading path, then its text."""
    headings = tuple(str(h) for h in payload.get("heading_path") or ())
    return Chunk("", "", 0, text, headings).embed_text


def _org_report(
    org: str,
    counts: dict[str, Counter[str]],
    reembedded: int,
    registry_rows: int,
    skipped: list[str],
) -> OrgReembed:
    before = counts.get(org, Counter())
    return OrgReembed(
        org=org,
        points=sum(before.values()),
        before=dict(sorted(before.items())),
        reembedded=reembedded,
        registry_rows=registry_rows,
        skipped=skipped,
    )
