"""A flow run whose kbflow process died ends Crashed, never 'Running' forever; and a CLI run's
INFO lines reach Prefect's Logs tab while the terminal stays quiet.

One real ``kbflow server`` for the module; the CLI runs in subprocesses against it
(PREFECT_API_URL). An ingest is held at a fault point (``KBFLOW_FAULT_AT=…=hang``) while it
runs, then killed with SIGKILL: nothing in it reports the end of its run. See
`kbflow.services.orchestration.flow_runs` for the bookkeeping that settles such runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from kbflow.services.orchestration.flow_runs import runs_dir
from kbflow.services.orchestration.prefect_api import RetryingTransport
from tests import web
from tests.conftest import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ORG = "acme"
HANG = "ingest.after_register:1=hang"


@dataclass
class Server:
    """``kbflow server`` on ``port`` with ``home``; `restart` stops it and starts another."""

    home: Path
    port: int
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    spawned: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kbflow.cli", "server", "--port", str(self.port)],
                cwd=REPO, env=self.env | {"PREFECT_SERVER_UI_ENABLED": "false"},
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        _until(lambda: _healthy(self.api), "a healthy Prefect API", 120, self.log)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("crashed-runs")
    home = root / "home"
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "KBFLOW_"))}
    env = clean | {
        "KBFLOW_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "KBFLOW_STORE_LOCK_TIMEOUT_S": "300",  # a second ingest waits for the first one's store
    }
    srv = Server(home=home, port=port, env=env, log=root / "server.log")
    srv.start()
    try:
        for args in (("users", "add", "root", "--role", "superadmin"),
                     ("orgs", "create", ORG, "--as", "root")):  # fmt: skip
            done = _kbflow(srv.env, *args)
            assert done.returncode == 0, done.stderr[-2000:]
        yield srv
    finally:
        for proc in srv.spawned:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        srv.stop()


def _kbflow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kbflow.cli", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _docs(folder: Path, name: str, n: int = 2) -> Path:
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"{name}-{i}.md").write_text(
            f"# {name.title()} note {i}\n\nThe {name} team meets on day {i + 1} of each month.\n"
        )
    return folder


def _healthy(api: str) -> bool:
    try:
        return web.get(f"{api}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _until(condition: Callable[[], Any], what: str, timeout_s: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            pytest.fail(f"no {what} after {timeout_s:.0f} s:\n{tail}")
        time.sleep(0.25)
    return value


def _api(server: Server) -> httpx.Client:
    return web.client(base_url=server.api, timeout=10, transport=RetryingTransport())


def _run(server: Server, run_id: str) -> dict[str, Any]:
    with _api(server) as api:
        response = api.get(f"/flow_runs/{run_id}")
    response.raise_for_status()
    return dict(response.json())


def _state(server: Server, run_id: str) -> str:
    return str((_run(server, run_id).get("state") or {}).get("type"))


def _records(home: Path) -> dict[int, dict[str, Any]]:
    """The flow-run records under ``home``, by pid."""
    folder = runs_dir(home)
    out: dict[int, dict[str, Any]] = {}
    for path in folder.glob("*.json") if folder.exists() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[int(data["pid"])] = data | {"path": path}
    return out


def _running_run(server: Server, proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    """The record of ``proc``'s flow run, once the server has that run Running."""

    def found() -> dict[str, Any] | None:
        if proc.poll() is not None:
            pytest.fail(f"ingest exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
        record = _records(server.home).get(proc.pid)
        if record and _state(server, record["run_id"]) == "RUNNING":
            return record
        return None

    return dict(_until(found, "running ingest flow run", 180, log))


def _ingest(server: Server, folder: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kbflow.cli", "ingest", str(folder), "--org", ORG, "--json"],
            cwd=REPO, env=server.env | env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    server.spawned.append(proc)
    return proc


def test_a_killed_ingest_ends_crashed_at_the_next_command_and_a_live_one_is_left_running(
    server: Server, tmp_path: Path
) -> None:
    dead_log, live_log = tmp_path / "dead.log", tmp_path / "live.log"
    dead = _ingest(server, _docs(tmp_path / "a", "ferry"), dead_log, KBFLOW_FAULT_AT=HANG)
    live = _ingest(server, _docs(tmp_path / "b", "garden"), live_log, KBFLOW_FAULT_AT=HANG)
    dead_run = _running_run(server, dead, dead_log)
    live_run = _running_run(server, live, live_log)

    dead.kill()  # kill -9: no chance to report anything
    dead.wait(timeout=30)
    assert _state(server, dead_run["run_id"]) == "RUNNING"  # what the UI showed for good

    listed = _kbflow(server.env, "docs", "list", "--org", ORG, "--json")

    assert listed.returncode == 0, listed.stderr[-2000:]
    _until(lambda: _state(server, dead_run["run_id"]) == "CRASHED", "Crashed state", 60, dead_log)
    message = (_run(server, dead_run["run_id"])["state"] or {}).get("message") or ""
    assert f"pid {dead.pid}" in message and "marked the run Crashed" in message, message
    assert not dead_run["path"].exists()
    assert "marked it Crashed" in listed.stderr
    # The concurrent run's process lives: its run and its record are left alone.
    assert _state(server, live_run["run_id"]) == "RUNNING"
    assert live_run["path"].exists()
    assert live.poll() is None

    # Killed too, it ends Crashed when `kbflow server` starts again, without another command.
    live.kill()
    live.wait(timeout=30)
    server.restart()
    _until(
        lambda: _state(server, live_run["run_id"]) == "CRASHED",
        "Crashed state after the server's restart",
        60,
        server.log,
    )
    message = (_run(server, live_run["run_id"])["state"] or {}).get("message") or ""
    assert f"pid {live.pid}" in message, message
    assert not live_run["path"].exists()


def test_a_cli_ingest_logs_info_to_prefect_and_nothing_more_to_the_terminal(
    server: Server, tmp_path: Path
) -> None:
    done = _kbflow(server.env, "ingest", str(_docs(tmp_path / "c", "harbour")), "--org", ORG,
                   "--json")  # fmt: skip

    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["documents"] == 2
    assert "INFO" not in done.stderr, done.stderr[-2000:]
    assert not _records(server.home)  # removed when the run ended
    body = {
        "flows": {"name": {"any_": ["ingest"]}},
        "flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}},
        "sort": "START_TIME_DESC",
        "limit": 1,
    }
    with _api(server) as api:
        (run,) = api.post("/flow_runs/filter", json=body).json()

        def info_lines() -> list[str]:
            logs = api.post(
                "/logs/filter",
                json={"logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200},
            ).json()
            return [log["message"] for log in logs if log["level"] == 20]

        lines = _until(info_lines, "INFO log lines of the run", 30, tmp_path / "none")
    assert any("discovered 2 sources" in line for line in lines), lines


def test_a_command_of_the_home_reports_to_its_running_server_without_being_told(
    server: Server, tmp_path: Path
) -> None:
    """No PREFECT_API_URL: the ingest finds this home's `kbflow server` and runs there (its
    run in that UI), instead of starting a temporary server of its own (which keeps its runs
    in the same database: the run's own record says which API it reports to)."""
    env = {k: v for k, v in server.env.items() if k != "PREFECT_API_URL"}
    log = tmp_path / "ingest.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kbflow.cli", "ingest", str(_docs(tmp_path / "d", "ferry")),
             "--org", ORG, "--json"],
            cwd=REPO, env=env | {"KBFLOW_FAULT_AT": HANG}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    server.spawned.append(proc)
    try:
        record = _running_run(server, proc, log)
        assert record["api_url"] == server.api, record
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_only_a_live_answering_server_of_the_home_is_adopted(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.settings import Settings
    from kbflow.services.orchestration.server import SERVER_RECORD, adopt_running_server

    # Recorded first, so that whatever adopt_running_server sets is undone after the test (it
    # writes os.environ itself; a URL left behind would send later tests' runs to a dead server).
    monkeypatch.setenv("PREFECT_API_URL", "")
    monkeypatch.delenv("PREFECT_API_URL")
    assert adopt_running_server(Settings(home=server.home)) == server.api
    assert os.environ["PREFECT_API_URL"] == server.api

    monkeypatch.delenv("PREFECT_API_URL")
    record = json.loads((server.home / SERVER_RECORD).read_text())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    other = tmp_path / "other"
    other.mkdir()
    for pid, created in (
        (int(dead.stdout), record["create_time"]),  # its process is gone
        (record["pid"], record["create_time"] - 60),
    ):  # a reused pid
        (other / SERVER_RECORD).write_text(
            json.dumps(record | {"pid": pid, "create_time": created})
        )
        assert adopt_running_server(Settings(home=other)) is None
    (other / SERVER_RECORD).write_text("{not json")
    assert adopt_running_server(Settings(home=other)) is None
    assert "PREFECT_API_URL" not in os.environ

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # the user's own wins
    assert adopt_running_server(Settings(home=server.home)) is None
