# Over 500 lines: mostly data, the demo's six sample documents as text.
"""Sample corpus for ``kbflow demo``: six documents about the fictional client Larkspur Cycles.

Larkspur Cycles is an invented bicycle maker and retailer (head office and workshop in Utrecht,
stores in Rotterdam and Ghent). The corpus covers every format the ingest pipeline reads —
Markdown, HTML, DOCX, PDF and CSV — and holds specific, mutually consistent facts (leave days,
bike weights, warranty terms, breach-notification deadlines, phone numbers) so that the demo's
searches have crisp answers.

One document, ``pricing-2027-draft.md``, is a draft that the demo marks ``pending_review``; its
distinctive figures (the Aurora e-bike rising to 3,450 EUR) show that the approval gate keeps it
out of search results until someone approves it.

Writing is idempotent: every file gets the same bytes on every run (fixed document dates, fixed
ZIP member times, no randomness), and a file whose bytes already match is left untouched, so
re-ingesting the demo skips unchanged files.

One module on purpose: it is data, and the documents' facts must agree with the demo's questions.
"""

from __future__ import annotations

import datetime as dt
import html
import io
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

import docx
from fpdf import FPDF
from fpdf.enums import XPos, YPos

logger = logging.getLogger(__name__)

CLIENT_NAME = "Larkspur Cycles"
EMAIL_DOMAIN = "larkspur-cycles.example"

HANDBOOK_FILE = "handbook.md"
PRODUCT_SHEET_FILE = "product-sheet.html"
RETURNS_POLICY_FILE = "returns-policy.docx"
SECURITY_WHITEPAPER_FILE = "security-whitepaper.pdf"
CONTACTS_FILE = "contacts.csv"
PRICING_DRAFT_FILE = "pricing-2027-draft.md"

# Fixed document dates: metadata must not depend on when the demo runs, or re-ingesting would
# see "changed" files every time.
DOCUMENT_DATE = dt.datetime(2026, 1, 15, 9, 0, 0, tzinfo=dt.UTC)
# Earliest timestamp a ZIP member can carry; used for every member of the DOCX.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class DemoQuery:
    """A question the demo asks, and the file expected to answer it.

    Attributes:
        question: The natural-language question sent to search.
        expect_in: File name (within the corpus folder) expected among the top hits, or None
            when the only document that answers it is pending review and must stay hidden.
    """

    question: str
    expect_in: str | None


@dataclass(frozen=True)
class DemoCorpus:
    """What ``write_demo_corpus`` wrote.

    Attributes:
        files: Every file written, in a fixed order; includes ``pending_file``.
        pending_file: The draft document the demo marks ``pending_review``.
        queries: Sample questions with the file expected to answer each.
    """

    files: list[Path]
    pending_file: Path
    queries: list[DemoQuery]


@dataclass(frozen=True)
class Bike:
    """One model in the Larkspur Cycles range; the single source for every bike fact."""

    name: str
    sku: str
    category: str
    weight_kg: float
    frame: str
    gears: str
    price_eur: int
    summary: str


SPARROW = Bike(
    name="Sparrow City",
    sku="LC-SPR-100",
    category="City bike",
    weight_kg=13.2,
    frame="6061 aluminium, step-through",
    gears="Shimano Nexus 7-speed hub",
    price_eur=749,
    summary=(
        "An upright commuter with a chain guard, dynamo lights, mudguards and a rear rack rated "
        "for 25 kg. Available in Fjord Blue and Oat White, frame sizes S, M and L."
    ),
)
MERIDIAN = Bike(
    name="Meridian Gravel",
    sku="LC-MER-300",
    category="Gravel bike",
    weight_kg=9.4,
    frame="Carbon fibre (T700), hand-finished in Utrecht",
    gears="Shimano GRX 2x11 (22 speeds)",
    price_eur=2190,
    summary=(
        "A lightweight carbon gravel bike with clearance for 45 mm tyres, hydraulic disc brakes "
        "and three bottle mounts. Frame sizes 50, 53, 56 and 59 cm."
    ),
)
AURORA = Bike(
    name="Aurora E-Bike",
    sku="LC-AUR-500",
    category="Electric trekking bike",
    weight_kg=23.8,
    frame="6061 aluminium with integrated 500 Wh battery",
    gears="Shimano Deore 10-speed",
    price_eur=3190,
    summary=(
        "A trekking e-bike with a 250 W mid-drive motor, pedal assistance up to 25 km/h and a "
        "range of up to 110 km. The 500 Wh battery charges fully in 4.5 hours."
    ),
)
BIKES: tuple[Bike, ...] = (SPARROW, MERIDIAN, AURORA)

# Draft figures; they appear only in the pending document, never in approved ones.
PROPOSED_2027_PRICES_EUR: dict[str, int] = {
    SPARROW.sku: 789,
    MERIDIAN.sku: 2290,
    AURORA.sku: 3450,
}

DEMO_QUERIES: tuple[DemoQuery, ...] = (
    DemoQuery("How many days of paid annual leave do full-time employees get?", HANDBOOK_FILE),
    DemoQuery("How much does the Meridian gravel bike weigh?", PRODUCT_SHEET_FILE),
    DemoQuery("How long is the warranty on the Aurora e-bike battery?", RETURNS_POLICY_FILE),
    DemoQuery("How quickly are customers notified after a data breach?", SECURITY_WHITEPAPER_FILE),
    DemoQuery("What is the phone number of the Ghent store manager?", CONTACTS_FILE),
    DemoQuery("What will the Aurora e-bike cost after the proposed 2027 price increase?", None),
)


def _eur(amount: int) -> str:
    return f"{amount:,} EUR"


# --------------------------------------------------------------------------------------------
# 1. Employee handbook (Markdown)
# --------------------------------------------------------------------------------------------

HANDBOOK_MD = f"""\
# {CLIENT_NAME} Employee Handbook

Version 4.2, effective 1 March 2026. Owned by People & Culture (people@{EMAIL_DOMAIN}).

{CLIENT_NAME} designs, builds and sells bicycles from our head office and frame workshop in
Utrecht and our stores in Rotterdam and Ghent. This handbook explains how we work together. If
anything here is unclear, ask your manager or the People & Culture team.

## Onboarding

### Your first day

Your first day starts at 09:00 at the reception of the Utrecht head office. Bring a photo ID
and your signed contract. You will meet your onboarding buddy, collect your laptop and building
badge, and join the welcome session at 11:00, which ends with a tour of the frame workshop.

### Your first three months

Your probation period is three months. Your manager holds check-ins at 30, 60 and 90 days.

- Week 1: complete the online IT security course and, for workshop roles, the safety induction.
- Month 1: agree three goals for your probation period with your manager.
- Month 3: probation review with your manager and People & Culture.

### Onboarding buddy

Every new starter is paired with a buddy from another team for the first six weeks. Your buddy
answers everyday questions, introduces you to colleagues and has lunch with you once a week.

## Working hours

### Standard week

A full-time week is 38 hours. Office staff may start between 07:30 and 10:00 and must be
available during core hours, 10:00 to 15:00, Monday to Friday. Record your hours in the HR
portal by the end of each week.

### Store and workshop shifts

Stores are open Tuesday to Saturday from 09:30 to 18:00, and until 21:00 on Thursdays. The
workshop runs from 07:00 to 15:30, Monday to Friday. Shift rosters are published in the
scheduling tool four weeks in advance; swap shifts only with your store manager's approval.

### Overtime

Overtime must be approved by your manager in advance. It is compensated as time off in lieu at
1.5 hours for every hour worked, to be taken within three months.

## Remote work

Office-based employees who have completed probation may work remotely up to two days per week,
on days agreed with their manager. Store and workshop roles are on site. Remote work must be
done from the Netherlands or Belgium; working from another country needs written approval from
People & Culture because of tax and insurance rules.

You receive a one-off home office allowance of 350 EUR for a desk chair or monitor and an
internet allowance of 25 EUR per month. Always connect through the company VPN when you are not
on the office network.

## Leave

### Annual leave

Full-time employees receive 27 days of paid annual leave per calendar year, plus public
holidays. Part-time employees receive leave pro rata. Up to 5 unused days may be carried over to
the next year and must be taken by 30 June. Request leave in the HR portal at least two weeks in
advance; store staff need four weeks' notice for leave between April and August, our peak
season.

### Sick leave

If you are ill, call your manager before 09:30 on your first day of absence; a text message is
not enough. From the fourth consecutive day of absence, the company doctor will contact you.

### Parental and special leave

Birth partners receive 10 days of fully paid leave within six months of the birth. You also get
5 days of bereavement leave for close family and 1 day of moving leave per year.

## Expenses

### What you can claim

- Public transport for business travel, second class.
- Mileage for your own car or bike at 0.23 EUR per km.
- Meals during business travel, up to 35 EUR per day.
- Hotels, up to 140 EUR per night.

### How to claim

Submit claims in the expense app within 30 days, with a photo of the receipt for every item
over 10 EUR. Managers approve claims up to 1,000 EUR; larger claims also need the Finance
Director's approval. Claims approved by the 20th are paid with that month's salary.

### Staff discount

Every employee may buy one Larkspur bike every two years at a 30% staff discount, plus 20% off
parts and accessories.

## IT security basics

### Accounts and passwords

Use a password of at least 14 characters for every work account, store it in the company
password manager and never reuse it elsewhere. Multi-factor authentication is required on all
company accounts.

### Devices

Laptops are encrypted and managed by IT. Your screen locks after 5 minutes of inactivity; lock
it yourself whenever you step away. Personal USB storage devices are not allowed. Install
security updates within 7 days of being prompted.

### Phishing and incidents

Report suspicious emails with the "Report phishing" button or to security@{EMAIL_DOMAIN}.
Report a lost or stolen device to the IT service desk (extension 4357) within 1 hour, even
outside office hours.

### Customer data

Keep customer data in approved systems only: the order system and the CRM. Never copy it to
personal email, private cloud storage or spreadsheets on your laptop.
"""


def build_handbook_md() -> bytes:
    """Returns the employee handbook as UTF-8 Markdown bytes."""
    return HANDBOOK_MD.encode("utf-8")


# --------------------------------------------------------------------------------------------
# 2. Product sheet (HTML)
# --------------------------------------------------------------------------------------------


def _spec_row(bike: Bike) -> str:
    cells = (
        bike.name,
        bike.sku,
        f"{bike.weight_kg:.1f} kg",
        bike.frame,
        bike.gears,
        _eur(bike.price_eur),
    )
    return "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells) + "</tr>"


def _bike_section(bike: Bike) -> str:
    return (
        f"<h3>{html.escape(bike.name)} ({html.escape(bike.sku)})</h3>\n"
        f"<p><strong>{html.escape(bike.category)}</strong> &middot; "
        f"{bike.weight_kg:.1f} kg &middot; {html.escape(_eur(bike.price_eur))}</p>\n"
        f"<p>{html.escape(bike.summary)}</p>\n"
    )


def build_product_sheet_html() -> bytes:
    """Returns the product sheet for the three bikes as UTF-8 HTML bytes."""
    header = "".join(
        f"<th>{label}</th>" for label in ("Model", "SKU", "Weight", "Frame", "Gears", "Price")
    )
    rows = "\n".join(_spec_row(bike) for bike in BIKES)
    sections = "".join(_bike_section(bike) for bike in BIKES)
    page = f"""\
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{CLIENT_NAME} 2026 Range - Product Sheet</title>
</head>
<body>
<h1>{CLIENT_NAME} 2026 Range</h1>
<p>Three bikes, designed in Utrecht and sold in our Utrecht, Rotterdam and Ghent stores and
online. Prices include 21% VAT and a first service after 500 km.</p>
<h2>Specifications</h2>
<table>
<thead><tr>{header}</tr></thead>
<tbody>
{rows}
</tbody>
</table>
<h2>The bikes</h2>
{sections}<h2>Ordering and delivery</h2>
<p>In-stock bikes ship within 3 business days; delivery is free in the Netherlands and Belgium.
Every bike is assembled and test-ridden in our workshop before it leaves.</p>
</body>
</html>
"""
    return page.encode("utf-8")


# --------------------------------------------------------------------------------------------
# 3. Returns and warranty policy (DOCX)
# --------------------------------------------------------------------------------------------

# (heading level, heading text, paragraphs, bullet points); level 1 and 2 map to Word's
# "Heading 1" / "Heading 2" styles so the extractor sees a real outline.
_PolicySection = tuple[int, str, tuple[str, ...], tuple[str, ...]]

RETURNS_POLICY_SECTIONS: tuple[_PolicySection, ...] = (
    (
        1,
        "Returns",
        (
            f"This policy applies to everything bought from {CLIENT_NAME} in our stores or "
            "online. Version 3.1, effective 1 January 2026.",
        ),
        (),
    ),
    (
        2,
        "30-day returns",
        (
            "You can return any bike, part or accessory within 30 days of delivery or "
            "collection for a full refund, provided that:",
        ),
        (
            "bikes have been ridden no more than 50 km and are undamaged;",
            "clothing and accessories are unused, in their original packaging, with tags;",
            "you have proof of purchase (an order number starting with LC-ORD-);",
            "the item is not a custom build (non-standard frame size or paint) or a gift card, "
            "which cannot be returned.",
        ),
    ),
    (
        2,
        "How to return an item",
        (
            "Request a return authorisation (RMA) number from returns@"
            f"{EMAIL_DOMAIN} or on +31 30 555 0150 (Monday to Friday, 09:00 to 17:00). "
            "Bring the item to any store, or we collect bikes free of charge in the Netherlands "
            "and Belgium. Returning parts by post costs 6.95 EUR, which we waive for faulty "
            "items.",
        ),
        (),
    ),
    (
        2,
        "Refunds",
        (
            "We refund to the original payment method within 10 business days of receiving "
            "and inspecting the item.",
        ),
        (),
    ),
    (
        1,
        "Warranty",
        (
            "Our warranty covers defects in materials and workmanship for the original owner, "
            "in addition to your statutory rights.",
        ),
        (),
    ),
    (
        2,
        "Coverage periods",
        (),
        (
            f"Aluminium frames ({SPARROW.name}, {AURORA.name}): lifetime warranty.",
            f"Carbon frames ({MERIDIAN.name}): 7 years.",
            "Components such as gears, brakes and wheels: 2 years.",
            f"{AURORA.name} motor: 3 years.",
            f"{AURORA.name} battery: 3 years or 800 full charge cycles, whichever comes first; "
            "we replace a battery that holds less than 70% of its original capacity.",
        ),
    ),
    (
        2,
        "What is not covered",
        (),
        (
            "Wear parts: tyres, chains, cassettes and brake pads.",
            "Damage from crashes, racing or commercial rental use.",
            "Aftermarket modifications, including unauthorised motor tuning.",
        ),
    ),
    (
        2,
        "Making a warranty claim",
        (
            f"Email the Warranty Team at warranty@{EMAIL_DOMAIN} with your order number, the "
            "frame serial number (stamped under the bottom bracket, format LSP-26-000123) and "
            "photos of the defect. We decide within 5 business days and repair or replace the "
            "part. If a repair takes longer than 7 days, we lend you a bike.",
        ),
        (),
    ),
    (
        1,
        "Crash replacement",
        (
            "If you damage a frame in a crash within 3 years of purchase, you can buy a "
            "replacement frame at 50% off the list price.",
        ),
        (),
    ),
)


def _normalise_zip(data: bytes) -> bytes:
    """Rewrites a ZIP archive with fixed member timestamps so its bytes are reproducible.

    python-docx stamps every member with the current time, which would change the file's hash
    on every run.
    """
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(data)) as src,
        zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as dst,
    ):
        for member in src.infolist():
            info = zipfile.ZipInfo(member.filename, date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            dst.writestr(info, src.read(member.filename))
    return out.getvalue()


def build_returns_policy_docx() -> bytes:
    """Returns the customer returns and warranty policy as DOCX bytes.

    Sections use Word's Heading 1 / Heading 2 styles and conditions use the List Bullet style.
    Core properties carry fixed dates and ZIP members fixed times, so the bytes never change.
    """
    document = docx.Document()
    document.add_heading(f"{CLIENT_NAME} Returns and Warranty Policy", level=0)
    for level, heading, paragraphs, bullets in RETURNS_POLICY_SECTIONS:
        document.add_heading(heading, level=level)
        for text in paragraphs:
            document.add_paragraph(text)
        for text in bullets:
            document.add_paragraph(text, style="List Bullet")

    props = document.core_properties
    props.title = f"{CLIENT_NAME} Returns and Warranty Policy"
    props.author = f"{CLIENT_NAME} Customer Service"
    props.last_modified_by = f"{CLIENT_NAME} Customer Service"
    props.comments = f"Sample document for the kbflow demo; {CLIENT_NAME} is fictional."
    props.revision = 1
    # python-docx wants naive datetimes here and writes them as UTC.
    props.created = DOCUMENT_DATE.replace(tzinfo=None)
    props.modified = DOCUMENT_DATE.replace(tzinfo=None)

    buffer = io.BytesIO()
    document.save(buffer)
    return _normalise_zip(buffer.getvalue())


# --------------------------------------------------------------------------------------------
# 4. Security whitepaper (PDF, two pages)
# --------------------------------------------------------------------------------------------

# One tuple per page: (section heading, paragraphs). ASCII only: fpdf2's core fonts are latin-1.
WHITEPAPER_TITLE = f"{CLIENT_NAME} Security Whitepaper: How We Protect Customer Data"
WHITEPAPER_PAGES: tuple[tuple[tuple[str, tuple[str, ...]], ...], ...] = (
    (
        (
            "1. Overview",
            (
                f"{CLIENT_NAME} holds names, delivery addresses, order histories, e-bike serial "
                "numbers and service records for about 84,000 customers. Payment card data never "
                "touches our systems: card payments are handled by a PCI DSS Level 1 payment "
                "provider. This whitepaper (version 2026.1) describes how we protect the data "
                "we do hold.",
            ),
        ),
        (
            "2. Encryption",
            (
                f"{CLIENT_NAME} encrypts all customer data at rest with AES-256, including "
                "databases, file storage and backups. Data in transit is protected with TLS 1.3; "
                "TLS 1.2 is the minimum we accept from legacy partner systems.",
                "Encryption keys are held in a cloud hardware security module (HSM) and rotated "
                "every 90 days. Staff laptops use full-disk encryption, and a laptop that has "
                "not checked in for 30 days is locked remotely.",
            ),
        ),
        (
            "3. Access control",
            (
                "All staff sign in through single sign-on with multi-factor authentication; "
                "administrators must use hardware security keys. Access is role-based and "
                "follows least privilege: store staff see only the orders of their own store.",
                "Managers review every access right quarterly. Privileged access to production "
                "is granted just in time, for at most 4 hours, and every session is logged. "
                "Accounts of leavers are disabled by 18:00 on their last working day.",
            ),
        ),
    ),
    (
        (
            "4. Incident response",
            (
                "Our Security Officer, Elif Kaya, owns the incident response plan. A security "
                "engineer is on call 24/7, and a SEV1 incident is acknowledged within 15 "
                "minutes.",
                "If a breach of personal data is confirmed, we notify affected customers within "
                "48 hours and the Dutch Data Protection Authority within 72 hours, as the GDPR "
                "requires. Every incident ends with a written post-incident review within 10 "
                "business days. We rehearse the plan in a tabletop exercise twice a year.",
            ),
        ),
        (
            "5. Backups and retention",
            (
                "Encrypted backups are taken daily, stored in a second region and kept for 35 "
                "days. We test a full restore every month. Order records are kept for 7 years, "
                "as tax law requires; marketing data is deleted after 24 months without "
                "activity.",
            ),
        ),
        (
            "6. Contact",
            (
                f"Report a vulnerability or ask about this whitepaper at security@{EMAIL_DOMAIN}. "
                "We acknowledge reports within 2 business days.",
            ),
        ),
    ),
)


class _WhitepaperPdf(FPDF):
    """FPDF with a page-number footer; fpdf2 calls ``footer`` as each page closes."""

    def footer(self) -> None:
        self.set_y(-15)
        self.set_font("Helvetica", style="I", size=9)
        self.cell(0, 6, f"Page {self.page_no()} of {{nb}}", align="C")


def build_security_whitepaper_pdf() -> bytes:
    """Returns the two-page data-protection whitepaper as PDF bytes with a text layer.

    The creation date is fixed, so fpdf2's metadata and file id are the same on every run.
    """
    pdf = _WhitepaperPdf(format="A4")
    pdf.set_auto_page_break(auto=True, margin=20)
    pdf.set_creation_date(DOCUMENT_DATE)
    pdf.set_title(WHITEPAPER_TITLE)
    pdf.set_author(f"{CLIENT_NAME} Security Team")
    pdf.set_margins(left=20, top=20, right=20)
    for page_number, sections in enumerate(WHITEPAPER_PAGES, start=1):
        pdf.add_page()
        if page_number == 1:
            pdf.set_font("Helvetica", style="B", size=16)
            pdf.multi_cell(0, 8, WHITEPAPER_TITLE, new_x=XPos.LMARGIN, new_y=YPos.NEXT)
            pdf.ln(4)
        for heading, paragraphs in sections:
            pdf.set_font("Helvetica", style="B", size=13)
            pdf.cell(0, 8, heading, new_x=XPos.LMARGIN, new_y=YPos.NEXT)
            pdf.set_font("Helvetica", size=11)
            for text in paragraphs:
                pdf.multi_cell(0, 6, text, new_x=XPos.LMARGIN, new_y=YPos.NEXT)
                pdf.ln(3)
    return bytes(pdf.output())


# --------------------------------------------------------------------------------------------
# 5. Contacts (CSV)
# --------------------------------------------------------------------------------------------

CONTACTS_HEADER: tuple[str, ...] = ("name", "role", "team", "email", "phone", "office")
# (name, role, team, phone, office); the email is derived from the name.
CONTACTS: tuple[tuple[str, str, str, str, str], ...] = (
    ("Marit de Boer", "Chief Executive Officer", "Leadership", "+31 30 555 0101", "Utrecht HQ"),
    ("Jonas Verhoeven", "Finance Director", "Finance", "+31 30 555 0102", "Utrecht HQ"),
    (
        "Priya Raman",
        "Head of People & Culture",
        "People & Culture",
        "+31 30 555 0103",
        "Utrecht HQ",
    ),
    ("Tomasz Nowak", "IT Service Desk Lead", "IT", "+31 30 555 0104", "Utrecht HQ"),
    ("Elif Kaya", "Security Officer", "IT", "+31 30 555 0105", "Utrecht HQ"),
    ("Sander Jacobs", "Head of Engineering", "Product", "+31 30 555 0106", "Utrecht HQ"),
    ("Lotte Maes", "Workshop Manager", "Workshop", "+31 30 555 0107", "Utrecht HQ"),
    ("Noor Vermeulen", "Warranty Team Lead", "Customer Service", "+31 30 555 0108", "Utrecht HQ"),
    ("Daan Smit", "Customer Service Agent", "Customer Service", "+31 30 555 0109", "Utrecht HQ"),
    ("Ruben Jansen", "Marketing Manager", "Marketing", "+31 30 555 0110", "Utrecht HQ"),
    ("Fenna Bakker", "Store Manager", "Retail", "+31 10 555 0201", "Rotterdam Store"),
    ("Wout Peeters", "Store Manager", "Retail", "+32 9 555 0301", "Ghent Store"),
)


def _email_for(name: str) -> str:
    first, *rest = name.lower().split()
    return f"{first}.{''.join(rest)}@{EMAIL_DOMAIN}"


def build_contacts_csv() -> bytes:
    """Returns the staff contact list as UTF-8 CSV bytes with a header row."""
    lines = [",".join(CONTACTS_HEADER)]
    for name, role, team, phone, office in CONTACTS:
        # No field contains a comma or quote, so plain joining is valid CSV and byte-stable.
        lines.append(",".join((name, role, team, _email_for(name), phone, office)))
    return ("\n".join(lines) + "\n").encode("utf-8")


# --------------------------------------------------------------------------------------------
# 6. Draft 2027 pricing memo (Markdown, pending review in the demo)
# --------------------------------------------------------------------------------------------


def _price_change_row(bike: Bike) -> str:
    proposed = PROPOSED_2027_PRICES_EUR[bike.sku]
    change = (proposed - bike.price_eur) / bike.price_eur * 100
    return (
        f"| {bike.name} | {bike.sku} | {_eur(bike.price_eur)} | {_eur(proposed)} | +{change:.1f}% |"
    )


def build_pricing_draft_md() -> bytes:
    """Returns the draft 2027 price-increase memo as UTF-8 Markdown bytes."""
    aurora_new = _eur(PROPOSED_2027_PRICES_EUR[AURORA.sku])
    rows = "\n".join(_price_change_row(bike) for bike in BIKES)
    memo = f"""\
# DRAFT: 2027 Price Increase Proposal

**Status:** Draft for leadership review. Not approved; do not share with stores or customers.
**Author:** Jonas Verhoeven, Finance Director
**Date:** 3 November 2026

## Summary

We propose raising list prices for all three bikes from 1 February 2027. The Aurora e-bike price
rises to {aurora_new} (from {_eur(AURORA.price_eur)}), the largest increase in the range.

## Proposed 2027 prices

| Model | SKU | Current price | Proposed 2027 price | Change |
|---|---|---|---|---|
{rows}

## Reasons

- Battery cell costs for the Aurora rose 11% when our supply contract was renewed.
- Our carbon frame supplier adds a 6% surcharge from January 2027.
- The 2027 wage agreement raises workshop and store pay by 4.5%.

## Customer impact

- Orders placed up to and including 31 January 2027 keep current prices.
- The 30% staff discount and free delivery stay unchanged.
- Marketing will announce the new prices to customers on 15 January 2027.

## Next steps

Leadership decides on 15 December 2026. Store managers are briefed on 10 January 2027.
"""
    return memo.encode("utf-8")


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

_BUILDERS = (
    (HANDBOOK_FILE, build_handbook_md),
    (PRODUCT_SHEET_FILE, build_product_sheet_html),
    (RETURNS_POLICY_FILE, build_returns_policy_docx),
    (SECURITY_WHITEPAPER_FILE, build_security_whitepaper_pdf),
    (CONTACTS_FILE, build_contacts_csv),
    (PRICING_DRAFT_FILE, build_pricing_draft_md),
)


def _write_if_changed(path: Path, data: bytes) -> bool:
    """Writes ``data`` to ``path`` unless the file already holds exactly those bytes."""
    if path.is_file() and path.read_bytes() == data:
        return False
    path.write_bytes(data)
    return True


def write_demo_corpus(dest: Path) -> DemoCorpus:
    """Writes the Larkspur Cycles sample corpus into ``dest``.

    Idempotent: each run produces byte-identical files, and files that already match are not
    rewritten (their modification times are kept too).

    Args:
        dest: Folder to write into; created, with parents, if missing. Other files in it are
            left alone.

    Returns:
        The written files, the draft to mark ``pending_review``, and the demo's sample queries.
    """
    dest.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    changed = 0
    for name, build in _BUILDERS:
        path = dest / name
        changed += _write_if_changed(path, build())
        files.append(path)
    logger.debug("demo corpus in %s: %d files, %d rewritten", dest, len(files), changed)
    return DemoCorpus(
        files=files,
        pending_file=dest / PRICING_DRAFT_FILE,
        queries=list(DEMO_QUERIES),
    )
