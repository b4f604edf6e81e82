"""Research drafts on documents nobody here wrote: the walk-through's seed bundle, taken from the
shared real documents (``../shared/datasets/real-docs``): three PDFs (an IBM Redbook with a
contents table, running footers and an authors section; a four-page paper; a multi-page
essay), a DOCX, a PPTX, an HTML page, a CSV of customer contacts, and a prompt.

Nothing here is a list of expected facts (the documents were not written for kbflow, and facts
picked by someone who has read the drafts drift toward them). The checks are structural, and
each is measured against the documents' reference text (``groundtruth/<file>.md``, made by
others), not against kbflow's own rules:

- ``furniture``: draft lines that quote page furniture: a contents line (a dot leader to a page
  number), a bare page number, or a line the extracted seed repeats page after page (three
  times or more in kbflow's own unstripped extraction) that the reference text does not hold;
- ``not_in_reference``: quoted lines whose words the cited seed's reference text does not hold
  at all (extraction noise; listed for a reader, not a defect on its own: extractors differ);
- ``duplicate_quotes``: a quoted line whose words another line of the four drafts already holds;
- ``contacts``: of the people the seeds name with a role (the Redbook's authors) and the contact
  rows the CSV holds, how many the contacts draft names, with the role or company beside the
  name on the same line.

`WalkthroughResult` holds the figures and the offending lines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evals.questions import datasets_folder

REAL_DOCS = datasets_folder() / "real-docs"
SEEDS = (
    "redp5110_sampled.pdf",
    "normal_4pages.pdf",
    "multi_page.pdf",
    "word_sample.docx",
    "powerpoint_sample.pptx",
    "example_03.html",
    "csv-comma.csv",
)
PROMPT = (
    "Research our client, the DB2 for i Center of Excellence: how it protects customer data, "
    "the people to contact, and how it writes."
)
CLIENT = "DB2 for i Center of Excellence"

# People the seeds name with a role, by the words a line must hold to name them with it.
PEOPLE = {
    "Jim Bainbridge": ("consultant",),
    "Hernando Bedoya": ("specialist",),
}

_CITE = re.compile(r"\s*\[(?:doc|url|search):[^\]]+\]")
_MARKER = re.compile(r"^\s*(?:[-*+]\s+|\d+[.)]\s+|>\s*)")
_LEADER = re.compile(r"(?:\.\s?){5,}")  # a contents line's dot leader, wherever it is cut
_PAGE = re.compile(r"^\s*(?:page\s+)?(?:\d{1,4}|[ivxlc]{1,7})\s*$", re.I)
_EDGE_PAGE = re.compile(r"^(?:\d+|[ivxlc]+) | (?:\d+|[ivxlc]+)$")
_FOOTER = re.compile(r"\n---\n## Citations[ \t]*\n")


def available() -> str | None:
    """None when the shared real documents are here, else why the walk-through cannot run."""
    missing = [name for name in SEEDS if not (REAL_DOCS / "sources" / name).is_file()]
    return f"the shared real documents are missing {', '.join(missing)}" if missing else None


def seed_files() -> list[Path]:
    return [REAL_DOCS / "sources" / name for name in SEEDS]


def _words(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.casefold()))


def reference(name: str) -> str:
    """A seed's reference text (``groundtruth/<file>.md``, or ``<stem>.md`` for a PDF), as
    words."""
    folder = REAL_DOCS / "groundtruth"
    for candidate in (folder / f"{name}.md", folder / f"{Path(name).stem}.md"):
        if candidate.is_file():
            return _words(candidate.read_text(errors="replace"))
    return ""


def repeated_lines(extracted: str, times: int = 3) -> set[str]:
    """The lines (as words, page numbers aside) met ``times`` or more in one extracted text."""
    counts: dict[str, int] = {}
    for line in extracted.splitlines():
        key = _page_free(_words(line))
        if key and not line.lstrip().startswith("|"):
            counts[key] = counts.get(key, 0) + 1
    return {k for k, n in counts.items() if n >= times and len(k.split()) > 1}


def _page_free(words: str) -> str:
    """Words with page numbers aside: any number, a roman numeral at either end."""
    return re.sub(r"\d+", "#", _EDGE_PAGE.sub(" # ", words)).strip()


def quoted_lines(content: str) -> list[tuple[str, list[str]]]:
    """The body's quoted lines (list items, table rows, prose), each with the ids it cites."""
    body = _FOOTER.split(content)[0]
    out = []
    for line in body.splitlines():
        text = line.strip()
        if not text or text.startswith(("#", ">")) or re.match(r"^\|[\s:|-]+\|$", text):
            continue
        cites = re.findall(r"\[((?:doc|url|search):[^\]]+)\]", text)
        plain = _MARKER.sub("", _CITE.sub("", text)).strip(" |")
        if plain:
            out.append((plain, cites))
    return out


@dataclass
class WalkthroughResult:
    """Figures over the four drafts, and the lines behind each."""

    lines: int = 0
    furniture: list[str] = field(default_factory=list)
    not_in_reference: list[str] = field(default_factory=list)
    duplicate_quotes: list[str] = field(default_factory=list)
    people_named: dict[str, bool] = field(default_factory=dict)
    people_with_role: dict[str, bool] = field(default_factory=dict)
    csv_contacts: int = 0
    csv_contacts_named: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out |= {
            "furniture_lines": len(self.furniture),
            "not_in_reference_lines": len(self.not_in_reference),
            "duplicate_quote_lines": len(self.duplicate_quotes),
        }
        return out


def score(
    drafts: Mapping[str, str],
    cites: Mapping[str, str],
    extracted: Mapping[str, str],
    contacts_draft: str,
) -> WalkthroughResult:
    """Score the four drafts.

    Args:
        drafts: filename -> content.
        cites: citation id (``doc:<id>``) -> the seed's file name.
        extracted: seed file name -> kbflow's extracted text of it, unstripped (to tell lines
            it repeats page after page).
        contacts_draft: the contacts draft's filename.
    """
    result = WalkthroughResult()
    references = {name: reference(name) for name in set(cites.values())}
    repeated = {name: repeated_lines(text) for name, text in extracted.items()}
    said: list[str] = []
    for content in drafts.values():
        for plain, ids in quoted_lines(content):
            result.lines += 1
            words = _words(plain.rstrip("…"))
            names = [cites[i] for i in ids if i in cites]
            held = any(words and words in references.get(n, "") for n in names)
            page_free = _page_free(words)
            footer = any(
                page_free in line for n in names for line in repeated.get(n, set())
            )  # a footer's piece: the sentence splitter may cut "… reserved. iii" in two
            if _LEADER.search(plain) or _PAGE.match(plain) or (footer and not held):
                result.furniture.append(plain)
            elif names and not held and all(references.get(n) for n in names):
                result.not_in_reference.append(plain)
            if len(words.split()) >= 4 and any(words in s or s in words for s in said):
                result.duplicate_quotes.append(plain)
            said.append(words)
    contacts = drafts.get(contacts_draft, "")
    for person, roles in PEOPLE.items():
        lines = [ln for ln in contacts.splitlines() if person in ln]
        result.people_named[person] = bool(lines)
        result.people_with_role[person] = any(
            any(role in ln.casefold() for role in roles) for ln in lines
        )
    rows = _csv_contacts()
    result.csv_contacts = len(rows)
    result.csv_contacts_named = sum(
        any(first in ln and last in ln and (company in ln or email in ln)
            for ln in contacts.splitlines())
        for first, last, company, email in rows
    )  # fmt: skip
    return result


def _csv_contacts() -> Sequence[tuple[str, str, str, str]]:
    import csv

    path = REAL_DOCS / "sources" / "csv-comma.csv"
    with path.open(newline="") as handle:
        return [
            (r["First Name"], r["Last Name"], r["Company"], r["Email"])
            for r in csv.DictReader(handle)
        ]
