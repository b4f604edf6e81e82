"""What the admin routers share: the ids a path names, the audited permission checks, and the
202 a background job is answered with.

Routers import this module, `kbflow.api.auth` (the caller and the service), `kbflow.api.schemas`
and `kbflow.api.uploads`, never each other (tests/kbflow/test_api_openapi.py checks).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path as FsPath
from typing import Annotated, TypeVar

from fastapi import Path, Response

from core.errors import Forbidden
from kbflow.api.auth import Service
from kbflow.api.schemas import JobAccepted
from kbflow.services.jobs import queue as jobs
from sinks.registry import JobRecord, SqlRegistry

ADMIN_PREFIX = "/v1/admin"
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

DocId = Annotated[str, Path(pattern=ID_PATTERN, description="A document id.")]
OrgId = Annotated[str, Path(pattern=ID_PATTERN, description="An org id.")]
JobId = Annotated[str, Path(pattern=ID_PATTERN, description="A job id (202 answers name it).")]

AcceptedT = TypeVar("AcceptedT", bound=JobAccepted)
JsonT = TypeVar("JsonT")


@contextmanager
def refusals_audited(
    registry: SqlRegistry, user: str, attempted: str, *, org_id: str | None
) -> Iterator[None]:
    """A refused admin action leaves an audit row (``kb.access.denied``) saying who tried
    what, on which org, and why not."""
    try:
        yield
    except Forbidden as exc:
        registry.people.record_denied(user, attempted, org_id=org_id, reason=str(exc))
        raise


def may_decide(service: Service, user: str, org: str, attempted: str, what: str) -> None:
    """Refuse, before the body is read, a caller who may not change the org's knowledge (an
    audit row says so)."""
    from tasks.review.access import authorize_decision

    registry = service.ctx.registry
    with refusals_audited(registry, user, attempted, org_id=org):
        authorize_decision(registry, user, org, what=what)


def accepted(
    answer: type[AcceptedT],
    job: JobRecord,
    registry: SqlRegistry,
    response: Response,
    **extra: str,
) -> AcceptedT:
    """A 202's body, as ``answer`` (`JobAccepted`, or a model that adds ``extra``): the job's
    id, kind, state and org, whether it waits for a slot (``queued``, with its
    ``queue_position``), and ``extra``; ``response`` gets the ``Location`` to follow the job
    at."""
    response.headers["Location"] = f"{ADMIN_PREFIX}/jobs/{job.id}"
    body = {"job_id": job.id, "kind": job.kind, "status": job.status.value, "org": job.org_id}
    return answer.model_validate({**body, **jobs.admission(registry, job.id), **extra})


def scrubbed(value: JsonT, folder: FsPath) -> JsonT:
    """``value`` (JSON: dicts, lists, text, numbers) without the server's paths under
    ``folder`` (a reason may name a file by its full path): they become
    ``KBFLOW_HOME``-relative or plain names."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    text = text.replace(f"{folder}/", "").replace(str(folder), "")
    out: JsonT = json.loads(text)
    return out
