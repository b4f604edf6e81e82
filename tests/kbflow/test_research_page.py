"""The research page's view of runs (`kbflow.services.research.page`) over a real registry."""

from __future__ import annotations

from pathlib import Path

from core.models import DocStatus, Role, SourceTag
from core.settings import Settings
from kbflow.services.jobs import RESEARCH_KIND
from kbflow.services.research.page import research_page
from sinks.registry import SqlRegistry

PARAMS = {"client_name": "Larkspur", "model": None, "budget_tokens": 200000, "reviewer": "amy"}


def test_a_run_whose_drafts_wait_says_so_with_the_registrys_own_times(tmp_path: Path) -> None:
    """Issue 44, found by the AM's whole day in a browser: once a run's drafts were stored the
    page answered 500 (SQLite gives a draft's time without its zone, the job's has one: they
    could not be compared). The run now reads "drafts ready" with how many wait."""
    settings = Settings(home=tmp_path / "home")
    registry = SqlRegistry.open(settings.registry_url)
    try:
        registry.people.ensure_org("larkspur")
        registry.people.ensure_user("amy", Role.ACCOUNT_MANAGER)
        registry.people.assign_am("larkspur", "amy")
        job = registry.jobs.create_job("larkspur", kind=RESEARCH_KIND, inputs=[], params=PARAMS)
        registry.jobs.note_progress(job.id, {"stage": "saving", "tokens": 41_250})
        kb = registry.catalog.ensure_collection("larkspur", "kb", "Knowledge-base documents")
        for name in ("brand_voice.md", "key_contacts.md"):
            registry.documents.create_document(
                org_id="larkspur", collection_id=kb.id, source_key=f"synthesis:larkspur:{name}",
                title=name, uri=f"kb://larkspur/{name}", content_hash=name,
                status=DocStatus.PENDING_REVIEW, source_tag=SourceTag.AGENT_SYNTHESIS.value,
                synthesis_run_id="run-1",
            )  # fmt: skip
        page = research_page(settings, registry, registry.people.get_user("amy"),
                             registry.people.get_org("larkspur"))  # fmt: skip
    finally:
        registry.close()
    (run,) = page.runs
    assert (run.job.id, run.stage, run.drafts) == (job.id, "drafts ready", 2)
    assert run.detail == "2 drafts waiting for your review in the inbox"
    # what it spent, recorded as it saved them: the final report comes after the review
    assert (run.spent_tokens, run.max_tokens) == (41_250, 200_000)
    assert page.refresh  # the run waits for its review: the page keeps following it


def test_kbflow_jobs_shows_the_stage_a_running_research_job_reported(tmp_path: Path) -> None:
    """`kbflow jobs list` and `jobs status` name the stage beside a running research job."""
    from kbflow.cli.jobs import _job_line

    registry = SqlRegistry.open(Settings(home=tmp_path / "home").registry_url)
    try:
        registry.people.ensure_org("larkspur")
        job = registry.jobs.create_job("larkspur", kind=RESEARCH_KIND, inputs=[], params=PARAMS)
        assert "(" not in _job_line(registry.jobs.get_job(job.id))  # nothing reported yet
        registry.jobs.note_progress(job.id, {"stage": "fetching", "done": 3, "total": 4})
        assert _job_line(registry.jobs.get_job(job.id)).endswith("(fetching 3 of 4)")
        registry.jobs.note_progress(job.id, {"stage": "synthesising"})
        assert _job_line(registry.jobs.get_job(job.id)).endswith("(synthesising)")
    finally:
        registry.close()
