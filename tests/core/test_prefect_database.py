"""A new home's Prefect database is a copy of one migrated once per machine
(`core.prefect_database`): a temporary server on it starts without running a migration, and
nothing that exists is ever replaced."""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from importlib import metadata
from pathlib import Path

import pytest

from core import prefect_database
from core.settings import Settings, configure_environment


def _newest_migration(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        (version,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    conn.close()
    return str(version)


def test_the_template_is_a_migrated_prefect_database_built_once() -> None:
    template = prefect_database.build_template()  # the session fixture built it already
    assert template is not None and template.is_file()
    assert template.name == f"prefect-{metadata.version('prefect')}.db"
    assert _newest_migration(template)  # every migration ran: the version table is there
    assert not Path(f"{template}-wal").exists()  # the file alone is the database
    mtime = template.stat().st_mtime_ns
    assert prefect_database.build_template() == template  # found, not built again
    assert template.stat().st_mtime_ns == mtime


def test_a_new_kbflow_home_gets_a_private_copy_and_an_existing_one_keeps_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    for name in prefect_database.URL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    template = prefect_database.build_template()
    assert template is not None
    settings = Settings(home=tmp_path / "home")
    configure_environment(settings)  # what every command does first
    db = settings.home.resolve() / "prefect" / "prefect.db"
    assert db.read_bytes() == template.read_bytes()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert _newest_migration(db) == _newest_migration(template)
    assert not [p for p in db.parent.iterdir() if p.name.startswith(".prefect-db-")]

    db.write_bytes(b"the home's own")  # a database that exists is never replaced
    assert prefect_database.seed(db.parent, build=True) is False
    assert db.read_bytes() == b"the home's own"


def test_a_database_of_the_users_choosing_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefect_home = tmp_path / "prefect"
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "postgresql+asyncpg://db/prefect")
    assert prefect_database.seed(prefect_home, build=True) is False
    assert not prefect_home.exists()
    # A server started with an environment of its own: its URL counts, not this process's.
    env = {k: v for k, v in os.environ.items() if k not in prefect_database.URL_VARIABLES}
    assert prefect_database.seed(prefect_home, environ=env) is True
    # The user's own PREFECT_HOME is not kbflow's to fill.
    monkeypatch.delenv("PREFECT_API_DATABASE_CONNECTION_URL")
    theirs = tmp_path / "their-prefect"
    monkeypatch.setenv("PREFECT_HOME", str(theirs))
    configure_environment(Settings(home=tmp_path / "home"))
    assert not (theirs / "prefect.db").exists()


def test_two_processes_seeding_one_home_leave_one_whole_database(tmp_path: Path) -> None:
    template = prefect_database.build_template()
    assert template is not None
    home = tmp_path / "prefect"
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(prefect_database.seed(home)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert (home / "prefect.db").read_bytes() == template.read_bytes()
    assert [p.name for p in home.iterdir()] == ["prefect.db"]


def test_no_prefect_means_no_template(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def missing(name: str) -> str:
        raise prefect_database.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(prefect_database.metadata, "version", missing)
    assert prefect_database.template_path() is None
    assert prefect_database.build_template() is None
    assert prefect_database.seed(tmp_path / "prefect", build=True) is False
