"""The research flow's Prefect tasks: gather -> synthesize -> persist, each taking values (the
request, the corpus, the drafts, ``Settings``) and opening what it needs.

Transient faults are retried, permanent ones fail at once (:mod:`tasks.retries`):

- ``fetch-page``: one public page through the SSRF guard; a timeout, a lost connection, a 429
  or a 5xx is retried; an SSRF block, a 4xx or a name that does not resolve is not. A page and
  its retries count as one fetch against ``KBFLOW_RESEARCH_MAX_FETCHES``.
- ``synthesize-drafts``: Claude with no retries of its own (``max_retries=0``: this task is the
  one retry layer), so a 529 "overloaded" or a 429 is retried here and a 400 is not; the offline
  synthesizer never fails transiently. Each attempt charges a fresh copy of the budget.
- ``persist-drafts``: a busy embedded store is retried.

Gathering is not retried as a whole: its fetches are, one by one.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from core.models import DraftDocument, ResearchCorpus, ResearchRequest
from core.settings import Settings
from sinks.connect import open_registry, open_vector_store
from tasks.research.fetch import FetchResult, safe_get
from tasks.research.progress import job_progress
from tasks.research.run import (
    Drafted,
    Gathered,
    Persisted,
    gather_corpus,
    persist_drafts,
    synthesize_drafts,
)
from tasks.research.synthesizers import synthesizer_for
from tasks.retries import TASK_RETRIES
from tasks.text.embed import embedder_for


@task(name="fetch-page", cache_policy=NO_CACHE, persist_result=False, **TASK_RETRIES)
def fetch_page_task(url: str, timeout_s: float, allow_loopback: bool = False) -> FetchResult:
    """One public page, SSRF-guarded (:func:`tasks.research.fetch.safe_get`; ``allow_loopback``
    is the guard's test-only switch, ``KBFLOW_SOURCES_TEST_ALLOW_LOOPBACK``)."""
    return safe_get(url, timeout_s=timeout_s, allow_loopback=allow_loopback)


@task(name="gather-corpus", cache_policy=NO_CACHE, persist_result=False)
def gather_task(
    request: ResearchRequest, settings: Settings, public_context: bool, job_id: str | None = None
) -> Gathered:
    """The seed bundle and public context as one corpus (its text is never persisted); how far
    it has got is recorded on the job ``job_id`` (`tasks.research.progress`)."""
    timeout_s = settings.research.research_fetch_timeout_s
    loopback = settings.sources.sources_test_allow_loopback
    with open_registry(settings) as registry, open_vector_store(settings) as store:
        return gather_corpus(
            request,
            registry=registry,
            store=store,
            max_fetches=settings.research.research_max_fetches,
            fetch=lambda url: fetch_page_task(url, timeout_s, loopback),
            public_context=public_context,
            progress=job_progress(registry, job_id),
        )


@task(name="synthesize-drafts", cache_policy=NO_CACHE, persist_result=False, **TASK_RETRIES)
def synthesize_task(gathered: Gathered, settings: Settings) -> Drafted:
    """Four validated drafts: written by the configured model (`tasks.llm.provider_of`: Claude
    with a key, an OpenAI-compatible server by URL; this task retries it), else offline."""
    return synthesize_drafts(gathered, synthesizer_for(settings, gathered.request.model))


@task(name="persist-drafts", cache_policy=NO_CACHE, **TASK_RETRIES)
def persist_task(
    drafts: tuple[DraftDocument, ...],
    corpus: ResearchCorpus,
    org: str,
    settings: Settings,
    run_id: str,
) -> Persisted:
    """The drafts as pending_review documents of the synthesis run ``run_id`` (the flow names
    it first, to record its review's hold on them): what was stored (the drafts' ids, the
    drafts of the last run superseded, those held back)."""
    with open_registry(settings) as registry, open_vector_store(settings) as store:
        return persist_drafts(
            drafts, corpus, org, run_id, registry=registry, store=store,
            embedder=embedder_for(settings),
        )  # fmt: skip
