"""The three calls the `prefect` job runner makes to a Prefect server, over its REST API.

Start a run of a deployment, and read a flow run's state: what
``prefect.deployments.run_deployment(name, parameters=..., timeout=0)`` and
``PrefectClient.read_flow_run`` do, spoken with httpx so that `kbflow serve`, which submits and
reads jobs, never imports Prefect (tests/test_layers.py). The server is ``PREFECT_API_URL`` from
the environment; ``PREFECT_API_KEY`` (Prefect Cloud) or ``PREFECT_API_AUTH_STRING`` (a server
started with basic auth) authenticate as Prefect's own client does. `core.settings`'
``configure_environment`` exports the credential of ``kbflow server --auth`` (its home's
``prefect-auth`` file, or KBFLOW_PREFECT_AUTH_STRING) as ``PREFECT_API_AUTH_STRING``.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from core.errors import ConfigError, JobRunnerUnavailable
from core.http import tls_context

TIMEOUT_S = 10.0
RETRY_STATUSES = frozenset({429, 502, 503, 504})
RETRY_ATTEMPTS = 5
RETRY_MAX_WAIT_S = 4.0
FAILED_TYPES = frozenset({"FAILED", "CRASHED", "CANCELLED"})
"""Final flow run states in which a job did not get done."""


@dataclass(frozen=True)
class RunState:
    """A flow run's state as the server has it: ``type`` (COMPLETED, CRASHED, …), its display
    ``name`` and its ``message``."""

    type: str
    name: str
    message: str | None


def api_url() -> str:
    """``PREFECT_API_URL``; raises JobRunnerUnavailable saying how to set one up when unset."""
    url = os.environ.get("PREFECT_API_URL", "").strip()
    if not url:
        raise JobRunnerUnavailable(
            "KBFLOW_JOB_RUNNER=prefect needs a Prefect server: PREFECT_API_URL is unset. Start "
            "one (`kbflow server`), export PREFECT_API_URL=http://127.0.0.1:4200/api, deploy "
            "the job flow (`prefect deploy --name kbflow-job`) and start a worker (`prefect "
            "worker start --pool kbflow-process`) — or set KBFLOW_JOB_RUNNER=process."
        )
    return url.rstrip("/")


class RetryingTransport(httpx.BaseTransport):
    """Prefect's server answers 503 while its database is busy (and 429/502/504 behind a
    proxy) and means "try again", as Prefect's own client does: so do we, a few times with a
    growing pause (its ``Retry-After`` when it gives one, at most ``RETRY_MAX_WAIT_S``). Every
    call here is safe to repeat: reads, a run start with an idempotency key, a resume (a run
    resumed once is no longer paused)."""

    def __init__(self, attempts: int = RETRY_ATTEMPTS) -> None:
        self._inner = httpx.HTTPTransport(verify=tls_context())
        self._attempts = attempts

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        for attempt in range(1, self._attempts + 1):
            response = self._inner.handle_request(request)
            if response.status_code not in RETRY_STATUSES or attempt == self._attempts:
                return response
            response.read()
            response.close()
            time.sleep(_retry_wait(response.headers.get("retry-after"), attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        self._inner.close()


def _retry_wait(retry_after: str | None, attempt: int) -> float:
    try:
        told = float(retry_after) if retry_after else None
    except ValueError:
        told = None
    wait = told if told is not None and told >= 0 else 0.5 * 2 ** (attempt - 1)
    return min(wait, RETRY_MAX_WAIT_S)


def auth_headers(auth: str | None = None) -> dict[str, str]:
    """The headers that authenticate to a Prefect API: basic auth with ``auth`` (default:
    PREFECT_API_AUTH_STRING), else a bearer PREFECT_API_KEY; none without either."""
    if auth := auth or os.environ.get("PREFECT_API_AUTH_STRING"):
        return {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()}
    if key := os.environ.get("PREFECT_API_KEY"):
        return {"Authorization": f"Bearer {key}"}
    return {}


def _client(url: str) -> httpx.Client:
    return httpx.Client(
        base_url=url, headers=auth_headers(), timeout=TIMEOUT_S, transport=RetryingTransport()
    )


def _checked(response: httpx.Response, what: str) -> Any:
    if response.status_code == 401:
        raise JobRunnerUnavailable(
            f"the Prefect server at {response.request.url.copy_with(path='/')} wants a "
            f"credential to {what}: set PREFECT_API_AUTH_STRING (a server started with "
            "`kbflow server --auth` keeps it in KBFLOW_HOME/prefect-auth, which kbflow "
            "commands with that KBFLOW_HOME send themselves)"
        )
    if response.is_error:
        raise JobRunnerUnavailable(
            f"the Prefect server at {response.request.url.copy_with(path='/')} refused to "
            f"{what}: HTTP {response.status_code} {response.text[:300]}"
        )
    return response.json()


def deployment_id(url: str, name: str) -> str:
    """The id of deployment ``name`` (FLOW/DEPLOYMENT); JobRunnerUnavailable when the server
    has none (ConfigError when ``name`` is not FLOW/DEPLOYMENT)."""
    flow_name, sep, deployment = name.partition("/")
    if not (flow_name and sep and deployment):
        raise ConfigError(
            f"KBFLOW_JOB_DEPLOYMENT must be FLOW/DEPLOYMENT, e.g. kbflow-job/kbflow-job. "
            f"Currently {name!r}."
        )
    try:
        with _client(url) as client:
            response = client.get(f"/deployments/name/{flow_name}/{deployment}")
    except httpx.HTTPError as exc:
        raise JobRunnerUnavailable(
            f"the Prefect server at {url} (PREFECT_API_URL) did not answer: {exc} — start it "
            "(`kbflow server`) or fix PREFECT_API_URL"
        ) from exc
    if response.status_code == 404:
        raise JobRunnerUnavailable(
            f"the Prefect server at {url} has no deployment {name!r} to run background jobs "
            "on: run `prefect deploy --name kbflow-job` from the kbflow repo and start a "
            "worker (`prefect worker start --pool kbflow-process`), or set "
            "KBFLOW_JOB_DEPLOYMENT to the deployment you made."
        )
    return str(_checked(response, f"read deployment {name!r}")["id"])


def start_run(url: str, deployment: str, parameters: dict[str, Any], *, key: str) -> str:
    """Schedule a run of ``deployment`` (an id) with ``parameters``; returns its flow run id.

    ``key`` is the run's idempotency key: asking twice with one key gives the same run.
    """
    body = {"parameters": parameters, "idempotency_key": key}
    try:
        with _client(url) as client:
            response = client.post(f"/deployments/{deployment}/create_flow_run", json=body)
    except httpx.HTTPError as exc:
        raise JobRunnerUnavailable(f"the Prefect server at {url} did not answer: {exc}") from exc
    return str(_checked(response, f"start a run of deployment {deployment}")["id"])


def run_state(url: str, flow_run_id: str) -> RunState | None:
    """The flow run's current state (None before it has one); JobRunnerUnavailable when the
    server does not answer or does not know the run."""
    try:
        with _client(url) as client:
            response = client.get(f"/flow_runs/{flow_run_id}")
    except httpx.HTTPError as exc:
        raise JobRunnerUnavailable(f"the Prefect server at {url} did not answer: {exc}") from exc
    state = _checked(response, f"read flow run {flow_run_id}").get("state")
    if not state:
        return None
    return RunState(
        type=state["type"], name=state.get("name") or state["type"], message=state.get("message")
    )


def configured_url() -> str | None:
    """``PREFECT_API_URL`` when set (None: no Prefect server is known to this process)."""
    return os.environ.get("PREFECT_API_URL", "").strip().rstrip("/") or None


def _runs(client: httpx.Client, run_ids: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each of ``run_ids`` the server knows, with its state (``{}`` before it has one) and the
    form keys a paused run stored (``{}`` while its form is not stored yet)."""
    for run_id in run_ids:
        response = client.get(f"/flow_runs/{run_id}")
        if response.is_error:
            continue
        run = response.json()
        state = run.get("state") or {}
        keyset = (state.get("state_details") or {}).get("run_input_keyset") or {}
        yield str(run_id), {**run, "state": state, "keyset": keyset}


def paused_review_run(url: str, run_ids: Sequence[str], org: str, field: str) -> str | None:
    """The first of ``run_ids`` (runs kbflow recorded, newest first) that is a paused run of
    the ``review`` flow for ``org`` whose stored form has ``field`` (a draft's ``doc_<id>``),
    ready to be resumed; None when there is none. Runs not in ``run_ids`` are never
    considered: a paused run planted through the Prefect API gets no decision."""
    try:
        with _client(url) as client:
            for run_id, run in _runs(client, run_ids):
                if run["state"].get("type") != "PAUSED":
                    continue
                if (run.get("parameters") or {}).get("org") != org:
                    continue
                if "schema" not in run["keyset"]:
                    continue  # paused, its form not stored yet: not resumable
                response = client.get(f"/flow_runs/{run_id}/input/{run['keyset']['schema']}")
                if not response.is_error and f'"{field}"' in response.text:
                    return run_id
    except httpx.HTTPError as exc:
        raise JobRunnerUnavailable(f"the Prefect server at {url} did not answer: {exc}") from exc
    return None


def pausing_soon(url: str, run_ids: Sequence[str]) -> bool:
    """Whether one of ``run_ids`` is still on its way to a pause: scheduled, pending or
    running, or paused with its form not stored yet. A run that is done, or gone from the
    server, is not."""
    try:
        with _client(url) as client:
            for _, run in _runs(client, run_ids):
                kind = run["state"].get("type")
                if kind in ("SCHEDULED", "PENDING", "RUNNING"):
                    return True
                if kind == "PAUSED" and "schema" not in run["keyset"]:
                    return True
    except httpx.HTTPError as exc:
        raise JobRunnerUnavailable(f"the Prefect server at {url} did not answer: {exc}") from exc
    return False


def resume_run(url: str, flow_run_id: str, run_input: dict[str, Any]) -> None:
    """Resume a paused flow run with ``run_input`` (the form's answer), as the UI's Submit
    does; JobRunnerUnavailable when the server refuses (e.g. the run is no longer paused)."""
    try:
        with _client(url) as client:
            response = client.post(
                f"/flow_runs/{flow_run_id}/resume", json={"run_input": run_input}
            )
    except httpx.HTTPError as exc:
        raise JobRunnerUnavailable(f"the Prefect server at {url} did not answer: {exc}") from exc
    result = _checked(response, f"resume flow run {flow_run_id}")
    status = (result or {}).get("status") if isinstance(result, dict) else None
    if status not in (None, "ACCEPT"):
        raise JobRunnerUnavailable(
            f"the Prefect server did not resume run {flow_run_id}: "
            f"{(result or {}).get('details') or status}"
        )
