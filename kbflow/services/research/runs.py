"""Research: an account manager's seed bundle, and the run that drafts four KB documents from it
(`kbflow seed`, `kbflow research`).

Only the org's account manager or a superadmin may seed or run research; the drafts wait as
pending_review for `kbflow.services.review.drafts`. Seeding and the research permission live in
`kbflow.services.research.seeds` (no Prefect: the HTTP service calls them) and are re-exported here.
"""

from __future__ import annotations

from core.contracts import ResearchReport
from core.settings import Settings
from kbflow.services.research.seeds import (
    DEFAULT_BUDGET_TOKENS,
    authorize_research,
    list_seeds,
    seed,
)

__all__ = [
    "DEFAULT_BUDGET_TOKENS",
    "REVIEW_WAIT_S",
    "authorize_research",
    "list_seeds",
    "run_research",
    "seed",
]

REVIEW_WAIT_S = 3600
"""How long a research run waits for the review form by default, when a Prefect server is set."""


def run_research(
    settings: Settings,
    org: str,
    *,
    client_name: str,
    model: str | None,
    budget_tokens: int,
    reviewer: str | None,
    review_timeout_s: int | None,
    job_id: str | None = None,
) -> ResearchReport:
    """Run the research flow: draft the four documents, then pause for the review form.

    ``review_timeout_s`` None waits `REVIEW_WAIT_S` when a Prefect server is set (its UI shows
    the form) and does not pause without one. ``job_id`` names the registry job this run does
    (a background research job, `kbflow.services.job_runner`): the flow records its run id on it.

    Returns:
        The run's report, also when the run ended Failed: the budget stopped it
        (``budget_exceeded``) or its review failed (``review_failed``).
    """
    from core.errors import RunFailed
    from flows.research import research
    from kbflow.services.orchestration import prefect_api_url, tracked

    timeout = review_timeout_s
    if timeout is None:
        timeout = REVIEW_WAIT_S if prefect_api_url() else 0
    try:
        with tracked(settings.home, research) as run:
            return run(
                org=org,
                client_name=client_name,
                model=model,
                budget_cap_tokens=budget_tokens,
                reviewer=reviewer,
                review_timeout_s=timeout,
                job_id=job_id,
            )
    except RunFailed as exc:  # the budget stopped it, or its review failed: see the report
        return ResearchReport.model_validate(exc.report)
