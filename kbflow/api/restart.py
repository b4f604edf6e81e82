"""Restarts and upgrades of ``kbflow serve`` that drop no request (issue 33 item 5).

Two forms, both on SIGHUP to the process that holds the listening socket:

- ``--workers N``: uvicorn's supervisor starts a replacement worker, waits until it has loaded
  its model and serves, then stops the old one, one worker at a time (`supervise`). The
  parent keeps the socket (and the embedded store) all along; each old worker closes only its
  own copy of the socket.
- one process: it checks that the code on disk imports, stops accepting (connections that
  arrive from then on wait in the kernel's backlog of the socket, which it keeps open),
  drains, closes the store, then executes ``kbflow serve`` again in the same process (same
  pid) on that socket (`reexec`): the new code answers what waited.

Either way a retiring server lets each busy connection end on its own (`DrainingServer`): from
the first moment of its shutdown every answer says ``Connection: close``, so a client with a
pool of keep-alive connections opens a new one (to a live server) for its next request, and a
request already on its way on an idle connection is still answered; only connections idle for
`IDLE_GRACE_S` are closed, which a client notices before it would reuse one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Generator
from contextlib import contextmanager
from types import FrameType
from typing import Any, NoReturn

import uvicorn
from uvicorn.supervisors import multiprocess

# uvicorn's logger: what an operator sees beside "Shutting down" in either log format.
log = logging.getLogger("uvicorn.error")

CLOSE = (b"connection", b"close")
"""The header that tells a client not to reuse a connection."""

WORKER_READY_S = 120
"""How long a replacement worker may take to answer (its model loads first; on a loaded small
machine that takes tens of seconds). uvicorn's supervisor also waits this long for a worker's
health ping before it replaces the worker as hung."""

PREFLIGHT = "import kbflow.cli, kbflow.api.app"
"""What the code on disk must do before a single process executes it (an upgrade that does
not even import is refused, and the old code keeps serving)."""

IDLE_GRACE_S = 0.5
"""How long a retiring server keeps an idle keep-alive connection open: a request already on its
way on it is still answered (with ``Connection: close``). One idle longer is closed, as the
keep-alive timeout would: a client notices that before it reuses the connection."""

FD_OPTION = "--fd"
"""``kbflow serve``'s hidden option: serve on this inherited, listening socket."""


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose shutdown stops accepting, answers every request under way or
    arriving on an open connection with ``Connection: close``, and closes only connections idle
    for `IDLE_GRACE_S` (then uvicorn's own shutdown; all within the graceful-shutdown timeout).

    Why: uvicorn's own shutdown closes every idle keep-alive connection at once, under a request
    a client may have just sent on it: at a high request rate that was ~2 connection errors per
    stop (tests/kbflow/test_serve_restart.py), and none with this one.

    ``restartable``: SIGHUP asks for a restart (the single-process form): after a preflight
    of the code on disk the server shuts down with `restart` set, for the caller to `reexec`.
    """

    def __init__(self, config: uvicorn.Config, *, restartable: bool = False) -> None:
        super().__init__(config)
        self.restart = False
        self._restartable = restartable
        self._preflight: threading.Thread | None = None

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            if not self._restartable or threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = signal.signal(signal.SIGHUP, self._on_hup)
            try:
                yield
            finally:
                signal.signal(signal.SIGHUP, previous)

    def _on_hup(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit or (self._preflight is not None and self._preflight.is_alive()):
            return  # a restart or a stop is already under way
        log.info("SIGHUP: checking the code on disk before restarting")
        self._preflight = threading.Thread(
            target=self._restart_if_sound, name="kbflow-restart", daemon=True
        )
        self._preflight.start()

    def _restart_if_sound(self) -> None:
        problem = preflight()
        if problem is not None:
            log.error("restart refused, the old code keeps serving: %s", problem)
            return
        if self.should_exit:  # stopped meanwhile (SIGTERM): stay stopped
            return
        log.info("restarting: draining, then executing the new code on the same socket")
        self.restart = True
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.config.timeout_graceful_shutdown
        deadline = None if timeout is None else loop.time() + timeout
        settle = loop.time() + IDLE_GRACE_S
        for server in self.servers:
            server.close()  # stop accepting: other workers, or the kernel's backlog, take them
        self._close_after_each_answer()
        while not self.force_exit and (deadline is None or loop.time() < deadline):
            connections = list(self.server_state.connections)
            if not any(map(_busy, connections)) and (not connections or loop.time() >= settle):
                break
            await asyncio.sleep(0.05)
        if deadline is not None:  # uvicorn's own wait gets what is left of the timeout
            self.config.timeout_graceful_shutdown = int(max(0.0, deadline - loop.time()))
        await super().shutdown(sockets)  # closes the connections still idle

    def _close_after_each_answer(self) -> None:
        """Every answer from now on carries ``Connection: close`` (those under way included)."""
        config = self.config
        config.encoded_headers = [*config.encoded_headers, CLOSE]  # uvicorn re-reads it each second
        self.server_state.default_headers = [*self.server_state.default_headers, CLOSE]
        for connection in filter(_busy, list(self.server_state.connections)):
            cycle: Any = getattr(connection, "cycle")  # noqa: B009  (not on every protocol)
            cycle.keep_alive = False
            if not getattr(cycle, "response_started", True):
                cycle.default_headers = [*cycle.default_headers, CLOSE]


def _busy(connection: object) -> bool:
    """Whether ``connection`` is answering a request."""
    cycle = getattr(connection, "cycle", None)
    return cycle is not None and not getattr(cycle, "response_complete", True)


class _DrainingProcess(multiprocess.Process):
    """A ``--workers`` process whose server is a `DrainingServer`."""

    @property
    def server(self) -> uvicorn.Server:
        if self._server is None:
            self._server = DrainingServer(config=self.config)
        return self._server


def supervise(config: uvicorn.Config, sock: socket.socket) -> None:
    """Run ``config.workers`` worker processes on ``sock`` until SIGTERM or SIGINT; SIGHUP
    replaces them one at a time, each after its replacement is ready (uvicorn's supervisor)."""
    config.timeout_worker_healthcheck = WORKER_READY_S
    # uvicorn's supervisor builds its workers from this module's name at each start.
    multiprocess.Process = _DrainingProcess  # type: ignore[misc]
    multiprocess.Multiprocess(config, sockets=[sock]).run()


def preflight(timeout_s: float = 300) -> str | None:
    """Why the code on disk cannot serve (its import fails), or None."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", PREFLIGHT],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not check it: {exc}"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return f"`python -c {PREFLIGHT!r}` failed: {lines[-1] if lines else done.returncode}"
    return None


def listening_socket(config: uvicorn.Config, fd: int | None = None) -> socket.socket:
    """``kbflow serve``'s listening socket: bound now from ``config``, or the one a restarted
    process was given as ``fd``; either way with TCP_NODELAY set, which every connection it
    accepts inherits.

    Why: uvicorn's ``bind_socket`` builds its socket with protocol 0, and a socket accepted from
    it reports protocol 0 too, so asyncio (which sets TCP_NODELAY only where the protocol says
    TCP) leaves Nagle's algorithm on. A response written in two parts then waits for the
    client's delayed ACK: ~40 ms on every request but the first of a kept-alive connection.
    """
    sock = config.bind_socket() if fd is None else inherited_socket(fd)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def inherited_socket(fd: int) -> socket.socket:
    """The listening socket a restarted ``kbflow serve`` was given (family and type read from
    the descriptor)."""
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)
    return sock


def reexec(fd: int) -> NoReturn:
    """Execute this ``kbflow serve`` command again, in this process, serving on ``fd``.

    The new program starts with SIGHUP ignored until its server handles it, so a second SIGHUP
    during its start cannot end it.
    """
    os.set_inheritable(fd, True)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    argv = [sys.executable, *_without_fd(sys.orig_argv[1:]), FD_OPTION, str(fd)]
    log.info("executing %s", " ".join(argv[1:]))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


def _without_fd(args: list[str]) -> list[str]:
    """``args`` less an earlier restart's ``--fd N`` (or ``--fd=N``)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == FD_OPTION:
            skip = True
        elif not arg.startswith(FD_OPTION + "="):
            out.append(arg)
    return out
