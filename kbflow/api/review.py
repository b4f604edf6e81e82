"""The review routes, for people: the review queue, a document's text, decisions (409 when
someone else decided first), and the audit log. The same rules as the CLI
(`tasks.review.access`), with the person taken from the token instead of ``--as``.

Decisions write through the store this process holds open (`tasks.review.machine.held`): the
embedded store has one owner, and while ``kbflow serve`` runs, that is the service.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from core.errors import ConfigError, Forbidden, NotFound
from core.models import DocStatus
from kbflow.api.auth import ServiceDep, UserId
from kbflow.api.deps import ADMIN_PREFIX, ID_PATTERN, DocId, OrgId
from kbflow.api.schemas import (
    AuditEntry,
    DocumentOut,
    DocumentView,
    DraftsResponse,
    ReviewCodeOut,
)
from sinks.registry import SqlRegistry

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


@contextmanager
def _refusals_audited(
    registry: SqlRegistry, user: str, attempted: str, doc_id: str
) -> Iterator[None]:
    """A refused decision leaves an audit row saying who tried what on which document (in
    the document's org), and why not."""
    try:
        yield
    except Forbidden as exc:
        try:
            org_id: str | None = registry.get_document(doc_id).org_id
        except NotFound:
            org_id = None
        registry.record_denied(user, f"{attempted} {doc_id}", org_id=org_id, reason=str(exc))
        raise


@router.get("/orgs/{org}/drafts", response_model=DraftsResponse)
def list_drafts(
    org: OrgId,
    user: UserId,
    service: ServiceDep,
    status: Annotated[list[DocStatus] | None, Query()] = None,
) -> dict[str, Any]:
    """An org's drafts grouped by research run (default: pending_review and rejected), for
    those who may inspect them; the JSON of `kbflow review list --json`."""
    from tasks.review.inspection import list_drafts as drafts

    ctx = service.read()
    if status:
        groups = drafts(ctx.registry, user, org, statuses=status)
    else:
        groups = drafts(ctx.registry, user, org)
    return {
        "org": org,
        "runs": [
            {"synthesis_run_id": run, "documents": [d.to_dict() for d in docs]}
            for run, docs in groups.items()
        ],
    }


@router.get("/documents/{doc_id}", response_model=DocumentView)
def show_document(doc_id: DocId, user: UserId, service: ServiceDep) -> dict[str, Any]:
    """A document's record and full stored text, whatever its status (`kbflow review show`)."""
    from tasks.review.inspection import inspect_draft
    from tasks.review.machine import held

    ctx = service.read()
    view = inspect_draft(doc_id, user, registry=ctx.registry, open_store=held(ctx.vector_store))
    return {"document": view.doc.to_dict(), "chunks": view.chunks, "text": view.text}


# Registered before the decisions: `/edit` is not a decision's verb.
@router.post("/documents/{doc_id}/edit", response_model=DocumentOut)
def edit(doc_id: DocId, body: EditBody, user: UserId, service: ServiceDep) -> dict[str, Any]:
    """Replace a document's content and approve it (an approved document gets a new approved
    version); 409 when someone decided first."""
    from tasks.review.machine import edit_and_approve, held

    settings = service.settings
    with service.use() as ctx, _refusals_audited(ctx.registry, user, "edit", doc_id):
        doc = edit_and_approve(
            doc_id,
            user,
            body.content,
            registry=ctx.registry,
            open_store=held(ctx.vector_store),
            embedder=ctx.embedder,
            max_words=settings.ingest.chunk_max_words,
            overlap_words=settings.ingest.chunk_overlap_words,
            note=body.note,
        )
    return dict(doc.to_dict())


# Registered before the decisions too: `/restore` takes an embedder (a fallback) and a note.
@router.post("/documents/{doc_id}/restore", response_model=DocumentOut)
def restore(
    doc_id: DocId, user: UserId, service: ServiceDep, body: DecisionBody | None = None
) -> dict[str, Any]:
    """Put a withdrawn document back in service: a new approved version with its text (the
    withdrawn version stays withdrawn; answers that cited it keep their provenance); the note
    is required. 409 when it is not withdrawn, a newer version of its source is approved or
    withdrawn too, or someone decided first (nothing changed)."""
    from tasks.review.machine import held
    from tasks.review.machine import restore as restore_document

    note = body.note if body else None
    if not (note and note.strip()):
        raise ConfigError("restoring needs a note saying why (it is audited)")
    with service.use() as ctx, _refusals_audited(ctx.registry, user, "restore", doc_id):
        doc = restore_document(
            doc_id, user, registry=ctx.registry, open_store=held(ctx.vector_store), note=note,
            embedder=ctx.embedder,
        )  # fmt: skip
    return dict(doc.to_dict())


@router.post("/documents/{doc_id}/{verb}", response_model=DocumentOut)
def decide(
    doc_id: DocId,
    verb: Literal["approve", "reject", "withdraw"],
    user: UserId,
    service: ServiceDep,
    body: DecisionBody | None = None,
) -> dict[str, Any]:
    """Approve, reject or withdraw one document; 409 when it is no longer in the state the
    decision needs (someone decided first: nothing changed)."""
    from tasks.review.machine import approve, held, reject, withdraw

    note = body.note if body else None
    if verb == "withdraw" and not (note and note.strip()):
        raise ConfigError("withdrawing needs a note saying why (it is audited)")
    transition: Any = {"approve": approve, "reject": reject, "withdraw": withdraw}[verb]
    with service.use() as ctx, _refusals_audited(ctx.registry, user, verb, doc_id):
        doc = transition(
            doc_id, user, registry=ctx.registry, open_store=held(ctx.vector_store), note=note
        )
    return dict(doc.to_dict())


@router.get("/orgs/{org}/audit", response_model=list[AuditEntry])
def audit(
    org: OrgId,
    user: UserId,
    service: ServiceDep,
    doc: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[dict[str, Any]]:
    """The org's most recent audit rows (or one document's), for those who may inspect it."""
    from sinks.registry.audit import audit_dict
    from tasks.review.access import authorize_inspection

    registry = service.read().registry
    authorize_inspection(registry, user, org)
    rows = registry.audit_trail(org, doc, last=limit)
    return [audit_dict(row) for row in rows]


class CodeBody(BaseModel):
    """Optionally, the one paused review run the code is for."""

    model_config = ConfigDict(extra="forbid", strict=True)

    flow_run_id: str | None = Field(None, pattern=r"^[0-9a-fA-F-]{36}$")


@router.post("/orgs/{org}/review-codes", response_model=ReviewCodeOut)
def review_code(
    org: OrgId, user: UserId, service: ServiceDep, body: CodeBody | None = None
) -> dict[str, Any]:
    """A one-time review code for the caller (a superadmin or the org's account manager): the
    proof a paused review run's form asks for (`kbflow review code`). Refusals are audited."""
    from tasks.review.codes import issue_code

    registry = service.read().registry
    run = body.flow_run_id if body else None
    try:
        issued = issue_code(registry, user, org, flow_run_id=run)
    except Forbidden as exc:
        registry.record_denied(user, "get a review code", org_id=org, reason=str(exc))
        raise
    return {
        "code": issued.code,
        "user_id": issued.user_id,
        "org_id": issued.org_id,
        "flow_run_id": issued.flow_run_id,
        "expires_at": issued.expires_at.isoformat(timespec="seconds"),
    }
