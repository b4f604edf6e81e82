"""Start ``kbflow serve`` as a child process on a free loopback port and wait until it answers.

One helper for everything that runs the service beside itself: the demo, the serve benchmark
and the tests that drive the real server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from core.http import tls_context

REPO = Path(__file__).resolve().parents[2]


class ServiceDidNotStart(RuntimeError):
    """The service exited, or did not answer ``/readyz`` in time; the message has its log."""


class ReadyAnswer(TypedDict):
    """``/readyz``'s answer (`kbflow.api.schemas.Readiness`)."""

    status: Literal["ready", "degraded"]
    vector_store: Literal["open", "unavailable"]
    shared: bool


@dataclass(frozen=True)
class Launched:
    base: str  # http://127.0.0.1:<port>
    ready: ReadyAnswer  # the first /readyz answer that counted
    proc: subprocess.Popen[bytes]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def launched(
    home: Path,
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    require_ready: bool = True,
    wait_s: float = 180,
    code: Path = REPO,
) -> Iterator[Launched]:
    """``kbflow serve [args]`` over the data in ``home`` until the block ends.

    Args:
        home: its ``KBFLOW_HOME``.
        log: where its output goes (a file, never a pipe that could fill).
        env: more environment for it.
        require_ready: wait for ``status: ready``; False accepts a degraded start too.
        wait_s: how long it may take to answer.
        code: the checkout whose code it runs (a benchmark's baseline); default this one.

    Raises:
        ServiceDidNotStart: it exited or did not answer in time.
    """
    port = free_port()
    environ = {**os.environ, "KBFLOW_HOME": str(Path(home).resolve()), **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(code), os.environ.get("PYTHONPATH", "")) if p
    )
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kbflow.cli", "serve", "--port", str(port), *args],
            cwd=code,
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        ready = wait_ready(base, proc, log, require_ready=require_ready, wait_s=wait_s)
        yield Launched(base, ready, proc)
    finally:
        stop(proc)


def wait_ready(
    base: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    *,
    require_ready: bool = True,
    wait_s: float = 180,
) -> ReadyAnswer:
    """Poll ``/readyz`` until it counts; its answer."""
    import httpx

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceDidNotStart(f"kbflow serve exited with {proc.returncode}:\n{_tail(log)}")
        try:
            response = httpx.get(f"{base}/readyz", timeout=2, verify=tls_context())
            ready: ReadyAnswer = response.json()
            if response.status_code == 200 and (
                ready.get("status") == "ready" or not require_ready
            ):
                return ready
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.3)
    raise ServiceDidNotStart(f"kbflow serve was not ready within {wait_s:g}s:\n{_tail(log)}")


def stop(proc: subprocess.Popen[bytes], wait_s: float = 30) -> None:
    """Ask it to stop (SIGTERM: a graceful shutdown), then kill it if it does not."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(log: Path, chars: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"
