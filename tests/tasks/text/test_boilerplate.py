"""Page furniture leaves extracted text; everything else stays as written."""

from __future__ import annotations

from tasks.text.boilerplate import is_toc_line, strip_boilerplate

# Shaped like a technical PDF's text after extraction: a contents table with dot leaders, a
# running footer with the page number on every page, a copyright line per page, bare page
# numbers, and real content in between (a table, a list, a sentence said twice on purpose).
CONTENTS_TABLE = """\
## Row and Column Access Control Support in IBM DB2 for i

| Notices . . . . . . . . . . . . . . . . . . . . . . . | . vii |
| - | - |
| Trademarks . . . . . . . . . . . . . . . . . . . . . | viii |
| Preface . . . . . . . . . . . . . . . . . . . . . . . | . xi |
| Chapter 1. Securing and protecting IBM DB2 data . . . . . . | . 1 |
| 1.1 Security fundamentals. . . . . . . . . . . . . . . . | . 2 |
"""

PAGES = [
    "A column mask manifests a column value access control rule for a specific column.",
    "A teller can see only the last four digits of a tax identification number.",
    "Separation of duties simplifies the management of authorities.",
    "The RCAC administrator has the QIBM_DB_SECADM function usage ID.",
]


def _document() -> str:
    parts = [CONTENTS_TABLE]
    for n, body in enumerate(PAGES, start=3):
        parts.append(
            f"{body}\n\n"
            "| Column | Rule |\n| - | - |\n| TAX_ID | last four digits |\n\n"
            "- Define the mask\n- Activate it\n\n"
            f"Chapter 1. Securing and protecting IBM DB2 data {n}\n\n"
            "© Copyright IBM Corp. 2014. All rights reserved.\n\n"
            f"{n}\n"
        )
    parts.append("Contact the CoE at coe@example.com for help.\n")
    parts.append("Contact the CoE at coe@example.com for help.\n")
    return "\n".join(parts)


def test_running_footers_contents_and_page_numbers_go_and_the_content_stays() -> None:
    text = _document()
    out = strip_boilerplate(text)
    assert "Notices" not in out and "Trademarks" not in out and ". . . ." not in out
    assert "Chapter 1. Securing and protecting IBM DB2 data" not in out  # footer and TOC row
    assert "Copyright" not in out
    assert not any(line.strip().isdigit() for line in out.splitlines())
    for body in PAGES:
        assert body in out
    assert out.count("| TAX_ID | last four digits |") == len(PAGES)  # table rows are content
    assert out.count("- Define the mask") == len(PAGES)  # so are list items
    assert out.count("Contact the CoE at coe@example.com for help.") == 2  # said twice: kept
    assert "## Row and Column Access Control Support in IBM DB2 for i" in out
    assert "\n\n\n" not in out


def test_a_contents_section_of_plain_lines_goes_with_its_heading() -> None:
    text = (
        "# Handbook\n\nIntro sentence of the handbook.\n\n## Contents\n\n"
        "Pricing 3\nReturns and warranty 7\nContacts 9\n\n"
        "## Pricing\n\nThe Aurora sells for 3,490 EUR.\n"
    )
    out = strip_boilerplate(text)
    assert "Contents" not in out and "Returns and warranty 7" not in out
    assert "Intro sentence of the handbook." in out
    assert "## Pricing\n\nThe Aurora sells for 3,490 EUR.\n" in out


def test_what_only_looks_like_furniture_is_kept() -> None:
    text = (
        "Delivery takes 3 days.\n\nDelivery takes 3 days.\n\n"  # a fact twice, no page number
        "Our hotline is open from 9 to 17.\n\n"
        "| Year | Revenue |\n| - | - |\n| 2023 | 12 |\n| 2024 | 14 |\n"
    )
    assert strip_boilerplate(text) == text


def test_contents_lines_are_told_by_their_dot_leaders() -> None:
    assert is_toc_line("1.3.2 New controls: Row and Column Access Control. . . . . . . 5")
    assert is_toc_line("Preface ........................ xi")
    assert not is_toc_line("Prices rose by 5 percent in 2024.")
    assert not is_toc_line("Wait... 5 minutes.")
