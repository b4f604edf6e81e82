"""The research route: start an org's research run (`kbflow research`) in a background job.

For the org's account manager or a superadmin (a refusal is an audit row). Long work runs in a
background process (`kbflow.services.jobs.queue`): the route answers 202 with the job's id and a
``Location`` to follow it (`kbflow.api.jobs`). At most KBFLOW_JOBS_MAX_RUNNING jobs run at once
(KBFLOW_JOBS_MAX_RUNNING_PER_ORG of one org's); the others wait in a queue, still PROCESSING,
the 202 (and the job's status) saying ``queued: true`` and their ``queue_position``; past
KBFLOW_JOBS_MAX_QUEUED_PER_ORG waiting jobs an org's next one is refused (429, Retry-After).
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from core import ids
from core.errors import Forbidden
from kbflow.api.auth import ServiceDep, UserId
from kbflow.api.deps import ADMIN_PREFIX, OrgId, accepted, refusals_audited
from kbflow.api.schemas import JobAccepted
from kbflow.api.uploads import invalid
from kbflow.services.jobs import queue as jobs
from kbflow.services.research import seeds

router = APIRouter(prefix=ADMIN_PREFIX, tags=["research"])

MAX_BUDGET_TOKENS = 10_000_000


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


@router.post("/orgs/{org}/research", status_code=202, response_model=JobAccepted)
def start_research(
    org: OrgId, body: ResearchBody, user: UserId, service: ServiceDep, response: Response
) -> JobAccepted:
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
    return accepted(JobAccepted, job, service.ctx.registry, response)
