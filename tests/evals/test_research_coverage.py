"""The research coverage scorer: what counts as a fact in the right draft, and as cited."""

from __future__ import annotations

import json
import re

from core.models import KB_FILENAMES
from evals.research_coverage import CIDER, PHYSIO, Fact, score_drafts, scripted_reply

BRAND, PRODUCT, COMPLIANCE, CONTACTS = KB_FILENAMES
CITES = {"sheet.md": "doc:s1", "notes.md": "doc:n2"}
PRICE = Fact("price", PRODUCT, "sheet.md", r"Quince.*4\.10 EUR", "a price")
LAUNCH = Fact("launch", PRODUCT, "notes.md", r"Zero Brine.*2\.40 EUR", "a price in prose")


def drafts(product: str, **others: str) -> dict[str, str]:
    out = {name: f"# {name}\n\n---\n## Citations\n" for name in KB_FILENAMES}
    out[PRODUCT] = f"# Product\n\n{product}\n\n---\n## Citations\n- [doc:s1] Sheet\n"
    out.update(others)
    return out


def test_a_table_row_is_cited_by_its_own_source_cell() -> None:
    table = (
        "| Cider | Price | Source |\n|---|---|---|\n| Quince | 4.10 EUR | [doc:s1] |\n"
        "| Tidepool | 3.60 EUR | [doc:s1] |"
    )
    (result,) = score_drafts(drafts(table), CITES, [PRICE]).facts
    assert result.found and result.cited
    uncited = table.replace("| Quince | 4.10 EUR | [doc:s1] |", "| Quince | 4.10 EUR | |")
    (result,) = score_drafts(drafts(uncited), CITES, [PRICE]).facts
    assert result.found and not result.cited  # the next row's citation does not count


def test_a_prose_paragraph_is_one_unit_across_its_wrapped_lines() -> None:
    prose = "Zero Brine launches in April, an alcohol-free drink\nat 2.40 EUR a bottle [doc:n2]."
    (result,) = score_drafts(drafts(prose), CITES, [LAUNCH]).facts
    assert result.found and result.cited
    two_paragraphs = prose.replace("\nat", "\n\nat")
    (result,) = score_drafts(drafts(two_paragraphs), CITES, [LAUNCH]).facts
    assert not result.found


def test_the_citation_must_name_the_seed_that_holds_the_fact() -> None:
    (result,) = score_drafts(drafts("- Quince costs 4.10 EUR [doc:n2]"), CITES, [PRICE]).facts
    assert result.found and not result.cited


def test_a_fact_in_the_wrong_draft_is_not_found_but_shown_where_it_is() -> None:
    compliance = "# C\n\n- Quince costs 4.10 EUR [doc:s1]\n\n---\n## Citations\n- [doc:s1] S\n"
    coverage = score_drafts(drafts("- nothing", **{COMPLIANCE: compliance}), CITES, [PRICE])
    (result,) = coverage.facts
    assert not result.found and result.found_in == (COMPLIANCE,)
    assert coverage.missing() == ["price"] and coverage.cited_ratio == 0.0


def test_the_footer_never_counts_as_the_draft_saying_the_fact() -> None:
    product = "# P\n\n- nothing\n\n---\n## Citations\n- [doc:s1] Quince 4.10 EUR sheet\n"
    (result,) = score_drafts(drafts("", **{PRODUCT: product}), CITES, [PRICE]).facts
    assert not result.found and result.found_in == ()


def test_every_fact_is_in_its_seed_file_and_the_scripted_reply_cites_the_run_ids() -> None:
    for bundle in (CIDER, PHYSIO):
        texts = {p.name: " ".join(p.read_text().split()) for p in bundle.seed_files()}
        facts = bundle.facts()
        assert len({f.id for f in facts}) == len(facts)
        for fact in facts:
            assert fact.draft in KB_FILENAMES
            # a CSV's commas and HTML's tags stand where the drafts' table cells and spaces do
            text = re.sub(r"<[^>]+>", " ", texts[fact.seed]).replace(",", " | ")
            assert fact.matches(text), (bundle.name, fact.id)
    cites = {p.name: f"doc:{n}" for n, p in enumerate(CIDER.seed_files())}
    reply = json.loads(scripted_reply(cites, {cid: f"title {cid}" for cid in cites.values()}))
    assert [d["filename"] for d in reply["documents"]] == list(KB_FILENAMES)
    text = json.dumps(reply)
    assert "[seed:" not in text and "- [doc:2] title doc:2" in text
