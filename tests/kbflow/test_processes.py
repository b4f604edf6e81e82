"""Process tracking (kbflow.services.orchestration.processes) on stand-in processes: PID files,
reaping, supervision.

The stand-ins are tiny Python processes whose command line carries a Prefect server's marker,
so these tests are fast and need no Prefect; tests/kbflow/test_processes_cli.py runs the real
servers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kbflow.services.orchestration import processes
from kbflow.services.orchestration.processes import PREFECT_SERVER, TEMPORARY_SERVER, ChildRecord
from tests.conftest import running

REPO = Path(__file__).resolve().parents[2]
FAKE_SERVER = "import time; time.sleep(120)"
MARKER = "prefect.server.api.server:create_app"  # what the temporary server's cmdline holds


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; whatever survives the test is killed and reaped."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _start(started: list[subprocess.Popen[bytes]], *args: str) -> psutil.Process:
    proc = subprocess.Popen([sys.executable, "-c", *args])
    started.append(proc)
    return psutil.Process(proc.pid)


def _dead_owner() -> tuple[int, float]:
    """The pid and create time of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    created = psutil.Process(proc.pid).create_time()
    proc.wait(timeout=30)
    return proc.pid, created


def _write(home: Path, record: ChildRecord) -> Path:
    path = processes.run_dir(home) / record.filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record.__dict__ | {"cmdline": list(record.cmdline)}))
    return path


def test_reaping_a_home_without_pid_files_does_nothing(tmp_path: Path) -> None:
    assert processes.reap_orphans(tmp_path / "home") == []
    assert not (tmp_path / "home").exists()


@pytest.mark.integration
def test_an_orphan_of_a_dead_owner_is_stopped_with_its_children(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    spawn_grandchild = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "time.sleep(120)\n"
    )
    orphan = _start(started, spawn_grandchild, MARKER)
    deadline = time.monotonic() + 30
    while not orphan.children() and time.monotonic() < deadline:
        time.sleep(0.05)
    (grandchild,) = orphan.children()
    owner_pid, owner_created = _dead_owner()
    record = ChildRecord(
        TEMPORARY_SERVER, owner_pid, owner_created, orphan.pid, orphan.create_time(), ()
    )
    path = _write(tmp_path, record)

    (reaped,) = processes.reap_orphans(tmp_path, grace_s=5)

    assert reaped.stopped and reaped.record == record
    assert not path.exists()
    assert not running(orphan) and not running(grandchild)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("cmdline_marker", "age_s"),
    [(MARKER, 100.0), ("", 0.0)],
    ids=["pid reused: other create time", "pid reused: not a Prefect server"],
)
def test_a_pid_file_whose_child_pid_now_names_another_process_kills_nothing(
    tmp_path: Path, started: list[subprocess.Popen[bytes]], cmdline_marker: str, age_s: float
) -> None:
    unrelated = _start(started, FAKE_SERVER, *([cmdline_marker] if cmdline_marker else []))
    owner_pid, owner_created = _dead_owner()
    record = ChildRecord(
        TEMPORARY_SERVER, owner_pid, owner_created, unrelated.pid, unrelated.create_time() - age_s
    )
    path = _write(tmp_path, record)

    (reaped,) = processes.reap_orphans(tmp_path, grace_s=5)

    assert not reaped.stopped
    assert not path.exists()
    assert running(unrelated)


@pytest.mark.integration
def test_a_pid_file_of_a_live_owner_is_left_alone(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    child = _start(started, FAKE_SERVER, MARKER)
    me = psutil.Process()
    record = ChildRecord(TEMPORARY_SERVER, me.pid, me.create_time(), child.pid, child.create_time())
    path = _write(tmp_path, record)

    assert processes.reap_orphans(tmp_path) == []
    assert path.exists() and running(child)


def test_an_unreadable_pid_file_is_discarded(tmp_path: Path) -> None:
    path = processes.run_dir(tmp_path) / "prefect-server-1-2.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert processes.reap_orphans(tmp_path) == []
    assert not path.exists()


@pytest.mark.parametrize(
    ("kind", "cmdline", "expected"),
    [
        (TEMPORARY_SERVER, ["python", "-m", "uvicorn", "--factory", MARKER], True),
        (PREFECT_SERVER, ["python", "-m", "prefect", "server", "start", "--port", "1"], True),
        (PREFECT_SERVER, ["/venv/bin/python", "/venv/bin/prefect", "server", "start"], True),
        (PREFECT_SERVER, ["python", "-m", "prefect", "worker", "start"], False),
        (TEMPORARY_SERVER, ["python", "-m", "kbflow.services.job_runner", "abc123"], False),
        (PREFECT_SERVER, ["python", "-m", "kbflow.services.job_runner", "abc123"], False),
    ],
)
def test_what_counts_as_a_recorded_kind(kind: str, cmdline: list[str], expected: bool) -> None:
    assert processes.looks_like(kind, cmdline) is expected


# --- run_supervised and guard_process change signal handlers: they run in a child process ----

SUPERVISOR = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from kbflow.services.orchestration.processes import PREFECT_SERVER, run_supervised

    child = (
        "import signal, subprocess, sys, time\\n"
        "if sys.argv[1] == 'stubborn':\\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\\n"
        "print('ready', flush=True)\\n"
        "time.sleep(120)\\n"
    )
    cmd = [sys.executable, "-c", child, sys.argv[2], "prefect", "server", "start"]
    sys.exit(run_supervised(cmd, home=Path(sys.argv[1]), kind=PREFECT_SERVER, grace_s=1.0))
    """
)


def _supervisor(home: Path, mode: str) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    sup = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(home), mode],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sup.stdout is not None and sup.stdout.readline().strip() == "ready"
    tree = psutil.Process(sup.pid).children(recursive=True)
    deadline = time.monotonic() + 30
    while len(tree) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
        tree = psutil.Process(sup.pid).children(recursive=True)
    assert len(tree) == 2, tree  # the supervised child and its own child
    return sup, tree


@pytest.mark.integration
@pytest.mark.parametrize("sig", processes.FORWARDED_SIGNALS, ids=lambda s: s.name)
def test_a_signal_to_the_supervisor_stops_the_whole_child_group(
    tmp_path: Path, sig: signal.Signals
) -> None:
    sup, tree = _supervisor(tmp_path, "polite")
    try:
        _wait_for(lambda: any(processes.run_dir(tmp_path).glob("*.json")), "the PID file")
        sup.send_signal(sig)
        assert sup.wait(timeout=30) == 128 + sig
        assert psutil.wait_procs(tree, timeout=10)[1] == []
        assert list(processes.run_dir(tmp_path).iterdir()) == []  # forgotten
    finally:
        _kill_all(sup, tree)


@pytest.mark.integration
def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    sup, tree = _supervisor(tmp_path, "stubborn")
    try:
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=30) == 128 + signal.SIGKILL
        assert psutil.wait_procs(tree, timeout=10)[1] == []
    finally:
        _kill_all(sup, tree)


GUARDED = textwrap.dedent(
    """
    import subprocess, sys, time, types
    from pathlib import Path
    from kbflow.services.orchestration.processes import guard_process

    guard_process(Path(sys.argv[1]), watch_interval_s=0.05)
    sys.modules.setdefault("prefect", types.ModuleType("prefect"))  # what arms the watcher
    server = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "{marker}"]
    )
    print(server.pid, flush=True)
    sys.stdin.read()  # until the test closes stdin (or signals us)
    """
).replace("{marker}", MARKER)


def _guarded_owner(home: Path) -> subprocess.Popen[str]:
    """A guarded process that starts a stand-in temporary server and prints its pid."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # it would disarm
    return subprocess.Popen(
        [sys.executable, "-c", GUARDED, str(home)],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.integration
@pytest.mark.parametrize("how", ["clean exit", "SIGTERM", "SIGHUP"])
def test_a_guarded_process_records_its_temporary_server_and_stops_it_when_it_exits(
    tmp_path: Path, how: str
) -> None:
    owner = _guarded_owner(tmp_path)
    assert owner.stdin is not None and owner.stdout is not None
    server = psutil.Process(int(owner.stdout.readline()))
    try:
        pid_file = processes.run_dir(tmp_path) / f"{TEMPORARY_SERVER}-{owner.pid}-{server.pid}.json"
        _wait_for(pid_file.exists, "the PID file")
        if how == "clean exit":
            owner.stdin.close()
            assert owner.wait(timeout=30) == 0
        else:
            sig = signal.SIGTERM if how == "SIGTERM" else signal.SIGHUP
            owner.send_signal(sig)
            assert owner.wait(timeout=30) == 128 + sig
        assert not running(server)
        assert not pid_file.exists()
    finally:
        _kill_all(owner, [server])


@pytest.mark.integration
def test_the_temporary_server_of_a_killed_guarded_process_is_reaped_next_time(
    tmp_path: Path,
) -> None:
    owner = _guarded_owner(tmp_path)
    assert owner.stdout is not None
    server = psutil.Process(int(owner.stdout.readline()))
    try:
        pid_file = processes.run_dir(tmp_path) / f"{TEMPORARY_SERVER}-{owner.pid}-{server.pid}.json"
        _wait_for(pid_file.exists, "the PID file")
        owner.kill()
        owner.wait(timeout=30)
        assert running(server)  # the orphan

        (reaped,) = processes.reap_orphans(tmp_path, grace_s=5)

        assert reaped.stopped and not running(server) and not pid_file.exists()
    finally:
        _kill_all(owner, [server])


def _wait_for(condition: object, what: str, timeout_s: float = 30) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _kill_all(proc: subprocess.Popen[str], others: list[psutil.Process]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    for other in others:
        with contextlib.suppress(psutil.Error):
            other.kill()
