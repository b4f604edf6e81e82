"""One process owns the embedded store; a second gets a clear 'busy' error, not a broken shard."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from kbflow.models import ChunkPoint, SparseVec
from sinks.qdrant_edge import QdrantEdgeStore
from sinks.vectors import point_id_for

_SECOND_PROCESS = textwrap.dedent(
    """
    import sys
    from kbflow.errors import StoreBusy
    from sinks.qdrant_edge import QdrantEdgeStore
    try:
        QdrantEdgeStore.open(sys.argv[1], lock_timeout_s=float(sys.argv[2])).close()
    except StoreBusy as exc:
        print("BUSY:", exc)
        sys.exit(3)
    print("OPENED")
    """
)


def _open_in_other_process(path: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _SECOND_PROCESS, str(path), str(timeout_s)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _point(i: int) -> ChunkPoint:
    vec = [0.0] * 384
    vec[i % 384] = 1.0
    return ChunkPoint(
        point_id=point_id_for(f"d:{i}"),
        dense=vec,
        sparse=SparseVec([i + 1], [1.0]),
        payload={"org_id": "acme", "doc_id": "d", "chunk_id": f"d:{i}", "text": "t"},
    )


def test_second_process_gets_busy_error_and_holder_keeps_working(tmp_path: Path) -> None:
    path = tmp_path / "vectors"
    store = QdrantEdgeStore.open(path, lock_timeout_s=1)
    try:
        store.upsert([_point(0)])
        result = _open_in_other_process(path, 0.5)
        assert result.returncode == 3, result.stdout + result.stderr
        assert "busy" in result.stdout and "KBFLOW_QDRANT_URL" in result.stdout
        # The holder was not disturbed: it can still write and flush.
        store.upsert([_point(1)])
        assert store.count() == 2
    finally:
        store.close()
    result = _open_in_other_process(path, 0.5)
    assert result.returncode == 0 and "OPENED" in result.stdout, result.stderr
    reopened = QdrantEdgeStore.open(path, lock_timeout_s=1)
    try:
        assert reopened.count() == 2
    finally:
        reopened.close()


def test_busy_error_in_process(tmp_path: Path) -> None:
    from kbflow.errors import StoreBusy

    path = tmp_path / "vectors"
    holder = QdrantEdgeStore.open(path, lock_timeout_s=1)
    try:
        try:
            QdrantEdgeStore.open(path, lock_timeout_s=0.2)
        except StoreBusy as exc:
            message: Any = str(exc)
        else:  # pragma: no cover - the assertion below reports it
            message = None
        assert message is not None and f"pid {__import__('os').getpid()}" in message
    finally:
        holder.close()
