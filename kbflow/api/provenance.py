"""The provenance route: which recorded answers cited a document, or every answer to revisit
(`kbflow provenance --json`), for those who may inspect the org's drafts. The CLI's
``provenance`` has no such rule, being the operator's; over HTTP the caller is a person, and
the answers carry the org's agents' questions.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from core.errors import ConfigError
from kbflow.api.auth import ServiceDep, UserId
from kbflow.api.deps import ADMIN_PREFIX, ID_PATTERN, OrgId
from kbflow.api.schemas import ProvenanceRow
from kbflow.api.uploads import invalid

router = APIRouter(prefix=ADMIN_PREFIX, tags=["provenance"])


@router.get("/orgs/{org}/provenance", response_model=list[ProvenanceRow])
def provenance(
    org: OrgId,
    user: UserId,
    service: ServiceDep,
    doc: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
    since: Annotated[str | None, Query(max_length=40)] = None,
    stale: bool = False,
) -> list[ProvenanceRow]:
    """The recorded answers for the org that cited ``doc`` (or, with ``stale=true``, every
    answer to revisit), each flagged when its document was rejected, superseded, withdrawn or
    changed since (`kbflow provenance --json`); ``since``: 7d, 12h, 30m, 2w or an ISO date.

    For those who may inspect the org's drafts."""
    from kbflow.services.query.answers import parse_since
    from kbflow.services.query.answers import provenance as trace
    from tasks.review.access import authorize_inspection

    if doc is None and not stale:
        raise invalid("doc", "say what to trace: doc=DOC_ID, or stale=true", where="query")
    try:
        parse_since(since)
    except ConfigError as exc:
        raise invalid("since", str(exc), where="query") from exc
    authorize_inspection(service.ctx.registry, user, org)
    # The ledger takes its reads and writes one at a time itself (`sinks.ledger`).
    rows = trace(service.settings, doc=doc, since=since, stale=stale, org=org)
    return [ProvenanceRow.model_validate(row) for row in rows]
