"""The embedded store shared on one machine: its owner serves it to local processes.

Qdrant Edge allows one process per shard and has no read-only open, so while ``kbflow serve``
runs (the owner, holding the shard's lock for its lifetime) a CLI command or a Prefect flow run
reaches the same shard through the owner: a Unix socket in the Linux abstract namespace, named
after the user and the shard's path (:func:`socket_name`).

- **Who may connect.** The owner accepts only peers of its own user id (``SO_PEERCRED``), and a
  client accepts only an owner of its own user id: another user can neither read the store nor
  pose as its owner. An abstract socket leaves no file behind when its process dies, so there is
  no stale socket to clean up or to be fooled by.
- **What crosses it.** The `VectorStore` calls, as length-prefixed JSON frames: points with
  their vectors, the caller's ``Scope`` (the owner rebuilds the gate with ``build_gate``, so the
  filter is the very one the caller would have applied), hits with their payloads. Nothing is
  pickled, and an unknown call is refused.
- **What is serialised.** Each call runs under the owner's store lock, which is held only for the
  shard operation: clients embed before they call, so the lock never covers a model.

Every call is idempotent (upsert by stable point id, payload set, deletes, reads), which is what
lets `sinks.connect` retry a call on a fresh store when the owner goes away mid-call.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import socket
import socketserver
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from core.errors import StoreError
from core.models import ChunkPayload, ChunkPoint, PayloadPatch, Scope, SparseVec, StoredHit
from sinks.gate import Gate, build_gate
from sinks.vectors import DelegatingStore, VectorStore

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 512 * 1024 * 1024
_CONNECT_TIMEOUT_S = 2.0


class OwnerGone(StoreError):
    """The process that owns the store stopped answering (it exited, or the connection broke)."""


def socket_name(shard_path: Path) -> str:
    """The abstract socket name of the shard at ``shard_path`` for this user."""
    digest = hashlib.sha256(str(Path(shard_path).resolve()).encode()).hexdigest()[:24]
    return f"\0kbflow-store-{os.getuid()}-{digest}"


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _send(sock: socket.socket, message: Any) -> None:
    data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_FRAME_BYTES:
        raise StoreError(
            f"a store call of {len(data)} bytes is over the {MAX_FRAME_BYTES}-byte frame limit: "
            "upsert fewer points at a time"
        )
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> Any | None:
    """One frame's JSON, or None when the peer closed the connection between frames."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise StoreError(f"a frame of {size} bytes is over the limit")
    body = _recv_exact(sock, size)
    if body is None:
        raise ConnectionError("the peer closed the connection mid-frame")
    return json.loads(body)


# -- the wire forms ------------------------------------------------------------------------------


def _scope_to_wire(gate: Gate) -> dict[str, Any]:
    if build_gate(gate.scope) != gate:
        raise StoreError("only a gate made by build_gate can be sent to the store's owner")
    s = gate.scope
    return {
        "org_id": s.org_id,
        "today": s.today.isoformat(),
        "audiences": list(s.audiences),
        "collections": None if s.collections is None else list(s.collections),
        "all_audiences": s.all_audiences,
    }


def _gate_from_wire(wire: dict[str, Any]) -> Gate:
    collections = wire["collections"]
    return build_gate(
        Scope(
            org_id=str(wire["org_id"]),
            today=dt.date.fromisoformat(wire["today"]),
            audiences=tuple(str(a) for a in wire["audiences"]),
            collections=None if collections is None else tuple(str(c) for c in collections),
            all_audiences=bool(wire["all_audiences"]),
        )
    )


def _point_to_wire(p: ChunkPoint) -> list[Any]:
    return [p.point_id, list(p.dense), [p.sparse.indices, p.sparse.values], p.payload]


def _point_from_wire(w: list[Any]) -> ChunkPoint:
    point_id, dense, (indices, values), payload = w
    return ChunkPoint(str(point_id), dense, SparseVec(indices, values), payload)


def _patch_from_wire(a: dict[str, Any]) -> PayloadPatch:
    return cast(PayloadPatch, dict(a["payload"]))


def _sparse_from_wire(w: list[Any] | None) -> SparseVec | None:
    return None if w is None else SparseVec(w[0], w[1])


def _hit_to_wire(h: StoredHit) -> list[Any]:
    return [h.point_id, h.score, h.payload, h.legs]


def _hit_from_wire(w: list[Any]) -> StoredHit:
    return StoredHit(str(w[0]), float(w[1]), w[2], w[3])


# -- the owner's side ----------------------------------------------------------------------------


def _dispatch(store: VectorStore, op: str, a: dict[str, Any]) -> Any:
    """Run one call on the owner's store; the result in its wire form."""
    if op == "upsert":
        store.upsert([_point_from_wire(p) for p in a["points"]])
        return None
    if op == "set_vectors":
        store.set_vectors([_point_from_wire(p) for p in a["points"]], _patch_from_wire(a))
        return None
    if op == "query":
        hits = store.query(
            _gate_from_wire(a["scope"]),
            dense=a["dense"],
            sparse=_sparse_from_wire(a["sparse"]),
            limit=int(a["limit"]),
            prefetch_limit=int(a["prefetch_limit"]),
            rrf_k=int(a["rrf_k"]),
            with_payload=bool(a.get("with_payload", True)),
        )
        return [_hit_to_wire(h) for h in hits]
    if op == "payloads":
        return store.payloads([str(i) for i in a["ids"]])
    if op == "set_document_payload":
        store.set_document_payload(str(a["doc_id"]), _patch_from_wire(a))
        return None
    if op == "delete_stale_chunks":
        store.delete_stale_chunks(str(a["doc_id"]), keep_content_hash=str(a["keep"]))
        return None
    if op == "delete_document":
        store.delete_document(str(a["doc_id"]))
        return None
    if op == "inspect_document_chunks":
        return [_hit_to_wire(h) for h in store.inspect_document_chunks(str(a["doc_id"]))]
    if op == "iter_payloads":
        return [_hit_to_wire(h) for h in store.iter_payloads([str(f) for f in a["fields"]])]
    if op == "count":
        return store.count(a["org_id"])
    if op == "optimize":
        store.optimize()
        return None
    if op == "snapshot":  # a consistent copy of the shard, taken here under the store lock
        from sinks.snapshot import copy_edge_shard

        root = a.get("previous_root")
        return copy_edge_shard(
            store,
            Path(a["dest"]),
            previous=a.get("previous"),
            previous_root=None if root is None else Path(root),
        )
    if op == "ping":
        return "pong"
    raise StoreError(f"unknown store call {op!r}")


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        if _peer_uid(sock) != os.getuid():
            log.warning("refused a store connection from another user")
            return
        while True:
            try:
                message = _recv(sock)
            except (OSError, ValueError, StoreError) as exc:
                log.debug("store connection dropped: %s", exc)
                return
            if message is None:
                return
            try:
                with self.server.lock:
                    result = _dispatch(self.server.store, str(message["op"]), message["args"])
                reply: dict[str, Any] = {"ok": result}
            except Exception as exc:  # the caller gets the message; the owner keeps serving
                log.warning("store call %s failed: %s", message.get("op"), exc)
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            try:
                _send(sock, reply)
            except OSError:
                return


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, name: str, store: VectorStore, lock: threading.Lock) -> None:
        self.store = store
        self.lock = lock
        super().__init__(name, _Handler)  # type: ignore[arg-type]


class StoreOwner:
    """Serves an open store to this user's local processes until :meth:`close`.

    ``lock`` is the one lock every user of ``store`` in this process takes around each call.
    """

    def __init__(self, shard_path: Path, store: VectorStore, lock: threading.Lock) -> None:
        self.name = socket_name(shard_path)
        self._server = _Server(self.name, store, lock)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="kbflow-store-owner", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# -- a local process's side ----------------------------------------------------------------------


class SharedStoreClient:
    """A `VectorStore` whose calls the owning process runs (see the module docstring).

    Thread-safe: one call at a time on the connection.
    """

    def __init__(self, sock: socket.socket, shard_path: Path) -> None:
        self._sock: socket.socket | None = sock
        self.path = shard_path
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, shard_path: Path) -> SharedStoreClient | None:
        """A client of the process that owns ``shard_path``, or None when none listens."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(_CONNECT_TIMEOUT_S)
        try:
            sock.connect(socket_name(shard_path))
            if _peer_uid(sock) != os.getuid():
                raise StoreError("the store's socket is held by another user: refusing it")
            client = cls(sock, shard_path)
            sock.settimeout(None)
            client._call("ping", {})
            return client
        except (OSError, OwnerGone):
            sock.close()
            return None

    def _call(self, op: str, args: dict[str, Any]) -> Any:
        with self._lock:
            if self._sock is None:
                raise StoreError("this store connection is closed")
            try:
                _send(self._sock, {"op": op, "args": args})
                reply = _recv(self._sock)
            except (OSError, ValueError) as exc:
                self._drop()
                raise OwnerGone(
                    f"the process that owns the vector store at {self.path} went away during "
                    f"{op}: {exc}"
                ) from exc
            if reply is None:
                self._drop()
                raise OwnerGone(
                    f"the process that owns the vector store at {self.path} closed the "
                    f"connection during {op} (it stopped)"
                )
        if "error" in reply:
            raise StoreError(f"the vector store's owner could not {op}: {reply['error']}")
        return reply["ok"]

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def upsert(self, points: Sequence[ChunkPoint]) -> None:
        if points:
            self._call("upsert", {"points": [_point_to_wire(p) for p in points]})

    def set_vectors(self, points: Sequence[ChunkPoint], payload: PayloadPatch) -> None:
        if points:
            self._call(
                "set_vectors",
                {"points": [_point_to_wire(p) for p in points], "payload": payload},
            )

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
        wire = self._call(
            "query",
            {
                "scope": _scope_to_wire(gate),
                "dense": None if dense is None else list(dense),
                "sparse": None if sparse is None else [sparse.indices, sparse.values],
                "limit": limit,
                "prefetch_limit": prefetch_limit,
                "rrf_k": rrf_k,
                "with_payload": with_payload,
            },
        )
        return [_hit_from_wire(h) for h in wire]

    def payloads(self, point_ids: Sequence[str]) -> dict[str, ChunkPayload]:
        found: dict[str, ChunkPayload] = self._call("payloads", {"ids": list(point_ids)})
        return found

    def set_document_payload(self, doc_id: str, payload: PayloadPatch) -> None:
        self._call("set_document_payload", {"doc_id": doc_id, "payload": payload})

    def delete_stale_chunks(self, doc_id: str, *, keep_content_hash: str) -> None:
        self._call("delete_stale_chunks", {"doc_id": doc_id, "keep": keep_content_hash})

    def delete_document(self, doc_id: str) -> None:
        self._call("delete_document", {"doc_id": doc_id})

    def inspect_document_chunks(self, doc_id: str) -> list[StoredHit]:
        return [
            _hit_from_wire(h) for h in self._call("inspect_document_chunks", {"doc_id": doc_id})
        ]

    def iter_payloads(self, fields: Sequence[str]) -> Iterator[StoredHit]:
        wire = self._call("iter_payloads", {"fields": list(fields)})  # now, not when iterated
        return iter([_hit_from_wire(h) for h in wire])

    def count(self, org_id: str | None = None) -> int:
        return int(self._call("count", {"org_id": org_id}))

    def optimize(self) -> None:
        self._call("optimize", {})

    def snapshot(
        self,
        dest: Path,
        *,
        previous: dict[str, Any] | None = None,
        previous_root: Path | None = None,
    ) -> dict[str, Any]:
        """Have the owner copy the shard into ``dest`` (a new folder) under its store lock, so
        the copy is consistent while it serves (`sinks.snapshot.copy_edge_shard`; the same
        user's processes only, like every call)."""
        snapshot: dict[str, Any] = self._call(
            "snapshot",
            {
                "dest": str(Path(dest).resolve()),
                "previous": previous,
                "previous_root": None if previous_root is None else str(previous_root.resolve()),
            },
        )
        return snapshot

    def close(self) -> None:
        with self._lock:
            self._drop()


class LockedStore(DelegatingStore):
    """A store every call of which holds ``lock``: the owner's threads (its HTTP requests, and
    the local processes it serves) take turns in the shard, one short call at a time."""

    def __init__(self, store: VectorStore, lock: threading.Lock) -> None:
        self.inner = store
        self._lock = lock

    def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            out = getattr(self.inner, name)(*args, **kwargs)
            if name == "iter_payloads":  # read it all now, inside the lock
                out = iter(list(out))
            return out
