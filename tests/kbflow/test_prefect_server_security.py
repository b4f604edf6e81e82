"""The Prefect servers kbflow starts answer no other web page, and `kbflow server --auth` wants
its credential (issue 31).

Real servers started the way kbflow starts them: ``kbflow server`` in a subprocess (its own
KBFLOW_HOME, no Prefect settings of the session's), and the temporary server a command's flow
run starts. A browser enforces CORS from the ``Access-Control-Allow-Origin`` header; a server
that gives it to any origin (Prefect's default, ``*``) lets any page a user opens read and
resume its runs.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from core.settings import (
    PREFECT_AUTH_FILE,
    Settings,
    configure_environment,
    prefect_auth_string,
)
from kbflow.services.orchestration import server as orchestration
from kbflow.services.orchestration.server import (
    ensure_credential_file,
    plan_prefect_server,
    prefect_server_environment,
    server_origins,
)
from tests import web
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
EVIL = "https://evil.example"


def _clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A CLI environment: this test's KBFLOW_HOME, no Prefect or kbflow settings of the
    session's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "KBFLOW_"))}
    return env | {"KBFLOW_HOME": str(home), "PYTHONPATH": str(REPO)} | extra


def _acao(response: httpx.Response) -> str | None:
    return response.headers.get("access-control-allow-origin")


def _preflight(api: str, origin: str) -> httpx.Response:
    return httpx.options(
        f"{api}/flow_runs/filter",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
        timeout=10,
    )


# --- kbflow server --auth: a real server --------------------------------------------------------


@dataclass
class Server:
    home: Path
    port: int
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api(self) -> str:
        return f"{self.origin}/api"

    def output(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")


def _healthy(api: str) -> bool:
    try:
        return web.get(f"{api}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`kbflow server --auth` on loopback, UI off (the API is what a page would call)."""
    base = tmp_path_factory.mktemp("prefect-auth")
    home, port = base / "home", free_port()
    out, err = base / "server.out", base / "server.err"
    env = _clean_env(
        home,
        PREFECT_SERVER_UI_ENABLED="false",
        KBFLOW_PREFECT_CORS_ORIGINS="https://ops.example.com",
    )
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kbflow.cli", "server", "--port", str(port), "--auth"],
            cwd=REPO, env=env, stdout=stdout, stderr=stderr,
        )  # fmt: skip
    running = Server(home, port, proc, out, err)
    try:
        deadline = time.monotonic() + 150
        while not _healthy(running.api):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"kbflow server did not start ({proc.poll()}):\n{running.output()}")
            time.sleep(0.3)
        yield running
    finally:
        proc.send_signal(signal.SIGTERM)  # stops its whole process group
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.integration
def test_kbflow_server_answers_its_own_origin_and_no_other_page(server: Server) -> None:
    evil = web.get(f"{server.api}/health", headers={"Origin": EVIL}, timeout=10)
    assert evil.status_code == 200  # a browser would hide it: no allow header for that page
    assert _acao(evil) is None
    refused = _preflight(server.api, EVIL)
    assert refused.status_code >= 400 and _acao(refused) is None
    for origin in (server.origin, f"http://localhost:{server.port}", "https://ops.example.com"):
        allowed = _preflight(server.api, origin)
        assert allowed.status_code == 200, origin
        assert _acao(allowed) == origin  # the UI, its loopback alias, the operator's origin


@pytest.mark.integration
def test_kbflow_server_auth_refuses_anonymous_calls_and_keeps_its_credential_private(
    server: Server,
) -> None:
    credential_file = server.home / PREFECT_AUTH_FILE
    assert stat.S_IMODE(credential_file.stat().st_mode) == 0o600
    credential = credential_file.read_text().strip()
    assert len(credential) >= 40

    anonymous = web.post(f"{server.api}/flow_runs/filter", json={}, timeout=10)
    assert anonymous.status_code == 401
    wrong = web.post(
        f"{server.api}/flow_runs/filter", json={}, auth=("kbflow", "guess"), timeout=10
    )
    assert wrong.status_code == 401
    from_page = web.post(
        f"{server.api}/flow_runs/filter", json={}, headers={"Origin": EVIL}, timeout=10
    )
    assert from_page.status_code == 401 and _acao(from_page) is None
    user, _, password = credential.partition(":")
    allowed = web.post(f"{server.api}/flow_runs/filter", json={}, auth=(user, password), timeout=10)
    assert allowed.status_code == 200, allowed.text

    output = server.output()
    assert credential not in output and password not in output
    assert "PREFECT_API_AUTH_STRING" in output and str(credential_file.resolve()) in output


_CLIENT = """
import json, sys
from core.settings import Settings, configure_environment
configure_environment(Settings())
from kbflow.services.orchestration import prefect_api
from core.errors import JobRunnerUnavailable
out = {}
try:
    prefect_api.deployment_id(sys.argv[1], "kbflow-job/kbflow-job")
except JobRunnerUnavailable as exc:
    out["deployment"] = str(exc)
if sys.argv[2] == "flow":
    from prefect import flow
    from prefect.client.orchestration import get_client

    @flow(name="kbflow-auth-check")
    def add(a: int, b: int) -> int:
        return a + b

    out["result"] = add(1, 2)
    with get_client(sync_client=True) as client:
        out["runs"] = [r.name for r in client.read_flow_runs()]
        out["state"] = client.read_flow_runs()[0].state_type.value
print(json.dumps(out))
"""


def _client(server: Server, home: Path, mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _CLIENT, server.api, mode],
        cwd=REPO, env=_clean_env(home, PREFECT_API_URL=server.api),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.integration
def test_kbflow_clients_of_the_home_send_the_credential_and_others_are_refused(
    server: Server, tmp_path: Path
) -> None:
    same_home = _client(server, server.home, "flow")
    assert same_home["result"] == 3  # the flow engine reported its run to the server
    assert same_home["state"] == "COMPLETED" and same_home["runs"]
    assert "has no deployment" in str(same_home["deployment"])  # kbflow's own REST client

    elsewhere = _client(server, tmp_path / "other-home", "rest")
    assert "wants a credential" in str(elsewhere["deployment"])
    assert "PREFECT_API_AUTH_STRING" in str(elsewhere["deployment"])


# --- the temporary server a command's flow run starts -------------------------------------------

_TEMPORARY = """
import json
from core.settings import Settings, configure_environment
configure_environment(Settings())
import httpx
from prefect.server.api.server import SubprocessASGIServer

server = SubprocessASGIServer()
server.start()
try:
    api = server.api_url
    out = {}
    for origin in ("https://evil.example", "https://ops.example.com"):
        r = httpx.options(api + "/flow_runs/filter", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
        g = httpx.get(api + "/health", headers={"Origin": origin})
        out[origin] = [r.status_code, r.headers.get("access-control-allow-origin"),
                       g.headers.get("access-control-allow-origin")]
    print(json.dumps(out))
finally:
    server.stop()
"""


@pytest.mark.integration
def test_the_temporary_server_answers_no_other_page(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _TEMPORARY],
        cwd=REPO,
        env=_clean_env(tmp_path / "home", KBFLOW_PREFECT_CORS_ORIGINS="https://ops.example.com"),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    status, preflight, simple = out[EVIL]
    assert status >= 400 and preflight is None and simple is None
    listed = "https://ops.example.com"
    assert out[listed] == [200, listed, listed]  # the origin the operator listed


# --- the pieces, without a server ---------------------------------------------------------------


def test_auth_defaults_on_off_loopback_and_the_credential_is_made_once(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    assert not plan_prefect_server(settings, 4200).auth
    assert not plan_prefect_server(settings, 4200, host="localhost").auth
    assert not plan_prefect_server(settings, 4200, host="::1").auth
    assert not settings.prefect_auth_file.exists()  # nothing generated without auth

    plan = plan_prefect_server(settings, 4200, host="0.0.0.0")
    assert plan.auth and plan.credential_file == settings.prefect_auth_file.resolve()
    assert plan.credential and plan.credential not in repr(plan)
    assert stat.S_IMODE(settings.prefect_auth_file.stat().st_mode) == 0o600
    again = plan_prefect_server(settings, 4201, host="10.1.2.3")
    assert again.auth and again.credential == plan.credential  # generated once, then kept
    assert not plan_prefect_server(settings, 4200, host="0.0.0.0", auth=False).auth

    env = prefect_server_environment(plan)
    assert env["PREFECT_SERVER_API_AUTH_STRING"] == plan.credential
    assert env["PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS"] == ",".join(plan.origins)
    assert "*" not in plan.origins
    off = prefect_server_environment(plan_prefect_server(settings, 4200, auth=False))
    assert "PREFECT_SERVER_API_AUTH_STRING" not in off


def test_the_operators_credential_wins_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KBFLOW_PREFECT_AUTH_STRING", "ops:" + "s" * 30)
    settings = Settings(home=tmp_path / "home")
    plan = plan_prefect_server(settings, 4200, auth=True)
    assert plan.credential == "ops:" + "s" * 30
    assert plan.credential_source == orchestration.AUTH_SETTING_ENV
    assert not settings.prefect_auth_file.exists()
    monkeypatch.setenv("KBFLOW_PREFECT_AUTH_STRING", "short")
    with pytest.raises(ValidationError, match="prefect_auth_string"):
        Settings()


def test_a_credential_file_others_may_read_is_made_private_and_a_link_is_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / PREFECT_AUTH_FILE
    path.write_text("kbflow:" + "x" * 40 + "\n")
    path.chmod(0o644)
    assert ensure_credential_file(path) == "kbflow:" + "x" * 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(orchestration.ConfigError, match="not a regular file"):
        ensure_credential_file(link)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".prefect-auth-")]


def test_origins_are_the_uis_own_plus_the_listed_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    assert server_origins("127.0.0.1", 4200) == [
        "http://127.0.0.1:4200",
        "http://localhost:4200",
        "http://[::1]:4200",
    ]
    assert server_origins("kb.example.com", 80, "https://a.example") == [
        "http://kb.example.com:80",
        "https://a.example",
    ]
    monkeypatch.setenv("KBFLOW_PREFECT_CORS_ORIGINS", " https://A.example/ ,http://b:8080")
    assert Settings().orchestration.prefect_cors_origins == "https://a.example,http://b:8080"
    for bad in ("*", "null", "https://a.example/path", "ftp://a.example", "a.example"):
        monkeypatch.setenv("KBFLOW_PREFECT_CORS_ORIGINS", bad)
        with pytest.raises(ValidationError, match="prefect_cors_origins"):
            Settings()


def test_configure_environment_exports_the_homes_credential_unless_the_user_set_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("PREFECT_API_AUTH_STRING", "PREFECT_API_KEY", "KBFLOW_PREFECT_AUTH_STRING"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS", "*")  # Prefect's default
    with_file = Settings(home=tmp_path / "a")
    credential = ensure_credential_file(with_file.prefect_auth_file)
    without = Settings(home=tmp_path / "b")

    configure_environment(with_file)
    assert os.environ["PREFECT_API_AUTH_STRING"] == credential == prefect_auth_string(with_file)
    assert os.environ["PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS"] == ""  # no page but listed
    assert os.environ["PREFECT_SERVER_CORS_ALLOWED_ORIGINS"] == ""
    configure_environment(without)  # another home: its (no) credential, not the last one's
    assert "PREFECT_API_AUTH_STRING" not in os.environ

    monkeypatch.setenv("PREFECT_API_AUTH_STRING", "mine:" + "m" * 20)
    configure_environment(with_file)
    assert os.environ["PREFECT_API_AUTH_STRING"] == "mine:" + "m" * 20  # the user's own wins
    monkeypatch.delenv("PREFECT_API_AUTH_STRING")
    monkeypatch.setenv("PREFECT_API_KEY", "pnu_cloud")  # Prefect would send ours instead
    configure_environment(with_file)
    assert "PREFECT_API_AUTH_STRING" not in os.environ
