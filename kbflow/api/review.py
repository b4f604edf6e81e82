"""The review routes, for people: the review queue, a document's text, decisions (409 when
someone else decided first), and the audit log. The same rules as the CLI
(`tasks.review.access`), with the person taken from the token instead of ``--as``.

Decisions take the one decision path (`kbflow.services.review.decisions.decide`, as the CLI
and the inbox do: a paused review run kbflow started that holds the draft gets it, else it
applies directly; a refusal is audited) and write through the store this process holds open
(`tasks.review.machine.held`): the embedded store has one owner, and while ``kbflow serve``
runs, that is the service.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from core.errors import Forbidden
from core.models import DocStatus
from kbflow.api.auth import Service, ServiceDep, UserId
from kbflow.api.deps import ADMIN_PREFIX, ID_PATTERN, DocId, OrgId
from kbflow.api.schemas import (
    AuditEntry,
    DocumentOut,
    DocumentView,
    DraftRun,
    DraftsResponse,
    ReviewCodeOut,
)
from sinks.registry import DocRecord
from tasks.review.decisions import Verb

router = APIRouter(prefix=ADMIN_PREFIX, tags=["review"])

MAX_NOTE_CHARS = 2000
MAX_CONTENT_CHARS = 1_000_000


class DecisionBody(BaseModel):
    """A note for the audit log (required to withdraw)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    note: str | None = Field(None, max_length=MAX_NOTE_CHARS)


class EditBody(DecisionBody):
    """The document's new content (Markdown), approved with the edit."""

    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)


@router.get("/orgs/{org}/drafts", response_model=DraftsResponse)
def list_drafts(
    org: OrgId,
    user: UserId,
    service: ServiceDep,
    status: Annotated[list[DocStatus] | None, Query()] = None,
) -> DraftsResponse:
    """An org's drafts grouped by research run (default: pending_review and rejected), for
    those who may inspect them; the JSON of `kbflow review list --json`."""
    from tasks.review.inspection import list_drafts as drafts

    ctx = service.read()
    if status:
        groups = drafts(ctx.registry, user, org, statuses=status)
    else:
        groups = drafts(ctx.registry, user, org)
    return DraftsResponse(
        org=org,
        runs=[
            DraftRun(synthesis_run_id=run, documents=[_document(d) for d in docs])
            for run, docs in groups.items()
        ],
    )


@router.get("/documents/{doc_id}", response_model=DocumentView)
def show_document(doc_id: DocId, user: UserId, service: ServiceDep) -> DocumentView:
    """A document's record and full stored text, whatever its status (`kbflow review show`)."""
    from tasks.review.inspection import inspect_draft
    from tasks.review.machine import held

    ctx = service.read()
    view = inspect_draft(doc_id, user, registry=ctx.registry, open_store=held(ctx.vector_store))
    return DocumentView(document=_document(view.doc), chunks=view.chunks, text=view.text)


def _document(doc: DocRecord) -> DocumentOut:
    """A document's registry record as the routes answer it."""
    return DocumentOut.model_validate(doc.to_dict())


def _decision(
    service: Service,
    user: str,
    doc_id: str,
    verb: Verb,
    *,
    note: str | None,
    content: str | None = None,
) -> DocumentOut:
    """One decision through the one decision path (`kbflow.services.review.decisions`), on the
    store this process holds open; the document's record after it."""
    from kbflow.services.review.decisions import decide as decide_one
    from tasks.review.machine import held

    with service.use() as ctx:
        decided = decide_one(
            service.settings, ctx.registry, held(ctx.vector_store), lambda: ctx.embedder, user,
            doc_id, verb, surface="http", note=note, content=content,
        )  # fmt: skip
    return _document(decided.doc)


# Registered before the decisions: `/edit` is not a decision's verb.
@router.post("/documents/{doc_id}/edit", response_model=DocumentOut)
def edit(doc_id: DocId, body: EditBody, user: UserId, service: ServiceDep) -> DocumentOut:
    """Replace a document's content and approve it (an approved document gets a new approved
    version); 409 when someone decided first."""
    return _decision(service, user, doc_id, Verb.EDIT, note=body.note, content=body.content)


# Registered before the decisions too: `/restore` takes an embedder (a fallback) and a note.
@router.post("/documents/{doc_id}/restore", response_model=DocumentOut)
def restore(
    doc_id: DocId, user: UserId, service: ServiceDep, body: DecisionBody | None = None
) -> DocumentOut:
    """Put a withdrawn document back in service: a new approved version with its text (the
    withdrawn version stays withdrawn; answers that cited it keep their provenance); the note
    is required. 409 when it is not withdrawn, a newer version of its source is approved or
    withdrawn too, or someone decided first (nothing changed)."""
    return _decision(service, user, doc_id, Verb.RESTORE, note=body.note if body else None)


@router.post("/documents/{doc_id}/{verb}", response_model=DocumentOut)
def decide(
    doc_id: DocId,
    verb: Literal["approve", "reject", "withdraw"],
    user: UserId,
    service: ServiceDep,
    body: DecisionBody | None = None,
) -> DocumentOut:
    """Approve, reject or withdraw one document; 409 when it is no longer in the state the
    decision needs (someone decided first: nothing changed)."""
    return _decision(service, user, doc_id, Verb(verb), note=body.note if body else None)


@router.get("/orgs/{org}/audit", response_model=list[AuditEntry])
def audit(
    org: OrgId,
    user: UserId,
    service: ServiceDep,
    doc: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[AuditEntry]:
    """The org's most recent audit rows (or one document's), for those who may inspect it."""
    from sinks.registry.audit import audit_dict
    from tasks.review.access import authorize_inspection

    registry = service.read().registry
    authorize_inspection(registry, user, org)
    rows = registry.audit.audit_trail(org, doc, last=limit)
    return [AuditEntry.model_validate(audit_dict(row)) for row in rows]


class CodeBody(BaseModel):
    """Optionally, the one paused review run the code is for."""

    model_config = ConfigDict(extra="forbid", strict=True)

    flow_run_id: str | None = Field(None, pattern=r"^[0-9a-fA-F-]{36}$")


@router.post("/orgs/{org}/review-codes", response_model=ReviewCodeOut)
def review_code(
    org: OrgId, user: UserId, service: ServiceDep, body: CodeBody | None = None
) -> ReviewCodeOut:
    """A one-time review code for the caller (a superadmin or the org's account manager): the
    proof a paused review run's form asks for (`kbflow review code`). Refusals are audited."""
    from tasks.review.codes import issue_code

    registry = service.read().registry
    run = body.flow_run_id if body else None
    try:
        issued = issue_code(registry, user, org, flow_run_id=run)
    except Forbidden as exc:
        registry.people.record_denied(user, "get a review code", org_id=org, reason=str(exc))
        raise
    return ReviewCodeOut(
        code=issued.code,
        user_id=issued.user_id,
        org_id=issued.org_id,
        flow_run_id=issued.flow_run_id,
        expires_at=issued.expires_at.isoformat(timespec="seconds"),
    )
