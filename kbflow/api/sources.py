"""The source routes: an org's synced sources (docs/SOURCES.md) added, listed, shown, changed,
removed and synced, as ``kbflow sources add/list/show/update/remove/sync --json`` do.

Listing and showing are for whoever may inspect the org's drafts; adding, changing, removing
and syncing for the org's account manager or a superadmin, and a local folder for a superadmin
only (`kbflow.services.sources.definitions`; a refusal is an audit row). Whether the caller may act
on the org is checked before a source is looked up, so a refusal says neither whether the org exists
nor whether it has a source of that name.

A sync runs as a background job (as an upload does: 202, the job at ``Location``), so this
server never loads Prefect; 409 while another sync of the source runs. A scheduled sync runs
on the Prefect workers instead (`kbflow sources schedule`).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Query, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from core.errors import ConfigError
from kbflow.api.auth import Service, ServiceDep, UserId
from kbflow.api.deps import ADMIN_PREFIX, OrgId, accepted, may_decide, scrubbed
from kbflow.api.schemas import ApiModel, JobAccepted
from kbflow.services.sources import definitions as sources
from sinks.registry import SourceRecord
from tasks.sources import KINDS

router = APIRouter(prefix=ADMIN_PREFIX, tags=["sources"])

SourceName = Annotated[
    str,
    Path(pattern=r"^[A-Za-z0-9_.-]{1,120}$", description="The source's name (or its id)."),
]
MAX_PATTERNS = 100
MAX_PATTERN_CHARS = 500
MAX_CONFIG_KEYS = 50

# --- bodies ------------------------------------------------------------------------------------


class _SourceFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    audience: str | None = Field(None, max_length=200, description="Audience its documents get.")
    include: list[Annotated[str, Field(max_length=MAX_PATTERN_CHARS)]] | None = Field(
        None, max_length=MAX_PATTERNS, description="Only items whose key matches one of these."
    )
    exclude: list[Annotated[str, Field(max_length=MAX_PATTERN_CHARS)]] | None = Field(
        None, max_length=MAX_PATTERNS, description="Skip items whose key matches one of these."
    )
    timezone: str | None = Field(None, max_length=64, description="The schedule's (IANA name).")


class SourceBody(_SourceFields):
    """A new source (`kbflow sources add`'s options). ``config`` is its kind's settings
    (docs/SOURCES.md), never a secret: credentials come from the server's environment."""

    name: str = Field(min_length=1, max_length=120, description="Unique in the org.")
    kind: str = Field(min_length=1, max_length=40, description=f"One of {', '.join(KINDS)}.")
    config: dict[str, Any] = Field(max_length=MAX_CONFIG_KEYS)
    collection: str = Field(min_length=1, max_length=300, description="Where its documents go.")
    status: str = Field("pending_review", description="pending_review or approved.")
    max_items: int = Field(10_000, ge=1, description="Items synced at most.")
    max_item_bytes: int = Field(50_000_000, ge=1, description="Largest item read, in bytes.")
    schedule: str | None = Field(None, max_length=200, description="Cron, e.g. '0 6 * * *'.")


class SourceChanges(_SourceFields):
    """What to change (`kbflow sources update`'s options): only the fields given. ``config``
    is merged into the source's; ``schedule: ""`` removes the schedule."""

    config: dict[str, Any] | None = Field(None, max_length=MAX_CONFIG_KEYS)
    collection: str | None = Field(None, min_length=1, max_length=300)
    status: str | None = None
    max_items: int | None = Field(None, ge=1)
    max_item_bytes: int | None = Field(None, ge=1)
    schedule: str | None = Field(None, max_length=200)

    @model_validator(mode="after")
    def _not_null(self) -> SourceChanges:
        for name in ("config", "collection", "status", "max_items", "max_item_bytes"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} cannot be null: leave it out to keep it as it is")
        return self


# --- answers -----------------------------------------------------------------------------------


def _isoformat(value: object) -> object:
    return value.isoformat() if isinstance(value, dt.datetime) else value


IsoTime = Annotated[str, BeforeValidator(_isoformat)]
"""A time as ISO 8601 text: a record's datetime as ``isoformat()`` writes it."""


class SourceOut(ApiModel):
    """A source as `kbflow sources add --json` writes it: its record (`SourceRecord`), field
    for field (`of`)."""

    id: str
    org_id: str
    name: str
    kind: str
    config: dict[str, Any]
    collection: str
    status: str
    audience: str | None
    include: list[str]
    exclude: list[str]
    max_items: int
    max_item_bytes: int
    schedule: str | None
    timezone: str | None
    created_by: str
    created_at: IsoTime
    updated_at: IsoTime
    last_sync: dict[str, Any] | None

    @classmethod
    def of(cls, record: SourceRecord) -> SourceOut:
        """The source's record as the API answers it."""
        return cls.model_validate(record, from_attributes=True)


class SourceItems(ApiModel):
    present: int
    failed: int
    gone: int


class SourceView(SourceOut):
    """A source as `kbflow sources show --json` writes it: with whether a sync runs now, its
    items by state and its next scheduled run."""

    running: bool
    items: SourceItems
    next_run: str | None


class SourceRemoved(ApiModel):
    removed: str
    name: str
    org_id: str
    withdrawn: int


# --- routes ------------------------------------------------------------------------------------


@router.post("/orgs/{org}/sources", status_code=201, response_model=SourceOut)
def add_source(org: OrgId, body: SourceBody, user: UserId, service: ServiceDep) -> SourceOut:
    """Add a source to the org (`kbflow sources add --json`): 201 with it. Nothing is read
    until it is synced (``POST …/sources/{name}/sync``, or its schedule).

    For the org's account manager or a superadmin; a local folder for a superadmin only. 422
    for a config its kind refuses (each kind's keys: docs/SOURCES.md)."""
    may_decide(service, user, org, "add a source", "add sources")
    with _secrets_kept_out():
        fields = sources.source_fields(
            body.kind, body.config, collection=body.collection, status=body.status,
            audience=body.audience, include=body.include, exclude=body.exclude,
            max_items=body.max_items, max_item_bytes=body.max_item_bytes,
            schedule=body.schedule, timezone=body.timezone,
        )  # fmt: skip
    settings = service.settings
    made = sources.add_source(settings, org, body.name, fields, actor=user)
    return _clean(SourceOut.of(made), service)


@router.get("/orgs/{org}/sources", response_model=list[SourceView])
def list_sources(org: OrgId, user: UserId, service: ServiceDep) -> list[SourceView]:
    """The org's sources with their last sync (`kbflow sources list --org ORG --json`), for
    those who may inspect its drafts."""
    _may_inspect(service, user, org)
    found = sources.list_sources(service.settings, org)
    return [_clean(SourceView.model_validate(s), service) for s in found]


@router.get("/orgs/{org}/sources/{name}", response_model=SourceView)
def show_source(org: OrgId, name: SourceName, user: UserId, service: ServiceDep) -> SourceView:
    """One source (`kbflow sources show --json`): its settings, last sync (counts, errors),
    items by state, whether a sync runs now and its next scheduled run."""
    _may_inspect(service, user, org)
    shown = sources.get_source(service.settings, name, org)
    return _clean(SourceView.model_validate(shown), service)


@router.patch("/orgs/{org}/sources/{name}", response_model=SourceOut)
def update_source(
    org: OrgId, name: SourceName, body: SourceChanges, user: UserId, service: ServiceDep
) -> SourceOut:
    """Change a source (`kbflow sources update --json`): the fields given. Items the new
    patterns or caps leave out are withdrawn at the next complete sync; a new collection or
    status applies to items synced from then on. 422 when nothing is given."""
    may_decide(service, user, org, "change a source", "change sources")
    changes = body.model_dump(exclude_unset=True)
    with _secrets_kept_out():
        done = sources.update_source(service.settings, name, org, changes, actor=user)
    return _clean(SourceOut.of(done), service)


@router.delete("/orgs/{org}/sources/{name}", response_model=SourceRemoved)
def remove_source(
    org: OrgId,
    name: SourceName,
    user: UserId,
    service: ServiceDep,
    withdraw: Annotated[
        bool, Query(description="Also take its documents out of service (audited).")
    ] = False,
) -> SourceRemoved:
    """Remove a source and its sync state (`kbflow sources remove --json`). Its documents stay
    in service unless ``withdraw=true``: then each is withdrawn, audited "removed at source"."""
    may_decide(service, user, org, "remove a source", "remove sources")
    removed = sources.remove_source(service.settings, name, org, actor=user, withdraw=withdraw)
    return SourceRemoved.model_validate(removed)


@router.post(
    "/orgs/{org}/sources/{name}/sync",
    status_code=202,
    response_model=JobAccepted,
    responses={409: {"description": "A sync of the source runs already."}},
)
async def sync_source(
    org: OrgId, name: SourceName, user: UserId, service: ServiceDep, response: Response
) -> JobAccepted | JSONResponse:
    """Sync a source now, as a background job (`kbflow sources sync`): 202 with the job to
    follow at ``Location`` (``GET …/jobs/{id}``); its ``result`` is the sync's summary
    (``counts``; ``outcome`` partial when an item failed, each in ``errors``), FAILED with the
    reason when the source could not be listed (nothing is withdrawn then).

    For the org's account manager or a superadmin. 409 while another sync of it runs (this
    server's, a command's or a scheduled one)."""
    from tasks.sources.state import sync_running

    settings = service.settings
    await run_in_threadpool(may_decide, service, user, org, "sync a source", "sync sources")
    source = await run_in_threadpool(sources.resolve_source, settings, name, org)
    if sync_running(settings.home, source.id):
        return JSONResponse(
            {"detail": f"a sync of source {source.name!r} (org {org}) is running already"},
            status_code=409,
        )
    job = await run_in_threadpool(sources.submit_sync_job, settings, org, source.id, actor=user)
    return await run_in_threadpool(accepted, JobAccepted, job, service.ctx.registry, response)


# --- helpers -----------------------------------------------------------------------------------


def _may_inspect(service: Service, user: str, org: str) -> None:
    """Refuse a caller who may not read the org's drafts (an unknown org as another org)."""
    from tasks.review.access import authorize_inspection

    authorize_inspection(service.ctx.registry, user, org)


_USERINFO = re.compile(r"(?<=://)[^/@\s'\"]+@")


@contextmanager
def _secrets_kept_out() -> Iterator[None]:
    """A refused config is answered without what may be a secret in it: a URL's user and
    password (which a source's config never keeps) are not echoed back."""
    try:
        yield
    except ConfigError as exc:
        text = str(exc)
        redacted = _USERINFO.sub("***@", text)
        if redacted == text:
            raise
        raise ConfigError(redacted) from None


SourceT = TypeVar("SourceT", bound=SourceOut)


def _clean(source: SourceT, service: Service) -> SourceT:
    """``source`` without the server's paths under its home (a staged file's, in a sync's
    errors); its ``config`` is kept as it is (it names where the source lives)."""
    out = scrubbed(source.model_dump(exclude={"config"}), service.settings.home.resolve())
    return type(source).model_validate({**out, "config": source.config})
