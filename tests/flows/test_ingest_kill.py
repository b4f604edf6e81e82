"""A changed re-ingest killed with a real SIGKILL (`kill -9`) in the middle, as the hostile review
did it: the CLI in a subprocess dies at a fault point (``KBFLOW_FAULT_AT=…=kill``) with no
chance to clean up. After the kill no source has two servable versions and no retired text is
served; the same command run again converges; reconcile then finds nothing to repair.
``tests/tasks/test_ingest_crash.py`` checks every instant of the run in-process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from core.models import SERVABLE_PARSE_STATUSES, Scope, SearchMode
from core.settings import Settings
from kbflow.services.query.context import open_home
from sinks.connect import open_registry
from tests.conftest import running

pytestmark = pytest.mark.integration

FILES = 20


def _write(folder: Path, version: int) -> None:
    folder.mkdir(exist_ok=True)
    for i in range(FILES):
        (folder / f"route-{i:02d}.md").write_text(
            f"# Ferry route {i}\n\nEdition {version}: boarding for route {i} closes "
            f"{10 + version} minutes before departure. Marker v{version}x{i}.\n"
        )


def _kbflow(home: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI; its output goes to files, not pipes: a process killed with SIGKILL leaves
    its temporary Prefect server holding whatever it inherited until the next command reaps
    it, and a pipe would keep this test waiting for that."""
    env = {**os.environ, "KBFLOW_HOME": str(home), "KBFLOW_INGEST_BATCH_DOCS": "5"}
    env.pop("KBFLOW_FAULT_AT", None)
    if fault:
        env["KBFLOW_FAULT_AT"] = fault
    out, err = home.parent / "stdout.txt", home.parent / "stderr.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        code = subprocess.run(
            [sys.executable, "-m", "kbflow.cli", *args],
            stdout=stdout, stderr=stderr, text=True, env=env, timeout=600,
        ).returncode  # fmt: skip
    return subprocess.CompletedProcess(args, code, out.read_text(), err.read_text())


def _state(home: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Servable versions per source, and which versions' texts a search returns."""
    monkeypatch.setenv("KBFLOW_HOME", str(home))
    settings = Settings()
    with open_registry(settings) as registry:
        docs = registry.documents.list_documents("acme")
    servable: dict[str, list[int]] = {}
    for d in docs:
        if d.status in (None, "approved") and d.parse_status in SERVABLE_PARSE_STATUSES:
            servable.setdefault(d.source_key, []).append(d.version)
    served: dict[str, set[int]] = {}
    with open_home(settings) as ctx:
        for mode in SearchMode:
            for hit in ctx.search(
                "ferry route boarding edition departure", Scope(org_id="acme"), mode=mode,
                top_k=50,
            ):  # fmt: skip
                version = 1 if "Marker v1x" in hit.text else 2
                served.setdefault(hit.uri, set()).add(version)
    return {"servable": servable, "served": served}


def _check(state: dict[str, Any]) -> None:
    doubles = {k: v for k, v in state["servable"].items() if len(v) > 1}
    assert not doubles, f"two servable versions: {doubles}"
    for uri, versions in state["served"].items():
        assert versions == set(state["servable"][uri]), (uri, versions)


def _prefect_server_of(proc: psutil.Process, home: Path) -> bool:
    """A temporary Prefect server the killed run (under ``home``) left behind."""
    try:
        cmdline = " ".join(proc.info["cmdline"] or [])
        return "prefect.server" in cmdline and proc.ppid() == 1 and _started_under(proc, home)
    except psutil.Error:
        return False


def _started_under(proc: psutil.Process, home: Path) -> bool:
    try:
        return proc.environ().get("KBFLOW_HOME") == str(home)
    except psutil.Error:
        return False


# All slow (`make test-all`): tests/tasks/ingest/test_ingest_crash.py crashes the same re-ingest
# at every fault point in the default run, and tests/kbflow/test_processes_cli.py and
# test_crashed_runs.py kill -9 a real ingest there.
KILLS = [
    pytest.param("ingest.after_hide:2", id="after_hide-2", marks=pytest.mark.slow),
    pytest.param("ingest.after_register:7", id="after_register-7", marks=pytest.mark.slow),
    pytest.param("ingest.after_upsert:1", id="after_upsert-1", marks=pytest.mark.slow),
    pytest.param("ingest.after_publish:3", id="after_publish-3", marks=pytest.mark.slow),
    # The last batch: the re-run has nothing to index, only the retired chunks to hide.
    pytest.param("ingest.after_publish:4", id="after_publish-4", marks=pytest.mark.slow),
    pytest.param("ingest.after_settle:4", id="after_settle-4", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("fault", KILLS)
def test_kill_9_during_a_changed_reingest_then_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    home, folder = tmp_path / "home", tmp_path / "docs"
    assert _kbflow(home, "users", "add", "root", "--role", "superadmin").returncode == 0
    assert _kbflow(home, "orgs", "create", "acme", "--as", "root").returncode == 0
    _write(folder, 1)
    first = _kbflow(home, "ingest", str(folder), "--org", "acme", "--json")
    assert first.returncode == 0, first.stderr[-2000:]
    _write(folder, 2)

    killed = _kbflow(home, "ingest", str(folder), "--org", "acme", "--json", fault=f"{fault}=kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    orphans = [p for p in psutil.process_iter(["cmdline"]) if _prefect_server_of(p, home)]
    after_kill = _state(home, monkeypatch)
    _check(after_kill)

    rerun = _kbflow(home, "ingest", str(folder), "--org", "acme", "--json")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    converged = _state(home, monkeypatch)
    _check(converged)
    assert len(converged["servable"]) == FILES
    assert all(v == [2] for v in converged["servable"].values())
    assert all(v == {2} for v in converged["served"].values())

    assert not [p for p in orphans if running(p)], "the killed run's server was not reaped"
    dry = _kbflow(home, "reconcile", "--org", "acme", "--dry-run", "--json")
    report = json.loads(dry.stdout)
    assert report["duplicates"] == [] and report["repaired"] == []
    again = json.loads(_kbflow(home, "ingest", str(folder), "--org", "acme", "--json").stdout)
    assert (again["documents"], again["unchanged"]) == (0, FILES)
