"""tests/pg_cluster.py: the throwaway PostgreSQL the second test pass runs on."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

from tests import pg_cluster

PROBE = (
    "import os, sys, tempfile; from pathlib import Path;"
    " url = os.environ['KBFLOW_TEST_DATABASE_URL'];"
    " print(url);"
    " sys.exit(7 if url.startswith('postgresql+psycopg://postgres@127.0.0.1:') else 1)"
)


def test_without_binaries_it_skips_with_how_to_get_them_but_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KBFLOW_TEST_DATABASE_URL", raising=False)
    monkeypatch.setattr(pg_cluster, "find_bindir", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    assert pg_cluster.main(["--", sys.executable, "-c", "raise SystemExit(5)"]) == 0
    err = capsys.readouterr().err
    assert "skipped: no PostgreSQL binaries" in err and "apt-get install postgresql" in err
    monkeypatch.setenv("CI", "true")
    assert pg_cluster.main(["--", sys.executable, "-c", "raise SystemExit(5)"]) != 0
    assert "FAILED: no PostgreSQL binaries" in capsys.readouterr().err


def test_a_given_server_is_used_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KBFLOW_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:1/x")
    assert pg_cluster.main(["--", sys.executable, "-c", PROBE]) == 7


def test_the_cluster_runs_the_command_and_is_removed_after(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    if pg_cluster.find_bindir() is None:
        pytest.skip(f"no PostgreSQL binaries: {pg_cluster.HOW_TO_GET}")
    monkeypatch.delenv("KBFLOW_TEST_DATABASE_URL", raising=False)
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob("kbflow-pg-*"))
    assert pg_cluster.main(["--", sys.executable, "-c", PROBE]) == 7  # the command's own code
    assert "/kbflow_test" in capfd.readouterr().out
    assert set(tmp.glob("kbflow-pg-*")) <= before  # its files are gone
