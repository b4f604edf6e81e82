"""Qdrant Edge: the embedded default vector store, in-process and on disk.

One process owns a shard at a time. A second open that Edge itself rejects was seen to break the
first process's next flush, so we take our own OS file lock *before* touching the shard: a
second kbflow process waits (bounded) and then gets :class:`~core.errors.StoreBusy` without
ever opening the shard.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from core.errors import StoreBusy, StoreError
from core.models import ChunkPayload, ChunkPoint, PayloadPatch, SparseVec, StoredHit, chunk_payload
from sinks.gate import Gate, to_edge_filter
from sinks.vectors import DENSE, DENSE_DIM, PAYLOAD_INDEXES, SPARSE, sort_hits, stored_point

log = logging.getLogger(__name__)

_LOCK_POLL_S = 0.1


class QdrantEdgeStore:
    """Vector store on a Qdrant Edge shard under ``path``, guarded by ``<path>.lock``."""

    def __init__(self, shard: Any, path: Path, lock_fd: int) -> None:
        self._shard = shard
        self.path = path
        self._lock_fd: int | None = lock_fd
        self._dirty = False

    @classmethod
    def open(cls, path: Path, *, lock_timeout_s: float = 10.0) -> QdrantEdgeStore:
        """Lock, then load the shard at ``path`` (creating it on first use).

        Raises:
            StoreBusy: another process holds the lock for longer than ``lock_timeout_s``.
            StoreError: the shard exists but cannot be loaded.
        """
        path = Path(path).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = _acquire_lock(path.with_name(path.name + ".lock"), lock_timeout_s)
        return cls._load(path, lock_fd)

    @classmethod
    def try_open(cls, path: Path) -> QdrantEdgeStore | None:
        """Open the shard if no other process holds it, else None at once (no waiting)."""
        path = Path(path).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        _record_holder(fd)
        return cls._load(path, fd)

    @classmethod
    def _load(cls, path: Path, lock_fd: int) -> QdrantEdgeStore:
        """Load (or create) the shard whose lock ``lock_fd`` holds; releases it on failure."""
        import qdrant_edge as qe

        try:
            started = time.perf_counter()
            if (path / "edge_config.json").exists():
                shard = qe.EdgeShard.load(str(path))
                fresh = False
            else:
                shard = qe.EdgeShard.create(str(path), _edge_config())
                fresh = True
            store = cls(shard, path, lock_fd)
            store._create_indexes(fresh=fresh)
            log.debug("opened edge shard %s in %.2fs", path, time.perf_counter() - started)
            return store
        except Exception as exc:
            _release_lock(lock_fd)
            raise StoreError(
                f"could not open the Qdrant Edge shard at {path}: {exc}. If the directory is "
                "damaged, move it aside and re-run the ingest to rebuild it."
            ) from exc

    def _create_indexes(self, *, fresh: bool) -> None:
        """Index every gated field; on an existing shard, only the ones it lacks (a field the
        gate started filtering on after the shard was made)."""
        import qdrant_edge as qe

        have = set() if fresh else set(dict(self._shard.info().payload_schema or {}))
        made = False
        for index in PAYLOAD_INDEXES:
            if index.field in have:
                continue
            schema: Any
            if index.tenant:
                schema = qe.KeywordIndexParams(is_tenant=True)
            elif index.kind == "datetime":
                schema = qe.PayloadSchemaType.Datetime
            else:
                schema = qe.PayloadSchemaType.Keyword
            self._shard.update(qe.UpdateOperation.create_field_index(index.field, schema))
            made = True
        if made:
            self._shard.flush()

    def upsert(self, points: Sequence[ChunkPoint]) -> None:
        import qdrant_edge as qe

        if not points:
            return
        edge_points = [
            qe.Point(id=p.point_id, vector=_named_vectors(p), payload=_raw(p.payload))
            for p in points
        ]
        self._shard.update(qe.UpdateOperation.upsert_points(edge_points))
        self._shard.flush()

    def query(
        self,
        gate: Gate,
        *,
        dense: list[float] | None,
        sparse: SparseVec | None,
        limit: int,
        prefetch_limit: int = 100,
        rrf_k: int = 60,
        with_payload: bool = True,
    ) -> list[StoredHit]:
        import qdrant_edge as qe

        flt = to_edge_filter(gate)
        legs = []
        if dense is not None:
            legs.append(qe.Query.Nearest(list(dense), using=DENSE))
        if sparse is not None and sparse.indices:
            vec = qe.SparseVector(indices=sparse.indices, values=sparse.values)
            legs.append(qe.Query.Nearest(vec, using=SPARSE))
        if not legs:
            return []
        if len(legs) == 1:
            request = qe.QueryRequest(
                limit=limit, query=legs[0], filter=flt, with_payload=with_payload
            )
        else:
            request = qe.QueryRequest(
                limit=limit,
                prefetches=[qe.Prefetch(limit=prefetch_limit, query=q, filter=flt) for q in legs],
                query=qe.Fusion.Rrf(k=rrf_k),  # type: ignore[arg-type]  # stub is wrong
                filter=flt,
                with_payload=with_payload,
            )
        points = self._shard.query(request)
        return sort_hits(
            [StoredHit(str(p.id), float(p.score), chunk_payload(p.payload or {})) for p in points]
        )

    def set_vectors(self, points: Sequence[ChunkPoint], payload: PayloadPatch) -> None:
        import qdrant_edge as qe

        ids = [p.point_id for p in points]
        found = {str(r.id) for r in self._shard.retrieve(ids, False, False)} if ids else set()
        present = [p for p in points if p.point_id in found]
        if not present:
            return
        self._shard.update(
            qe.UpdateOperation.update_vectors(
                [qe.PointVectors(p.point_id, _named_vectors(p)) for p in present]
            )
        )
        self._shard.update(
            qe.UpdateOperation.set_payload([p.point_id for p in present], _raw(payload))
        )
        self._shard.flush()

    def payloads(self, point_ids: Sequence[str]) -> dict[str, ChunkPayload]:
        if not point_ids:
            return {}
        records = self._shard.retrieve(list(point_ids), with_payload=True, with_vector=False)
        return {str(r.id): chunk_payload(r.payload or {}) for r in records}

    def retrieve_points(self, point_ids: Sequence[str]) -> list[ChunkPoint]:
        """These points (those that exist) with their vectors and payloads. Ungated: for a
        document's own points (a restore copies a withdrawn version's vectors), never search."""
        if not point_ids:
            return []
        records = self._shard.retrieve(list(point_ids), with_payload=True, with_vector=True)
        return [stored_point(r.id, r.vector, r.payload) for r in records]

    def set_document_payload(self, doc_id: str, payload: PayloadPatch) -> None:
        import qdrant_edge as qe

        flt = _doc_filter(doc_id)
        self._shard.update(qe.UpdateOperation.set_payload_by_filter(flt, _raw(payload)))
        self._shard.flush()

    def delete_stale_chunks(self, doc_id: str, *, keep_content_hash: str) -> None:
        import qdrant_edge as qe

        flt = qe.Filter(
            must=[_doc_filter(doc_id)],
            must_not=[
                qe.FieldCondition(key="content_hash", match=qe.MatchValue(keep_content_hash))
            ],
        )
        self._shard.update(qe.UpdateOperation.delete_points_by_filter(flt))
        self._shard.flush()

    def delete_document(self, doc_id: str) -> None:
        import qdrant_edge as qe

        flt = _doc_filter(doc_id)
        self._shard.update(qe.UpdateOperation.delete_points_by_filter(flt))
        self._shard.flush()

    def inspect_document_chunks(self, doc_id: str) -> list[StoredHit]:
        import qdrant_edge as qe

        flt = _doc_filter(doc_id)
        out: list[StoredHit] = []
        offset = None
        while True:
            records, offset = self._shard.scroll(
                qe.ScrollRequest(offset=offset, limit=256, filter=flt, with_payload=True)
            )
            out.extend(StoredHit(str(r.id), 0.0, chunk_payload(r.payload or {})) for r in records)
            if offset is None:
                break
        return sorted(out, key=lambda h: h.payload.get("chunk_index", 0))

    def iter_payloads(self, fields: Sequence[str]) -> Iterator[StoredHit]:
        import qdrant_edge as qe

        offset = None
        while True:
            records, offset = self._shard.scroll(
                qe.ScrollRequest(offset=offset, limit=1000, with_payload=list(fields))
            )
            for r in records:
                yield StoredHit(str(r.id), 0.0, chunk_payload(r.payload or {}))
            if offset is None:
                return

    def export_points(self, org_id: str | None = None, batch: int = 1000) -> Iterator[ChunkPoint]:
        """Every point (of one org, if given) with its vectors and payload (for copying a
        store, and benchmarks)."""
        import qdrant_edge as qe

        offset = None
        while True:
            records, offset = self._shard.scroll(
                qe.ScrollRequest(
                    offset=offset,
                    limit=batch,
                    filter=_org_filter(org_id),
                    with_payload=True,
                    with_vector=True,
                )
            )
            for r in records:
                yield stored_point(r.id, r.vector, r.payload)
            if offset is None:
                return

    def delete_org(self, org_id: str) -> None:
        """Remove every point of one org (a copy that replaces the org's points)."""
        import qdrant_edge as qe

        self._shard.update(qe.UpdateOperation.delete_points_by_filter(_org_filter(org_id)))
        self._shard.flush()

    def count(self, org_id: str | None = None) -> int:
        import qdrant_edge as qe

        return int(self._shard.count(qe.CountRequest(exact=True, filter=_org_filter(org_id))))

    def optimize(self) -> None:
        started = time.perf_counter()
        self._shard.optimize()
        self._shard.flush()
        log.info("optimized edge shard %s in %.1fs", self.path, time.perf_counter() - started)

    def close(self) -> None:
        if self._lock_fd is None:
            return
        try:
            self._shard.flush()
            self._shard.close()
        finally:
            _release_lock(self._lock_fd)
            self._lock_fd = None


def _doc_filter(doc_id: str) -> Any:
    """Every point of one document (maintenance and inspection; never a gate)."""
    import qdrant_edge as qe

    return qe.Filter(must=[qe.FieldCondition(key="doc_id", match=qe.MatchValue(doc_id))])


def _org_filter(org_id: str | None) -> Any:
    """Every point of one org (maintenance: counts and copies; never a gate), or None."""
    import qdrant_edge as qe

    if org_id is None:
        return None
    return qe.Filter(must=[qe.FieldCondition(key="org_id", match=qe.MatchValue(org_id))])


def _edge_config() -> Any:
    import qdrant_edge as qe

    return qe.EdgeConfig(
        vectors={DENSE: qe.EdgeVectorParams(size=DENSE_DIM, distance=qe.Distance.Cosine)},
        sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )


def _acquire_lock(lock_path: Path, timeout_s: float) -> int:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                try:
                    holder = _describe_holders(lock_path, fd)
                finally:
                    os.close(fd)
                raise StoreBusy(
                    f"the vector store at {lock_path.with_suffix('')} is busy: {holder} and did "
                    f"not release it within {timeout_s:g}s. Wait for it and retry, raise "
                    "KBFLOW_STORE_LOCK_TIMEOUT_S, or use a Qdrant server (KBFLOW_QDRANT_URL) for "
                    "many concurrent writers."
                ) from None
            time.sleep(_LOCK_POLL_S)
            continue
        _record_holder(fd)
        return fd


def _record_holder(fd: int) -> None:
    """A hint for people reading the lock file; the busy message asks the kernel instead."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)


def _describe_holders(lock_path: Path, probe_fd: int) -> str:
    """Who holds the lock, as the kernel sees it: "pid 4242 (python -m kbflow.cli ingest …)
    holds its lock file …".

    The pid written into the lock file is not proof: it outlives a release, and a process that
    forked after locking leaves the lock with its child. So the holders are the processes with
    an open descriptor on the lock file that carries the flock (``lock:`` in
    ``/proc/<pid>/fdinfo/<fd>``); the recorded pid is mentioned only when no holder is visible.
    """
    holders = _flock_holders(lock_path)
    if holders == [os.getpid()]:
        return (
            f"this process, {_process_label(os.getpid())}, holds its lock file {lock_path} "
            "through another open store; close that one first"
        )
    if holders:  # more than one when a process forked after locking: they share the lock
        named = ", ".join(_process_label(pid) for pid in holders)
        return f"{named} {'holds' if len(holders) == 1 else 'hold'} its lock file {lock_path}"
    unknown = f"another process holds its lock file {lock_path} (which one could not be seen"
    recorded = _recorded_pid(probe_fd)
    if recorded is None:
        return unknown + ")"
    if not _running(recorded):
        return unknown + f"; pid {recorded}, recorded in the file, is not running: a stale record)"
    return unknown + f"; the file records {_process_label(recorded)} as the last to take it)"


def _flock_holders(lock_path: Path) -> list[int]:
    """Pids of the processes whose open descriptors on ``lock_path`` carry a flock (Linux)."""
    import psutil

    wanted = os.path.realpath(lock_path)
    holders: list[int] = []
    for proc in psutil.process_iter():
        try:
            fds = [f.fd for f in proc.open_files() if f.path == wanted]
            if any(_carries_flock(proc.pid, fd) for fd in fds):
                holders.append(proc.pid)
        except (psutil.Error, OSError):  # gone, a zombie, or not ours to look at
            continue
    return sorted(holders)


def _carries_flock(pid: int, fd: int) -> bool:
    with open(f"/proc/{pid}/fdinfo/{fd}", encoding="utf-8") as info:
        return any(line.startswith("lock:") and " FLOCK " in line for line in info)


def _recorded_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _process_label(pid: int) -> str:
    """'pid 4242 (python -m kbflow.cli ingest docs)': the pid and its command, shortened."""
    import psutil

    try:
        proc = psutil.Process(pid)
        argv = proc.cmdline()
        command = " ".join([Path(argv[0]).name, *argv[1:]]) if argv else proc.name()
    except psutil.Error:
        return f"pid {pid}"
    command = " ".join(command.split())
    if len(command) > 80:
        command = command[:79] + "…"
    return f"pid {pid} ({command})"


def _release_lock(fd: int) -> None:
    try:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # leave no pid behind to be mistaken for a holder
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _named_vectors(point: ChunkPoint) -> dict[str, Any]:
    """A point's dense and sparse vectors, named as the collection declares them."""
    import qdrant_edge as qe

    sparse = qe.SparseVector(indices=point.sparse.indices, values=point.sparse.values)
    return {DENSE: list(point.dense), SPARSE: sparse}


def _raw(payload: ChunkPayload | PayloadPatch) -> dict[str, Any]:
    """A typed payload as Edge's bindings take it: the same dict."""
    return cast("dict[str, Any]", payload)
