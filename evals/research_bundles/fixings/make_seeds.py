"""Writes the fixings bundle's binary seeds, ``seeds/handbook.pdf`` (fpdf2) and
``seeds/price-list.xlsx`` (openpyxl), from the text below. The files are committed; this script
remakes them after an edit (``.venv/bin/python evals/research_bundles/fixings/make_seeds.py``).

Halden Fixings is a fictitious fastener distributor written for this eval. The handbook is a
long, several-page PDF whose headings, paragraphs and bullets arrive as plain paragraphs (the
native PDF pipeline keeps no heading levels); the workbook has three sheets (a price list, a
revenue table the bundle's prompt asks to leave out, an account team).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SEEDS = Path(__file__).resolve().parent / "seeds"
FIXED_DATE = datetime(2026, 3, 2, tzinfo=UTC)

# (heading, paragraphs); a paragraph that starts with "- " is a bullet.
HANDBOOK: list[tuple[str, list[str]]] = [
    (
        "About Halden Fixings",
        [
            "Halden Fixings B.V. is a family-owned distributor of industrial fasteners based in "
            "Zwolle, the Netherlands, founded in 1987. We supply bolts, nuts, anchors and "
            "threaded rod to construction firms, steel fabricators and installers across the "
            "Benelux, from a warehouse that holds about 14,000 stock lines.",
            "Besides stock sales we run three service lines for trade customers.",
            "- Vendor-managed inventory: we place bin-stock racks on the customer's site, "
            "refill them every week and invoice once a month.",
            "- Kitting: we pack fasteners per assembly or per floor, labelled with the "
            "customer's own part numbers, within five working days.",
            "- Certified torque testing: our lab tests structural bolt assemblies to EN 14399 "
            "and sends the test report within ten working days.",
            "Orders placed before 15:00 on a working day are delivered the next working day "
            "anywhere in the Benelux.",
        ],
    ),
    (
        "Handling and storage safety",
        [
            "Fasteners that rust or crack on site cost our customers far more than the parts "
            "themselves, so the handling rules below apply to every order picked in the "
            "warehouse and every delivery we make.",
            "- Zinc-flake coated and hot-dip galvanised fasteners must be stored dry and at "
            "least 10 cm off the floor.",
            "- High-strength bolts of property class 10.9 and above must never be "
            "electroplated after delivery, because of the risk of hydrogen embrittlement.",
            "- Staff must wear cut-resistant gloves when handling threaded rod and "
            "cut-to-length stock.",
            "- Pallets heavier than 1,000 kg may only be moved by a certified forklift driver.",
            "Any damaged pack found on delivery must be photographed and reported within 48 "
            "hours; after that we cannot accept a claim for transport damage.",
        ],
    ),
    (
        "Regulations we follow",
        [
            "Structural bolt assemblies are sold with a CE marking and a Declaration of "
            "Performance under the Construction Products Regulation (EU) No 305/2011. A "
            "Declaration of Performance is sent with every structural order and kept on file "
            "for ten years.",
            "We do not sell fasteners with hexavalent chromium coatings, which are restricted "
            "under REACH.",
        ],
    ),
    (
        "Returns and warranty",
        [
            "Unopened packs may be returned within 30 days of delivery for a full refund. "
            "Cut-to-length threaded rod and kitted orders cannot be returned.",
            "Our warranty covers manufacturing defects for 12 months from delivery; it does "
            "not cover corrosion caused by storing fasteners wet on site.",
        ],
    ),
    (
        "Writing to customers",
        [
            "We write like an experienced trade counter clerk: direct, practical and polite. "
            "Give quantities in pieces, never in boxes, and quote the customer's own part "
            "numbers so a site buyer can check an order at a glance.",
            '- Example: "Your 400 M12 wedge anchors ship today and reach Utrecht on '
            'Thursday morning."',
            "- Keep replies under 150 words and answer the question in the first sentence.",
            '- Avoid "ASAP" and "no worries" in any reply to a customer.',
            "- Never promise a delivery time the warehouse has not confirmed.",
        ],
    ),
    (
        "Customer data",
        [
            "Trade account records, including invoices and delivery notes, are kept for seven "
            "years because Dutch tax law requires it. A customer can ask for their personal "
            "data to be deleted by writing to privacy@haldenfixings.example; we answer within "
            "one month.",
        ],
    ),
    (
        "Escalation",
        [
            "Quality complaints about a delivered batch go straight to Mirjam de Vries, "
            "quality manager, on +31 38 555 0190.",
            "Out of hours, a site emergency goes to the on-call line, +31 38 555 0111.",
        ],
    ),
]

PRICES = [
    ("SKU", "Product", "Pack", "Price (EUR)"),
    ("HF-A12", "Wedge anchor M12 x 120", "50 pcs", 38.50),
    ("HF-B16", "Structural bolt set M16 10.9 HV", "25 sets", 112.00),
    ("HF-R10", "Threaded rod M10, 1 m, zinc-flake", "10 pcs", 21.90),
    ("HF-N20", "Hex nut M20 class 10", "100 pcs", 44.00),
    ("HF-K01", "Kitting, per kit", "1 kit", 6.50),
    ("HF-V01", "Vendor-managed inventory rack, per site and month", "1 site", 185.00),
]

REVENUE = [
    ("Year", "Revenue (EUR)", "Growth"),
    (2023, 14_200_000, "4 %"),
    (2024, 15_100_000, "6 %"),
    (2025, 16_350_000, "8 %"),
]

TEAM = [
    ("Name", "Role", "Email", "Phone"),
    ("Joost Bakker", "Account manager", "joost.bakker@haldenfixings.example", "+31 38 555 0142"),
    ("Sanne Kuipers", "Technical sales", "sanne.kuipers@haldenfixings.example", "+31 38 555 0157"),
    (
        "Pieter Halden",
        "Managing director",
        "pieter.halden@haldenfixings.example",
        "+31 38 555 0100",
    ),
]


def write_pdf(path: Path) -> None:
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.set_creation_date(FIXED_DATE)  # byte-stable output
    pdf.set_margins(20, 20, 20)
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 18)
    pdf.multi_cell(0, 10, "Halden Fixings - Customer Service Handbook 2026")
    for number, (heading, paragraphs) in enumerate(HANDBOOK):
        if number in (2, 4):
            pdf.add_page()  # several pages, sections running over them
        pdf.ln(4)
        pdf.set_font("Helvetica", "B", 13)
        pdf.multi_cell(0, 8, heading)
        pdf.set_font("Helvetica", "", 11)
        for paragraph in paragraphs:
            pdf.ln(2)
            if paragraph.startswith("- "):
                pdf.set_x(26)
                pdf.multi_cell(0, 6, "- " + paragraph[2:])
            else:
                pdf.multi_cell(0, 6, paragraph)
    pdf.output(str(path))


def write_xlsx(path: Path) -> None:
    from openpyxl import Workbook

    book = Workbook()
    sheets: list[tuple[str, list[tuple[Any, ...]]]] = [
        ("Price list", PRICES),
        ("Revenue", REVENUE),
        ("Account team", TEAM),
    ]
    for n, (title, rows) in enumerate(sheets):
        sheet = book.active if n == 0 else book.create_sheet()
        assert sheet is not None
        sheet.title = title
        for row in rows:
            sheet.append(list(row))
    book.properties.created = book.properties.modified = FIXED_DATE.replace(tzinfo=None)
    book.save(path)


if __name__ == "__main__":
    SEEDS.mkdir(exist_ok=True)
    write_pdf(SEEDS / "handbook.pdf")
    write_xlsx(SEEDS / "price-list.xlsx")
    print(f"wrote {SEEDS / 'handbook.pdf'} and {SEEDS / 'price-list.xlsx'}")
