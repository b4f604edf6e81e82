"""Fixtures the browser tests share (tests/flows/browser.py): `kbflow server` with a seeded
brand-new org, and a Chromium page."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import free_port
from tests.flows.browser import AM, BRIEF, INTRUDER, ORG, Ui, chromium_tab, kbflow_server


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    """`kbflow server` on a free port, with its own data dir, and a seeded brand-new org."""
    home = tmp_path_factory.mktemp("browser") / "home"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "KBFLOW_"))}
    env |= {
        "KBFLOW_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "KBFLOW_RESEARCH_OFFLINE": "true",
    }
    home.mkdir(parents=True)
    with kbflow_server(port, env, home.parent / "server.log"):
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


@pytest.fixture
def page(ui: Ui) -> Iterator[Any]:
    with chromium_tab(1400, 1000) as tab:
        yield tab
