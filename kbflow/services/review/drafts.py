"""Review: read drafts, decide on them, run the review flow, read the audit log, reconcile.

Decisions go through the one decision path (`kbflow.services.review.decisions`); the store is
opened only for a decision's vector step, so its lock is never held while rights are checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from core.contracts import ReviewReport
from core.models import DocStatus
from core.settings import Settings

if TYPE_CHECKING:
    from kbflow.services.review.decisions import Decided
    from sinks.registry import DocRecord, IssuedCode
    from sinks.registry.schema import AuditRow
    from tasks.review.inspection import DraftView
    from tasks.review.machine import ReconcileReport

NO_UI_SERVER = (
    "PREFECT_API_URL is not set, so the run would pause on a temporary server that no UI can "
    "reach. Start `kbflow server` in another shell and export "
    "PREFECT_API_URL=http://127.0.0.1:4200/api here."
)


def list_drafts(
    settings: Settings, actor: str, org: str, statuses: Sequence[DocStatus] = ()
) -> dict[str | None, list[DocRecord]]:
    """An org's drafts by synthesis run (default: pending_review and rejected), for those who
    may inspect them."""
    from sinks.connect import open_registry
    from tasks.review.inspection import list_drafts as drafts

    with open_registry(settings) as registry:
        if statuses:
            return drafts(registry, actor, org, statuses=statuses)
        return drafts(registry, actor, org)


def inspect(settings: Settings, doc_id: str, actor: str) -> DraftView:
    """A document's record and full stored text, whatever its status; rights are checked
    before the store is opened."""
    from kbflow.services.query import store_opener
    from sinks.connect import open_registry
    from tasks.review.inspection import inspect_draft

    with open_registry(settings) as registry:
        return inspect_draft(doc_id, actor, registry=registry, open_store=store_opener(settings))


def decision(
    settings: Settings,
    verb: str,
    doc_id: str,
    actor: str,
    *,
    note: str | None,
    content: str | None = None,
) -> Decided:
    """One CLI decision (approve, reject, withdraw, restore, edit) through the one decision
    path (`kbflow.services.review.decisions.decide`: a paused review run that holds the draft
    gets it, else it applies directly), and how it went. The registry is opened for it, the
    store only for its vector step, the embedder loaded only if the decision needs one.

    Raises:
        ReviewConflict: someone decided first (nothing changed).
        Forbidden: ``actor`` may not decide for the document's org (audited).
        ConfigError: a note or an edit's text is missing.
    """
    from kbflow.services.query import store_opener
    from kbflow.services.review.decisions import decide
    from sinks.connect import open_registry
    from tasks.review.decisions import Verb
    from tasks.text.embed import embedder_for

    with open_registry(settings) as registry:
        return decide(
            settings, registry, store_opener(settings), lambda: embedder_for(settings), actor,
            doc_id, Verb(verb), surface="cli", note=note, content=content,
        )  # fmt: skip


def run_review_flow(
    settings: Settings, org: str, *, reviewer: str | None, timeout_s: int
) -> tuple[ReviewReport, str | None]:
    """Run the review flow, which pauses for decisions in the Prefect UI, then applies them.

    Returns:
        The run's report and, when the run ended Failed (a refused reviewer, only invalid
        rows), why.

    Raises:
        KbflowError: no Prefect server is set (no UI could reach the paused run).
        ReviewTimeout: nobody submitted the form in time.
    """
    from core.errors import RunFailed
    from kbflow.services.orchestration import require_prefect_server

    require_prefect_server(NO_UI_SERVER)
    from flows.review import review
    from kbflow.services.orchestration import tracked

    try:
        with tracked(settings.home, review) as run:
            return run(org=org, reviewer=reviewer, timeout_s=timeout_s), None
    except RunFailed as exc:  # the run ended Failed; what it did is in its report
        return ReviewReport.model_validate(exc.report), str(exc)


def audit_trail(
    settings: Settings, org: str | None, doc: str | None, *, limit: int
) -> list[AuditRow]:
    """The most recent ``limit`` audit rows of an org (or one document); without ``org`` the
    agency-wide rows. An unknown org is an error, not an empty log."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        if org is not None:
            registry.people.get_org(org)
        return registry.audit.audit_trail(org, doc, last=limit)


def reconcile(settings: Settings, *, org: str | None, dry_run: bool) -> ReconcileReport:
    """Bring the search index in line with the registry (see `tasks.review.machine.reconcile`)."""
    from sinks.connect import open_registry, open_vector_store
    from tasks.review.machine import reconcile as reconcile_payloads

    with open_registry(settings) as registry, open_vector_store(settings) as store:
        return reconcile_payloads(registry, store, org_id=org, dry_run=dry_run)


def review_code(
    settings: Settings, org: str, actor: str | None, *, flow_run_id: str | None = None
) -> IssuedCode:
    """A one-time review code for ``actor`` (who must be allowed to decide for ``org``): the
    proof a paused review run's form asks for. A refusal is audited."""
    from core.errors import Forbidden
    from sinks.connect import open_registry
    from tasks.review.codes import issue_code

    with open_registry(settings) as registry:
        try:
            return issue_code(registry, actor, org, flow_run_id=flow_run_id)
        except Forbidden as exc:
            registry.people.record_denied(actor or "(anonymous)", "get a review code",
                                   org_id=org, reason=str(exc))  # fmt: skip
            raise
