"""Fact coverage of research drafts: does each fact of a seed bundle land in the right draft,
cited to the seed that holds it?

A bundle (``evals/research_bundles/<name>/seeds``) is the material an account manager might hand
over for a fictitious client, written for this eval; its ``expected_facts.jsonl`` lists what a
good set of drafts must carry, one fact a line: the draft it belongs in, the seed file that holds
it and a regular expression that must match one unit of that draft (see below; case-insensitive,
whitespace collapsed): a product's name with its price, a contact's phone number, a retention
period. Two bundles:

- ``cider`` (`CIDER`, 39 facts): a cider maker's brand guide (prose and do/don't lists), product
  sheet (a table, bullets, prose), legal notes (prose and a retention table), contacts CSV and
  call notes that mix every topic in prose. The offline synthesizer was improved against it.
- ``physio`` (`PHYSIO`, 23 facts): a physiotherapy clinic's HTML price list (names only in
  headings), team page with contacts in prose and numbered tone rules, and bulleted legal points.
  Written after the first round of improvements, as a check on them; 17 of its facts were found
  then, and it has informed the rules since, so it is no longer unseen.

A fact is *found* when a unit of its draft's body (above the Citations footer) matches: a table
row, a list item or a heading line, or a whole prose paragraph (lines wrap). It is *cited* when
that same unit cites the seed that holds it (``[doc:<id>]``): a row's Source column, the item's
own tag, a tag in the paragraph.

The cider bundle's ``claude_reply.md`` is a scripted Claude reply (the four documents, citing
``[seed:<file>]`` placeholders that `scripted_reply` replaces with the run's ids): scoring it
measures how kbflow parses and validates such a reply, not how well Claude writes.

Example::

    facts = CIDER.facts()
    result = score_drafts({d.filename: d.content for d in docs}, seed_cites, facts)
    print(result.found_ratio, result.cited_ratio)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BUNDLES = Path(__file__).resolve().parent / "research_bundles"

_FOOTER = re.compile(r"\n---\n## Citations[ \t]*\n")
_TABLE_OR_ITEM = re.compile(r"^\s*(?:\||[-*+]\s|\d+[.)]\s|#)")
_DOCUMENT = re.compile(r"^<!-- document: (\S+) \| (.+?) -->$", re.M)
_SEED_FOOTER_LINE = re.compile(r"^- \[seed:([^\]]+)\]\s*$", re.M)
_SEED_TAG = re.compile(r"\[seed:([^\]]+)\]")


@dataclass(frozen=True)
class Fact:
    """One fact of the bundle: where it must land and how to recognise it."""

    id: str
    draft: str
    seed: str
    pattern: str
    what: str

    def matches(self, line: str) -> bool:
        return re.search(self.pattern, " ".join(line.split()), re.I) is not None


@dataclass(frozen=True)
class FactResult:
    id: str
    draft: str
    seed: str
    found: bool
    cited: bool
    found_in: tuple[str, ...]  # every draft with a matching line (a misplaced fact shows here)


@dataclass(frozen=True)
class Coverage:
    facts: tuple[FactResult, ...]

    @property
    def total(self) -> int:
        return len(self.facts)

    @property
    def found(self) -> int:
        return sum(f.found for f in self.facts)

    @property
    def cited(self) -> int:
        return sum(f.cited for f in self.facts)

    @property
    def found_ratio(self) -> float:
        return self.found / self.total if self.total else 0.0

    @property
    def cited_ratio(self) -> float:
        """Facts in the right draft AND cited to their seed, over all facts."""
        return self.cited / self.total if self.total else 0.0

    def by_draft(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for f in self.facts:
            row = out.setdefault(f.draft, {"facts": 0, "found": 0, "cited": 0})
            row["facts"] += 1
            row["found"] += f.found
            row["cited"] += f.cited
        return out

    def missing(self) -> list[str]:
        """Ids of the facts not found, or found but not cited to their seed."""
        return [f.id for f in self.facts if not f.cited]

    def to_dict(self) -> dict[str, Any]:
        return {
            "facts": self.total,
            "found": self.found,
            "cited": self.cited,
            "found_ratio": round(self.found_ratio, 4),
            "cited_ratio": round(self.cited_ratio, 4),
            "by_draft": self.by_draft(),
            "per_fact": [asdict(f) for f in self.facts],
        }


def load_facts(path: Path) -> list[Fact]:
    """Expected facts, one JSON object a line."""
    return [Fact(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class Bundle:
    """A seed bundle and its expected facts."""

    name: str
    client_name: str

    @property
    def folder(self) -> Path:
        return BUNDLES / self.name

    def seed_files(self) -> list[Path]:
        """The seed files, in name order."""
        return sorted(p for p in (self.folder / "seeds").iterdir() if p.is_file())

    def facts(self) -> list[Fact]:
        return load_facts(self.folder / "expected_facts.jsonl")


CIDER = Bundle("cider", "Saltmarsh Cider Co.")
PHYSIO = Bundle("physio", "Brightline Physio")


def _units(body: str) -> list[str]:
    """The body's units, each of which must hold a fact and its citation together: a table
    row, list item or heading is one line; prose is its whole paragraph (lines wrap)."""
    lines = body.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].strip() or _TABLE_OR_ITEM.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        end = i
        while end < len(lines) and lines[end].strip() and not _TABLE_OR_ITEM.match(lines[end]):
            end += 1
        out.append(" ".join(lines[i:end]))
        i = end
    return out


def _body(content: str) -> str:
    parts = _FOOTER.split(content)
    return parts[0] if len(parts) > 1 else content


def score_drafts(
    drafts: Mapping[str, str], seed_cites: Mapping[str, str], facts: Sequence[Fact]
) -> Coverage:
    """Score four drafts (filename -> Markdown) against ``facts``.

    Args:
        drafts: each draft's whole content, footer included.
        seed_cites: seed file name -> the citation id the run gave it (``doc:<id>``).
        facts: from `load_facts`.
    """
    units = {name: _units(_body(content)) for name, content in drafts.items()}
    results = []
    for fact in facts:
        tag = f"[{seed_cites[fact.seed]}]"
        found_in = tuple(
            name for name, texts in units.items() if any(fact.matches(t) for t in texts)
        )
        hits = [text for text in units.get(fact.draft, []) if fact.matches(text)]
        results.append(
            FactResult(
                id=fact.id,
                draft=fact.draft,
                seed=fact.seed,
                found=bool(hits),
                cited=any(tag in scope for scope in hits),
                found_in=found_in,
            )
        )
    return Coverage(tuple(results))


def scripted_reply(seed_cites: Mapping[str, str], titles: Mapping[str, str]) -> str:
    """The cider bundle's scripted Claude reply (``claude_reply.md``) as the JSON object Claude
    is asked for, its ``[seed:<file>]`` placeholders replaced by the run's citation ids (footer
    lines also get the entry's title)."""
    text = (CIDER.folder / "claude_reply.md").read_text()
    marks = list(_DOCUMENT.finditer(text))
    documents = []
    for n, mark in enumerate(marks):
        end = marks[n + 1].start() if n + 1 < len(marks) else len(text)
        content = text[mark.end() : end].strip("\n") + "\n"
        content = _SEED_FOOTER_LINE.sub(
            lambda m: f"- [{seed_cites[m.group(1)]}] {titles[seed_cites[m.group(1)]]}", content
        )
        content = _SEED_TAG.sub(lambda m: f"[{seed_cites[m.group(1)]}]", content)
        documents.append({"filename": mark.group(1), "title": mark.group(2), "content": content})
    return json.dumps({"documents": documents}, ensure_ascii=False)
