"""The jobs route: a background job's state (`kbflow jobs status`), for those who may inspect
its org's drafts (its experts too). The CLI's ``jobs`` has no such rule, being the operator's;
over HTTP the caller is a person, and a job carries the org's drafts.

The upload and research routes start jobs (`kbflow.api.documents`, `kbflow.api.research`) and
answer 202 with a ``Location`` here.
"""

from __future__ import annotations

from pathlib import Path as FsPath
from typing import Any

from fastapi import APIRouter

from core.models import JobStatus
from core.settings import Settings
from kbflow.api.auth import ServiceDep, UserId
from kbflow.api.deps import ADMIN_PREFIX, JobId, scrubbed
from kbflow.api.schemas import JobOut
from kbflow.services.jobs import queue as jobs
from sinks.registry import JobRecord

router = APIRouter(prefix=ADMIN_PREFIX, tags=["jobs"])


# Unset keys stay out: ``synthesis_run_id`` is a research job's only.
@router.get("/jobs/{job_id}", response_model=JobOut, response_model_exclude_unset=True)
def job_status(job_id: JobId, user: UserId, service: ServiceDep) -> JobOut:
    """A background job (`kbflow jobs status`): PROCESSING, COMPLETE (``result``: the ingest or
    research report) or FAILED (``error``: why), for those who may inspect its org's drafts.
    A PROCESSING job waiting for a slot says ``queued: true`` and its ``queue_position``.

    A job whose process died without finishing is marked FAILED here, and queued jobs whose
    slot is free are started."""
    from tasks.review.access import authorize_item

    registry = service.ctx.registry
    _, job = authorize_item(
        registry, user, f"job {job_id!r}", lambda: registry.jobs.get_job(job_id),
        lambda job: job.org_id, inspect=True,
    )  # fmt: skip
    job = jobs.refresh(registry, job, service.settings)
    shown = _job_json(job, service.settings)
    return JobOut.model_validate({**shown, **jobs.admission(registry, job.id)})


def _job_json(job: JobRecord, settings: Settings) -> dict[str, Any]:
    """A job as the API shows it: its files by name, no server paths, no process ids."""
    finished = job.status is not JobStatus.PROCESSING
    failed = job.status is JobStatus.FAILED
    out: dict[str, Any] = {
        "id": job.id,
        "kind": job.kind,
        "status": job.status.value,
        "org": job.org_id,
        "created_at": job.created_at.isoformat(),
        "finished_at": job.updated_at.isoformat() if finished else None,
        "error": job.reason if failed else None,
        "note": job.reason if finished and not failed else None,
        "flow_run_id": job.flow_run_id,
        "files": [FsPath(p).name for p in job.inputs],
        "params": {k: v for k, v in job.params.items() if k not in ("actor", jobs.QUEUE_MARK)},
        "result": job.report,
    }
    if job.kind == jobs.RESEARCH_KIND:
        out["synthesis_run_id"] = (job.report or {}).get("synthesis_run_id")
        out["progress"] = job.progress  # the stage a running run reported (None once it ends)
    return scrubbed(out, settings.home.resolve())
