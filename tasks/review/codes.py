"""One-time review codes: how whoever resumes a paused review run proves who they are.

A paused run's form can be submitted by anyone who reaches the Prefect API, so a name typed into
it proves nothing. A code proves it: :func:`issue_code` gives one to a user who may decide for
the org (``kbflow review code``, the HTTP API with the user's token, or the review inbox for
the logged-in user), and the run redeems it with :func:`prove_reviewer` before it applies
anything. A code is bound to the user and the org (and to one run when given), lasts at most
15 minutes, is used once, and only its hash is stored (see :mod:`sinks.registry.logins`).
"""

from __future__ import annotations

import datetime as dt

from sinks.registry import IssuedCode, SqlRegistry, UserRecord
from tasks.review.access import authorize_decision

CODE_TTL = dt.timedelta(minutes=15)


def issue_code(
    registry: SqlRegistry,
    actor: str | None,
    org_id: str,
    *,
    flow_run_id: str | None = None,
    ttl: dt.timedelta = CODE_TTL,
) -> IssuedCode:
    """A new review code for ``actor``, who must be allowed to decide for ``org_id``.

    Raises:
        Forbidden: the actor may not decide for the org (audited by the caller's refusal).
    """
    user = authorize_decision(registry, actor, org_id, what="get a review code")
    return registry.issue_review_code(user.id, org_id, flow_run_id=flow_run_id, ttl=ttl)


def prove_reviewer(registry: SqlRegistry, code: str, org_id: str, flow_run_id: str) -> UserRecord:
    """The user a review code proves, used up, if they (still) may decide for ``org_id``.

    Raises:
        Unauthorized: no code, or an unknown, used, expired or foreign code.
        Forbidden: the code's user may no longer decide for the org (their role changed).
    """
    user_id = registry.redeem_review_code(code, org_id=org_id, flow_run_id=flow_run_id)
    return authorize_decision(registry, user_id, org_id)
