"""What the browser tests share: Debian's Chromium and Playwright (a test module that needs them
calls `playwright()` at import, and is skipped without them), and `kbflow server` with a seeded
brand-new org (the ``ui`` fixture of tests/flows/conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("KBFLOW_CHROMIUM") or shutil.which("chromium")
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def playwright() -> Any:
    """``playwright.sync_api``; skips (the whole module, when called at its import) where
    Chromium or Playwright is not installed."""
    if CHROMIUM is None:
        pytest.skip(
            "chromium is not installed (`make browser-deps` installs it as root)",
            allow_module_level=True,
        )
    return pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


ORG, AM, INTRUDER = "larch-cycles", "amy", "mallory"
BRIEF = """# Larch Cycles brief

Larch Cycles sells the Wren city bike for 899 EUR and the Kestrel cargo bike for 2,400 EUR.
Our tone is warm, plain and practical.
Customer service is run by Dana Lee, dana@larch.example, +44 20 7946 0018.
All bikes carry a five-year frame warranty under UK consumer law.
"""


@dataclass
class Ui:
    home: Path
    url: str  # the UI, e.g. http://127.0.0.1:PORT
    env: dict[str, str]

    def kbflow(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "kbflow.cli", *args],
            capture_output=True, text=True, env=self.env, timeout=300,
        )  # fmt: skip
        if check:
            assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
        return done

    def data(self, *args: str) -> Any:
        return json.loads(self.kbflow(*args, "--json").stdout)

    def start(self, *args: str, name: str) -> subprocess.Popen[str]:
        """A CLI command in the background; its output goes to files (``name``.out/.err)."""
        out = (self.home.parent / f"{name}.out").open("w")
        err = (self.home.parent / f"{name}.err").open("w")
        return subprocess.Popen(
            [sys.executable, "-m", "kbflow.cli", *args],
            stdout=out, stderr=err, text=True, env=self.env,
        )  # fmt: skip

    def paused_run_url(self, name: str, proc: subprocess.Popen[str], timeout_s: float) -> str:
        """The run link the command prints while its review waits (see `kbflow.flow_cli`)."""
        err = self.home.parent / f"{name}.err"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(r"(http://\S+/runs/flow-run/[0-9a-f-]{36})", err.read_text())
            if found:
                return found.group(1)
            if proc.poll() is not None:
                pytest.fail(f"{name} exited ({proc.returncode}) before pausing:\n{err.read_text()}")
            time.sleep(0.5)
        pytest.fail(f"{name} did not pause within {timeout_s}s:\n{err.read_text()}")


def shoot(tab: Any, tmp_path: Path, name: str) -> Path:
    """A full-page screenshot, also into $KBFLOW_UI_SCREENSHOTS when it is set."""
    path = tmp_path / f"{name}.png"
    tab.screenshot(path=str(path), full_page=True)
    if wanted := os.environ.get("KBFLOW_UI_SCREENSHOTS"):
        Path(wanted).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(wanted) / path.name)
    return path


@contextlib.contextmanager
def chromium_tab(width: int, height: int) -> Iterator[Any]:
    """A page in Debian's Chromium, ``width`` x ``height``, until the block ends."""
    with playwright().sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


@contextlib.contextmanager
def kbflow_server(port: int, env: dict[str, str], log_path: Path) -> Iterator[str]:
    """`kbflow server --port PORT` (its output to ``log_path``) until the block ends; yields
    its API URL once it answers, and fails the test if it does not within 120 s."""
    api = f"http://127.0.0.1:{port}/api"
    server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "kbflow.cli", "server", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=server_env,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not _healthy(api):
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"kbflow server did not start:\n{log_path.read_text()}")
                time.sleep(0.5)
            yield api
        finally:
            server.send_signal(signal.SIGTERM)  # `kbflow server` stops its whole process group
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()


def _healthy(api: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
