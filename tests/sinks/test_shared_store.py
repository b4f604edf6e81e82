"""The embedded store shared by its owner: other processes of the same user read and write it
through the owner, get exactly what the owner would answer, and carry on when the owner stops;
other users and unknown calls are refused."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from core.errors import StoreError
from core.models import ChunkPoint, Scope, SparseVec
from core.settings import Settings
from sinks.connect import open_vector_store
from sinks.gate import Gate, build_gate
from sinks.qdrant_edge import QdrantEdgeStore
from sinks.shared_store import (
    LockedStore,
    SharedStoreClient,
    StoreOwner,
    _recv,
    _send,
    socket_name,
)
from sinks.vectors import point_id_for

pytestmark = pytest.mark.integration  # each test starts or reaches a real service

REPO = Path(__file__).resolve().parents[2]

# An owner in its own process: opens the shard, serves it, prints READY, waits to be killed.
_OWNER = textwrap.dedent(
    """
    import sys, threading, time
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.shared_store import StoreOwner
    store = QdrantEdgeStore.open(sys.argv[1], lock_timeout_s=5)
    owner = StoreOwner(store.path, store, threading.Lock())
    print("READY", flush=True)
    while True:
        time.sleep(1)
    """
)


def _point(
    i: int, *, org: str = "acme", status: str = "approved", audience: str = "all"
) -> ChunkPoint:
    vec = [0.0] * 384
    vec[i % 384] = 1.0
    vec[(i * 7 + 3) % 384] += 0.5
    return ChunkPoint(
        point_id=point_id_for(f"d{i}:0"),
        dense=vec,
        sparse=SparseVec([i + 1, 1000], [1.0, 0.5]),
        payload={
            "org_id": org, "doc_id": f"d{i}", "chunk_id": f"d{i}:0", "chunk_index": 0,
            "text": f"text {i}", "status": status, "parse_status": "ingested", "audience": audience,
            "collection_path": "default", "content_hash": f"h{i}",
        },
    )  # fmt: skip


def _points() -> list[ChunkPoint]:
    out = []
    for i in range(40):
        org = "acme" if i % 4 else "globex"
        status = "pending_review" if i % 5 == 0 else "approved"
        audience = "staff" if i % 3 == 0 else "all"
        out.append(_point(i, org=org, status=status, audience=audience))
    return out


@contextmanager
def _owner_process(path: Path, log: Path) -> Iterator[subprocess.Popen[str]]:
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", _OWNER, str(path)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        deadline = time.monotonic() + 120
        while "READY" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the owner did not start"
            time.sleep(0.1)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _closed_by_peer(sock: socket.socket) -> bool:
    """The peer hung up (an orderly close, or a reset because our bytes went unread)."""
    sock.settimeout(5)
    try:
        return sock.recv(10) == b""
    except ConnectionResetError:
        return True


def _gates() -> list[Gate]:
    today = dt.date(2026, 12, 1)
    return [
        build_gate(Scope("acme", today=today)),
        build_gate(Scope("acme", today=today, audiences=("staff",))),
        build_gate(Scope("globex", today=today, all_audiences=True)),
        build_gate(Scope("acme", today=today, collections=("hr",))),
    ]


def test_a_client_gets_what_the_owner_would_answer(tmp_path: Path) -> None:
    """The same calls, on the store directly and through its owner: the same answers."""
    path = tmp_path / "vectors"
    store = QdrantEdgeStore.open(path, lock_timeout_s=1)
    owner = StoreOwner(path, store, threading.Lock())
    client = SharedStoreClient.connect(path)
    try:
        assert client is not None
        client.upsert(_points())
        assert client.count() == store.count() == 40
        assert client.count("globex") == store.count("globex") == 10
        answered = 0
        for gate in _gates():
            for dense, sparse in (
                (_point(8).dense, _point(8).sparse),
                (_point(9).dense, None),
                (None, SparseVec([1000], [1.0])),
            ):
                kw: dict[str, Any] = {"dense": dense, "sparse": sparse, "limit": 50}
                direct = store.query(gate, **kw)
                assert client.query(gate, **kw) == direct
                answered += bool(direct)
        assert answered >= 9  # most gates admit something: the comparison is not of nothing
        direct = store.query(_gates()[0], dense=_point(8).dense, sparse=None, limit=50)
        bare = client.query(
            _gates()[0], dense=_point(8).dense, sparse=None, limit=50, with_payload=False
        )
        assert [h.point_id for h in bare] == [h.point_id for h in direct]
        assert all(h.payload == {} for h in bare)
        ids = [h.point_id for h in direct]
        assert (
            client.payloads(ids) == store.payloads(ids) == {h.point_id: h.payload for h in direct}
        )
        hits = client.query(_gates()[0], dense=None, sparse=SparseVec([1000], [1.0]), limit=50)
        assert hits and all(h.payload["org_id"] == "acme" for h in hits)
        assert all(
            h.payload["status"] == "approved" and h.payload["audience"] == "all" for h in hits
        )
        client.set_document_payload("d1", {"status": "withdrawn"})
        assert store.inspect_document_chunks("d1")[0].payload["status"] == "withdrawn"
        assert client.inspect_document_chunks("d1") == store.inspect_document_chunks("d1")
        client.delete_stale_chunks("d2", keep_content_hash="h2")
        assert store.count() == 40
        client.delete_stale_chunks("d2", keep_content_hash="other")
        client.delete_document("d3")
        assert store.count() == 38 == client.count()
        ids = sorted(h.point_id for h in client.iter_payloads(["doc_id"]))
        assert ids == sorted(h.point_id for h in store.iter_payloads(["doc_id"]))
        # A re-embed's write: new vectors and the model id; the rest of the payload stays.
        (before,) = store.inspect_document_chunks("d4")
        client.set_vectors([ChunkPoint(before.point_id, _point(5).dense, _point(5).sparse, {})],
                           {"embedding_model": "m2"})  # fmt: skip
        (after,) = store.inspect_document_chunks("d4")
        assert after.payload == {**before.payload, "embedding_model": "m2"}
    finally:
        if client is not None:
            client.close()
        owner.close()
        store.close()


def test_nobody_listening_means_no_client(tmp_path: Path) -> None:
    assert SharedStoreClient.connect(tmp_path / "vectors") is None


def test_a_gate_not_built_by_build_gate_is_not_sent(tmp_path: Path) -> None:
    """The owner rebuilds the gate from the scope, so a hand-made gate would be a lie: refused."""
    path = tmp_path / "vectors"
    store = QdrantEdgeStore.open(path, lock_timeout_s=1)
    owner = StoreOwner(path, store, threading.Lock())
    client = SharedStoreClient.connect(path)
    try:
        assert client is not None
        gate = _gates()[0]
        loose = Gate(scope=gate.scope, conditions=gate.conditions[:1])  # org only: no status
        with pytest.raises(StoreError, match="build_gate"):
            client.query(loose, dense=_point(1).dense, sparse=None, limit=5)
    finally:
        if client is not None:
            client.close()
        owner.close()
        store.close()


def test_unknown_calls_and_bad_frames_are_refused_and_the_owner_keeps_serving(
    tmp_path: Path,
) -> None:
    path = tmp_path / "vectors"
    store = QdrantEdgeStore.open(path, lock_timeout_s=1)
    store.upsert(_points())
    owner = StoreOwner(path, store, threading.Lock())
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(socket_name(path))
            _send(raw, {"op": "close", "args": {}})
            assert "unknown store call" in _recv(raw)["error"]
            _send(raw, {"op": "__del__", "args": {}})
            assert "unknown store call" in _recv(raw)["error"]
            _send(raw, {"op": "count", "args": {"org_id": None}})
            assert _recv(raw) == {"ok": 40}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(socket_name(path))
            raw.sendall(b"\xff\xff\xff\xffgarbage")  # a frame over the limit: dropped
            assert _closed_by_peer(raw)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.connect(socket_name(path))
            data = b"not json"
            raw.sendall(len(data).to_bytes(4, "big") + data)
            assert _closed_by_peer(raw)
        client = SharedStoreClient.connect(path)
        assert client is not None and client.count() == 40
        client.close()
    finally:
        owner.close()
        store.close()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_can_neither_connect_nor_read(tmp_path: Path) -> None:
    path = tmp_path / "vectors"
    store = QdrantEdgeStore.open(path, lock_timeout_s=1)
    store.upsert(_points())
    owner = StoreOwner(path, store, threading.Lock())
    probe = textwrap.dedent(
        f"""
        import os, socket, struct
        os.setgid(65534); os.setuid(65534)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect({socket_name(path)!r})
        body = b'{{"op":"count","args":{{"org_id":null}}}}'
        try:
            s.sendall(struct.pack(">I", len(body)) + body)
            s.settimeout(5)
            reply = s.recv(100)
        except (ConnectionResetError, BrokenPipeError):  # refused before or after it sent
            reply = b""
        print("REFUSED" if reply == b"" else f"ANSWERED {{reply!r}}")
        """
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
        )
        assert "REFUSED" in result.stdout, result.stdout + result.stderr
    finally:
        owner.close()
        store.close()


def test_a_command_reaches_the_store_through_its_owner_in_another_process(
    tmp_path: Path,
) -> None:
    """With the shard owned by another process, `open_vector_store` does not wait for the lock
    (a second of timeout would not do): it goes through the owner, whose writes it sees."""
    settings = Settings(home=tmp_path / "home", store_lock_timeout_s=1)
    with _owner_process(settings.vectors_dir, tmp_path / "owner.log"):
        started = time.monotonic()
        with open_vector_store(settings) as store:
            assert time.monotonic() - started < 1.0
            store.upsert(_points())
            assert store.count() == 40
        with open_vector_store(settings) as again:
            assert again.count("acme") == 30


def test_when_the_owner_dies_the_command_carries_on_as_owner(tmp_path: Path) -> None:
    """Kill the owner between two calls of one command: the next call reopens the store (now as
    its owner) and nothing written through the dead owner is lost."""
    settings = Settings(home=tmp_path / "home", store_lock_timeout_s=10)
    with (
        _owner_process(settings.vectors_dir, tmp_path / "owner.log") as owner,
        open_vector_store(settings) as store,
    ):
        store.upsert(_points()[:20])
        owner.kill()
        owner.wait()
        store.upsert(_points()[20:])
        assert store.count() == 40
    reopened = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)
    try:
        assert reopened.count() == 40
    finally:
        reopened.close()


def test_the_owner_lets_one_call_at_a_time_into_the_shard(tmp_path: Path) -> None:
    """Calls through the owner and calls of the owner's own threads take the same lock."""
    path = tmp_path / "vectors"
    store = QdrantEdgeStore.open(path, lock_timeout_s=1)
    lock = threading.Lock()
    owner = StoreOwner(path, store, lock)
    locked = LockedStore(store, lock)
    client = SharedStoreClient.connect(path)
    assert client is not None
    try:
        with lock:  # the owner's own thread is in the shard: the client's call must wait
            done = threading.Event()
            t = threading.Thread(target=lambda: (client.count(), done.set()))
            t.start()
            assert not done.wait(0.5)
        assert done.wait(10)
        t.join()
        errors: list[str] = []

        def write(offset: int) -> None:
            try:
                for i in range(5):
                    (client if offset % 2 else locked).upsert([_point(offset * 100 + i)])
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(repr(exc))

        threads = [threading.Thread(target=write, args=(k,)) for k in range(1, 5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and locked.count() == 20
    finally:
        client.close()
        owner.close()
        store.close()


def test_frames_are_json_not_pickles(tmp_path: Path) -> None:
    """What crosses the socket is plain JSON (nothing that runs code when read)."""
    a, b = socket.socketpair()
    with a, b:
        _send(a, {"op": "count", "args": {"org_id": "acme"}})
        header = b.recv(4)
        body = b.recv(int.from_bytes(header, "big"))
        assert json.loads(body) == {"op": "count", "args": {"org_id": "acme"}}
