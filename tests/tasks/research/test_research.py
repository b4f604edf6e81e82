"""Research as a plain unit of work, offline: seed -> corpus -> extractive drafts -> pending.

Budget overruns (tokens or fetches) persist nothing and count in the Prometheus counter; a run
exactly at the caps succeeds; a second run supersedes the first run's still-pending drafts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from core.models import KB_FILENAMES, ResearchRequest, Scope, SearchMode
from tasks.ingest.extract import file_to_document
from tasks.query.retrieve import search
from tasks.research.extractive import ExtractiveSynthesizer
from tasks.research.fetch import FetchError, FetchResult
from tasks.research.run import run_research
from tasks.research.seed import SeedBundle, seed_bundle

BRIEF = """# Larkspur Cycles brief

## Voice
Our voice is warm, plain and confident. We write like a friendly mechanic, not a bank.
Example: "Hi Sam, your bike is ready — ride safe!" Avoid jargon such as "synergy".

## Products
Larkspur sells the Sparrow city bike for 749 EUR and the Aurora e-bike for 3,190 EUR.
The Aurora is aimed at commuters; the Sparrow ships in March.

## Compliance
E-bike batteries must follow the EU battery regulation. Customer data is processed under GDPR.

## Contacts
Wout Peeters, store manager, wout.peeters@larkspur-cycles.example, +32 9 555 0301.
Escalate warranty disputes to Noor Vermeulen, warranty lead.
"""


def offline(url: str) -> FetchResult:
    raise FetchError(f"{url}: offline or unreachable", url=url)


def _counter(org: str) -> float:
    return REGISTRY.get_sample_value("kb_research_budget_exceeded_total", {"org": org}) or 0.0


@pytest.fixture
def world(edge_store: Any, registry: Any, embedder: Any, tmp_path: Path) -> dict[str, Any]:
    brief = tmp_path / "brief.md"
    brief.write_text(BRIEF)
    for org in ("lark", "lark2"):
        registry.people.ensure_org(org, "Larkspur Cycles")
        seed_bundle(
            SeedBundle(files=(brief,), urls=("https://larkspur.example/",),
                       prompts=("Focus on commuters.",)),
            org, registry=registry, store=edge_store, embedder=embedder,
            extract_file=lambda s: file_to_document(s.path),
        )  # fmt: skip
    return {"store": edge_store, "registry": registry, "embedder": embedder}


def _run(world: dict[str, Any], org: str = "lark", **kw: Any) -> Any:
    max_fetches = kw.pop("max_fetches", 30)
    request = ResearchRequest(org_id=org, client_name="Larkspur Cycles", **kw)
    return run_research(
        request,
        registry=world["registry"],
        store=world["store"],
        embedder=lambda: world["embedder"],
        synthesizer=ExtractiveSynthesizer(world["embedder"]),
        max_fetches=max_fetches,
        fetch=offline,
    )


def _drafts(world: dict[str, Any], org: str) -> list[Any]:
    return [
        d
        for d in world["registry"].documents.list_documents(org)
        if d.source_tag == "agent_synthesis"
    ]


def test_offline_research_drafts_four_pending_documents(world: dict[str, Any]) -> None:
    outcome = _run(world)
    assert not outcome.budget_exceeded and outcome.synthesis_run_id
    assert [d.filename for d in outcome.documents] == list(KB_FILENAMES)
    assert any("offline" in n for n in outcome.notes)  # public context failed fast, run went on
    drafts = _drafts(world, "lark")
    assert len(drafts) == 4
    assert {(d.status, d.synthesis_run_id) for d in drafts} == {
        ("pending_review", outcome.synthesis_run_id)
    }
    contacts = next(d for d in outcome.documents if d.filename == "key-contacts-extracted.md")
    assert "wout.peeters@larkspur-cycles.example" in contacts.content
    for mode in SearchMode:
        hits = search("Aurora e-bike commuters warranty", Scope(org_id="lark"), mode=mode,
                      store=world["store"], registry=world["registry"],
                      embedder=world["embedder"])  # fmt: skip
        assert hits == []  # drafts pending, seeds for the AM audience only


def test_a_second_run_supersedes_the_first_runs_pending_drafts(world: dict[str, Any]) -> None:
    first = _run(world).synthesis_run_id
    second = _run(world)
    assert second.superseded_drafts == 4
    by_run: dict[str, set[str]] = {}
    for d in _drafts(world, "lark"):
        by_run.setdefault(d.synthesis_run_id, set()).add(d.status)
    assert by_run == {first: {"superseded"}, second.synthesis_run_id: {"pending_review"}}


def test_budget_caps_exactly_at_and_just_over(world: dict[str, Any]) -> None:
    ok = _run(world, "lark2")
    spent = ok.consumed_tokens
    assert spent > 0
    # Just over the token cap: nothing persisted, the counter moves.
    before = _counter("lark")
    over = _run(world, "lark", budget_cap_tokens=spent - 1)
    assert over.budget_exceeded and over.documents == []
    assert over.synthesis_run_id is None
    assert _drafts(world, "lark") == []
    assert _counter("lark") == before + 1
    # Exactly at the caps: 4 fetches (homepage, X, two searches) and the same tokens.
    at = _run(world, "lark", budget_cap_tokens=spent, max_fetches=4)
    assert not at.budget_exceeded and len(_drafts(world, "lark")) == 4


def test_crossing_the_fetch_cap_persists_nothing(world: dict[str, Any]) -> None:
    before = _counter("lark")
    out = _run(world, "lark", max_fetches=3)
    assert out.budget_exceeded
    assert _drafts(world, "lark") == []
    assert _counter("lark") == before + 1


def test_a_capped_run_reports_which_cap_stopped_it(world: dict[str, Any]) -> None:
    by_fetches = _run(world, "lark", max_fetches=3).to_dict()
    assert by_fetches["budget"] == {
        "fetches": 3,
        "max_fetches": 3,
        "tokens": by_fetches["consumed_tokens"],
        "max_tokens": 200_000,
        "exceeded": "fetches",
    }
    assert by_fetches["budget_stop"].startswith("stopped by the fetch cap: 3 of 3 fetches")
    assert "KBFLOW_RESEARCH_MAX_FETCHES" in by_fetches["budget_stop"]
    assert "--budget" not in by_fetches["budget_stop"]
    assert any("the fetch cap stopped it" in note for note in by_fetches["notes"])

    by_tokens = _run(world, "lark", budget_cap_tokens=1).to_dict()
    assert by_tokens["budget"]["exceeded"] == "tokens"
    assert by_tokens["budget_stop"].startswith("stopped by the token budget")
    assert "raise --budget (now 1)" in by_tokens["budget_stop"]
    assert any("the token budget stopped it" in note for note in by_tokens["notes"])

    done = _run(world, "lark").to_dict()
    assert done["budget"]["exceeded"] is None and done["budget_stop"] is None


CONTACTS_CSV = (
    "Name,Role,Email,Phone\n"
    "Wout Peeters,Store manager,wout.peeters@larkspur-cycles.example,+32 9 555 0301\n"
    "Noor Vermeulen,Warranty lead,noor.vermeulen@larkspur-cycles.example,+32 9 555 0302\n"
    "Lies Claes,Head of sales,lies.claes@larkspur-cycles.example,+32 9 555 0303\n"
)


def test_offline_drafts_keep_a_seed_table_and_keep_their_footer_as_metadata(
    world: dict[str, Any], tmp_path: Path
) -> None:
    registry, store = world["registry"], world["store"]
    sheet = tmp_path / "contacts.csv"
    sheet.write_text(CONTACTS_CSV)
    registry.people.ensure_org("lark3", "Larkspur Cycles")
    seed_bundle(
        SeedBundle(files=(sheet,), urls=("https://larkspur.example/",)), "lark3",
        registry=registry, store=store, embedder=world["embedder"],
        extract_file=lambda s: file_to_document(s.path),
    )  # fmt: skip
    seeds = {d.source_tag: d for d in registry.documents.list_documents("lark3")}
    csv_seed = seeds["am_file"]

    outcome = _run(world, "lark3")

    contacts = next(d for d in outcome.documents if d.filename == KB_FILENAMES[3])
    lines = contacts.content.splitlines()  # the seed's table, a row a line, cited per row
    header = lines.index("| Name | Role | Email | Phone | Source |")
    assert lines[header + 1] == "|---|---|---|---|---|"
    assert lines[header + 2 : header + 5] == [
        f"| {name} | {role} | {mail} | {phone} | [doc:{csv_seed.id}] |"
        for name, role, mail, phone in (r.split(",") for r in CONTACTS_CSV.splitlines()[1:])
    ]
    # The footer is metadata: no chunk holds it, the registry keeps each entry with its URI.
    by_name = {d.title: d for d in _drafts(world, "lark3")}
    stored = by_name[contacts.title]
    chunks = registry.chunks.document_chunks([stored.id])[stored.id]
    assert chunks and all("Citations" not in c.heading_path for c in chunks)
    footer = contacts.content.split("\n---\n## Citations\n")[1].strip().splitlines()
    assert footer and not [line for line in footer for c in chunks if line in c.text]
    assert "| Wout Peeters | Store manager |" in " ".join(c.text for c in chunks)
    refs = {r.cite_id: r for r in stored.citations}
    assert refs[f"doc:{csv_seed.id}"].title == csv_seed.title
    assert refs[f"doc:{csv_seed.id}"].uri == csv_seed.uri
    assert {r.cite_id for r in stored.citations} <= {f"doc:{d.id}" for d in seeds.values()}


def test_a_rerun_holds_back_what_was_rejected_and_offers_a_change_to_an_edit(
    world: dict[str, Any],
) -> None:
    """Issue 44: re-running research brought back a draft the AM had rejected, and offered a
    new version of one she had edited and approved with no word that it would replace her
    text. Now the rejected one is held back while its sources are the same (the run's notes
    say so), and the edited one is proposed with a note that it is a change to her version."""
    from core.models import DocStatus, DraftDocument, Role
    from tasks.research.run import rerun_rule
    from tasks.review.decisions import Verb, apply_decision
    from tasks.review.machine import held

    registry, store = world["registry"], world["store"]
    registry.people.ensure_user("amy", Role.ACCOUNT_MANAGER)
    registry.people.assign_am("lark", "amy")
    first = _run(world)
    by_file = dict(zip([d.filename for d in first.documents], first.doc_ids, strict=True))
    rejected_file, edited_file = KB_FILENAMES[0], KB_FILENAMES[1]
    decide = {
        "registry": registry,
        "open_store": held(store),
        "embedder": lambda: world["embedder"],
    }
    apply_decision(Verb.REJECT, by_file[rejected_file], "amy", note="off brand", **decide)
    draft = next(d for d in first.documents if d.filename == edited_file)
    mine = draft.content.replace("\n## ", "\n- Our own line, added by amy.\n\n## ", 1)
    apply_decision(Verb.EDIT, by_file[edited_file], "amy", content=mine, **decide)
    approved_file = KB_FILENAMES[2]  # approved as it is: the same text again is no news
    apply_decision(Verb.APPROVE, by_file[approved_file], "amy", **decide)

    second = _run(world)
    files = [d.filename for d in second.documents]
    assert sorted(files) == sorted([edited_file, KB_FILENAMES[3]]), files
    assert len(second.doc_ids) == 2
    assert f"{approved_file}: not proposed again: it is unchanged since amy approved it (v1)" in (
        second.notes
    )
    approved = registry.documents.versions_of("lark", f"synthesis:lark:{approved_file}")
    assert [v.status for v in approved] == ["approved"]  # no empty change waits in the inbox
    same = next(d for d in first.documents if d.filename == approved_file)
    gone = dataclasses.replace(approved[0], status=DocStatus.WITHDRAWN.value)
    proposed, note = rerun_rule(same, [gone])  # withdrawn: a restore brings it back, not this
    assert not proposed and note and "unchanged since it was withdrawn on" in note
    held_note = next(n for n in second.notes if n.startswith(f"{rejected_file}: not proposed"))
    assert "amy rejected it on" in held_note and "sources have not changed" in held_note
    versions = registry.documents.versions_of("lark", f"synthesis:lark:{rejected_file}")
    assert [v.status for v in versions] == [DocStatus.REJECTED.value]  # nothing new waits
    assert any(
        n.startswith(f"{edited_file}: proposed as a change to the version amy edited")
        for n in second.notes
    ), second.notes
    edited = registry.documents.versions_of("lark", f"synthesis:lark:{edited_file}")
    assert [v.status for v in edited] == ["approved", "pending_review"]  # hers still served

    # The same document drafted from other sources is proposed again, saying what changed.
    (rejected,) = versions
    other = DraftDocument(
        filename=rejected_file, title=rejected.title,
        content="# T\n\nNew fact [doc:fresh].\n\n---\n## Citations\n- [doc:fresh] New brief\n",
    )  # fmt: skip
    proposed, note = rerun_rule(other, versions)
    assert proposed and note is not None
    assert "its sources changed (new sources doc:fresh; no longer cited" in note

    # Her edited version is what the new draft's page compares against, and it says so.
    from core.settings import Settings
    from kbflow.api.inbox import _templates
    from kbflow.services.query.context import OpenHome
    from kbflow.services.review.inbox import age, draft_page

    settings = Settings()
    ctx = OpenHome(settings=settings, registry=registry, store=store, embedder=world["embedder"])
    amy = registry.people.get_user("amy")
    page = draft_page(ctx, settings, amy, edited[-1].id, None)
    assert page.current is not None and page.current.id == edited[0].id
    assert any(d.kind == "del" and "Our own line, added by amy." in d.text for d in page.diff)
    html = _templates.get_template("draft.html").render(
        age=age, page=page, org=registry.people.get_org("lark"), user=amy, csrf="x",
        edited=None, rows=20, note="", current=None,
    )  # fmt: skip
    assert "Version 1 is the text amy edited and approved on" in html
    assert "Approving this draft replaces it" in html
