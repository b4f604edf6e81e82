"""Nothing a kbflow command starts outlives it: the real CLI, the real Prefect servers.

``kbflow ingest`` without PREFECT_API_URL runs its flow on a temporary Prefect server that
Prefect starts as a child process; ``kbflow server`` runs ``prefect server start``. Each test
starts the command in a subprocess with its own KBFLOW_HOME (and so its own PREFECT_HOME),
signals or kills it, and checks with psutil that none of its descendants survive.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from kbflow.services.orchestration.prefect_api import RetryingTransport
from kbflow.services.orchestration.processes import PREFECT_SERVER, TEMPORARY_SERVER, run_dir
from tests import web
from tests.conftest import free_port, running

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ORG = "acme"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    """The CLI's environment: this test's KBFLOW_HOME, and no Prefect settings of the session's
    (kbflow then puts PREFECT_HOME under KBFLOW_HOME)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return clean | {"KBFLOW_HOME": str(home)}


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    path = tmp_path / "docs" / "leave.md"
    path.parent.mkdir()
    path.write_text("# Annual leave\n\nEvery employee gets 25 days of paid annual leave a year.\n")
    return path


@pytest.fixture
def spawned() -> Iterator[list[psutil.Process]]:
    """Every process a test saw; whatever still runs at the end is killed (and the test fails
    on its own assertions first)."""
    seen: list[psutil.Process] = []
    yield seen
    for proc in seen:
        try:
            if proc.is_running():
                proc.kill()
        except psutil.Error:
            pass


def _kbflow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kbflow.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _start(env: dict[str, str], *args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kbflow.cli", *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait_for(
    condition: Callable[[], Any],
    what: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    timeout_s: float = 120,
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"exited ({proc.returncode}) before {what}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout_s:.0f} s:\n{_tail(log)}")
        time.sleep(0.2)


def _soon(condition: Callable[[], Any], timeout_s: float = 5) -> Any:
    """``condition()``'s first truthy value within ``timeout_s``, else its last value."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:] if log.exists() else "(no output)"


def _pid_file(home: Path, kind: str) -> dict[str, Any] | None:
    files = sorted(run_dir(home).glob(f"{kind}-*.json")) if run_dir(home).exists() else []
    return json.loads(files[0].read_text()) | {"path": files[0]} if files else None


def _gone_within(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``procs`` still running (zombies do not count) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in procs if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _healthy(api_url: str) -> bool:
    try:
        return web.get(f"{api_url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _temporary_server(ingest: subprocess.Popen[bytes]) -> psutil.Process | None:
    """The temporary Prefect server among the children of ``ingest``, once it is healthy."""
    for child in psutil.Process(ingest.pid).children():
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        if "prefect.server.api.server:create_app" in cmdline:
            port = cmdline[cmdline.index("--port") + 1]
            return child if _healthy(f"http://127.0.0.1:{port}/api") else None
    return None


def _api_of(server: psutil.Process) -> str:
    cmdline = server.cmdline()
    return f"http://127.0.0.1:{cmdline[cmdline.index('--port') + 1]}/api"


def _created_org(env: dict[str, str]) -> None:
    root = _kbflow(env, "users", "add", "root", "--role", "superadmin")
    assert root.returncode == 0, root.stderr[-2000:]
    made = _kbflow(env, "orgs", "create", ORG, "--as", "root")
    assert made.returncode == 0, made.stderr[-2000:]


def test_kill_9_of_an_ingest_orphans_its_temporary_server_until_the_next_command_reaps_it(
    env: dict[str, str], home: Path, doc: Path, tmp_path: Path, spawned: list[psutil.Process]
) -> None:
    _created_org(env)
    log = tmp_path / "ingest.log"
    ingest = _start(env, "ingest", str(doc), "--org", ORG, "--json", log=log)
    spawned.append(psutil.Process(ingest.pid))
    server = _wait_for(lambda: _temporary_server(ingest), "temporary server", ingest, log)
    spawned.append(server)
    record = _soon(lambda: _pid_file(home, TEMPORARY_SERVER))  # written as the server started

    ingest.kill()
    ingest.wait(timeout=30)
    time.sleep(1)
    assert running(server), "the temporary server should be an orphan now"

    listed = _kbflow(env, "docs", "list", "--org", ORG, "--json")

    assert listed.returncode == 0, listed.stderr[-2000:]
    assert json.loads(listed.stdout) == []  # the killed ingest stored nothing
    assert _gone_within([server], 15) == [], "the next command did not reap the orphan"
    assert "orphaned prefect-temporary-server" in listed.stderr
    assert record is not None
    assert (record["owner_pid"], record["child_pid"]) == (ingest.pid, server.pid)
    assert record["child_create_time"] == pytest.approx(server.create_time(), abs=1)
    assert not record["path"].exists()


def test_sigterm_of_a_running_ingest_leaves_no_child_process_behind(
    env: dict[str, str], home: Path, doc: Path, tmp_path: Path, spawned: list[psutil.Process]
) -> None:
    _created_org(env)
    log = tmp_path / "ingest.log"
    ingest = _start(env, "ingest", str(doc), "--org", ORG, "--json", log=log)
    spawned.append(psutil.Process(ingest.pid))
    server = _wait_for(lambda: _temporary_server(ingest), "temporary server", ingest, log)
    api = _api_of(server)

    def flow_running() -> bool:
        with web.client(timeout=5, transport=RetryingTransport()) as prefect:
            runs = prefect.post(f"{api}/flow_runs/filter", json={}).json()
        return any(r["state_type"] == "RUNNING" for r in runs)

    _wait_for(flow_running, "running ingest flow run", ingest, log)
    record = _pid_file(home, TEMPORARY_SERVER)
    family = psutil.Process(ingest.pid).children(recursive=True)
    spawned.extend(family)

    ingest.send_signal(signal.SIGTERM)
    code = ingest.wait(timeout=60)

    assert _gone_within(family, 15) == [], _tail(log)
    assert code == 128 + signal.SIGTERM, _tail(log)  # a clean exit, not death by signal
    assert record is not None and not record["path"].exists()


def test_sigterm_to_kbflow_server_stops_the_prefect_server_and_frees_its_port(
    env: dict[str, str], home: Path, tmp_path: Path, spawned: list[psutil.Process]
) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    server = _start(
        env | {"PREFECT_SERVER_UI_ENABLED": "false"}, "server", "--port", str(port), log=log
    )
    spawned.append(psutil.Process(server.pid))
    _wait_for(lambda: _healthy(f"http://127.0.0.1:{port}/api"), "healthy API", server, log)
    family = psutil.Process(server.pid).children(recursive=True)
    spawned.extend(family)
    assert family, "kbflow server runs prefect server start as a child"
    record = _pid_file(home, PREFECT_SERVER)

    server.send_signal(signal.SIGTERM)
    code = server.wait(timeout=60)

    assert _gone_within(family, 15) == [], _tail(log)
    assert _port_is_free(port)
    assert code == 128 + signal.SIGTERM, _tail(log)
    assert record is not None and record["child_pid"] in {p.pid for p in family}
    assert not record["path"].exists()
