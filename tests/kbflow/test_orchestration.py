"""`prefect_starting`: the temporary Prefect server starts while the caller loads what the flow
needs, and the flow then runs on that server rather than starting another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kbflow.services.orchestration import server as orchestration
from kbflow.services.orchestration.server import prefect_starting

_REPO = Path(__file__).resolve().parents[2]

_SCRIPT = """
import json, sys
from core.settings import Settings, configure_environment
configure_environment(Settings())
import psutil
from prefect import flow
from kbflow.services.orchestration.processes import TEMPORARY_SERVER, looks_like
from kbflow.services.orchestration.server import prefect_starting

def servers():
    return [c.pid for c in psutil.Process().children() if looks_like(TEMPORARY_SERVER, c.cmdline())]

with prefect_starting():
    pass
after = servers()

@flow
def add(a: int, b: int) -> int:
    return a + b

result = add(1, 2)
print(json.dumps({"after": after, "then": servers(), "result": result}))
"""


def _run(tmp_path: Path, **env: str) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    environ.update(KBFLOW_HOME=str(tmp_path / "home"), PYTHONPATH=str(_REPO), **env)
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        cwd=_REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.integration
def test_the_flow_runs_on_the_server_started_meanwhile(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert len(out["after"]) == 1  # up when the block is left
    assert out["then"] == out["after"]  # the flow found it: no second server
    assert out["result"] == 3


def _server_starts(
    monkeypatch: pytest.MonkeyPatch, start: Callable[[], None], api_url: str | None = None
) -> None:
    """Prefect's temporary server start replaced by ``start``; ``api_url`` the server set."""
    from prefect.server.api.server import SubprocessASGIServer

    monkeypatch.setattr(orchestration, "prefect_api_url", lambda: api_url)
    monkeypatch.setattr(SubprocessASGIServer, "start", lambda self, timeout=None: start())


def test_the_block_runs_while_the_server_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    block_ran = threading.Event()
    starts: list[bool] = []

    def start() -> None:
        # Answers only once the block has run: a start before (or after) the block fails.
        starts.append(block_ran.wait(timeout=10))

    _server_starts(monkeypatch, start)
    with prefect_starting():
        block_ran.set()
    assert starts == [True]


def test_a_server_that_fails_to_start_raises_after_the_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def start() -> None:
        raise RuntimeError("Timed out while attempting to connect to ephemeral Prefect API")

    _server_starts(monkeypatch, start)
    ran = []
    with pytest.raises(RuntimeError, match="ephemeral Prefect API"), prefect_starting():
        ran.append(True)
    assert ran == [True]


def test_nothing_starts_when_a_server_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    def start() -> None:
        raise AssertionError("a server is set: nothing may start")

    _server_starts(monkeypatch, start, api_url="http://127.0.0.1:4200/api")
    with prefect_starting():
        pass


def test_nothing_starts_when_temporary_servers_are_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def start() -> None:
        raise AssertionError("PREFECT_SERVER_EPHEMERAL_ENABLED is off: nothing may start")

    from prefect.settings import PREFECT_SERVER_EPHEMERAL_ENABLED, temporary_settings

    _server_starts(monkeypatch, start)
    with temporary_settings({PREFECT_SERVER_EPHEMERAL_ENABLED: False}), prefect_starting():
        pass


def test_an_error_in_the_block_does_not_wait_for_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    release = threading.Event()

    def start() -> None:
        release.wait(timeout=30)  # a server that takes its time

    _server_starts(monkeypatch, start)
    began = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt), prefect_starting():
            raise KeyboardInterrupt
        assert time.monotonic() - began < 5
    finally:
        release.set()
