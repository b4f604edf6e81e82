"""A throwaway PostgreSQL for the tests: start a cluster, run a command against it, remove it.

    python -m tests.pg_cluster -- python -m pytest tests/sinks/test_registry.py

runs the command with ``KBFLOW_TEST_DATABASE_URL`` pointing at a fresh cluster on a free
loopback port, stops the cluster and deletes its files (also on Ctrl-C or failure), and exits
with the command's status. Where ``KBFLOW_TEST_DATABASE_URL`` is already set, the command runs
against that server and nothing is started.

Without PostgreSQL binaries it prints why it skipped and exits 0, except under CI (``CI=true``),
where a pass that silently vanished would look like a pass that succeeded: there it exits 3.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DATABASE = "kbflow_test"
EXIT_NO_POSTGRES = 3
HOW_TO_GET = (
    "install PostgreSQL (`apt-get install postgresql`, as `make test-postgres` does when run "
    "as root), or point KBFLOW_TEST_DATABASE_URL at a server, e.g. "
    "postgresql+psycopg://postgres@127.0.0.1:5432/kbflow_test"
)


def find_bindir() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: the newest /usr/lib/postgresql/*/bin,
    else ``pg_config --bindir``, else PATH. None when there is none."""

    def has_tools(folder: Path) -> bool:
        return (folder / "initdb").is_file() and (folder / "pg_ctl").is_file()

    def version(folder: str) -> float:
        try:
            return float(Path(folder).parent.name)
        except ValueError:
            return 0.0

    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if has_tools(Path(folder)):
            return Path(folder)
    if pg_config := shutil.which("pg_config"):
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            out = ""
        if out and has_tools(Path(out)):
            return Path(out)
    initdb = shutil.which("initdb")
    if initdb and has_tools(Path(initdb).parent):
        return Path(initdb).parent
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres(argv: list[str]) -> list[str]:
    """``initdb`` refuses to run as root: there the cluster belongs to the postgres user."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


@contextmanager
def cluster(bindir: Path) -> Iterator[str]:
    """A running cluster for the block; yields its ``postgresql+psycopg://`` URL."""
    root = Path(tempfile.mkdtemp(prefix="kbflow-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(sockets, "postgres", "postgres")
    pg_ctl = str(bindir / "pg_ctl")
    started = False
    try:
        initdb = [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]
        subprocess.run(
            _as_postgres(initdb),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        port = _free_port()
        options = (
            f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        subprocess.run(
            _as_postgres(
                [pg_ctl, "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start"]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        started = True
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/{DATABASE}"
    finally:
        if started:
            subprocess.run(
                _as_postgres([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"]),
                stdout=subprocess.DEVNULL,
                check=False,
            )
        shutil.rmtree(root, ignore_errors=True)


def _run(command: list[str], url: str) -> int:
    env = {**os.environ, "KBFLOW_TEST_DATABASE_URL": url}
    proc = subprocess.Popen(command, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # The child got the same Ctrl-C; wait for it so the cluster is not pulled from under it.
        proc.send_signal(signal.SIGINT)
        proc.wait()
        return 130


def main(argv: list[str]) -> int:
    """Run ``argv`` (after an optional ``--``) against a throwaway cluster; its exit status."""
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m tests.pg_cluster -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    if url := os.environ.get("KBFLOW_TEST_DATABASE_URL"):
        return _run(command, url)
    bindir = find_bindir()
    if bindir is None:
        ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
        print(
            f"{'FAILED' if ci else 'skipped'}: no PostgreSQL binaries (initdb, pg_ctl) found in "
            f"/usr/lib/postgresql/*/bin, `pg_config --bindir` or PATH — {HOW_TO_GET}",
            file=sys.stderr,
        )
        return EXIT_NO_POSTGRES if ci else 0
    # SIGTERM (a CI timeout) becomes an exception, so the cluster is stopped and removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with cluster(bindir) as url:
        return _run(command, url)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
