"""Research: from an org's seed bundle (plus bounded public context) to four validated drafts,
persisted as ``pending_review`` under one synthesis run.

``run_research`` is the plain unit of work behind the ``research`` flow. Budget overruns and
invalid output persist nothing: drafts are written only after the whole run has succeeded.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.contracts import BudgetSpent, DraftOut, ResearchReport
from core.errors import BudgetExceeded
from core.models import DocStatus, DraftDocument, ResearchCorpus, ResearchRequest, SourceTag
from sinks.registry import DocRecord, SqlRegistry
from sinks.vectors import VectorStore
from tasks.ingest.discover import Source
from tasks.ingest.index import IngestTarget, WorkItem, index_batch
from tasks.research.budget import ResearchBudget
from tasks.research.cite_check import check_drafts
from tasks.research.claude import SYSTEM_PROMPT
from tasks.research.corpus import build_corpus, homepage_of, seed_entries
from tasks.research.progress import Progress, silent
from tasks.research.public_context import Fetcher, SearchProvider, gather_public_context
from tasks.research.seed import list_seeds
from tasks.research.synthesize import Synthesizer, estimate_tokens, validate_drafts
from tasks.review.machine import supersede
from tasks.text.citations import footer_entries
from tasks.text.embed import Embedder
from tasks.text.review_note import split_review_note

log = logging.getLogger(__name__)

DRAFTS_COLLECTION = "kb"
MAX_OUTPUT_TOKENS = 16_000


def _spent(budget: ResearchBudget) -> BudgetSpent:
    return BudgetSpent(
        fetches=budget.fetches,
        max_fetches=budget.max_fetches,
        tokens=budget.tokens,
        max_tokens=budget.max_tokens,
        exceeded=budget.exceeded,
    )


@dataclass
class Gathered:
    """The research corpus and what gathering it cost (step 1 of 3)."""

    request: ResearchRequest
    corpus: ResearchCorpus
    budget: ResearchBudget
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None  # the budget stopped the run here: why


@dataclass
class Drafted:
    """Four validated drafts and the budget after writing them (step 2 of 3)."""

    drafts: tuple[DraftDocument, ...]
    budget: ResearchBudget
    model_id: str
    stopped: str | None = None


def gather_corpus(
    request: ResearchRequest,
    *,
    registry: SqlRegistry,
    store: VectorStore,
    max_fetches: int = 30,
    fetch: Fetcher | None = None,
    search_provider: SearchProvider | None = None,
    public_context: bool = True,
    progress: Progress = silent,
) -> Gathered:
    """The AM's seed inputs and (unless ``public_context`` is off) SSRF-guarded public context,
    as one citable corpus, each charged to the run's budget; ``progress`` is told of the
    ``reading`` and ``fetching`` stages (`tasks.research.progress`)."""
    org = request.org_id
    registry.people.get_org(org)
    budget = ResearchBudget(org, max_fetches=max_fetches, max_tokens=request.budget_cap_tokens)
    notes: list[str] = []
    seeds = list_seeds(registry, org)
    progress("reading", 0, len(seeds))
    am_entries = seed_entries(seeds, store)
    if not am_entries:
        notes.append("no seed inputs: research uses public context only")
    public = []
    try:
        budget.charge_tokens(
            sum(estimate_tokens(e.text) for e in am_entries), "account-manager corpus"
        )
        if public_context:
            found = gather_public_context(
                request.client_name,
                homepage_of(seeds, am_entries),
                budget=budget,
                fetch=fetch,
                search_provider=search_provider,
                progress=lambda done, total: progress("fetching", done, total),
            )
            notes.extend(found.notes)
            public = found.entries
        else:
            notes.append("public context skipped (research offline): AM inputs only")
    except BudgetExceeded as exc:
        notes.append(str(exc))
        corpus = build_corpus(request.client_name, am_entries)
        return Gathered(request, corpus, budget, notes, budget.stop_reason() or str(exc))
    return Gathered(request, build_corpus(request.client_name, [*am_entries, *public]), budget,
                    notes)  # fmt: skip


def synthesize_drafts(gathered: Gathered, synthesizer: Synthesizer) -> Drafted:
    """Four drafts from the corpus, validated, their tokens charged to a COPY of the budget
    (so a retried attempt is charged once)."""
    budget = copy.deepcopy(gathered.budget)
    try:
        budget.charge_tokens(estimate_tokens(SYSTEM_PROMPT), "prompt")
        remaining = budget.max_tokens - budget.tokens
        result = synthesizer.synthesize(
            gathered.corpus, max_output_tokens=max(1, min(remaining, MAX_OUTPUT_TOKENS))
        )
        drafts = validate_drafts(result.documents, gathered.corpus)
        if not synthesizer.model_id.startswith("extractive"):  # a model wrote prose: check it
            drafts, dropped = check_drafts(drafts, gathered.corpus)
            if dropped:
                gathered.notes.append(
                    f"citation check: {len(dropped)} sentence(s) dropped because the source "
                    "they cite does not hold them — review what is left and add what is "
                    "missing from the seeds"
                )
                gathered.notes.extend(d.note() for d in dropped)
        budget.charge_tokens(sum(estimate_tokens(d.content) for d in drafts), "response")
    except BudgetExceeded as exc:
        gathered.notes.append(str(exc))
        return Drafted((), budget, synthesizer.model_id, budget.stop_reason() or str(exc))
    return Drafted(drafts, budget, synthesizer.model_id)


def stopped_outcome(notes: list[str], budget: ResearchBudget, model_id: str,
                    why: str) -> ResearchReport:  # fmt: skip
    """The report of a run the budget stopped: nothing persisted; ``budget_stop`` says which
    cap, and the setting or flag that raises it."""
    return ResearchReport(
        synthesis_run_id=None,
        budget_exceeded=True,
        documents=[],
        consumed_tokens=budget.tokens,
        doc_ids=[],
        notes=notes,
        synthesizer=model_id,
        superseded_drafts=0,
        budget=_spent(budget),
        budget_stop=why,
    )


def persisted_outcome(
    gathered: Gathered, drafted: Drafted, run_id: str, persisted: Persisted
) -> ResearchReport:
    """The report of a finished run: its drafts persisted as pending_review under ``run_id``
    (a draft held back as a rejected one is not among its documents; the notes say why)."""
    return ResearchReport(
        synthesis_run_id=run_id,
        budget_exceeded=False,
        documents=[
            DraftOut(filename=d.filename, title=d.title, content=d.content)
            for d in drafted.drafts
            if d.filename not in persisted.held_back
        ],
        consumed_tokens=drafted.budget.tokens,
        doc_ids=persisted.doc_ids,
        notes=[*gathered.notes, *persisted.notes],
        synthesizer=drafted.model_id,
        superseded_drafts=persisted.superseded,
        budget=_spent(drafted.budget),
        budget_stop=None,
    )


def run_research(
    request: ResearchRequest,
    *,
    registry: SqlRegistry,
    store: VectorStore,
    embedder: Callable[[], Embedder],
    synthesizer: Synthesizer,
    max_fetches: int = 30,
    fetch: Fetcher | None = None,
    search_provider: SearchProvider | None = None,
    public_context: bool = True,
) -> ResearchReport:
    """Gather the corpus, synthesize and validate, and persist four pending drafts: the three
    steps the research flow runs as Prefect tasks, here in one call (its report has no
    review).

    On a budget overrun: ``budget_exceeded`` is true, no documents, nothing persisted (the
    counter is incremented by the budget itself).
    """
    gathered = gather_corpus(
        request, registry=registry, store=store, max_fetches=max_fetches, fetch=fetch,
        search_provider=search_provider, public_context=public_context,
    )  # fmt: skip
    if gathered.stopped:
        return stopped_outcome(gathered.notes, gathered.budget, synthesizer.model_id,
                               gathered.stopped)  # fmt: skip
    drafted = synthesize_drafts(gathered, synthesizer)
    if drafted.stopped:
        return stopped_outcome(gathered.notes, drafted.budget, drafted.model_id, drafted.stopped)
    run_id = uuid.uuid4().hex
    persisted = persist_drafts(
        drafted.drafts, gathered.corpus, request.org_id, run_id, registry=registry, store=store,
        embedder=embedder(),
    )  # fmt: skip
    return persisted_outcome(gathered, drafted, run_id, persisted)


@dataclass(frozen=True)
class Persisted:
    """What `persist_drafts` stored: the new drafts' ids, how many drafts of an earlier run
    they superseded, the files held back (their content was rejected and its sources have not
    changed), and a note for the account manager per draft that a decision shaped."""

    doc_ids: list[str]
    superseded: int
    held_back: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()


def _footer_ids(content: str) -> frozenset[str]:
    """The ids a draft's Citations footer lists (what its text cites)."""
    _, found, footer = content.rpartition("\n## Citations\n")
    return frozenset(cite for cite, _ in (footer_entries(footer) if found else None) or ())


def _decided(versions: list[DocRecord]) -> DocRecord | None:
    """The newest version of a source that a person decided on (not a waiting draft)."""
    waiting = (DocStatus.PENDING_REVIEW.value, DocStatus.SUPERSEDED.value)
    return next((v for v in reversed(versions) if v.status not in waiting), None)


def rerun_rule(draft: DraftDocument, versions: list[DocRecord]) -> tuple[bool, str | None]:
    """Whether a re-run proposes ``draft`` given the earlier ``versions`` of its document
    (oldest first), and the note that says why, when a decision shaped it:

    - its last decision was a rejection and the draft cites the same sources: held back (the
      same content would be proposed again); with other sources it is proposed, saying which;
    - its last decision approved a person's edit: proposed as a change to that text (the
      inbox shows the difference against it), saying so;
    - it is word for word the version last approved (or restored) or withdrawn: held back, as
      there is nothing to decide (a withdrawn text comes back by a restore, not a re-run).
    """
    last = _decided(versions)
    if last is None:
        return True, None
    when = f"{(last.rejected_at or last.updated_at):%Y-%m-%d}"
    unchanged = last.content_hash == _sha(draft.content)
    if unchanged and last.status == DocStatus.APPROVED.value:
        who = last.approved_by or "a reviewer"
        return False, (
            f"{draft.filename}: not proposed again: it is unchanged since {who} approved it "
            f"(v{last.version})"
        )
    if unchanged and last.status == DocStatus.WITHDRAWN.value:
        return False, (
            f"{draft.filename}: not proposed again: it is unchanged since it was withdrawn on "
            f"{last.updated_at:%Y-%m-%d} (v{last.version}; restore it in the library to serve "
            "it again)"
        )
    if last.status == DocStatus.REJECTED.value:
        before = frozenset(c.cite_id for c in last.citations)
        now = _footer_ids(draft.content)
        if now == before:
            return False, (
                f"{draft.filename}: not proposed again: {last.rejected_by or 'a reviewer'} "
                f"rejected it on {when} and its sources have not changed (seed new or changed "
                "material to have it drafted again)"
            )
        added, removed = sorted(now - before), sorted(before - now)
        changed = "; ".join(
            part
            for part in (
                f"new sources {', '.join(added)}" if added else "",
                f"no longer cited {', '.join(removed)}" if removed else "",
            )
            if part
        )
        return True, (
            f"{draft.filename}: proposed again although {last.rejected_by or 'a reviewer'} "
            f"rejected it on {when}: its sources changed ({changed})"
        )
    if last.status == DocStatus.APPROVED.value and last.edited_by:
        edited = f"{(last.edited_at or last.updated_at):%Y-%m-%d}"
        return True, (
            f"{draft.filename}: proposed as a change to the version {last.edited_by} edited "
            f"and approved on {edited} (v{last.version}): the inbox shows what it would change "
            "in that text; nothing replaces it unless approved"
        )
    return True, None


def persist_drafts(
    drafts: tuple[DraftDocument, ...],
    corpus: ResearchCorpus,
    org: str,
    run_id: str,
    *,
    registry: SqlRegistry,
    store: VectorStore,
    embedder: Embedder,
) -> Persisted:
    """Ingest the drafts as pending_review (one synthesis run), then supersede the previous
    run's still-pending drafts of the same documents. A draft whose document was rejected
    with the same sources is held back (`rerun_rule`)."""
    collection = registry.catalog.ensure_collection(
        org, DRAFTS_COLLECTION, "Knowledge-base documents"
    )
    current = registry.documents.current_documents(org)
    items = []
    held: set[str] = set()
    notes: list[str] = []
    for draft in drafts:
        key = f"synthesis:{org}:{draft.filename}"
        proposed, note = rerun_rule(draft, registry.documents.versions_of(org, key))
        if note:
            notes.append(note)
        if not proposed:
            held.add(draft.filename)
            continue
        # A note for the reviewer (the offline banner) is kept beside the text, never chunked.
        body, review_note = split_review_note(draft.content)
        items.append(
            WorkItem(
                Source(
                    source_key=key,
                    uri=f"kb://{org}/{draft.filename}",
                    content_hash=_sha(draft.content),
                    path=Path(draft.filename),
                    record=(draft.title, body),
                    markdown=True,
                    review_note=review_note,
                ),
                previous=current.get(key),
            )
        )
    target = IngestTarget(
        org_id=org,
        collection_id=collection.id,
        collection_path=collection.path,
        status=DocStatus.PENDING_REVIEW,
        source_tag=SourceTag.AGENT_SYNTHESIS.value,
        synthesis_run_id=run_id,
        actor="research",
    )
    # The drafts' Citations footers are kept with them, with the URIs the corpus knows.
    uris = {e.cite_id: e.uri for e in corpus.entries if e.uri}
    report = index_batch(
        items, target, store=store, registry=registry, embedder=embedder, extract_file=_no_file,
        cite_uris=uris,
    )  # fmt: skip
    superseded = 0
    for item in items:
        prev = item.previous
        for old in registry.documents.versions_of(org, item.source.source_key) if prev else []:
            if old.status == DocStatus.PENDING_REVIEW.value and old.synthesis_run_id != run_id:
                superseded += supersede(old, store, registry, actor="research")
    log.info("research run %s persisted %d drafts for %s", run_id, report.documents, org)
    return Persisted(report.doc_ids, superseded, frozenset(held), tuple(notes))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _no_file(source: Source) -> Any:
    raise AssertionError(f"drafts are records, not files: {source.source_key}")
