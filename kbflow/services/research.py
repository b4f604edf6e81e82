"""Research: an account manager's seed bundle, and the run that drafts four KB documents from it
(`kbflow seed`, `kbflow research`).

Only the org's account manager or a superadmin may seed or run research; the drafts wait as
pending_review for `kbflow.services.review`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.contracts import ResearchReport
from core.settings import Settings

if TYPE_CHECKING:
    from sinks.registry import DocRecord

REVIEW_WAIT_S = 3600
"""How long a research run waits for the review form by default, when a Prefect server is set."""


def seed(
    settings: Settings,
    org: str,
    *,
    actor: str | None,
    files: Sequence[Path] = (),
    urls: Sequence[str] = (),
    prompts: Sequence[str] = (),
) -> dict[str, Any]:
    """Store seed inputs for an org's research (files extracted in a worker process).

    A bundle that would pass a limit (file size, the org's file count) stores nothing.

    Returns:
        ``org``, ``stored`` (new inputs), ``doc_ids`` and ``skipped`` (``source``, ``reason``).
    """
    from sinks.connect import open_registry, open_vector_store
    from tasks.ingest.isolate import isolated_extractor
    from tasks.research.seed import SeedBundle, seed_bundle
    from tasks.review.access import authorize_decision
    from tasks.text.embed import get_embedder

    bundle = SeedBundle(tuple(files), tuple(urls), tuple(prompts))
    with open_registry(settings) as registry:
        user = authorize_decision(registry, actor, org, what="seed research inputs")
        bundle.check()
        with isolated_extractor(settings) as extract, open_vector_store(settings) as store:
            report = seed_bundle(
                bundle,
                org,
                registry=registry,
                store=store,
                embedder=get_embedder(settings.embedding_model, settings.embed_batch_size),
                extract_file=extract,
                actor=user.id,
            )
    return {
        "org": org,
        "stored": report.documents,
        "doc_ids": report.doc_ids,
        "skipped": [{"source": s, "reason": r} for s, r in report.skipped],
    }


def list_seeds(settings: Settings, org: str, actor: str) -> list[DocRecord]:
    """An org's seed inputs (am_file, am_url, am_prompt), for those who may read its drafts."""
    from sinks.connect import open_registry
    from tasks.research.seed import list_seeds as seeds
    from tasks.review.access import authorize_inspection

    with open_registry(settings) as registry:
        authorize_inspection(registry, actor, org)
        return seeds(registry, org)


def authorize_research(settings: Settings, org: str, actor: str | None) -> None:
    """Refuse (Forbidden) anyone but the org's account manager or a superadmin, before a flow
    run starts (the flow checks again, for deployments)."""
    from sinks.connect import open_registry
    from tasks.review.access import authorize_decision

    with open_registry(settings) as registry:
        authorize_decision(registry, actor, org, what="run research")


def run_research(
    settings: Settings,
    org: str,
    *,
    client_name: str,
    model: str | None,
    budget_tokens: int,
    reviewer: str | None,
    review_timeout_s: int | None,
) -> ResearchReport:
    """Run the research flow: draft the four documents, then pause for the review form.

    ``review_timeout_s`` None waits `REVIEW_WAIT_S` when a Prefect server is set (its UI shows
    the form) and does not pause without one.

    Returns:
        The run's report, also when the run ended Failed: the budget stopped it
        (``budget_exceeded``) or its review failed (``review_failed``).
    """
    from core.errors import RunFailed
    from flows.research import research
    from kbflow.services.orchestration import prefect_api_url

    timeout = review_timeout_s
    if timeout is None:
        timeout = REVIEW_WAIT_S if prefect_api_url() else 0
    try:
        return research(
            org=org,
            client_name=client_name,
            model=model,
            budget_cap_tokens=budget_tokens,
            reviewer=reviewer,
            review_timeout_s=timeout,
        )
    except RunFailed as exc:  # the budget stopped it, or its review failed: see the report
        return ResearchReport.model_validate(exc.report)
