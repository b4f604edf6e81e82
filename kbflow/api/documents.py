"""The document upload route: one document (`kbflow ingest`'s options as form fields) ingested
by a background job, answered 202 with the job's id and a ``Location`` to follow it
(`kbflow.api.jobs`).

For the org's account manager or a superadmin (a refusal is an audit row). The upload streams
to disk as it arrives (`kbflow.api.uploads`); `kbflow.api.limits.BodyLimit` holds the upload
routes to `kbflow.api.uploads.upload_body_cap` instead of the JSON cap. Over the running-jobs
limits the job waits its turn (`kbflow.api.research` says how).
"""

from __future__ import annotations

import datetime as dt
import shutil
import uuid

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import Field, field_validator

from core import ids
from core.contracts import IngestRequest
from core.models import DocStatus
from kbflow.api.auth import ServiceDep, UserId
from kbflow.api.deps import ADMIN_PREFIX, OrgId, accepted, may_decide
from kbflow.api.schemas import UploadAccepted
from kbflow.api.uploads import (
    FILE_PART,
    TEXT_PART,
    UploadForm,
    UploadLimits,
    checked_form,
    file_cap_bytes,
    invalid,
    multipart_body,
    receive_upload,
)
from kbflow.services.jobs import queue as jobs

router = APIRouter(prefix=ADMIN_PREFIX, tags=["documents"])


class DocumentForm(UploadForm):
    """Besides the ``file``: where it goes and how it is reviewed (`kbflow ingest`'s options)."""

    collection: str = Field("default", description="Collection path, e.g. 'policies/hr'.")
    status: DocStatus = Field(DocStatus.APPROVED, description="Review status of the document.")
    audience: str | None = Field(None, description="Its audience (default: everyone).")
    effective_date: dt.date | None = Field(None, description="Hidden from agents before this day.")
    source_tag: str | None = Field(None, max_length=100, description="Free tag recorded on it.")

    @field_validator("collection")
    @classmethod
    def _collection(cls, value: str) -> str:
        return ids.collection_path(value)

    @field_validator("audience")
    @classmethod
    def _audience(cls, value: str | None) -> str | None:
        return None if value is None else ids.audience(value)


@router.post(
    "/orgs/{org}/documents",
    status_code=202,
    response_model=UploadAccepted,
    openapi_extra=multipart_body(
        {
            "file": FILE_PART,
            "collection": TEXT_PART,
            "status": {"type": "string", "enum": [s.value for s in DocStatus]},
            "audience": TEXT_PART,
            "effective_date": {"type": "string", "format": "date"},
            "source_tag": TEXT_PART,
        },
        ["file"],
    ),
)
async def upload_document(
    org: OrgId, request: Request, user: UserId, service: ServiceDep, response: Response
) -> UploadAccepted:
    """Upload one document (multipart ``file``, with `kbflow ingest`'s ``collection``,
    ``status``, ``audience``, ``effective_date``, ``source_tag``) to be ingested by a background
    job: 202 with the job's id and a ``Location`` to follow it.

    For the org's account manager or a superadmin. The part's declared type picks how the file
    is read; its name and bytes must agree (415 otherwise, with the accepted types). The file is
    kept under the kbflow home (``uploads/``) for the job, which reads it after this answer; it
    is removed when the job is COMPLETE, and KBFLOW_JOBS_FAILED_UPLOAD_RETENTION_H hours after
    it FAILED. Over the running-jobs limits the job waits its turn: ``queued`` is true and
    ``queue_position`` its place (1: next); 429 with Retry-After when the org's queue is full.
    """
    settings = service.settings
    await run_in_threadpool(may_decide, service, user, org, "upload", "upload documents")
    folder = settings.home.resolve() / "uploads" / uuid.uuid4().hex
    folder.mkdir(parents=True, mode=0o700)
    try:
        received = await receive_upload(
            request,
            folder,
            file_fields=frozenset({"file"}),
            limits=UploadLimits(max_files=1, max_file_bytes=file_cap_bytes(settings)),
        )
        if not received.files:
            raise invalid("file", "send the document as the multipart field 'file'")
        form = checked_form(DocumentForm, received.fields)
        ingest = IngestRequest(org=org, **form.model_dump())
        upload = received.files[0]
        job = await run_in_threadpool(
            jobs.submit_ingest_job, settings, [str(upload.path)], ingest, actor=user
        )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    registry = service.ctx.registry
    return await run_in_threadpool(
        accepted, UploadAccepted, job, registry, response, file=upload.name, type=upload.kind
    )
