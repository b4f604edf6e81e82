"""Job records in the registry: one row per long ingest, from PROCESSING to COMPLETE or FAILED.

A job's work is a Prefect flow run (its id is recorded once the run starts); the row is what
`kbflow jobs` shows, and it outlives the Prefect server that ran the flow.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, or_, select, update

from core.errors import NotFound
from core.models import JobStatus
from sinks.registry.base import Repository
from sinks.registry.schema import JobRow, aware, utcnow


@dataclass(frozen=True)
class JobRecord:
    id: str
    org_id: str
    kind: str
    status: JobStatus
    inputs: list[str]
    params: dict[str, Any]
    reason: str | None
    report: dict[str, Any] | None
    flow_run_id: str | None
    pid: int | None
    log_path: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    progress: dict[str, Any] | None = None  # how far a PROCESSING job has got (`note_progress`)

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["status"] = self.status.value
        out["created_at"] = self.created_at.isoformat()
        out["updated_at"] = self.updated_at.isoformat()
        return out


def _record(row: JobRow) -> JobRecord:
    report, progress = row.report, None
    if row.status == JobStatus.PROCESSING.value and row.report and set(row.report) == {"progress"}:
        report, progress = None, row.report["progress"]  # no report until the job finishes
    return JobRecord(
        id=row.id,
        org_id=row.org_id,
        kind=row.kind,
        status=JobStatus(row.status),
        inputs=list(row.inputs),
        params=dict(row.params),
        reason=row.reason,
        report=report,
        flow_run_id=row.flow_run_id,
        pid=row.pid,
        log_path=row.log_path,
        created_at=aware(row.created_at),
        updated_at=aware(row.updated_at),
        progress=progress,
    )


class JobsRepository(Repository):
    """Background ingest jobs (audio, video, large files): their rows and states."""

    def create_job(
        self,
        org_id: str,
        *,
        kind: str,
        inputs: list[str],
        params: dict[str, Any],
        log_path: str | None = None,
    ) -> JobRecord:
        job_id = uuid.uuid4().hex[:12]
        with self.session() as s, s.begin():
            s.add(
                JobRow(
                    id=job_id,
                    org_id=org_id,
                    kind=kind,
                    status=JobStatus.PROCESSING.value,
                    inputs=inputs,
                    params=params,
                    log_path=log_path,
                )
            )
        return self.get_job(job_id)

    def update_job_runner(
        self,
        job_id: str,
        *,
        pid: int | None = None,
        flow_run_id: str | None = None,
        log_path: str | None = None,
    ) -> None:
        """Record the process, its log and, once it starts, the Prefect flow run."""
        values: dict[str, Any] = {"updated_at": utcnow()}
        if log_path is not None:
            values["log_path"] = log_path
        if pid is not None:
            values["pid"] = pid
        if flow_run_id is not None:
            values["flow_run_id"] = flow_run_id
        with self.session() as s, s.begin():
            s.execute(update(JobRow).where(JobRow.id == job_id).values(**values))

    def note_progress(self, job_id: str, progress: dict[str, Any]) -> bool:
        """Record how far a PROCESSING job has got (its report holds ``{"progress": ...}``
        until the job finishes and its final report replaces it); False if it had finished."""
        with self.session() as s, s.begin():
            done = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == JobStatus.PROCESSING.value)
                .values(report={"progress": progress}, updated_at=utcnow())
            )
            return bool(done.rowcount)  # type: ignore[attr-defined]

    def finish_job(
        self,
        job_id: str,
        status: JobStatus,
        *,
        reason: str | None = None,
        report: dict[str, Any] | None = None,
    ) -> bool:
        """Move a PROCESSING job to its final state; False if it had already finished."""
        with self.session() as s, s.begin():
            done = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == JobStatus.PROCESSING.value)
                .values(status=status.value, reason=reason, report=report, updated_at=utcnow())
            )
            return bool(done.rowcount)  # type: ignore[attr-defined]

    def get_job(self, job_id: str) -> JobRecord:
        with self.session() as s:
            row = s.get(JobRow, job_id)
            if row is None:
                raise NotFound(f"job {job_id!r} does not exist — `kbflow jobs list` shows jobs.")
            return _record(row)

    def list_jobs(
        self, org_id: str | None = None, status: JobStatus | None = None, limit: int = 50
    ) -> list[JobRecord]:
        query = select(JobRow).order_by(JobRow.created_at.desc()).limit(limit)
        if org_id:
            query = query.where(JobRow.org_id == org_id)
        if status:
            query = query.where(JobRow.status == status.value)
        with self.session() as s:
            return [_record(row) for row in s.scalars(query)]

    def finished_jobs(
        self, kind: str, *, after: tuple[dt.datetime, str] | None = None, limit: int = 500
    ) -> list[JobRecord]:
        """Jobs of ``kind`` that ended (COMPLETE or FAILED), in the order they ended (then by
        id), after ``after`` = (the end time, the id) of the last one read; at most ``limit``."""
        query = (
            select(JobRow)
            .where(JobRow.kind == kind, JobRow.status != JobStatus.PROCESSING.value)
            .order_by(JobRow.updated_at, JobRow.id)
            .limit(limit)
        )
        if after is not None:
            when, job_id = after
            query = query.where(
                or_(
                    JobRow.updated_at > when,
                    and_(JobRow.updated_at == when, JobRow.id > job_id),
                )
            )
        with self.session() as s:
            return [_record(row) for row in s.scalars(query)]
