"""The ``prefect`` job runner without a worker: what submit does when it cannot start a run, and
what `refresh` makes of a job whose flow run ended (a real Prefect server: the test harness).

The full path (a worker runs the ``kbflow-job`` deployment) is tests/test_deployments.py.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.contracts import IngestRequest
from core.errors import JobRunnerUnavailable
from core.models import JobStatus
from core.settings import Settings
from kbflow.services.jobs import queue as jobs
from sinks.registry import SqlRegistry
from tests.conftest import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def harness_api(prefect_harness: None, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test harness's Prefect API, exported as PREFECT_API_URL for the job runner."""
    from prefect.settings import PREFECT_API_URL

    url = str(PREFECT_API_URL.value())
    monkeypatch.setenv("PREFECT_API_URL", url)
    return url


@pytest.fixture
def prefect_settings(settings: Settings) -> Settings:
    return settings.replace(job_runner="prefect")


@pytest.fixture
def jobs_registry(settings: Settings) -> Iterator[SqlRegistry]:
    registry = SqlRegistry.open(settings.registry_url)
    registry.people.ensure_org("acme")
    yield registry
    registry.close()


def _submit(settings: Settings) -> None:
    jobs.submit_ingest_job(settings, ["/data/call.mp3"], IngestRequest(org="acme"))


def test_no_prefect_server_set_refuses_the_job_and_records_none(
    prefect_settings: Settings, jobs_registry: SqlRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with pytest.raises(JobRunnerUnavailable) as err:
        _submit(prefect_settings)
    message = str(err.value)
    assert "PREFECT_API_URL is unset" in message
    assert "prefect deploy --name kbflow-job" in message and "worker" in message
    assert jobs_registry.jobs.list_jobs("acme") == []


def test_a_server_that_does_not_answer_refuses_the_job_and_records_none(
    prefect_settings: Settings, jobs_registry: SqlRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{free_port()}/api")
    with pytest.raises(JobRunnerUnavailable, match="did not answer"):
        _submit(prefect_settings)
    assert jobs_registry.jobs.list_jobs("acme") == []


def test_an_unknown_deployment_refuses_the_job_and_records_none(
    harness_api: str, prefect_settings: Settings, jobs_registry: SqlRegistry
) -> None:
    with pytest.raises(JobRunnerUnavailable) as err:
        _submit(prefect_settings)
    message = str(err.value)
    assert "no deployment 'kbflow-job/kbflow-job'" in message
    assert "prefect deploy --name kbflow-job" in message and harness_api in message
    assert jobs_registry.jobs.list_jobs("acme") == []


def test_a_deployment_name_must_say_flow_and_deployment(
    harness_api: str, prefect_settings: Settings, jobs_registry: SqlRegistry
) -> None:
    from core.errors import ConfigError

    odd = prefect_settings.replace(job_deployment="kbflow-job")
    with pytest.raises(ConfigError, match=r"FLOW/DEPLOYMENT.*'kbflow-job'"):
        _submit(odd)
    assert jobs_registry.jobs.list_jobs("acme") == []


def _flow_run(state: object) -> str:
    """A real flow run on the harness server, put in ``state``."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    @flow(name="kbflow-job")
    def stand_in(job_id: str) -> None:
        """Never runs: the server only needs a flow to hang the run on."""

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(stand_in, parameters={"job_id": "x"})
        client.set_flow_run_state(run.id, state, force=True)  # type: ignore[arg-type]
        return str(run.id)


def _job_on_run(registry: SqlRegistry, flow_run_id: str) -> str:
    job = registry.jobs.create_job("acme", kind="ingest", inputs=["/data/call.mp3"], params={})
    registry.jobs.update_job_runner(job.id, flow_run_id=flow_run_id)
    return job.id


def test_a_job_whose_flow_run_crashed_is_failed_naming_the_state(
    harness_api: str, jobs_registry: SqlRegistry
) -> None:
    from prefect.states import Crashed

    run_id = _flow_run(Crashed(message="Flow run infrastructure exited with non-zero status -9"))
    job_id = _job_on_run(jobs_registry, run_id)

    after = jobs.refresh(jobs_registry, jobs_registry.jobs.get_job(job_id))

    assert after.status is JobStatus.FAILED
    assert after.reason is not None
    assert f"flow run {run_id} ended Crashed" in after.reason
    assert "exited with non-zero status -9" in after.reason
    assert "re-run the ingest" in after.reason


def test_a_job_whose_flow_run_was_cancelled_is_failed(
    harness_api: str, jobs_registry: SqlRegistry
) -> None:
    from prefect.states import Cancelled

    job_id = _job_on_run(jobs_registry, _flow_run(Cancelled(message="cancelled by alice")))
    after = jobs.refresh(jobs_registry, jobs_registry.jobs.get_job(job_id))
    assert after.status is JobStatus.FAILED
    assert "ended Cancelled: cancelled by alice" in (after.reason or "")


def test_a_running_or_unreadable_flow_run_leaves_the_job_processing(
    harness_api: str, jobs_registry: SqlRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.states import Running

    def status(job_id: str) -> JobStatus:
        return jobs.refresh(jobs_registry, jobs_registry.jobs.get_job(job_id)).status

    running = _job_on_run(jobs_registry, _flow_run(Running()))
    unknown = _job_on_run(jobs_registry, "00000000-0000-0000-0000-000000000000")
    assert status(running) is JobStatus.PROCESSING
    assert status(unknown) is JobStatus.PROCESSING  # the server does not know the run

    # The server gone, or none set: the rows stay as they are, and the caller gets no error.
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{free_port()}/api")
    assert status(running) is JobStatus.PROCESSING
    monkeypatch.delenv("PREFECT_API_URL")
    assert status(running) is JobStatus.PROCESSING


def test_the_job_flow_ends_failed_with_the_jobs_reason(
    harness_api: str, settings: Settings, jobs_registry: SqlRegistry, tmp_path: Path
) -> None:
    """The worker's side in-process: the ``kbflow-job`` flow over an ingest whose only file is
    unreadable. The row is FAILED with the reason, the run is Failed with it as its message,
    and the row names the job's run, not its ``ingest`` subflow's."""
    from kbflow.job_flow import kbflow_job

    broken = tmp_path / "broken.pdf"
    broken.write_bytes(random.Random(7).randbytes(4096))
    job = jobs_registry.jobs.create_job(
        "acme", kind="ingest", inputs=[str(broken)], params=IngestRequest(org="acme").job_params()
    )

    state = kbflow_job(job_id=job.id, return_state=True)

    after = jobs_registry.jobs.get_job(job.id)
    assert after.status is JobStatus.FAILED and after.pid is None
    assert "broken.pdf" in (after.reason or "") and "match no format" in (after.reason or "")
    assert state.is_failed() and after.reason in (state.message or "")
    assert after.flow_run_id == str(state.state_details.flow_run_id)

    again = kbflow_job(job_id=job.id, return_state=True)  # a finished job is not run again
    assert again.is_failed() and jobs_registry.jobs.get_job(job.id) == after
