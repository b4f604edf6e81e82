"""The research steps that need no flow: an account manager's seed bundle, and who may run
research (`kbflow seed`, the first half of `kbflow research`, and the HTTP service).

Kept apart from `kbflow.services.research.runs` (which runs the flow) so that `kbflow serve` can
call them without reaching Prefect (tests/test_layers.py). Only the org's account manager or a
superadmin may seed or run research; the org's experts may read its seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from core.settings import Settings
from kbflow.services.research.types import SeedResult

if TYPE_CHECKING:
    from sinks.registry import DocRecord
    from tasks.review.machine import StoreOpener

DEFAULT_BUDGET_TOKENS = 200_000
"""A research run's token budget unless told otherwise (`kbflow research --budget`)."""


def seed(
    settings: Settings,
    org: str,
    *,
    actor: str | None,
    files: Sequence[Path] = (),
    urls: Sequence[str] = (),
    prompts: Sequence[str] = (),
    file_uris: Sequence[str] = (),
    open_store: StoreOpener | None = None,
) -> SeedResult:
    """Store seed inputs for an org's research (files extracted in a worker process).

    A bundle that would pass a limit (file size, the org's file count) stores nothing.

    Args:
        file_uris: Where each file came from, one per file (an upload's ``upload:ORG/NAME``);
            empty: each file is keyed by its own path, as `kbflow seed --file` does.
        open_store: How to reach the vector store; default: open the configured one (a
            process that holds it open, like ``kbflow serve``, passes its own).

    Returns:
        ``org``, ``stored`` (new inputs), ``doc_ids`` and ``skipped`` (``source``, ``reason``).
    """
    from sinks.connect import open_registry, open_vector_store
    from tasks.ingest.isolate import isolated_extractor
    from tasks.research.seed import SeedBundle, seed_bundle
    from tasks.review.access import authorize_decision
    from tasks.text.embed import embedder_for

    bundle = SeedBundle(tuple(files), tuple(urls), tuple(prompts), tuple(file_uris))
    with open_registry(settings) as registry:
        user = authorize_decision(registry, actor, org, what="seed research inputs")
        bundle.check()
        opener = open_store or (lambda: open_vector_store(settings))
        with isolated_extractor(settings) as extract, opener() as store:
            report = seed_bundle(
                bundle,
                org,
                registry=registry,
                store=store,
                embedder=embedder_for(settings),
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
