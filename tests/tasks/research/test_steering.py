"""The AM's prompts steer the offline drafts and are never quoted; every seed format feeds them;
no block is placed twice; golden examples are never anti-examples (issue 32, item 4).

The in-memory seeds read as extraction gives them: a PDF handbook's headings as plain title
lines above its paragraphs and bullets (the native PDF pipeline keeps no heading levels), an
XLSX workbook as one Markdown table per sheet, and dense call notes that compete with both.
The last test seeds a generated multi-page PDF and a workbook for real (Docling).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from core.models import KB_FILENAMES, CorpusEntry, ResearchCorpus, ResearchRequest
from evals.research_coverage import score_drafts
from tasks.ingest.extract import file_to_document
from tasks.research.extractive import ExtractiveSynthesizer
from tasks.research.run import run_research
from tasks.research.seed import SeedBundle, list_seeds, seed_bundle
from tasks.research.steering import Steering

BRAND, PRODUCT, COMPLIANCE, CONTACTS = KB_FILENAMES

HANDBOOK = "\n\n".join(
    [
        "Halden Fixings - Customer Service Handbook 2026",
        "About Halden Fixings",
        (
            "Halden Fixings B.V. is a family-owned distributor of industrial fasteners based "
            "in Zwolle, founded in 1987. We supply bolts, nuts, anchors and threaded rod to "
            "construction firms and steel fabricators across the Benelux."
        ),
        "Besides stock sales we run three service lines for trade customers.",
        (
            "- Vendor-managed inventory: we place bin-stock racks on the customer's site, "
            "refill them every week and invoice once a month."
        ),
        (
            "- Kitting: we pack fasteners per assembly or per floor, labelled with the "
            "customer's own part numbers, within five working days."
        ),
        (
            "- Certified torque testing: our lab tests structural bolt assemblies to EN 14399"
            " and sends the test report within ten working days."
        ),
        "Handling and storage safety",
        ("- Zinc-flake coated fasteners must be stored dry and at least 10 cm off the floor."),
        (
            "- High-strength bolts of property class 10.9 must never be electroplated after "
            "delivery, because of the risk of hydrogen embrittlement."
        ),
        (
            '- Staff must wear cut-resistant gloves when handling 1/2" threaded rod and '
            "cut-to-length stock. Pallets heavier than 1,000 kg may only be moved by a "
            "certified forklift driver. Any damaged pack found on delivery must be "
            "photographed and reported within 48 hours."
        ),
        "Writing to customers",
        "We write like an experienced trade counter clerk: direct, practical and polite.",
        (
            '- Example: "Your 400 M12 wedge anchors ship today and reach Utrecht on Thursday '
            'morning."'
        ),
        '- Avoid "ASAP" and "no worries" in any reply to a customer.',
        "Customer data",
        (
            "A customer can ask for their personal data to be deleted by writing to "
            "privacy@haldenfixings.example; we answer within one month."
        ),
        "Escalation",
        (
            "Quality complaints about a delivered batch go straight to Mirjam de Vries, "
            "quality manager, on +31 38 555 0190."
        ),
    ]
)

WORKBOOK = """# Price list

| SKU | Product | Pack | Price (EUR) |
|---|---|---|---|
| HF-A12 | Wedge anchor M12 x 120 | 50 pcs | 38.5 |
| HF-B16 | Structural bolt set M16 10.9 HV | 25 sets | 112 |
| HF-R10 | Threaded rod M10, 1 m, zinc-flake | 10 pcs | 21.9 |
| HF-K01 | Kitting, per kit | 1 kit | 6.5 |

# Revenue

| Year | Revenue (EUR) | Growth |
|---|---|---|
| 2024 | 15 100 000 | 6 % |
| 2025 | 16 350 000 | 8 % |

# Account team

| Name | Role | Email | Phone |
|---|---|---|---|
| Joost Bakker | Account manager | joost.bakker@haldenfixings.example | +31 38 555 0142 |
| Sanne Kuipers | Technical sales | sanne.kuipers@haldenfixings.example | +31 38 555 0157 |
"""

NOTES = "\n".join(
    [
        "# Kickoff call notes",
        "",
        "## Products",
        "Halden sells stainless steel bolts in sizes M6 to M30, sold per box of 100.",
        "Halden offers galvanised anchors for concrete, priced per pack of 50.",
        "The product range includes hex nuts, washers, threaded rod and chemical anchors.",
        "Prices for stainless bolts start at 0.40 EUR per piece.",
        "Chemical anchor cartridges cost 14.90 EUR each.",
        "The company sells a starter kit of 500 mixed fixings for 79 EUR.",
        "Trade customers get a 5 % discount on orders over 2,000 EUR.",
        "A subscription plan for monthly restocking costs 49 EUR per month.",
        "The webshop offers next-day delivery on 9,000 products.",
        "Halden's own brand of wood screws is sold in boxes of 200 for 12 EUR.",
        "Our customers are site buyers at construction firms and installers.",
        "The new product catalogue launches in May 2026.",
    ]
)


PDF, XLSX, MD = "file:///seeds/handbook.pdf", "file:///seeds/stock.xlsx", "file:///seeds/notes.md"


def corpus(*prompts: str, handbook: str = HANDBOOK) -> ResearchCorpus:
    entries = [
        CorpusEntry("doc:hb01", "handbook", handbook, "am_file", PDF),
        CorpusEntry("doc:wb02", "stock", WORKBOOK, "am_file", XLSX),
        CorpusEntry("doc:nt03", "Kickoff call notes", NOTES, "am_file", MD),
    ]
    entries += [
        CorpusEntry(f"doc:pm{n}", f"AM prompt: {p[:40]}", p, "am_prompt", f"am-prompt:{n}")
        for n, p in enumerate(prompts)
    ]
    return ResearchCorpus("Halden Fixings", tuple(entries))


@pytest.fixture(scope="module")
def synth(embedder: Any) -> ExtractiveSynthesizer:
    return ExtractiveSynthesizer(embedder)


def drafts(synth: ExtractiveSynthesizer, research: ResearchCorpus) -> dict[str, str]:
    result = synth.synthesize(research, max_output_tokens=4000)
    return {d.filename: d.content for d in result.documents}


def body(content: str) -> str:
    return content.split("\n---\n## Citations")[0]


def section(content: str, heading: str) -> str:
    return body(content).split(f"## {heading}\n")[1].split("\n## ")[0]


STEER = (
    "Focus on the torque testing service and the handbook's safety rules.\n"
    "Leave out the revenue figures.\n"
    "Audience: site buyers and procurement managers at construction firms."
)


# --- parsing -------------------------------------------------------------------------------


def test_a_prompt_reads_as_focus_leave_out_and_audience_naming_seeds_by_title_or_format() -> None:
    research = corpus(STEER, "Don't include the call notes; emphasise the spreadsheet.")
    steering = Steering.from_corpus(research)
    assert steering.focuses("doc:hb01", "Certified torque testing: our lab tests bolts")
    assert steering.focuses("doc:hb01", "Staff must wear gloves | Handling and storage safety")
    assert not steering.focuses("doc:nt03", "Safety first on site")  # not the handbook's
    assert steering.focuses("doc:wb02", "HF-A12 | Wedge anchor")  # "the spreadsheet": .xlsx
    assert steering.leaves_out("doc:wb02", "2025 | 16 350 000 | Year | Revenue (EUR) | Growth")
    assert steering.leaves_out("doc:nt03", "Halden sells stainless steel bolts")  # by title
    assert not steering.leaves_out("doc:hb01", "Halden sells stainless steel bolts")
    assert steering.bonus("doc:nt03", "Our customers are site buyers") > 0  # the audience
    assert not Steering.from_corpus(corpus("Please write in British English."))


# --- the offline drafts --------------------------------------------------------------------


def test_a_prompt_sentence_never_appears_in_a_draft(synth: ExtractiveSynthesizer) -> None:
    docs = drafts(synth, corpus(STEER))
    for content in docs.values():
        assert "[doc:pm0]" not in content
        for sentence in STEER.splitlines():
            words = sentence.rstrip(".").split()
            assert " ".join(words[:4]) not in content, sentence
            assert " ".join(words[-4:]) not in content, sentence
    coverage = score_drafts(docs, {}, [], [STEER], ["doc:pm0"])
    assert coverage.placement.prompt_quoted == 0
    assert coverage.placement.precision == 1.0


def test_focus_on_brings_a_pdf_fact_into_the_drafts(synth: ExtractiveSynthesizer) -> None:
    """Dense call notes fill the product context; the PDF's torque-testing service line only
    makes it when the prompt asks to focus on it (and then in the product context, not among
    the compliance risks, although it says "certified")."""
    fact = "Certified torque testing: our lab tests structural bolt assemblies to EN 14399"
    assert not any(fact in c for c in drafts(synth, corpus()).values())
    docs = drafts(synth, corpus("Focus on the torque testing service."))
    assert fact in section(docs[PRODUCT], "Products and services")
    assert fact not in docs[COMPLIANCE]


def test_leave_out_drops_a_spreadsheet_table(synth: ExtractiveSynthesizer) -> None:
    assert "16 350 000" in drafts(synth, corpus())[PRODUCT]  # the revenue sheet, unsteered
    docs = drafts(synth, corpus("Leave out the revenue figures."))
    assert not any("16 350 000" in c or "Revenue (EUR)" in c for c in docs.values())
    assert "| HF-A12 | Wedge anchor M12 x 120 | 50 pcs | 38.5 | [doc:wb02] |" in docs[PRODUCT]


def test_a_spreadsheet_table_keeps_its_header_and_every_format_contributes(
    synth: ExtractiveSynthesizer,
) -> None:
    docs = drafts(synth, corpus(STEER))
    product = body(docs[PRODUCT])
    head = "| SKU | Product | Pack | Price (EUR) | Source |\n|---|---|---|---|---|\n| HF-A12 |"
    assert head in product
    cited = set(re.findall(r"\[(doc:[^\]]+)\]", "".join(body(c) for c in docs.values())))
    assert {"doc:hb01", "doc:wb02", "doc:nt03"} <= cited
    # a stray inch mark in the PDF text does not fuse the rest of its paragraph into one line
    assert (
        "- Pallets heavier than 1,000 kg may only be moved by a certified forklift driver."
        in (docs[COMPLIANCE])
    )
    # the PDF's title lines label what follows; they are not facts
    assert not any("Handling and storage safety [" in c for c in docs.values())


def test_no_block_appears_twice_across_or_within_the_drafts(
    synth: ExtractiveSynthesizer,
) -> None:
    """The privacy address fits compliance and contacts; the example reply fits voice and
    status: each is placed once."""
    docs = drafts(synth, corpus())
    assert score_drafts(docs, {}, []).placement.duplicated_blocks == 0
    lines = [
        re.sub(r" \[[^\]]+\]", "", line)
        for c in docs.values()
        for line in body(c).splitlines()
        if line.startswith(("- ", "| ")) and not line.startswith(("| ---", "|---"))
    ]
    assert len(lines) == len(set(lines)), [x for x in lines if lines.count(x) > 1]
    assert "privacy@haldenfixings.example" in docs[COMPLIANCE]
    assert "privacy@" not in docs[CONTACTS]


def test_golden_examples_and_anti_examples_are_different_sentences(
    synth: ExtractiveSynthesizer,
) -> None:
    """A handbook with tone rules but no example copy and nothing to avoid: both sections say
    so, each quoting a different nearest passage (once the same one)."""
    plain = HANDBOOK.replace(
        '- Example: "Your 400 M12 wedge anchors ship today and reach Utrecht on Thursday '
        'morning."\n\n- Avoid "ASAP" and "no worries" in any reply to a customer.\n',
        "Keep replies short and answer the question in the first sentence. Use the "
        "customer's own part numbers in every reply.\n",
    )
    voice = drafts(synth, corpus(handbook=plain))[BRAND]
    golden = section(voice, "Golden examples").strip().splitlines()
    anti = section(voice, "Anti-examples").strip().splitlines()
    assert golden and anti
    quoted = [re.findall(r"“(.*)”", line) for line in (*golden, *anti)]
    assert all(quoted) and len({q[0] for q in quoted}) == len(quoted), (golden, anti)


# --- real seeds: a generated PDF and workbook through Docling ------------------------------


def _long_pdf(path: Path) -> None:
    """A nine-page handbook: company prose first, the safety rules on its last page."""
    from fpdf import FPDF

    filler = (
        "Our counter team answers questions from contractors across the region every working "
        "day, and this part of the handbook describes how orders are picked, packed and "
        "loaded in the warehouse before the trucks leave in the early morning. "
    )
    pdf = FPDF(format="A4")
    pdf.set_margins(20, 20, 20)
    for page in range(1, 10):
        pdf.add_page()
        pdf.set_font("Helvetica", "B", 13)
        title = "Handling and storage safety" if page == 9 else f"Warehouse routine, part {page}"
        pdf.multi_cell(0, 8, title, new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", "", 10)
        paragraphs = [filler * 4, filler * 3] if page < 9 else HANDBOOK_SAFETY
        for text in paragraphs:
            pdf.ln(3)
            pdf.multi_cell(0, 5, text, new_x="LMARGIN", new_y="NEXT")
    pdf.output(str(path))


HANDBOOK_SAFETY = [
    "Zinc-flake coated fasteners must be stored dry and at least 10 cm off the floor.",
    "High-strength bolts of property class 10.9 must never be electroplated after delivery, "
    "because of the risk of hydrogen embrittlement.",
]


def _workbook(path: Path) -> None:
    from openpyxl import Workbook

    book = Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.title = "Price list"
    for row in [line.strip("|").split("|") for line in WORKBOOK.splitlines()[2:8]]:
        if "---" not in row[0]:
            sheet.append([cell.strip() for cell in row])
    book.save(path)


def test_pdf_and_xlsx_seeds_both_contribute(
    edge_store: Any, registry: Any, embedder: Any, tmp_path: Path
) -> None:
    """The reported fault: nothing from the PDF handbook or the spreadsheet reached the drafts
    although the prompt asked to focus on them (a long PDF was cut to its first pages)."""
    handbook, prices, notes = tmp_path / "handbook.pdf", tmp_path / "prices.xlsx", tmp_path / "n.md"
    _long_pdf(handbook)
    _workbook(prices)
    notes.write_text(NOTES)
    prompt = "Focus on the handbook's safety rules and the price list. Audience: site buyers."
    registry.people.ensure_org("halden", "Halden Fixings")
    seed_bundle(
        SeedBundle(files=(handbook, prices, notes), prompts=(prompt,)), "halden",
        registry=registry, store=edge_store, embedder=embedder,
        extract_file=lambda source: file_to_document(source.path),
    )  # fmt: skip
    outcome = run_research(
        ResearchRequest(org_id="halden", client_name="Halden Fixings"), registry=registry,
        store=edge_store, embedder=lambda: embedder, synthesizer=ExtractiveSynthesizer(embedder),
        public_context=False,
    )  # fmt: skip
    docs = {d.filename: d.content for d in outcome.documents}
    cites = {Path(d.uri).name: f"[doc:{d.id}]" for d in list_seeds(registry, "halden")}
    compliance, product = body(docs[COMPLIANCE]), body(docs[PRODUCT])
    assert "hydrogen embrittlement" in compliance and cites["handbook.pdf"] in compliance
    row = next(line for line in product.splitlines() if "Wedge anchor M12 x 120" in line)
    assert row.endswith(f"| {cites['prices.xlsx']} |")
    assert "| SKU | Product | Pack | Price (EUR) | Source |" in product
    assert not any(prompt[:30] in c for c in docs.values())


def test_claude_reads_the_prompt_as_instructions_it_may_not_cite() -> None:
    from tasks.research.claude import user_message

    message = user_message(corpus(STEER))
    instructions = message.split("<instructions>\n")[1].split("\n</instructions>")[0]
    assert instructions == STEER
    assert "[doc:pm0]" not in message  # not a citation id, not a corpus entry
    assert "[doc:hb01]" in message.split("<corpus>")[1]
    assert "<instructions>" not in user_message(corpus())
