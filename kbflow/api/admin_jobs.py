"""The admin routes that bring knowledge in and follow it: an org's seed bundle, a research run,
a document upload, the background jobs they start, and the provenance of answers.

The same services and JSON as the CLI (`kbflow seed`, `kbflow seed list`, `kbflow research`,
`kbflow ingest`, `kbflow jobs status`, `kbflow provenance`), with the person taken from the
token. Who may do what is `tasks.review.access`: seeding, research and uploads are for the org's
account manager or a superadmin (a refusal is an audit row, as a refused decision is); reading
seeds, jobs and provenance for whoever may inspect the org's drafts (its experts too). The CLI's
``jobs`` and ``provenance`` have no such rule, being the operator's; over HTTP the caller is a
person, and those answers carry the org's drafts and its agents' questions.

Uploads stream to disk as they arrive (`kbflow.api.uploads`); `kbflow.api.limits.BodyLimit`
holds the upload routes (`UPLOAD_PATHS`) to `upload_body_cap` instead of the JSON cap. Long
work runs in a background process (`kbflow.services.jobs`): the route answers 202 with the job's
id and a ``Location`` to follow it. At most KBFLOW_JOBS_MAX_RUNNING jobs run at once
(KBFLOW_JOBS_MAX_RUNNING_PER_ORG of one org's); the others wait in a queue, still PROCESSING, the
202 (and the job's status) saying ``queued: true`` and their ``queue_position``; past
KBFLOW_JOBS_MAX_QUEUED_PER_ORG waiting jobs an org's next one is refused (429, Retry-After).
Seeding runs in the request, through the store this process holds open, like a decision.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path as FsPath
from typing import Annotated, Any, ClassVar, TypeVar
from urllib.parse import urlsplit

from fastapi import APIRouter, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core import ids
from core.contracts import IngestRequest
from core.errors import ConfigError, Forbidden
from core.models import DocStatus, JobStatus
from core.settings import Settings
from kbflow.api.admin import ID_PATTERN, OrgId, refusals_audited
from kbflow.api.auth import Service, ServiceDep, UserId
from kbflow.api.uploads import Received, UploadLimits, invalid, receive_upload
from kbflow.services import jobs, seeds
from sinks.registry import JobRecord, SqlRegistry
from tasks.research.seed import MAX_SEED_FILE_BYTES, MAX_SEED_FILES

router = APIRouter(prefix="/v1/admin", tags=["admin"])

UPLOAD_PATHS = re.compile(r"/v1/admin/orgs/[^/]+/(?:seed|documents)")
"""The routes whose bodies are uploads (POST): streamed, and capped by `upload_body_cap`."""

MAX_URL_CHARS = 2000
MAX_PROMPT_CHARS = 20_000
MAX_SEED_ITEMS = 50
MAX_BUDGET_TOKENS = 10_000_000
_FORM_SLACK_BYTES = 1 << 20  # multipart headers, URLs and prompts beside the files

JobId = Annotated[str, Path(pattern=ID_PATTERN, description="A job id (202 answers name it).")]


def file_cap_bytes(settings: Settings) -> int:
    """The most bytes one uploaded file may have (KBFLOW_API_MAX_UPLOAD_MB)."""
    return int(settings.api_max_upload_mb * 1024 * 1024)


def upload_body_cap(settings: Settings) -> int:
    """The most bytes an upload's body may have: a full seed bundle, and its form fields."""
    return MAX_SEED_FILES * file_cap_bytes(settings) + _FORM_SLACK_BYTES


# --- forms -------------------------------------------------------------------------------------


class _Form(BaseModel):
    """A multipart form's text fields; ``repeated`` names those that may come more than once."""

    model_config = ConfigDict(extra="forbid")
    repeated: ClassVar[frozenset[str]] = frozenset()


class SeedForm(_Form):
    """Besides the ``files``: URLs to research and free-text guidance, each field repeatable."""

    repeated = frozenset({"urls", "prompts"})

    urls: list[Annotated[str, Field(min_length=1, max_length=MAX_URL_CHARS)]] = Field(
        default_factory=list, max_length=MAX_SEED_ITEMS
    )
    prompts: list[Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]] = Field(
        default_factory=list, max_length=MAX_SEED_ITEMS
    )

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{url[:100]!r} is not an http(s) URL with a host")
        return urls

    @field_validator("prompts")
    @classmethod
    def _not_blank(cls, prompts: list[str]) -> list[str]:
        if any(not p.strip() for p in prompts):
            raise ValueError("a prompt is blank")
        return prompts


class DocumentForm(_Form):
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


class ResearchBody(BaseModel):
    """`kbflow research`'s options: the client, the model, the token budget, the reviewer."""

    model_config = ConfigDict(extra="forbid", strict=True)

    client_name: str = Field(min_length=1, max_length=200, description="The client's name.")
    model: str | None = Field(
        None, min_length=1, max_length=100, description="Anthropic model (default: the setting)."
    )
    budget_tokens: int = Field(
        seeds.DEFAULT_BUDGET_TOKENS, ge=1, le=MAX_BUDGET_TOKENS, description="Token budget."
    )
    reviewer: str | None = Field(
        None,
        max_length=120,
        description="Who the review form is prefilled with (default: the caller); they too "
        "must be the org's account manager or a superadmin.",
    )

    @field_validator("reviewer")
    @classmethod
    def _reviewer(cls, value: str | None) -> str | None:
        return None if value is None else ids.user_id(value)


FormT = TypeVar("FormT", bound=_Form)


def _form(model: type[FormT], fields: dict[str, list[str]]) -> FormT:
    """A form's fields checked by ``model``; a 422 names each bad field."""
    data: dict[str, Any] = {}
    for name, values in fields.items():
        if name in model.repeated:
            data[name] = values
        elif len(values) > 1:
            raise invalid(name, "given more than once")
        else:
            data[name] = values[0]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{"loc": ("body", *e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        raise RequestValidationError(errors) from exc


def _multipart(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """The OpenAPI description of a multipart body (the route reads it as a stream)."""
    schema = {"type": "object", "properties": properties, "required": required}
    return {
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}
    }


_FILE = {"type": "string", "format": "binary"}
_TEXT = {"type": "string"}


# --- seed bundle -------------------------------------------------------------------------------


@router.post(
    "/orgs/{org}/seed",
    openapi_extra=_multipart(
        {
            "files": {"type": "array", "items": _FILE, "maxItems": MAX_SEED_FILES},
            "urls": {"type": "array", "items": _TEXT},
            "prompts": {"type": "array", "items": _TEXT},
        },
        [],
    ),
)
async def seed_inputs(
    org: OrgId, request: Request, user: UserId, service: ServiceDep
) -> dict[str, Any]:
    """Seed research inputs for an org (`kbflow seed --json`): multipart ``files`` (at most 20
    per bundle, 25 MB each), ``urls`` and ``prompts`` (each field repeatable).

    For the org's account manager or a superadmin. The files are read from a private folder
    under the kbflow home, deleted after; each is keyed ``upload:ORG/NAME``, so sending a file
    of the same name again updates that input. 413 past a cap, 415 for a type kbflow does not
    read; a bundle that would pass the org's cap stores nothing (422)."""
    settings = service.settings
    await run_in_threadpool(_may_decide, service, user, org, "seed", "seed research inputs")
    limits = UploadLimits(
        max_files=MAX_SEED_FILES,
        max_file_bytes=min(file_cap_bytes(settings), MAX_SEED_FILE_BYTES),
    )
    with _private_folder(settings) as folder:
        received = await receive_upload(
            request, folder, file_fields=frozenset({"files"}), limits=limits
        )
        form = _form(SeedForm, received.fields)
        if not (received.files or form.urls or form.prompts):
            raise invalid("files", "give at least one of files, urls or prompts")
        result = await run_in_threadpool(_seed, service, org, user, received, form)
    return _scrubbed(result, folder)


def _seed(
    service: Service, org: str, user: str, received: Received, form: SeedForm
) -> dict[str, Any]:
    from tasks.review.machine import held

    with service.use() as ctx:
        return seeds.seed(
            service.settings,
            org,
            actor=user,
            files=[f.path for f in received.files],
            urls=form.urls,
            prompts=form.prompts,
            file_uris=[f"upload:{org}/{f.name}" for f in received.files],
            open_store=held(ctx.vector_store),
        )


@router.get("/orgs/{org}/seed")
def list_seed_inputs(org: OrgId, user: UserId, service: ServiceDep) -> list[dict[str, Any]]:
    """An org's seed inputs (`kbflow seed list --json`), for those who may inspect its drafts."""
    return [d.to_dict() for d in seeds.list_seeds(service.settings, org, user)]


# --- research ----------------------------------------------------------------------------------


@router.post("/orgs/{org}/research", status_code=202)
def start_research(
    org: OrgId, body: ResearchBody, user: UserId, service: ServiceDep
) -> JSONResponse:
    """Start a research run for an org (`kbflow research`) in a background job: 202 with the
    job's id and a ``Location`` to follow it.

    For the org's account manager or a superadmin. The run drafts the four documents
    (pending_review) and pauses for the review form as ``kbflow research`` does (with a Prefect
    server set; without one it does not pause: review with the drafts routes). The synthesis
    run id is not known up front (the flow makes it when it stores the drafts, and a run the
    budget stops has none), so it is not in this answer: the job's status carries
    ``flow_run_id`` once the flow starts and ``synthesis_run_id`` once the drafts are stored.
    """
    settings = service.settings
    with refusals_audited(service.ctx.registry, user, "research", org_id=org):
        seeds.authorize_research(settings, org, user)
    reviewer = body.reviewer or user
    if reviewer != user:
        try:
            seeds.authorize_research(settings, org, reviewer)
        except Forbidden as exc:
            raise invalid("reviewer", str(exc)) from exc
    job = jobs.submit_research_job(
        settings,
        org,
        client_name=body.client_name,
        model=body.model,
        budget_tokens=body.budget_tokens,
        reviewer=reviewer,
    )
    return _accepted(job, service.ctx.registry)


# --- document upload ---------------------------------------------------------------------------


@router.post(
    "/orgs/{org}/documents",
    status_code=202,
    openapi_extra=_multipart(
        {
            "file": _FILE,
            "collection": _TEXT,
            "status": {"type": "string", "enum": [s.value for s in DocStatus]},
            "audience": _TEXT,
            "effective_date": {"type": "string", "format": "date"},
            "source_tag": _TEXT,
        },
        ["file"],
    ),
)
async def upload_document(
    org: OrgId, request: Request, user: UserId, service: ServiceDep
) -> JSONResponse:
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
    await run_in_threadpool(_may_decide, service, user, org, "upload", "upload documents")
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
        form = _form(DocumentForm, received.fields)
        ingest = IngestRequest(org=org, **form.model_dump())
        upload = received.files[0]
        job = await run_in_threadpool(
            jobs.submit_ingest_job, settings, [str(upload.path)], ingest, actor=user
        )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    registry = service.ctx.registry
    return await run_in_threadpool(_accepted, job, registry, file=upload.name, type=upload.kind)


# --- jobs --------------------------------------------------------------------------------------


@router.get("/jobs/{job_id}")
def job_status(job_id: JobId, user: UserId, service: ServiceDep) -> dict[str, Any]:
    """A background job (`kbflow jobs status`): PROCESSING, COMPLETE (``result``: the ingest or
    research report) or FAILED (``error``: why), for those who may inspect its org's drafts.
    A PROCESSING job waiting for a slot says ``queued: true`` and its ``queue_position``.

    A job whose process died without finishing is marked FAILED here, and queued jobs whose
    slot is free are started."""
    from tasks.review.access import authorize_item

    registry = service.ctx.registry
    _, job = authorize_item(
        registry, user, f"job {job_id!r}", lambda: registry.get_job(job_id),
        lambda job: job.org_id, inspect=True,
    )  # fmt: skip
    job = jobs.refresh(registry, job, service.settings)
    return _job_json(job, service.settings) | jobs.admission(registry, job.id)


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
    return _scrubbed(out, settings.home.resolve())


def _accepted(job: JobRecord, registry: SqlRegistry, **extra: Any) -> JSONResponse:
    """202: the job's id, kind, state and org, whether it waits for a slot (``queued``, with
    its ``queue_position``), and ``extra``."""
    location = f"{router.prefix}/jobs/{job.id}"
    body = {"job_id": job.id, "kind": job.kind, "status": job.status.value, "org": job.org_id}
    body |= jobs.admission(registry, job.id)
    return JSONResponse(body | extra, status_code=202, headers={"Location": location})


# --- provenance --------------------------------------------------------------------------------


@router.get("/orgs/{org}/provenance")
def provenance(
    org: OrgId,
    user: UserId,
    service: ServiceDep,
    doc: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
    since: Annotated[str | None, Query(max_length=40)] = None,
    stale: bool = False,
) -> list[dict[str, Any]]:
    """The recorded answers for the org that cited ``doc`` (or, with ``stale=true``, every
    answer to revisit), each flagged when its document was rejected, superseded, withdrawn or
    changed since (`kbflow provenance --json`); ``since``: 7d, 12h, 30m, 2w or an ISO date.

    For those who may inspect the org's drafts."""
    from kbflow.services.answers import parse_since
    from kbflow.services.answers import provenance as trace
    from tasks.review.access import authorize_inspection

    if doc is None and not stale:
        raise invalid("doc", "say what to trace: doc=DOC_ID, or stale=true", where="query")
    try:
        parse_since(since)
    except ConfigError as exc:
        raise invalid("since", str(exc), where="query") from exc
    authorize_inspection(service.ctx.registry, user, org)
    # The ledger takes its reads and writes one at a time itself (`sinks.ledger`).
    return trace(service.settings, doc=doc, since=since, stale=stale, org=org)


# --- helpers -----------------------------------------------------------------------------------


def _may_decide(service: Service, user: str, org: str, attempted: str, what: str) -> None:
    """Refuse, before the body is read, a caller who may not change the org's knowledge (an
    audit row says so)."""
    from tasks.review.access import authorize_decision

    registry = service.ctx.registry
    with refusals_audited(registry, user, attempted, org_id=org):
        authorize_decision(registry, user, org, what=what)


@contextmanager
def _private_folder(settings: Settings) -> Iterator[FsPath]:
    """A folder only this process may read, under the kbflow home, removed after."""
    parent = settings.home.resolve() / "tmp"
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder = FsPath(tempfile.mkdtemp(prefix="upload-", dir=parent))  # mode 0700
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _scrubbed(value: dict[str, Any], folder: FsPath) -> dict[str, Any]:
    """``value`` without the server's paths under ``folder`` (a reason may name a file by its
    full path): they become ``KBFLOW_HOME``-relative or plain names."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    text = text.replace(f"{folder}/", "").replace(str(folder), "")
    scrubbed: dict[str, Any] = json.loads(text)
    return scrubbed
