"""Child processes that could outlive a kbflow command: recorded, stopped, and reaped.

A kbflow process can start two long-lived Prefect servers:

* the **temporary Prefect server** (``python -m uvicorn … prefect.server.api.server:create_app``)
  that Prefect starts as a child of any process that runs a flow without ``PREFECT_API_URL``;
* **``kbflow server``'s child**, ``python -m prefect server start``.

Both stop with their owner when it exits cleanly, and not when it is killed (``kill -9``, the
OOM killer): then they run on as orphans and keep their port. So, while its owner lives, each
is recorded in a PID file under ``<KBFLOW_HOME>/run/`` (owner and child pid, each with its
create time), removed when the owner exits cleanly; and the next kbflow command reaps the
children of owners that died (`reap_orphans`), after checking that the pid still names the
same process (create time) and that it still looks like a Prefect server (command line), so
that a reused pid is never killed.

Background ingest jobs (`kbflow.services.job_runner`) are never recorded: they are meant to outlive
the command that starts them. Their own temporary server is recorded by the job process itself.

Usage, at a process's entry point (``kbflow``'s CLI and the job runner do this)::

    guard_process(settings.home)  # reap, then record and stop what this process starts
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # psutil is imported on first use: `guard_process` runs at every CLI start
    import psutil

log = logging.getLogger(__name__)

TEMPORARY_SERVER = "prefect-temporary-server"
"""Kind of the temporary server Prefect starts in a process that has no PREFECT_API_URL."""
PREFECT_SERVER = "prefect-server"
"""Kind of the ``prefect server start`` child of ``kbflow server``."""

RUN_DIR = "run"
"""Folder under KBFLOW_HOME that holds the PID files."""

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""What `run_supervised` passes on to its child's process group."""

_CREATE_TIME_TOLERANCE_S = 1.0
"""psutil derives create times from the boot time, which can move by a clock adjustment; a
reused pid is younger than its PID file by far more than this."""


def looks_like(kind: str, cmdline: Sequence[str]) -> bool:
    """Whether a command line is one of the processes of ``kind`` that kbflow records.

    >>> looks_like(PREFECT_SERVER, ["python", "-m", "prefect", "server", "start"])
    True
    """
    if kind == TEMPORARY_SERVER:
        return any("prefect.server.api.server" in word for word in cmdline)
    if kind == PREFECT_SERVER:
        words = [Path(word).name for word in cmdline]
        return any(words[i : i + 3] == ["prefect", "server", "start"] for i in range(len(words)))
    return False


@dataclass(frozen=True)
class ChildRecord:
    """One PID file: a child process and the kbflow process that owns it."""

    kind: str
    owner_pid: int
    owner_create_time: float
    child_pid: int
    child_create_time: float
    cmdline: tuple[str, ...] = ()

    @property
    def filename(self) -> str:
        return f"{self.kind}-{self.owner_pid}-{self.child_pid}.json"

    @classmethod
    def read(cls, path: Path) -> ChildRecord:
        """Parse a PID file; raises ValueError (or OSError) when it is not one."""
        data = json.loads(path.read_text(encoding="utf-8"))
        try:
            return cls(
                kind=str(data["kind"]),
                owner_pid=int(data["owner_pid"]),
                owner_create_time=float(data["owner_create_time"]),
                child_pid=int(data["child_pid"]),
                child_create_time=float(data["child_create_time"]),
                cmdline=tuple(str(w) for w in data.get("cmdline", ())),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path} is not a kbflow PID file: {exc!r}") from exc


@dataclass(frozen=True)
class Reaped:
    """What `reap_orphans` did with one PID file of a dead owner."""

    record: ChildRecord
    stopped: bool
    """True when the orphan was running and was stopped; False when it was already gone or
    its pid now names another process (then nothing was killed)."""


def run_dir(home: Path) -> Path:
    """The folder of PID files under a KBFLOW_HOME."""
    return Path(home).resolve() / RUN_DIR


def record_child(home: Path, pid: int, kind: str) -> ChildRecord | None:
    """Write the PID file of child ``pid`` of this process; None when that pid is gone.

    The file is written whole (a temporary file, then a rename), so a reaper never reads half
    of one. This process removes it when it exits cleanly (`guard_process`) or with `forget`.
    """
    import psutil

    try:
        child = psutil.Process(pid)
        with child.oneshot():
            child_started, cmdline = child.create_time(), tuple(child.cmdline())
        owner_started = psutil.Process().create_time()
    except psutil.Error:
        return None
    record = ChildRecord(kind, os.getpid(), owner_started, pid, child_started, cmdline)
    folder = run_dir(home)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / record.filename
    tmp = path.with_suffix(".tmp")
    payload = asdict(record) | {"recorded_at": dt.datetime.now(dt.UTC).isoformat()}
    tmp.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    tmp.replace(path)
    with _lock:
        _own[path] = record
    return record


def forget(home: Path, record: ChildRecord) -> None:
    """Remove a PID file of this process (its child has stopped)."""
    path = run_dir(home) / record.filename
    path.unlink(missing_ok=True)
    with _lock:
        _own.pop(path, None)


def reap_orphans(home: Path, *, grace_s: float = 10.0) -> list[Reaped]:
    """Stop the recorded children whose owner has died, and remove their PID files.

    Costs one directory listing when nothing is recorded. A file whose owner is alive is left
    alone. An orphan is stopped (SIGTERM to it and its descendants, SIGKILL after ``grace_s``)
    only when its pid still names the recorded process — same create time, a command line of
    its kind — else the file is discarded and nothing is killed.
    """
    folder = run_dir(home)
    try:
        paths = sorted(p for p in folder.iterdir() if p.suffix == ".json")
    except FileNotFoundError:
        return []
    reaped: list[Reaped] = []
    for path in paths:
        try:
            record = ChildRecord.read(path)
        except FileNotFoundError:
            continue  # its owner has just removed it
        except (OSError, ValueError) as exc:
            log.warning("discarding unreadable PID file %s: %s", path, exc)
            path.unlink(missing_ok=True)
            continue
        if is_running(record.owner_pid, record.owner_create_time):
            continue
        child = _recorded_child(record)
        if child is not None:
            log.warning(
                "stopping orphaned %s (pid %d) left running by kbflow process %d, which died",
                record.kind,
                record.child_pid,
                record.owner_pid,
            )
            stop_tree(child, grace_s=grace_s)
        path.unlink(missing_ok=True)
        reaped.append(Reaped(record, stopped=child is not None))
    return reaped


def stop_tree(proc: psutil.Process, *, grace_s: float = 10.0) -> None:
    """SIGTERM a process and its descendants, then SIGKILL whatever is left after ``grace_s``.

    Zombies count as stopped: an orphan's zombie waits for init to reap it.
    """
    import psutil

    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        family = [proc]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for member in family:
            with contextlib.suppress(psutil.Error):
                member.send_signal(sig)  # psutil refuses a pid that now names another process
        family = _wait_gone(family, grace_s)
        if not family:
            return
    log.warning("processes %s did not stop after SIGKILL", [p.pid for p in family])


def run_supervised(
    cmd: Sequence[str],
    *,
    home: Path,
    kind: str,
    env: Mapping[str, str] | None = None,
    grace_s: float = 10.0,
) -> int:
    """Run ``cmd`` in its own process group until it exits; returns its exit code.

    SIGTERM, SIGINT and SIGHUP sent to this process are passed on to the child's whole group;
    whatever of the group has not exited ``grace_s`` after the first one is SIGKILLed, and so is
    anything the group leaves behind. The child is recorded as ``kind`` while it runs. A signal
    ends the wait with ``128 + signum`` unless the child chose its own code.
    """
    received: list[int] = []
    proc: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if proc is not None:
            _signal_group(proc.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    record = None
    try:
        # Handlers first: a signal that lands while the child starts is forwarded, not lost.
        proc = subprocess.Popen(
            list(cmd), env=None if env is None else dict(env), start_new_session=True
        )
        record = record_child(home, proc.pid, kind)
        if received:
            _signal_group(proc.pid, received[0])
        deadline: float | None = None  # for the group to exit, once a signal came
        killed = False
        while (code := proc.poll()) is None:
            time.sleep(0.1)
            if received and deadline is None:
                deadline = time.monotonic() + grace_s
            if deadline is not None and not killed and time.monotonic() > deadline:
                log.warning(
                    "pid %d still runs %.0f s after %s: killing its process group",
                    proc.pid,
                    grace_s,
                    signal.Signals(received[0]).name,
                )
                _signal_group(proc.pid, signal.SIGKILL)
                killed = True
        # Stragglers of its group, if any. Linux keeps a pid in use while it names a group.
        _signal_group(proc.pid, signal.SIGKILL)
    finally:
        if proc is not None and proc.poll() is None:  # an error of ours: take the child along
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if record is not None:
            forget(home, record)
    if code < 0:  # killed by a signal
        return 128 - code
    return 128 + received[0] if received and code == 0 else code


def guard_process(home: Path, *, watch_interval_s: float = 0.25) -> None:
    """Take charge, for this whole process, of the Prefect servers it may start.

    Call once, from the main thread, at a process entry point, before Prefect starts anything:

    1. reap orphans that dead kbflow processes left under ``home`` (`reap_orphans`);
    2. turn SIGTERM and SIGHUP into a clean exit (``SystemExit(128 + signum)``), so that
       ``finally`` blocks and Prefect's own ``atexit`` shutdown of its temporary server run;
    3. record each temporary Prefect server this process starts (a daemon thread looks for it
       among this process's children once Prefect is imported) and, at exit, stop any recorded
       child still running and remove the PID files.

    Later calls do nothing.
    """
    global _guarded_home
    with _lock:
        if _guarded_home is not None:
            return
        _guarded_home = Path(home).resolve()
    # atexit runs handlers last-in first-out: registered before Prefect registers its server's
    # stop(), this one runs after it and only finds what that left running.
    atexit.register(_at_exit)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _exit_on_signal)
    try:
        reap_orphans(home)
    except OSError as exc:  # an unreadable data dir: the command will say so itself
        log.warning("could not check %s for orphaned processes: %s", run_dir(home), exc)
    _watcher.start(_guarded_home, watch_interval_s)


# --- process-wide state behind guard_process -----------------------------------------------

_lock = threading.Lock()
_own: dict[Path, ChildRecord] = {}
"""PID files this process wrote and has not removed yet."""
_guarded_home: Path | None = None


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    # Once: a second SIGTERM must not cut the shutdown that the first one started short.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _at_exit() -> None:
    _watcher.stop()
    with _lock:
        own = list(_own.items())
    for path, record in own:
        child = _recorded_child(record)
        if child is not None:
            stop_tree(child, grace_s=5.0)
        path.unlink(missing_ok=True)
        with _lock:
            _own.pop(path, None)


class _ServerWatcher:
    """Finds the temporary Prefect server among this process's children and records it.

    Prefect starts that server lazily, deep inside its client, and exposes no hook; its
    subprocess is a direct child of this process with a recognisable command line (see
    `prefect.server.api.server.SubprocessASGIServer`). Polling costs nothing until Prefect is
    imported (commands such as ``search`` never import it) or when PREFECT_API_URL is set (no
    temporary server then), else ~2 ms per look.
    """

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, home: Path, interval_s: float) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(home, interval_s), name="kbflow-server-watcher", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)

    def _run(self, home: Path, interval_s: float) -> None:
        seen: set[int] = set()
        while not self._stop.wait(interval_s):
            if "prefect" not in sys.modules or os.environ.get("PREFECT_API_URL"):
                continue
            try:
                self._look(home, seen)
            except Exception:  # never let bookkeeping take the command down
                log.debug("server watcher failed", exc_info=True)

    @staticmethod
    def _look(home: Path, seen: set[int]) -> None:
        import psutil

        for child in psutil.Process().children():
            if child.pid in seen:
                continue
            try:
                cmdline = child.cmdline()
            except psutil.Error:
                continue
            if looks_like(TEMPORARY_SERVER, cmdline):
                seen.add(child.pid)
                record_child(home, child.pid, TEMPORARY_SERVER)


_watcher = _ServerWatcher()


# --- helpers ---------------------------------------------------------------------------------


def is_running(pid: int, create_time: float) -> bool:
    """Whether ``pid`` still names the process that was created at ``create_time`` (not a
    zombie, not a younger process that reused the pid); a process this user may not inspect
    counts as running."""
    import psutil

    try:
        proc = psutil.Process(pid)
        same = abs(proc.create_time() - create_time) < _CREATE_TIME_TOLERANCE_S
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # cannot tell: never treat an owner we cannot see as dead


def _recorded_child(record: ChildRecord) -> psutil.Process | None:
    """The recorded child if it still runs as recorded; None if gone or its pid was reused."""
    import psutil

    try:
        proc = psutil.Process(record.child_pid)
        with proc.oneshot():
            if abs(proc.create_time() - record.child_create_time) >= _CREATE_TIME_TOLERANCE_S:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            if not looks_like(record.kind, proc.cmdline()):
                return None
        return proc
    except psutil.Error:
        return None


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process has exited (or is a zombie); returns those still running."""
    import psutil

    deadline = time.monotonic() + timeout_s
    alive = procs
    while True:
        still: list[psutil.Process] = []
        for proc in alive:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    still.append(proc)
                elif proc.ppid() == os.getpid():
                    proc.wait(timeout=0)  # our own zombie: reap it
            except psutil.Error:
                pass
        alive = still
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
