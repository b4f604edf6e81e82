"""A new home's Prefect database, copied from one migrated once per machine.

The first Prefect server of a home (the temporary one a command starts, or `kbflow server`)
creates ``<PREFECT_HOME>/prefect.db`` and runs every one of Prefect's migrations on it: about
9 s and 8 CPU-seconds on two cores, before the first flow can run, for every new home. The
migrations are the same each time for one Prefect version, so kbflow runs them once per
machine and version into a template (``$XDG_CACHE_HOME/kbflow/prefect/prefect-<version>.db``;
``KBFLOW_PREFECT_DB_CACHE`` overrides the folder) and copies it into each new home. The server
still checks the database at start, and finds it at the newest migration.

Only Prefect's default database is seeded: a home whose ``prefect.db`` exists, or a process
with a database URL of its own (``PREFECT_API_DATABASE_CONNECTION_URL`` or
``PREFECT_SERVER_DATABASE_CONNECTION_URL``), is left alone. Nothing here imports Prefect.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from core.machine_cache import exclusive, kbflow_cache

log = logging.getLogger(__name__)

DATABASE_FILE = "prefect.db"
"""The database a Prefect server uses under PREFECT_HOME when no URL is set."""
URL_VARIABLES = ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL")
BUILD_TIMEOUT_S = 300.0


def template_path() -> Path | None:
    """Where this machine keeps the migrated database of the installed Prefect; None when
    Prefect is not installed."""
    try:
        version = metadata.version("prefect")
    except metadata.PackageNotFoundError:
        return None
    return kbflow_cache("prefect", "KBFLOW_PREFECT_DB_CACHE") / f"prefect-{version}.db"


def default_database(prefect_home: Path, environ: Mapping[str, str] | None = None) -> Path | None:
    """The database file a Prefect server of ``prefect_home`` would create; None when its
    environment (``environ``, else this process's) names a database of its own."""
    environ = os.environ if environ is None else environ
    if any(environ.get(name) for name in URL_VARIABLES):
        return None
    return prefect_home / DATABASE_FILE


def build_template() -> Path | None:
    """The migrated template, built first if this machine has none (once: a second process
    waits for the first). None when Prefect is not installed or the build failed (logged: a
    server then migrates its own database, as without a template)."""
    template = template_path()
    if template is None or template.is_file():
        return template
    with exclusive(template.parent / f"{template.name}.lock"):
        if template.is_file():
            return template
        with tempfile.TemporaryDirectory(dir=template.parent) as scratch:
            built = Path(scratch) / DATABASE_FILE
            env = {k: v for k, v in os.environ.items() if k not in URL_VARIABLES}
            env.update(PREFECT_HOME=scratch, PREFECT_API_DATABASE_CONNECTION_URL=(
                f"sqlite+aiosqlite:///{built}"))  # fmt: skip
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
                    env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                )  # fmt: skip
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("could not migrate a Prefect database template: %s", exc)
                return None
            if done.returncode != 0 or not built.is_file():
                log.warning(
                    "could not migrate a Prefect database template (exit %s): %s",
                    done.returncode, (done.stderr or done.stdout)[-500:],
                )  # fmt: skip
                return None
            _fold_journal(built)
            os.replace(built, template)
    return template


def seed(
    prefect_home: Path, *, build: bool = False, environ: Mapping[str, str] | None = None
) -> bool:
    """Copy the migrated template to ``prefect_home``'s new database, building the template
    first when ``build`` (else only if one is there); ``environ``: the server's environment,
    when it is not this process's. True when the home got a copy."""
    target = default_database(prefect_home, environ)
    if target is None or target.exists():
        return False
    template = build_template() if build else template_path()
    if template is None or not template.is_file():
        return False
    prefect_home.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=prefect_home, prefix=".prefect-db-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as out, template.open("rb") as src:
            shutil.copyfileobj(src, out)
        try:
            os.link(partial, target)  # never over a database another process made meanwhile
        except FileExistsError:
            return False
    finally:
        Path(partial).unlink(missing_ok=True)
    return True


def _fold_journal(path: Path) -> None:
    """Move a write-ahead log into the database file, so that the file alone is complete."""
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode=DELETE")
    db.close()
