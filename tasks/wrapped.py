"""Prefect task wrappers around the plain units of work (only flows import this module).

They take live resources (store, registry, embedder) as arguments, so results are not cached
(``NO_CACHE``); idempotency comes from the registry's content hashes instead. No retries: none
of these steps fails transiently, and a retried partial batch is resumed by the next plan.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.ingest.discover import discover
from tasks.ingest.index import extract_batch, index_batch, plan_ingest
from tasks.research.run import run_research
from tasks.review.machine import apply_decisions, draft_texts, pending_documents

discover_task = task(name="discover-sources", cache_policy=NO_CACHE)(discover)
plan_task = task(name="plan-ingest", cache_policy=NO_CACHE)(plan_ingest)
# Extraction runs in an isolated worker with its own per-file limits (tasks.ingest.isolate).
extract_batch_task = task(name="extract-batch", cache_policy=NO_CACHE)(extract_batch)
index_batch_task = task(name="index-batch", cache_policy=NO_CACHE, timeout_seconds=3600)(
    index_batch
)


list_pending_task = task(name="list-pending-reviews", cache_policy=NO_CACHE)(pending_documents)
# Reads the drafts' text for the review form; the result holds draft text: never persisted.
read_drafts_task = task(name="read-draft-texts", cache_policy=NO_CACHE, persist_result=False)(
    draft_texts
)
# Each decision is a compare-and-set that writes one audit row: never retried, never cached.
apply_decisions_task = task(name="apply-review-decisions", cache_policy=NO_CACHE)(apply_decisions)
# Research persists only after a whole successful run; a retry would start a new run.
research_task = task(name="research-and-persist-drafts", cache_policy=NO_CACHE)(run_research)
