"""The Prefect server kbflow talks to: whether one is set, and `kbflow server` to start one.

"Is a Prefect server set?" has one answer, :func:`prefect_api_url`: the API URL Prefect itself
will use, whether it comes from the environment, a ``.env`` file (`.env.example` suggests one),
``prefect.toml`` or a profile under ``PREFECT_HOME``. Call it after `core.settings`'
``configure_environment`` (the CLI does, first thing), so Prefect reads kbflow's data dir.

`kbflow server` (:func:`plan_prefect_server`, :func:`run_prefect_server`) answers web pages of
its own UI's origin only (plus KBFLOW_PREFECT_CORS_ORIGINS), and with ``auth`` (the default off
loopback) requires Prefect's basic-auth credential: KBFLOW_PREFECT_AUTH_STRING, or one generated
once into ``<KBFLOW_HOME>/prefect-auth`` (mode 0600), which kbflow's clients of that home send
(`core.settings.configure_environment` exports it as PREFECT_API_AUTH_STRING).

While it runs, `kbflow server` records its API address in ``<KBFLOW_HOME>/prefect-server.json``;
a kbflow command of the same home with no PREFECT_API_URL of its own reports its runs there
(:func:`adopt_running_server`) instead of starting a temporary server.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import secrets
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from core import prefect_database
from core.errors import ConfigError, KbflowError
from core.http import tls_context
from core.settings import Settings, prefect_cors_environment

log = logging.getLogger(__name__)

AUTH_ENV = "PREFECT_API_AUTH_STRING"
"""What a Prefect client or worker reads its credential from."""
SERVER_AUTH_ENV = "PREFECT_SERVER_API_AUTH_STRING"
"""What a Prefect server requires as basic auth when it is set."""
AUTH_SETTING_ENV = "KBFLOW_PREFECT_AUTH_STRING"
"""The operator's own credential, instead of a generated one."""


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
            if home := os.environ.get("PREFECT_HOME"):  # migrated once per machine, not per home
                prefect_database.seed(Path(home), build=True)
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


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is reachable from this machine only."""
    name = host.strip().strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    """``host`` as a URL names it: a wildcard bind as this machine's name, IPv6 bracketed."""
    name = host.strip().strip("[]")
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(name).is_unspecified:
            name = socket.getfqdn()
    return f"[{name}]" if ":" in name else name


def server_origins(host: str, port: int, extra: str = "") -> list[str]:
    """The web origins allowed to call a Prefect server on ``host``:``port`` from a browser:
    its own UI (under each loopback name when it listens there), then ``extra``
    (comma-separated, KBFLOW_PREFECT_CORS_ORIGINS)."""
    hosts = [_url_host(host)]
    name = host.strip().strip("[]")
    wildcard = name in ("0.0.0.0", "::")
    if is_loopback(host) or wildcard:
        hosts += ["127.0.0.1", "localhost", "[::1]"]
    origins = [f"http://{h.lower()}:{port}" for h in hosts]
    origins += [o for o in extra.split(",") if o]
    return list(dict.fromkeys(origins))


@dataclass(frozen=True)
class PrefectServerPlan:
    """How `kbflow server` starts ``prefect server start``: where, for which web origins, and
    whether it requires the credential (whose value stays out of ``repr`` and every message)."""

    host: str
    port: int
    url: str
    """The UI's address (``http://HOST:PORT``)."""
    origins: tuple[str, ...]
    auth: bool
    credential_source: str | None
    """Where the credential comes from: the file's path, or AUTH_SETTING_ENV; None without."""
    credential_file: Path | None
    credential: str | None = field(default=None, repr=False)

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"


def plan_prefect_server(
    settings: Settings, port: int, *, host: str = "127.0.0.1", auth: bool | None = None
) -> PrefectServerPlan:
    """Decide how `kbflow server` runs; with ``auth`` (None: on unless ``host`` is loopback)
    the credential is read, or generated once into ``settings.prefect_auth_file``.

    Raises:
        ConfigError: the credential file is not a regular file kbflow can read and write.
    """
    if auth is None:
        auth = not is_loopback(host)
    origins = server_origins(host, port, settings.orchestration.prefect_cors_origins)
    credential = source = None
    credential_file: Path | None = None
    if auth:
        given = settings.orchestration.prefect_auth_string
        if given is not None:
            credential, source = given.get_secret_value(), AUTH_SETTING_ENV
        else:
            credential_file = settings.prefect_auth_file.resolve()
            try:
                credential = ensure_credential_file(credential_file)
            except OSError as exc:
                raise ConfigError(
                    f"cannot keep the Prefect server's credential in {credential_file}: {exc} "
                    f"— fix the data directory's permissions, or set {AUTH_SETTING_ENV}"
                ) from exc
            source = str(credential_file)
    return PrefectServerPlan(
        host=host,
        port=port,
        url=f"http://{_url_host(host)}:{port}",
        origins=tuple(origins),
        auth=auth,
        credential_source=source,
        credential_file=credential_file,
        credential=credential,
    )


def ensure_credential_file(path: Path) -> str:
    """The credential in ``path``; generated (``kbflow:`` + 256 random bits) and written with
    mode 0600 when there is none. A file others may read is made private first.

    Raises:
        ConfigError: ``path`` is a link or not a regular file, or holds no credential.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    credential = "kbflow:" + secrets.token_urlsafe(32)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".prefect-auth-")  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(credential + "\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, path)  # whole or not at all; never over one already there
        except FileExistsError:
            return _read_credential_file(path)
        return credential
    finally:
        Path(tmp).unlink(missing_ok=True)


def _read_credential_file(path: Path) -> str:
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(
            f"{path} (the Prefect server's credential) is not a regular file: remove it and "
            "start `kbflow server --auth` again to generate one."
        )
    if info.st_mode & 0o077:
        log.warning("%s was readable by others: made it private (0600)", path)
        os.chmod(path, 0o600)
    text = path.read_text(encoding="utf-8").strip()
    if len(text) < 16 or any(c.isspace() for c in text):
        raise ConfigError(
            f"{path} holds no usable credential (16+ characters, no spaces): remove it to have "
            "`kbflow server --auth` generate one."
        )
    return text


def prefect_server_environment(plan: PrefectServerPlan) -> dict[str, str]:
    """The environment of ``prefect server start`` for ``plan``: this process's, with Prefect's
    CORS limited to ``plan.origins`` and its basic auth on or off as ``plan.auth`` says."""
    env = dict(os.environ)
    # The UI asks the API at PREFECT_UI_API_URL, which Prefect derives from port 4200 whatever
    # --port says: point it at this server (unless the user chose another address).
    env.setdefault("PREFECT_UI_API_URL", plan.api_url)
    env.update(prefect_cors_environment(",".join(plan.origins)))
    if plan.auth and plan.credential:
        env[SERVER_AUTH_ENV] = env[AUTH_ENV] = plan.credential
    else:
        env.pop(SERVER_AUTH_ENV, None)
    return env


def run_prefect_server(settings: Settings, plan: PrefectServerPlan) -> int:
    """Run ``prefect server start`` as ``plan`` says, with kbflow's data directory, until it
    stops; SIGTERM, SIGINT and SIGHUP stop it and everything it started. Returns its exit code.
    """
    from kbflow.services.orchestration.processes import PREFECT_SERVER, run_supervised

    cmd = [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        plan.host,
        "--port",
        str(plan.port),
    ]
    env = prefect_server_environment(plan)
    if home := env.get("PREFECT_HOME"):  # a new home's database: migrated once per machine
        prefect_database.seed(Path(home), build=True, environ=env)
    _sweep_once_up(settings, plan)
    record = _record_server(settings.home, local_api_url(plan))
    try:
        return run_supervised(cmd, home=settings.home, kind=PREFECT_SERVER, env=env)
    finally:
        with contextlib.suppress(OSError):
            record.unlink()


SERVER_RECORD = "prefect-server.json"
"""The record of this home's running `kbflow server` (its API address, its process)."""
ADOPT_TIMEOUT_S = 1.0


def local_api_url(plan: PrefectServerPlan) -> str:
    """``plan``'s API as a process on this machine reaches it (a wildcard bind over loopback)."""
    name = plan.host.strip().strip("[]")
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(name).is_unspecified:
            name = "::1" if ":" in name else "127.0.0.1"
    host = f"[{name}]" if ":" in name else name
    return f"http://{host}:{plan.port}/api"


def _record_server(home: Path, api_url: str) -> Path:
    import psutil

    me = psutil.Process()
    path = Path(home) / SERVER_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SERVER_RECORD}.{os.getpid()}.tmp")
    data = {"api_url": api_url, "pid": me.pid, "create_time": me.create_time()}
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)  # whole, never half-written
    return path


def running_server_url(settings: Settings) -> str | None:
    """The API address of this home's `kbflow server` while it runs (its record, its process
    alive: a pid reused by another process does not count), else None. Read at the moment of
    asking, so a long-running process (``kbflow serve``) finds a server started after it."""
    from kbflow.services.orchestration.processes import is_running

    path = Path(settings.home) / SERVER_RECORD
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        url, pid, created = str(data["api_url"]), int(data["pid"]), float(data["create_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none recorded, or not a record
    if not url.startswith("http://") or not is_running(pid, created):
        return None
    return url


def adopt_running_server(settings: Settings) -> str | None:
    """Point this process (and what it starts) at this home's running `kbflow server` when no
    PREFECT_API_URL is set: its runs then show in that server's UI, and no temporary server is
    started (seconds to a minute of a one-file command on a loaded machine). Returns the URL
    adopted, or None: a URL is already set, no server is recorded, its process is gone (a pid
    reused by another process included), or it does not answer within ``ADOPT_TIMEOUT_S``.
    Call before Prefect is imported (it reads PREFECT_API_URL once)."""
    if os.environ.get("PREFECT_API_URL", "").strip():
        return None
    url = running_server_url(settings)
    if url is None:
        return None
    import httpx

    try:  # up, even when it asks for the credential (401): the clients of this home send it
        if (
            httpx.get(f"{url}/health", timeout=ADOPT_TIMEOUT_S, verify=tls_context()).status_code
            >= 500
        ):
            return None
    except httpx.HTTPError:
        return None  # starting, or stuck: a temporary server as before
    os.environ["PREFECT_API_URL"] = url
    return url


def _sweep_once_up(settings: Settings, plan: PrefectServerPlan, *, wait_s: float = 300.0) -> None:
    """In a daemon thread: once the server answers (within ``wait_s``), mark Crashed the runs
    of this home whose kbflow process died (`kbflow.services.orchestration.flow_runs.sweep`), those
    of temporary servers included: they share its database under PREFECT_HOME."""
    from kbflow.services.orchestration import flow_runs

    api = local_api_url(plan)

    def sweep() -> None:
        import httpx

        deadline = time.monotonic() + wait_s
        with httpx.Client(timeout=2.0, verify=tls_context()) as client:
            while time.monotonic() < deadline:
                try:
                    if client.get(f"{api}/health").status_code < 500:
                        break  # up (a 401: up, with --auth)
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            else:
                return
        flow_runs.sweep(settings.home, servers=[api], auth=plan.credential if plan.auth else None)

    threading.Thread(target=sweep, name="kbflow-crashed-runs", daemon=True).start()


def serve_prefect(
    settings: Settings, port: int, *, host: str = "127.0.0.1", auth: bool | None = None
) -> int:
    """Run ``prefect server start`` on ``host``:``port`` with kbflow's data directory until it
    stops (see `plan_prefect_server`, `run_prefect_server`). Returns its exit code.
    """
    return run_prefect_server(settings, plan_prefect_server(settings, port, host=host, auth=auth))
