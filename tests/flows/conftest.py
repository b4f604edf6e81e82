"""Fixtures the browser tests share (tests/flows/browser.py): `kbflow server` with a seeded
brand-new org, and a Chromium page."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import free_port
from tests.flows.browser import (
    AM,
    BRIEF,
    CHROMIUM,
    INTRUDER,
    LAUNCH_ARGS,
    ORG,
    Ui,
    _healthy,
    playwright,
)


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    """`kbflow server` on a free port, with its own data dir, and a seeded brand-new org."""
    home = tmp_path_factory.mktemp("browser") / "home"
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "KBFLOW_"))}
    env |= {
        "KBFLOW_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_API_URL": api,
        "KBFLOW_RESEARCH_OFFLINE": "true",
    }
    server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    home.mkdir(parents=True)
    log = (home.parent / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "kbflow.cli", "server", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env=server_env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not _healthy(api):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"kbflow server did not start:\n{(home.parent / 'server.log').read_text()}"
                )
            time.sleep(0.5)
        ui = Ui(home=home, url=f"http://127.0.0.1:{port}", env=env)
        ui.kbflow("users", "add", "root", "--role", "superadmin")
        ui.kbflow("orgs", "create", ORG, "--name", "Larch Cycles", "--as", "root")
        ui.kbflow("users", "add", AM, "--role", "account_manager", "--as", "root")
        ui.kbflow("users", "add", INTRUDER, "--role", "engineer", "--org", ORG, "--as", "root")
        ui.kbflow("orgs", "assign-am", ORG, AM, "--as", "root")
        brief = home.parent / "brief.md"
        brief.write_text(BRIEF)
        ui.kbflow("seed", "--org", ORG, "--as", AM, "--file", str(brief))
        yield ui
    finally:
        server.send_signal(signal.SIGTERM)  # `kbflow server` stops its whole process group
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture
def page(ui: Ui) -> Iterator[Any]:
    with playwright().sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()
