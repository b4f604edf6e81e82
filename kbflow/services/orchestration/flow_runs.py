"""Flow runs that died with their process end Crashed, not 'Running' forever.

A flow that kbflow runs in its own process (``kbflow ingest``, ``research``, ``review flow``,
``models finetune``, a background job) reports its states to Prefect from that process. Killed
with ``kill -9`` (or by the OOM killer, or a power cut) it reports nothing more, and the Prefect
server shows it Running for good. Prefect's own remedy, flow-run heartbeats
(``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, at least 30 s) and a "zombie" automation that marks a
run Crashed once they stop, works only on a server that has that automation (Prefect Cloud
ships one; a self-hosted server has none until someone creates it), takes minutes, and cannot
help a run of a temporary server. Processes started by a Prefect worker or runner are watched
by it, and it marks the run Crashed when the process dies.

So kbflow keeps books of its own in-process runs: when one starts running, its process writes
``<KBFLOW_HOME>/flow-runs/<run id>.json`` (run id, pid and the process's create time, the API
URL it reports to: None for a temporary server) and removes it when the run ends in that
process. A record whose process is gone (no such pid, a zombie, or a pid reused by a younger
process) names a run that died: `sweep` looks it up and, while the server still has it
Running, Pending, Paused or Cancelling, sets it Crashed (forced) with a message saying so. The
next kbflow command sweeps (through the recorded server), and so does ``kbflow server`` once its
server answers (it also reaches runs recorded against a temporary server: these use the same
database under ``PREFECT_HOME``).

Records of live processes are never touched, so two kbflow commands at once are safe; one
sweep runs at a time per home (an advisory lock; a busy lock skips the sweep). A record whose
server does not know the run (another database) is dropped; one whose server does not answer
is kept for a later sweep, for `MAX_AGE_S` at most. A link or unreadable record is removed
with a warning. Sweeping never raises: a command's own work comes first.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kbflow.services.orchestration.processes import is_running

if TYPE_CHECKING:
    import httpx

    from core.settings import Settings

log = logging.getLogger(__name__)

RUNS_DIR = "flow-runs"
"""Folder under KBFLOW_HOME that holds the records of in-process flow runs."""
LOCK_FILE = ".sweep.lock"
MAX_AGE_S = 30 * 24 * 3600.0
"""A record no server could be asked about for this long is dropped."""
UNFINISHED = frozenset({"RUNNING", "PENDING", "PAUSED", "CANCELLING"})
"""States in which a run still waits for its process; one whose process is gone is Crashed."""
TIMEOUT_S = 5.0

F = TypeVar("F")


@dataclass(frozen=True)
class RunRecord:
    """One in-process flow run and the process that runs it."""

    run_id: str
    flow: str
    pid: int
    create_time: float
    api_url: str | None
    """The Prefect API the run reports to; None: a temporary server of its process."""
    recorded_at: float

    @property
    def filename(self) -> str:
        return f"{self.run_id}.json"

    @classmethod
    def read(cls, path: Path) -> RunRecord:
        """Parse a record; raises ValueError (or OSError) when ``path`` is not one (a link
        included)."""
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file")
        data = json.loads(path.read_text(encoding="utf-8"))
        try:
            record = cls(
                run_id=str(uuid.UUID(str(data["run_id"]))),
                flow=str(data.get("flow") or "?"),
                pid=int(data["pid"]),
                create_time=float(data["create_time"]),
                api_url=str(data["api_url"]) if data.get("api_url") else None,
                recorded_at=float(data.get("recorded_at") or info.st_mtime),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{path} is not a kbflow flow-run record: {exc!r}") from exc
        if record.filename != path.name:
            raise ValueError(f"{path} records run {record.run_id}, not its own name")
        return record


@dataclass(frozen=True)
class Swept:
    """What `sweep` did with the record of one run whose process is gone."""

    record: RunRecord
    outcome: str
    """``crashed`` (marked), ``finished`` (the server had it in a final state), ``unknown``
    (no server asked knows the run), ``kept`` (no server answered: tried again later),
    ``expired`` (kept too long)."""


def runs_dir(home: Path) -> Path:
    return Path(home).resolve() / RUNS_DIR


# --- in the process that runs the flow -------------------------------------------------------

_lock = threading.Lock()
_own: dict[Path, str] = {}
"""Records this process wrote and has not removed yet (path: run id)."""


@contextmanager
def tracked(home: Path, flow: F) -> Iterator[F]:
    """``flow`` (a Prefect flow) with a hook that records each of its runs in this process
    while it runs; on leaving the block, the records this process wrote are removed (the run
    has ended in it, whatever its state). Call the yielded flow instead of ``flow``."""
    hook = _recorder(Path(home))
    hooks = [*getattr(flow, "on_running_hooks", []), hook]
    try:
        yielded = flow.with_options(on_running=hooks)  # type: ignore[attr-defined]
    except Exception:  # never let bookkeeping stop a run
        log.debug("could not add the flow-run record hook", exc_info=True)
        yielded = flow
    try:
        yield yielded
    finally:
        forget_own()


def forget_own() -> None:
    """Remove every record this process wrote (its runs have ended here)."""
    with _lock:
        own = list(_own)
        _own.clear()
    for path in own:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def _recorder(home: Path) -> Callable[..., None]:
    def record_running(flow: Any, flow_run: Any, state: Any) -> None:
        try:
            record_run(home, str(flow_run.id), str(getattr(flow, "name", "?")))
        except Exception:  # a hook's error would only be logged by Prefect: say why here
            log.warning("could not record flow run %s under %s", flow_run.id, home, exc_info=True)

    return record_running


def record_run(home: Path, run_id: str, flow: str, *, api_url: str | None = None) -> Path:
    """Write this process's record of run ``run_id`` (whole: a temporary file, then a rename).
    ``api_url`` None: the API this process's Prefect settings name (None: a temporary server).
    """
    import psutil

    if api_url is None:
        from prefect.settings import get_current_settings

        api_url = get_current_settings().api.url or None
    record = RunRecord(
        run_id=str(uuid.UUID(run_id)),
        flow=flow,
        pid=os.getpid(),
        create_time=psutil.Process().create_time(),
        api_url=api_url.rstrip("/") if api_url else None,
        recorded_at=time.time(),
    )
    folder = runs_dir(home)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / record.filename
    tmp = folder / f".{record.run_id}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(asdict(record), indent=2), encoding="utf-8")
    tmp.replace(path)
    with _lock:
        _own[path] = record.run_id
    return path


# --- in any later kbflow process -------------------------------------------------------------


def sweep(
    home: Path,
    *,
    servers: Sequence[str] = (),
    auth: str | None = None,
    now: Callable[[], float] = time.time,
) -> list[Swept]:
    """Mark Crashed the recorded runs under ``home`` whose process is gone; see the module.

    Each such run is looked up on the server it recorded, then on ``servers`` (API URLs,
    e.g. ``http://127.0.0.1:4200/api``); ``auth`` is the basic-auth credential to send
    (default: PREFECT_API_AUTH_STRING, or a bearer PREFECT_API_KEY). Costs one directory
    listing when nothing is recorded, and no request while every recorded process lives.
    Never raises.
    """
    try:
        return _sweep(home, servers=servers, auth=auth, now=now)
    except Exception as exc:
        log.warning("could not check %s for crashed flow runs: %s", runs_dir(home), exc)
        return []


def sweep_at_start(settings: Settings) -> list[Swept]:
    """`sweep` at a kbflow command's start: through each run's own server, and the one
    PREFECT_API_URL names (a run of a temporary server may be in its database), with this
    home's credential (`core.settings.prefect_auth_string`) unless the user exported one."""
    from core.settings import prefect_auth_string

    configured = os.environ.get("PREFECT_API_URL", "").strip()
    auth = os.environ.get("PREFECT_API_AUTH_STRING")
    if auth is None and not os.environ.get("PREFECT_API_KEY"):
        auth = prefect_auth_string(settings)
    return sweep(settings.home, servers=[configured] if configured else [], auth=auth)


def _sweep(
    home: Path, *, servers: Sequence[str], auth: str | None, now: Callable[[], float]
) -> list[Swept]:
    folder = runs_dir(home)
    try:
        paths = sorted(p for p in folder.iterdir() if p.suffix == ".json")
    except (FileNotFoundError, NotADirectoryError):
        return []
    dead: list[tuple[Path, RunRecord]] = []
    for path in paths:
        try:
            record = RunRecord.read(path)
        except FileNotFoundError:
            continue  # its run has just ended
        except (OSError, ValueError) as exc:
            log.warning("removing unreadable flow-run record %s: %s", path, exc)
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            continue
        if not is_running(record.pid, record.create_time):
            dead.append((path, record))
    if not dead:
        return []
    with _sweep_lock(folder) as mine:
        if not mine:
            return []  # another kbflow process sweeps this home right now
        with _client(auth) as client:
            return [
                swept
                for path, record in dead
                if (swept := _settle(client, path, record, servers, now())) is not None
            ]


def _settle(
    client: httpx.Client, path: Path, record: RunRecord, servers: Sequence[str], now: float
) -> Swept | None:
    if not path.exists():
        return None  # another sweep settled it
    candidates = list(dict.fromkeys(u.rstrip("/") for u in (record.api_url, *servers) if u))
    missing_on: set[str] = set()
    for url in candidates:
        state = _state_of(client, url, record.run_id)
        if state is _NO_ANSWER:
            continue
        if state is None:
            missing_on.add(url)  # this server has no such run (another database)
            continue
        if state not in UNFINISHED:
            return _done(path, record, "finished")
        message = (
            f"the process running this flow (pid {record.pid}) ended without reporting; kbflow "
            f"marked the run Crashed at {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}"
        )
        if not _mark_crashed(client, url, record.run_id, message):
            return Swept(record, "kept")
        log.warning(
            "flow run %s (%s) was %s, its process (pid %d) gone: marked it Crashed",
            record.run_id,
            record.flow,
            state,
            record.pid,
        )
        return _done(path, record, "crashed")
    if now - record.recorded_at > MAX_AGE_S:
        return _done(path, record, "expired")
    if record.api_url in missing_on or (record.api_url is None and missing_on):
        # Its own server, or (run on a temporary server) one of this home's, has no such run.
        return _done(path, record, "unknown")
    return Swept(record, "kept")


def _done(path: Path, record: RunRecord, outcome: str) -> Swept:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
    return Swept(record, outcome)


_NO_ANSWER = object()


def _state_of(client: httpx.Client, url: str, run_id: str) -> object:
    """The run's state type on ``url``; None when that server has no such run; `_NO_ANSWER`
    when it does not answer (or refuses)."""
    import httpx

    try:
        response = client.get(f"{url}/flow_runs/{run_id}")
    except httpx.HTTPError:
        return _NO_ANSWER
    if response.status_code == 404:
        return None
    if response.is_error:
        log.warning(
            "the Prefect server at %s refused to read flow run %s: HTTP %d",
            url,
            run_id,
            response.status_code,
        )
        return _NO_ANSWER
    state = (response.json() or {}).get("state") or {}
    return str(state.get("type") or "PENDING")


def _mark_crashed(client: httpx.Client, url: str, run_id: str, message: str) -> bool:
    import httpx

    body = {
        "state": {"type": "CRASHED", "name": "Crashed", "message": message},
        "force": True,
    }
    try:
        response = client.post(f"{url}/flow_runs/{run_id}/set_state", json=body)
    except httpx.HTTPError:
        return False
    if response.is_error:
        log.warning(
            "the Prefect server at %s refused to mark flow run %s Crashed: HTTP %d",
            url,
            run_id,
            response.status_code,
        )
        return False
    return True


def _client(auth: str | None) -> httpx.Client:
    import httpx

    from kbflow.services.orchestration.prefect_api import RetryingTransport, auth_headers

    return httpx.Client(
        headers=auth_headers(auth),
        timeout=httpx.Timeout(TIMEOUT_S, connect=2.0),
        transport=RetryingTransport(attempts=2),
    )


@contextmanager
def _sweep_lock(folder: Path) -> Iterator[bool]:
    import fcntl

    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock
