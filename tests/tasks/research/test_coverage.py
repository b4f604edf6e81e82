"""Fact coverage of research drafts on the seed bundles of `evals.research_coverage`.

The bundle is seeded for real (Docling extraction, MiniLM, Qdrant Edge, SQLite) and research runs
offline through `run_research`, as the research flow's tasks run it, once with the extractive
synthesizer and once with Claude's SDK on a scripted ``httpx2.MockTransport`` reply. The
extractive figure is pinned at >= 90 % of the cider bundle's facts in the right draft, cited to
their seed (and >= 85 % on the second, physio bundle); the scripted figure checks that kbflow
keeps every fact and citation a good reply carries.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.contracts import ResearchReport
from core.models import KB_FILENAMES, ResearchRequest
from core.settings import Settings
from evals.research_coverage import CIDER, PHYSIO, Bundle, Coverage, score_drafts, scripted_reply
from sinks.registry import SqlRegistry
from tasks.ingest.extract import file_to_document
from tasks.research.claude import AnthropicSynthesizer
from tasks.research.extractive import ExtractiveSynthesizer
from tasks.research.run import MAX_OUTPUT_TOKENS, run_research
from tasks.research.seed import SeedBundle, list_seeds, seed_bundle
from tests.anthropic_mock import Recorder, anthropic_client, message

PRODUCT, CONTACTS = KB_FILENAMES[1], KB_FILENAMES[3]


class Seeded:
    """The bundle seeded into one home, and how to run research on it."""

    def __init__(self, bundle: Bundle, registry: SqlRegistry, store: Any, embedder: Any) -> None:
        self.bundle, self.registry, self.store, self.embedder = bundle, registry, store, embedder
        registry.people.ensure_org(bundle.name, bundle.client_name)
        seed_bundle(
            SeedBundle(files=tuple(bundle.seed_files())), bundle.name, registry=registry,
            store=store, embedder=embedder,
            extract_file=lambda source: file_to_document(source.path),
        )  # fmt: skip
        seeds = list_seeds(registry, bundle.name)
        self.cites = {Path(d.uri).name: f"doc:{d.id}" for d in seeds}
        self.titles = {f"doc:{d.id}": d.title for d in seeds}

    def research(self, synthesizer: Any) -> ResearchReport:
        return run_research(
            ResearchRequest(org_id=self.bundle.name, client_name=self.bundle.client_name),
            registry=self.registry, store=self.store, embedder=lambda: self.embedder,
            synthesizer=synthesizer, public_context=False,
        )  # fmt: skip

    def score(self, outcome: ResearchReport) -> Coverage:
        drafts = {d.filename: d.content for d in outcome.documents}
        return score_drafts(drafts, self.cites, self.bundle.facts())


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SqlRegistry, Any]]:
    from sinks.qdrant_edge import QdrantEdgeStore

    settings = Settings(home=tmp_path_factory.mktemp("coverage") / "home")
    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)
    try:
        yield registry, store
    finally:
        store.close()
        registry.close()


@pytest.fixture(scope="module")
def seeded(home: tuple[SqlRegistry, Any], embedder: Any) -> Seeded:
    return Seeded(CIDER, *home, embedder)


@pytest.fixture(scope="module")
def extractive(seeded: Seeded) -> tuple[ResearchReport, Coverage]:
    outcome = seeded.research(ExtractiveSynthesizer(seeded.embedder))
    return outcome, seeded.score(outcome)


def test_the_bundle_has_the_facts_the_issue_asks_for(seeded: Seeded) -> None:
    facts = CIDER.facts()
    assert set(seeded.cites) == {p.name for p in CIDER.seed_files()}
    assert {f.seed for f in facts} <= set(seeded.cites)
    per_draft = {name: [f for f in facts if f.draft == name] for name in KB_FILENAMES}
    brand, product, compliance, contacts = (per_draft[name] for name in KB_FILENAMES)
    assert len(brand) >= 4 and len(compliance) >= 4
    assert len({f.id.split("-")[1] for f in product}) >= 4  # products (dry, quince, ...)
    assert len({f.id.split("-")[1] for f in contacts if f.id.endswith("-phone")}) >= 3
    assert len({f.id for f in facts}) == len(facts)


def test_offline_research_puts_90_percent_of_the_facts_in_the_right_draft_cited(
    extractive: tuple[ResearchReport, Coverage],
) -> None:
    outcome, coverage = extractive
    assert [d.filename for d in outcome.documents] == list(KB_FILENAMES)
    assert coverage.total == 39
    assert coverage.cited_ratio >= 0.9, coverage.missing()
    assert coverage.found >= coverage.cited
    for draft, row in coverage.by_draft().items():  # no draft carries the figure alone
        assert row["cited"] >= 0.75 * row["facts"], (draft, row)


def test_offline_research_keeps_every_product_of_the_seed_table(
    extractive: tuple[ResearchReport, Coverage], seeded: Seeded
) -> None:
    """The reported fault: a seed naming three products, a product context keeping one."""
    outcome, coverage = extractive
    product = next(d.content for d in outcome.documents if d.filename == PRODUCT)
    cite = seeded.cites["product-sheet.md"]
    for name, spec, price in (
        ("Saltmarsh Dry", "4.5 % ABV", "3.20 EUR"),
        ("Quince and Sloe", "6.2 % ABV", "4.10 EUR"),
        ("Tidepool Perry", "5.0 % ABV", "3.60 EUR"),
    ):
        rows = [line for line in product.splitlines() if line.startswith(f"| {name} |")]
        assert len(rows) == 1, f"{name}'s row is not in the product context:\n{product}"
        assert spec in rows[0] and price in rows[0] and rows[0].endswith(f"| [{cite}] |")
    cited = {f.id for f in coverage.facts if f.cited}
    assert {f.id for f in coverage.facts if f.id.startswith("product-")} <= cited


def test_offline_drafts_stay_within_budget_and_cite_every_item(
    extractive: tuple[ResearchReport, Coverage], seeded: Seeded
) -> None:
    outcome, _ = extractive
    tags = tuple(f"[{cid}]" for cid in seeded.cites.values())
    for doc in outcome.documents:
        body = doc.content.split("\n---\n## Citations\n")[0]
        assert len(body) <= MAX_OUTPUT_TOKENS  # the per-document character budget
        lines = body.splitlines()
        items = [line for line in lines if line.startswith("- ")]
        rows = [  # table rows, less each table's header and separator
            line
            for n, line in enumerate(lines)
            if line.startswith("| ")
            and not (n + 1 < len(lines) and lines[n + 1].startswith("|---"))
        ]
        assert items or rows, doc.filename
        assert len(items) == len(set(items)), doc.filename  # nothing said twice in a draft
        for line in items + rows:
            assert any(tag in line for tag in tags), (doc.filename, line)


def test_offline_contacts_keep_the_sheet_whole_and_the_escalation_path(
    extractive: tuple[ResearchReport, Coverage], seeded: Seeded
) -> None:
    outcome, _ = extractive
    contacts = next(d.content for d in outcome.documents if d.filename == CONTACTS)
    sheet = [
        line
        for line in contacts.splitlines()
        if line.startswith("| ") and seeded.cites["contacts.csv"] in line
    ]
    assert len(sheet) == 3 and all("@saltmarsh-cider.example | +31 113 555 01" in s for s in sheet)
    escalation = contacts.split("## Escalation and contact paths")[1].split("\n---\n")[0]
    assert "go straight to Amira Haddad" in escalation
    assert seeded.cites["kickoff-notes.md"] in escalation


def test_the_claude_path_keeps_every_fact_and_citation_of_a_scripted_reply(
    seeded: Seeded,
) -> None:
    """Measures kbflow's handling of a reply (parse, validate, persist), not Claude's writing."""
    recorder = Recorder(message(f"```json\n{scripted_reply(seeded.cites, seeded.titles)}\n```"))
    synthesizer = AnthropicSynthesizer("unused", client=anthropic_client(recorder), max_retries=0)
    outcome = seeded.research(synthesizer)
    coverage = seeded.score(outcome)
    assert coverage.cited == coverage.total == 39, coverage.missing()
    (body,) = recorder.bodies  # one request, no repair turn
    user = body["messages"][0]["content"]
    for cid in seeded.cites.values():
        assert f"[{cid}]" in user  # every seed offered for citation ...
    for doc in seeded.registry.documents.get_documents(outcome.doc_ids).values():
        kept = {c.cite_id: c.uri for c in doc.citations}
        assert kept and all(uri for uri in kept.values())  # ... and kept with its URI
        assert set(kept) <= set(seeded.cites.values())


def test_the_scorer_counts_a_fact_without_its_seeds_citation_as_uncited(seeded: Seeded) -> None:
    reply = json.loads(scripted_reply(seeded.cites, seeded.titles))
    contacts = next(d for d in reply["documents"] if d["filename"] == CONTACTS)
    contacts["content"] = contacts["content"].replace(
        f"| [{seeded.cites['contacts.csv']}] |", f"| [{seeded.cites['brand-guide.md']}] |"
    )
    drafts = {d["filename"]: d["content"] for d in reply["documents"]}
    coverage = score_drafts(drafts, seeded.cites, CIDER.facts())
    uncited = {f.id for f in coverage.facts if f.found and not f.cited}
    assert uncited == {
        f"contact-{who}-{what}"
        for who in ("ilse", "joris", "amira")
        for what in ("role", "email", "phone")
    }


def test_offline_research_on_the_second_bundle(
    home: tuple[SqlRegistry, Any], embedder: Any
) -> None:
    """A clinic's HTML price list (names only in headings), contacts in prose, numbered rules."""
    physio = Seeded(PHYSIO, *home, embedder)
    outcome = physio.research(ExtractiveSynthesizer(embedder))
    coverage = physio.score(outcome)
    assert coverage.cited_ratio >= 0.85, coverage.missing()
    product = next(d.content for d in outcome.documents if d.filename == PRODUCT)
    assert "### Initial assessment" in product and "Price: 85 EUR." in product
