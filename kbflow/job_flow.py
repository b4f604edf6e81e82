"""The ``kbflow-job`` flow: one recorded background job, run by a Prefect worker.

With ``KBFLOW_JOB_RUNNER=prefect``, `kbflow.services.jobs.queue` records a PROCESSING job and
starts a run of the ``kbflow-job`` deployment (prefect.yaml) with its id. The worker's flow run
does what
``python -m kbflow.services.job_runner JOB_ID`` does (`kbflow.services.job_runner.run_job`: the
``ingest`` or ``research``
flow, here as a subflow) and its state says how the job ended: COMPLETED when the job is
COMPLETE, FAILED with the job's reason as the state's message when it is FAILED.

It lives beside `kbflow.services.job_runner`, not in ``flows/``, because a job's run is the app's
(research
runs through `kbflow.services.research.runs`) and floors only import down (tests/test_layers.py).
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.runtime import flow_run
from prefect.states import Failed

from core.errors import RunFailed
from core.models import JobStatus
from core.settings import Settings
from kbflow.services.job_runner import run_job
from sinks.connect import open_registry


@flow(name="kbflow-job")
def kbflow_job(job_id: str) -> dict[str, Any]:
    """Run the recorded job ``job_id`` to its end; returns the finished job's row as JSON.

    The run ends Failed, the job's reason its message (a plain call raises
    :class:`~core.errors.RunFailed` holding the row), when the job is FAILED.
    """
    settings = Settings()
    with open_registry(settings) as registry:
        if registry.jobs.get_job(job_id).flow_run_id is None:  # started by hand, not by a submit
            registry.jobs.update_job_runner(job_id, flow_run_id=str(flow_run.id))
    job = run_job(job_id, settings, record_pid=False)
    if job.status is JobStatus.FAILED:
        message = f"job {job.id} ({job.kind}) failed: {job.reason or 'no reason recorded'}"
        failed: Any = Failed(message=message, data=RunFailed(message, job.to_dict()))
        return failed  # typed Any: a caller never gets this state as a value
    return job.to_dict()
