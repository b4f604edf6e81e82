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

    bundle = SeedBundle(
        tuple(files), tuple(urls), tuple(prompts), tuple(file_uris),
        allow_loopback=settings.sources.sources_test_allow_loopback,
    )  # fmt: skip
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


def remove_seed(
    settings: Settings,
    org: str,
    doc_id: str,
    *,
    actor: str | None,
    open_store: StoreOpener | None = None,
) -> DocRecord:
    """Take one seed input out of an org's bundle (the next research run does not read it):
    withdrawn, with a note saying so, audited as the actor's decision. For the org's account
    manager or a superadmin.

    Raises:
        Forbidden: the actor may not decide for the org (audited).
        NotFound: ``doc_id`` is not one of the org's current seed inputs.
    """
    from core.errors import NotFound
    from sinks.connect import open_registry, open_vector_store
    from tasks.research.seed import list_seeds as current_seeds
    from tasks.review.access import authorize_decision
    from tasks.review.machine import held, withdraw

    with open_registry(settings) as registry:
        user = authorize_decision(registry, actor, org, what="remove a seed input")
        if doc_id not in {d.id for d in current_seeds(registry, org)}:
            raise NotFound(f"{doc_id!r} is not a seed input of org {org!r} (removed already?).")
        if open_store is not None:
            return withdraw(doc_id, user.id, registry=registry, open_store=open_store,
                            note="removed from the seed bundle")  # fmt: skip
        with open_vector_store(settings) as store:
            return withdraw(doc_id, user.id, registry=registry, open_store=held(store),
                            note="removed from the seed bundle")  # fmt: skip
