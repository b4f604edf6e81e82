"""One-time review codes: how whoever resumes a paused review run proves who they are, and
that the decisions the run reads are the ones they made.

A paused run's form can be submitted by anyone who reaches the Prefect API, so a name typed into
it proves nothing. A code proves it: :func:`issue_code` gives one to a user who may decide for
the org (``kbflow review code``, the HTTP API with the user's token, or the review inbox for
the logged-in user). A code is bound to the user and the org (and to one run when given), lasts
at most 15 minutes, is used once, and only its hash is stored (see :mod:`sinks.registry.logins`).

The code itself never goes into the run's input: Prefect stores that input where anyone who
reaches its API can read it, delete it and post other decisions before the run (which polls)
reads them. What goes in is a **proof** (:func:`sign_decisions`): an HMAC over the run's id and
the exact decisions (:func:`canonical_decisions`), keyed by the code's hash, beside a lookup tag
that does not reveal the key. The run verifies it against the stored hash with
:func:`prove_decisions` before it applies anything: a proof for other decisions or another run,
or decisions changed after they were signed, are refused and nothing is applied.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from core.errors import Unauthorized
from sinks.registry import IssuedCode, SqlRegistry, UserRecord
from sinks.registry.logins import code_hash
from tasks.review.access import authorize_decision

CODE_TTL = dt.timedelta(minutes=15)
PROOF_PREFIX = "kbp1"
"""Marks a decision proof (its version): ``kbp1.<lookup tag>.<hmac>``."""
DRAFT_FIELD_PREFIX = "doc_"


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
    return registry.logins.issue_review_code(user.id, org_id, flow_run_id=flow_run_id, ttl=ttl)


def prove_reviewer(registry: SqlRegistry, code: str, org_id: str, flow_run_id: str) -> UserRecord:
    """The user a review code proves, used up, if they (still) may decide for ``org_id``.

    Raises:
        Unauthorized: no code, or an unknown, used, expired or foreign code.
        Forbidden: the code's user may no longer decide for the org (their role changed).
    """
    user_id = registry.logins.redeem_review_code(code, org_id=org_id, flow_run_id=flow_run_id)
    return authorize_decision(registry, user_id, org_id)


def code_key(code: str) -> str:
    """The HMAC key of a code's proofs: its hash as the registry stores it (never the code)."""
    return code_hash(code)


def lookup_tag(key: str) -> str:
    """How a proof names its code without giving away the key (a hash of the key)."""
    return hashlib.sha256(f"kbflow-proof-tag:{key}".encode()).hexdigest()[:32]


def canonical_decisions(run_input: Mapping[str, Any]) -> str:
    """The decisions of a review run's input as one canonical string: every form field
    ``doc_<id>`` whose action is not ``skip`` (sorted by id), then every row of ``decisions``
    as sent. The proof covers exactly this; the code field and unknown keys are not in it."""

    def text(value: Any) -> str:
        return value.strip() if isinstance(value, str) else ""

    fields = []
    for name in sorted(run_input):
        value = run_input[name]
        if not name.startswith(DRAFT_FIELD_PREFIX) or not isinstance(value, Mapping):
            continue
        action = value.get("action") or "skip"
        if action == "skip":
            continue
        fields.append([name.removeprefix(DRAFT_FIELD_PREFIX), str(action),
                       value.get("content") or "", text(value.get("note"))])  # fmt: skip
    rows = run_input.get("decisions") or []
    return json.dumps(
        {"fields": fields, "decisions": rows if isinstance(rows, list) else [rows]},
        sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str,
    )  # fmt: skip


def _mac(key: str, flow_run_id: str, run_input: Mapping[str, Any]) -> str:
    message = f"{flow_run_id}\n{canonical_decisions(run_input)}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def sign_decisions(code: str, flow_run_id: str, run_input: Mapping[str, Any]) -> str:
    """The proof that the holder of ``code`` made exactly the decisions in ``run_input`` for
    run ``flow_run_id``: what goes into the run's ``code`` field instead of the code."""
    key = code_key(code)
    return f"{PROOF_PREFIX}.{lookup_tag(key)}.{_mac(key, flow_run_id, run_input)}"


def is_proof(value: str) -> bool:
    return value.strip().startswith(f"{PROOF_PREFIX}.")


def prove_decisions(
    registry: SqlRegistry, proof: str, org_id: str, flow_run_id: str, run_input: Mapping[str, Any]
) -> UserRecord:
    """The user whose code signed exactly these decisions for this run (the code used up),
    if they (still) may decide for ``org_id``.

    Raises:
        Unauthorized: no proof; a bare code (it would sit readable in Prefect's storage); an
            unknown, used, expired or foreign code; or decisions and run that are not the ones
            it signed (audited; the code stays unused).
        Forbidden: the code's user may no longer decide for the org.
    """
    proof = (proof or "").strip()
    if proof and not is_proof(proof):
        registry.review_runs.refuse_review_code(
            org_id, flow_run_id, "a bare review code was sent instead of a decision proof"
        )
        raise Unauthorized(
            "the run was given a bare review code, not a proof of the decisions: a code in the "
            "run's input can be read by anyone who reaches the Prefect API and reused for other "
            "decisions, so it is not accepted (and it is not used up). Decide in the review "
            "inbox (it resumes this run for you), or send `code` as "
            "tasks.review.codes.sign_decisions(code, run_id, run_input) (docs/REVIEW.md)."
        )
    if not proof:
        return prove_reviewer(registry, "", org_id, flow_run_id)  # says "no code was given"
    _, tag, mac = [*proof.split("."), "", ""][:3]

    def verify(key: str) -> bool:
        return hmac.compare_digest(_mac(key, flow_run_id, run_input), mac)

    user_id = registry.review_runs.redeem_review_proof(
        tag, verify, org_id=org_id, flow_run_id=flow_run_id, tag_of=lookup_tag
    )
    return authorize_decision(registry, user_id, org_id)
