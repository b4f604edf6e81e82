"""The seed routes: an org's seed bundle (files, URLs and prompts for its research), sent and
listed, as ``kbflow seed --json`` and ``kbflow seed list --json`` give them.

Seeding is for the org's account manager or a superadmin (a refusal is an audit row); listing
for whoever may inspect the org's drafts. The bundle streams to a private folder under the
kbflow home (`kbflow.api.uploads`) and is seeded in the request, through the store this process
holds open, like a decision.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from kbflow.api.auth import Service, ServiceDep, UserId
from kbflow.api.deps import ADMIN_PREFIX, OrgId, may_decide, scrubbed
from kbflow.api.schemas import DocumentOut, SeedResult
from kbflow.api.uploads import (
    FILE_PART,
    TEXT_PART,
    Received,
    SeedForm,
    checked_form,
    invalid,
    multipart_body,
    private_folder,
    receive_upload,
    seed_limits,
)
from kbflow.services.research import seeds
from tasks.research.seed import MAX_SEED_FILES

router = APIRouter(prefix=ADMIN_PREFIX, tags=["seeds"])


@router.post(
    "/orgs/{org}/seed",
    response_model=SeedResult,
    openapi_extra=multipart_body(
        {
            "files": {"type": "array", "items": FILE_PART, "maxItems": MAX_SEED_FILES},
            "urls": {"type": "array", "items": TEXT_PART},
            "prompts": {"type": "array", "items": TEXT_PART},
        },
        [],
    ),
)
async def seed_inputs(
    org: OrgId, request: Request, user: UserId, service: ServiceDep
) -> SeedResult:
    """Seed research inputs for an org (`kbflow seed --json`): multipart ``files`` (at most 20
    per bundle, 25 MB each), ``urls`` and ``prompts`` (each field repeatable).

    For the org's account manager or a superadmin. The files are read from a private folder
    under the kbflow home, deleted after; each is keyed ``upload:ORG/NAME``, so sending a file
    of the same name again updates that input. 413 past a cap, 415 for a type kbflow does not
    read; a bundle that would pass the org's cap stores nothing (422)."""
    settings = service.settings
    await run_in_threadpool(may_decide, service, user, org, "seed", "seed research inputs")
    with private_folder(settings) as folder:
        received = await receive_upload(
            request, folder, file_fields=frozenset({"files"}), limits=seed_limits(settings)
        )
        form = checked_form(SeedForm, received.fields)
        if not (received.files or form.urls or form.prompts):
            raise invalid("files", "give at least one of files, urls or prompts")
        return await run_in_threadpool(_seed, service, org, user, received, form, folder)


def _seed(
    service: Service, org: str, user: str, received: Received, form: SeedForm, folder: Path
) -> SeedResult:
    """The bundle seeded; what it stored, without the paths of ``folder`` it was read from."""
    from tasks.review.machine import held

    with service.use() as ctx:
        result = seeds.seed(
            service.settings,
            org,
            actor=user,
            files=[f.path for f in received.files],
            urls=form.urls,
            prompts=form.prompts,
            file_uris=[f"upload:{org}/{f.name}" for f in received.files],
            open_store=held(ctx.vector_store),
        )
    return SeedResult.model_validate(scrubbed(result, folder))


@router.get("/orgs/{org}/seed", response_model=list[DocumentOut])
def list_seed_inputs(org: OrgId, user: UserId, service: ServiceDep) -> list[DocumentOut]:
    """An org's seed inputs (`kbflow seed list --json`), for those who may inspect its drafts."""
    found = seeds.list_seeds(service.settings, org, user)
    return [DocumentOut.model_validate(d.to_dict()) for d in found]
