"""The Prefect server kbflow talks to: whether one is set, and `kbflow server` to start one.

"Is a Prefect server set?" has one answer, :func:`prefect_api_url`: the API URL Prefect itself
will use, whether it comes from the environment, a ``.env`` file (`.env.example` suggests one),
``prefect.toml`` or a profile under ``PREFECT_HOME``. Call it after `core.settings`'
``configure_environment`` (the CLI does, first thing), so Prefect reads kbflow's data dir.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from core.errors import KbflowError
from core.settings import Settings


def prefect_api_url() -> str | None:
    """The Prefect API this process's flow runs will report to; None when a run would start a
    temporary server of its own (no UI can reach a run paused there). Imports Prefect."""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url or None


@contextmanager
def prefect_starting() -> Iterator[None]:
    """Start the temporary Prefect server that this process's next flow run would start, in a
    thread, while the block runs; leave when it answers.

    The server takes seconds to start, in a process of its own, and the flow would wait for it
    before running a line: a block that loads what the flow needs (imports, models) runs in
    that wait instead. Prefect keeps one temporary server per process and the flow's client
    finds this one running. Nothing happens when a server is set (`prefect_api_url`). A server
    that fails to start raises what Prefect raises, after the block.
    """
    if prefect_api_url() or not _temporary_server_allowed():
        yield  # a server is set, or none may start (the flow then says so itself)
        return
    import encodings.idna  # noqa: F401  (httpx imports it on its first request: not in the thread)

    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    failed: list[BaseException] = []

    def start() -> None:
        try:
            server.start()
        except BaseException as exc:  # reported in the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=start, name="kbflow-prefect-start", daemon=True)
    thread.start()
    yield  # an error (or Ctrl-C) in the block leaves at once: the thread is a daemon, and
    # Prefect stops the server at exit
    thread.join()
    if failed:
        raise failed[0]


def _temporary_server_allowed() -> bool:
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_ENABLED

    return bool(PREFECT_SERVER_EPHEMERAL_ENABLED.value())


def require_prefect_server(message: str) -> str:
    """The Prefect API URL; raises KbflowError(``message``) when none is set."""
    url = prefect_api_url()
    if not url:
        raise KbflowError(message)
    return url


def serve_prefect(settings: Settings, port: int) -> int:
    """Run ``prefect server start`` on 127.0.0.1:``port`` with kbflow's data directory until it
    stops; SIGTERM, SIGINT and SIGHUP stop it and everything it started. Returns its exit code.
    """
    from kbflow.services.processes import PREFECT_SERVER, run_supervised

    cmd = [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    # The UI asks the API at PREFECT_UI_API_URL, which Prefect derives from port 4200 whatever
    # --port says: point it at this server (unless the user chose another address).
    env = dict(os.environ)
    env.setdefault("PREFECT_UI_API_URL", f"http://127.0.0.1:{port}/api")
    return run_supervised(cmd, home=settings.home, kind=PREFECT_SERVER, env=env)
