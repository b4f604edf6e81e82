"""One process owns the embedded store; a second gets a clear 'busy' error, not a broken shard."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from core.models import ChunkPoint, SparseVec
from sinks.qdrant_edge import QdrantEdgeStore
from sinks.vectors import point_id_for

_SECOND_PROCESS = textwrap.dedent(
    """
    import sys
    from core.errors import StoreBusy
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
    from core.errors import StoreBusy

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


# A process that takes the store's lock the way kbflow does, writes ``recorded`` into the lock
# file as if that pid held it, and waits for its stdin to close. With "fork" it forks after
# locking and exits, leaving the lock with its child (which prints its pid).
_LOCK_HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys
    path, recorded, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.pwrite(fd, (recorded or str(os.getpid())).encode(), 0)
    if mode == "fork" and os.fork():
        os._exit(0)
    print(os.getpid(), flush=True)
    sys.stdin.read()
    """
)


@contextmanager
def _lock_held(lock_path: Path, *, recorded: str = "", mode: str = "plain") -> Iterator[int]:
    """The pid of a live process holding ``lock_path``'s flock, until the block ends."""
    import psutil

    starter = subprocess.Popen(
        [sys.executable, "-c", _LOCK_HOLDER, str(lock_path), recorded, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None and starter.stdin is not None
    holder = int(starter.stdout.readline())
    try:
        yield holder
    finally:
        starter.stdin.close()  # the holder (or the forked child sharing the pipe) exits
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(holder).wait(timeout=30)
        starter.wait(timeout=30)


def _exited_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def _busy_message(path: Path) -> str:
    from core.errors import StoreBusy

    with pytest.raises(StoreBusy) as err:
        QdrantEdgeStore.open(path, lock_timeout_s=0.2)
    return str(err.value)


def test_busy_names_the_process_holding_the_lock_not_the_recorded_pid(tmp_path: Path) -> None:
    path = tmp_path / "vectors"
    stale = _exited_pid()
    with _lock_held(tmp_path / "vectors.lock", recorded=str(stale)) as holder:
        message = _busy_message(path)

    # Its pid and its command line (the interpreter's name and its arguments, shortened).
    assert f"pid {holder} ({Path(sys.executable).name} -c import fcntl" in message
    assert f"holds its lock file {tmp_path / 'vectors.lock'}" in message
    assert f"pid {stale}" not in message  # the file's pid is not the holder
    assert "is busy" in message and "KBFLOW_STORE_LOCK_TIMEOUT_S" in message


def test_busy_names_a_forked_child_that_inherited_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "vectors"
    with _lock_held(tmp_path / "vectors.lock", mode="fork") as child:
        recorded = int((tmp_path / "vectors.lock").read_text())
        message = _busy_message(path)

    assert recorded != child  # the file names the parent, which has exited
    assert f"pid {child} (" in message
    assert f"pid {recorded}" not in message


def test_a_stale_recorded_pid_is_not_presented_as_the_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sinks.qdrant_edge as edge

    path = tmp_path / "vectors"
    stale = _exited_pid()
    # As on a system where no holder can be seen (another user's process, no /proc).
    monkeypatch.setattr(edge, "_flock_holders", lambda lock_path: [], raising=False)
    with _lock_held(tmp_path / "vectors.lock", recorded=str(stale)):
        message = _busy_message(path)

    assert "which one could not be seen" in message
    assert f"pid {stale}, recorded in the file, is not running: a stale record" in message


def test_a_released_lock_leaves_no_pid_behind(tmp_path: Path) -> None:
    QdrantEdgeStore.open(tmp_path / "vectors", lock_timeout_s=1).close()
    assert (tmp_path / "vectors.lock").read_text() == ""
