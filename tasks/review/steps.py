"""The review flow's Prefect tasks: each takes values (an org, documents, decisions,
``Settings``) and opens what it needs. Reading the drafts retries a busy store; applying
decisions is never retried or cached (each is a compare-and-set with one audit row)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from core.errors import Forbidden, Unauthorized
from core.settings import Settings
from sinks.connect import open_registry, open_vector_store
from sinks.registry import DocRecord
from tasks.retries import TASK_RETRIES
from tasks.review.codes import prove_decisions
from tasks.review.decisions import Decision, Outcome, apply_decisions
from tasks.review.inspection import draft_texts
from tasks.review.inspection import pending_documents as pending
from tasks.review.machine import held
from tasks.text.embed import embedder_for


@task(name="list-pending-reviews", cache_policy=NO_CACHE, persist_result=False)
def list_pending_task(
    org: str, synthesis_run_id: str | None, settings: Settings
) -> list[DocRecord]:
    """The org's documents awaiting review (of one research run, if given)."""
    with open_registry(settings) as registry:
        registry.people.get_org(org)
        return pending(registry, org, synthesis_run_id)


# Its result holds the drafts' text: never persisted.
@task(name="read-draft-texts", cache_policy=NO_CACHE, persist_result=False, **TASK_RETRIES)
def read_drafts_task(docs: Sequence[DocRecord], settings: Settings) -> dict[str, str]:
    """Each draft's Markdown for the review form, the store held only while reading."""
    with open_vector_store(settings) as store:
        return draft_texts(
            docs, store, max_overlap_words=max(64, settings.ingest.chunk_overlap_words)
        )


@task(name="apply-review-decisions", cache_policy=NO_CACHE)
def apply_decisions_task(
    decisions: Sequence[Decision], reviewer: str, settings: Settings
) -> list[Outcome]:
    """Each decision on its own, checked and audited like `kbflow review approve/edit/…`."""
    with open_registry(settings) as registry, open_vector_store(settings) as store:
        return apply_decisions(
            decisions,
            reviewer,
            registry=registry,
            open_store=held(store),
            embedder=lambda: embedder_for(settings),
            max_words=settings.ingest.chunk_max_words,
            overlap_words=settings.ingest.chunk_overlap_words,
        )


@dataclass(frozen=True)
class Proven:
    """Who the proof proves (``reviewer``), or why it proves nobody (``refused``: a message
    that says what was wrong and what to do)."""

    reviewer: str | None = None
    refused: str | None = None


@task(name="prove-reviewer", cache_policy=NO_CACHE, persist_result=False)
def prove_reviewer_task(
    proof: str, org: str, flow_run_id: str, run_input: dict[str, Any], settings: Settings
) -> Proven:
    """Who made exactly the decisions in ``run_input`` for this run, proven by the proof their
    one-time review code signed (the code used up here): their user id, or why not (a used,
    expired, wrong or missing code, or a user who may no longer decide; audited, and nothing
    is applied then).

    A refusal is an answer, not a crash: it is returned, so Prefect does not log this task as
    failed with a traceback; the flow logs the one line that says what to do.
    """
    with open_registry(settings) as registry:
        try:
            return Proven(reviewer=prove_decisions(registry, proof, org, flow_run_id, run_input).id)
        except (Unauthorized, Forbidden) as exc:
            return Proven(refused=str(exc))


@task(name="record-review-run", cache_policy=NO_CACHE, persist_result=False, **TASK_RETRIES)
def record_review_run_task(
    flow_run_id: str,
    org: str,
    doc_ids: list[str],
    settings: Settings,
    synthesis_run_id: str | None = None,
) -> None:
    """Record this run as one kbflow started that holds these drafts (or every draft of
    ``synthesis_run_id``) for review: the inbox hands decisions to no other."""
    with open_registry(settings) as registry:
        registry.review_runs.record_review_run(
            flow_run_id, org, doc_ids, synthesis_run_id=synthesis_run_id
        )
