"""The ``research`` flow: seed bundle + public context -> four drafts (pending_review, one
synthesis run) -> pause for the account manager's decisions (the ``review`` flow as a subflow).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from flows.review import review
from kbflow.models import ResearchRequest
from kbflow.settings import Settings
from sinks.registry import SqlRegistry
from sinks.vectors import open_vector_store
from tasks.access import authorize_decision
from tasks.budget import push_metrics
from tasks.embed import get_embedder
from tasks.fetch import safe_get
from tasks.research import choose_synthesizer
from tasks.wrapped import research_task


@flow(name="research")
def research(
    org: str,
    client_name: str,
    model: str | None = None,
    budget_cap_tokens: int = 200_000,
    reviewer: str | None = None,
    review_timeout_s: int = 3600,
    offline: bool | None = None,
) -> dict[str, Any]:
    """Draft the four KB documents for ``org`` and pause for their review.

    ``reviewer`` is who runs it: the org's account manager or a superadmin (anyone else, or
    nobody, is refused before anything is fetched); the review form is prefilled with them.

    With ``review_timeout_s=0`` the flow returns after persisting the drafts (review them later
    with ``kbflow review``). A budget overrun persists nothing and skips the review.
    ``offline`` skips public context (default: the ``KBFLOW_RESEARCH_OFFLINE`` setting).
    """
    logger = get_run_logger()
    settings = Settings()
    request = ResearchRequest(
        org_id=org, client_name=client_name, model=model, budget_cap_tokens=budget_cap_tokens
    )
    key = settings.anthropic_api_key.get_secret_value() if settings.anthropic_api_key else None

    def embedder() -> Any:
        return get_embedder(settings.embedding_model, settings.embed_batch_size)

    registry = SqlRegistry.open(settings.registry_url)
    try:
        # Only the org's AM or a superadmin may start research (deployments included).
        authorize_decision(registry, reviewer, org, what="run research")
        with open_vector_store(settings) as store:
            outcome = research_task(
                request,
                registry=registry,
                store=store,
                embedder=embedder,
                synthesizer=choose_synthesizer(request, key, embedder),
                max_fetches=settings.research_max_fetches,
                fetch=lambda url: safe_get(url, timeout_s=settings.research_fetch_timeout_s),
                public_context=not (settings.research_offline if offline is None else offline),
            )
    finally:
        registry.close()  # hold nothing while the review pauses
    report = outcome.to_dict()
    if settings.metrics_pushgateway:
        push_metrics(settings.metrics_pushgateway, org)
    for note in outcome.notes:
        logger.warning("research %s: %s", org, note)
    if outcome.response.budget_exceeded:
        logger.error("research for %s stopped: budget exceeded; nothing was persisted", org)
        return report
    logger.info(
        "research run %s: %d drafts pending review (%s)",
        outcome.response.synthesis_run_id,
        len(outcome.doc_ids),
        outcome.synthesizer,
    )
    if review_timeout_s > 0:
        name = f"{flow_run.name or 'research'}-review"
        report["review"] = review.with_options(flow_run_name=name)(
            org=org,
            reviewer=reviewer,
            timeout_s=review_timeout_s,
            synthesis_run_id=outcome.response.synthesis_run_id,
        )
    return report
