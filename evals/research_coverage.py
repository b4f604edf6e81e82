"""Fact coverage of research drafts: does each fact of a seed bundle land in the right draft,
cited to the seed that holds it?

A bundle (``evals/research_bundles/<name>/seeds``) is the material an account manager might hand
over for a fictitious client, written for this eval; its ``expected_facts.jsonl`` lists what a
good set of drafts must carry, one fact a line: the draft it belongs in, the seed file that holds
it and a regular expression that must match one unit of that draft (see below; case-insensitive,
whitespace collapsed): a product's name with its price, a contact's phone number, a retention
period. A fact marked ``"absent": true`` is one the bundle's prompt asks to leave out: no draft
may hold it. Three bundles:

- ``cider`` (`CIDER`, 39 facts): a cider maker's brand guide (prose and do/don't lists), product
  sheet (a table, bullets, prose), legal notes (prose and a retention table), contacts CSV and
  call notes that mix every topic in prose. The offline synthesizer was improved against it.
- ``physio`` (`PHYSIO`, 23 facts): a physiotherapy clinic's HTML price list (names only in
  headings), team page with contacts in prose and numbered tone rules, and bulleted legal points.
  Written after the first round of improvements, as a check on them; 17 of its facts were found
  then, and it has informed the rules since, so it is no longer unseen.
- ``fixings`` (`FIXINGS`, 37 facts and one to leave out): a fastener distributor's PDF
  handbook (headings, prose and bullets that arrive as plain paragraphs), an XLSX workbook
  (a price list, a revenue sheet, an account team), text call notes and a Markdown voice
  note, one URL, and a steering prompt (``prompt.txt``: focus on the handbook's safety rules
  and the price list, leave out revenue figures, an audience). Many facts exist only in the
  PDF or only in the workbook. Written for the prompt-steering work (issue 32).

A bundle's optional ``prompt.txt`` (one prompt) and ``urls.txt`` (a URL a line) are seeded with
its files, as ``kbflow seed --prompt/--url`` stores them.

A fact is *found* when a unit of its draft's body (above the Citations footer) matches: a table
row, a list item or a heading line, or a whole prose paragraph (lines wrap). It is *cited* when
that same unit cites the seed that holds it (``[doc:<id>]``): a row's Source column, the item's
own tag, a tag in the paragraph. It is *misfiled* when a unit of another draft matches it.

Beyond coverage, over the four drafts' factual units (list items, table rows, prose
paragraphs; not headings, not the extractive drafts' "> " note): *precision* is the share that
cite a seed or fetched source and quote no prompt sentence; a unit that cites a prompt or holds
one of its sentences is a *prompt sentence quoted as fact*; a *duplicated block* is a list
item, paragraph or table (any of its rows) that some earlier block of the four drafts already
holds (compared without markers and citations).

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
from collections.abc import Collection, Mapping, Sequence
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
    absent: bool = False  # the prompt asks to leave it out: no draft may hold it

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
class Placement:
    """What the four drafts' factual units are made of (see the module's docstring)."""

    factual: int = 0  # list items, table rows, prose paragraphs
    from_sources: int = 0  # citing a seed or fetched source, quoting no prompt sentence
    prompt_quoted: int = 0
    duplicated_blocks: int = 0
    left_out_found: tuple[str, ...] = ()  # ids of "absent" facts some draft holds

    @property
    def precision(self) -> float:
        return self.from_sources / self.factual if self.factual else 0.0


@dataclass(frozen=True)
class Coverage:
    facts: tuple[FactResult, ...]
    placement: Placement = Placement()

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

    def misfiled(self) -> list[str]:
        """Ids of the facts a draft other than their own holds (a service line among the
        compliance risks), whether or not their own draft holds them too."""
        return [f.id for f in self.facts if any(d != f.draft for d in f.found_in)]

    def to_dict(self) -> dict[str, Any]:
        p = self.placement
        return {
            "facts": self.total,
            "found": self.found,
            "cited": self.cited,
            "found_ratio": round(self.found_ratio, 4),
            "cited_ratio": round(self.cited_ratio, 4),
            "factual_units": p.factual,
            "from_sources": p.from_sources,
            "precision": round(p.precision, 4),
            "prompt_quoted": p.prompt_quoted,
            "duplicated_blocks": p.duplicated_blocks,
            "misfiled": len(self.misfiled()),
            "misfiled_ids": self.misfiled(),
            "left_out_found": list(p.left_out_found),
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

    def prompts(self) -> tuple[str, ...]:
        """The AM's prompt (``prompt.txt``), if the bundle has one."""
        path = self.folder / "prompt.txt"
        return (path.read_text().strip(),) if path.is_file() else ()

    def urls(self) -> tuple[str, ...]:
        """The URLs the AM seeds (``urls.txt``, one a line), if any."""
        path = self.folder / "urls.txt"
        return tuple(path.read_text().split()) if path.is_file() else ()


CIDER = Bundle("cider", "Saltmarsh Cider Co.")
PHYSIO = Bundle("physio", "Brightline Physio")
FIXINGS = Bundle("fixings", "Halden Fixings")
BUNDLES_ALL = (CIDER, PHYSIO, FIXINGS)


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
    drafts: Mapping[str, str],
    seed_cites: Mapping[str, str],
    facts: Sequence[Fact],
    prompts: Sequence[str] = (),
    prompt_cites: Collection[str] = (),
) -> Coverage:
    """Score four drafts (filename -> Markdown) against ``facts``.

    Args:
        drafts: each draft's whole content, footer included.
        seed_cites: seed file name -> the citation id the run gave it (``doc:<id>``).
        facts: from `load_facts`.
        prompts: the AM's prompts, whose sentences no draft may quote as facts.
        prompt_cites: the citation ids the run gave the prompts.
    """
    bodies = {name: _body(content) for name, content in drafts.items()}
    units = {name: _units(body) for name, body in bodies.items()}
    results = []
    left_out = []
    for fact in facts:
        found_in = tuple(
            name for name, texts in units.items() if any(fact.matches(t) for t in texts)
        )
        if fact.absent:
            left_out += [fact.id] if found_in else []
            continue
        tag = f"[{seed_cites[fact.seed]}]"
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
    placement = _placement(bodies, prompts, frozenset(prompt_cites), tuple(left_out))
    return Coverage(tuple(results), placement)


_CITE = re.compile(r"\[((?:doc|url|search):[^\]]+)\]")
_MARKER = re.compile(r"^\s*(?:[-*+]\s+|\d+[.)]\s+)")
_TABLE_RULE = re.compile(r"^\|(?:\s*:?-{3,}:?\s*\|)+$")


def _blocks(body: str) -> list[list[str]]:
    """The body's factual blocks, each a list of units: a table's data rows (its header and
    separator left out), a list item, a prose paragraph. Headings and "> " notes are not
    facts."""
    lines = body.splitlines()
    blocks: list[list[str]] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line or line.startswith(("#", ">")) or re.fullmatch(r"[-*_=]+", line):
            i += 1
        elif line.startswith("|"):
            end = i
            while end < len(lines) and lines[end].strip().startswith("|"):
                end += 1
            rows = [r.strip() for r in lines[i:end]]
            has_header = len(rows) > 1 and _TABLE_RULE.match(rows[1].replace(" ", ""))
            blocks.append(rows[2:] if has_header else rows)
            i = end
        elif _MARKER.match(line):
            blocks.append([line])
            i += 1
        else:
            end = i
            while end < len(lines) and lines[end].strip() and not _TABLE_OR_ITEM.match(lines[end]):
                end += 1
            blocks.append([" ".join(x.strip() for x in lines[i:end])])
            i = max(end, i + 1)
    return [b for b in blocks if b]


def _plain(text: str) -> str:
    """A unit compared as text: no list marker, citations, cell bars or case."""
    text = _CITE.sub(" ", _MARKER.sub("", text))
    text = re.sub(r"\s*\|\s*", " ", text)
    return " ".join(text.split()).strip(" .").casefold()


def _prompt_sentences(prompts: Sequence[str]) -> list[str]:
    """Each prompt's sentences and lines (three words or more), compared as `_plain` text."""
    out = []
    for prompt in prompts:
        for part in re.split(r"(?<=[.!?])\s+|\n+", prompt):
            plain = _plain(part)
            if len(plain.split()) >= 3:
                out.append(plain[:60])  # a clipped quote ("Focus on …") still counts
    return out


def _placement(
    bodies: Mapping[str, str],
    prompts: Sequence[str],
    prompt_cites: frozenset[str],
    left_out: tuple[str, ...],
) -> Placement:
    quoted = _prompt_sentences(prompts)
    seen: set[str] = set()
    factual = from_sources = prompt_quoted = duplicated = 0
    for body in bodies.values():
        for block in _blocks(body):
            keys = [_plain(unit) for unit in block]
            duplicated += any(key and key in seen for key in keys)
            seen.update(k for k in keys if k)
            for unit, key in zip(block, keys, strict=True):
                cites = set(_CITE.findall(unit))
                from_prompt = bool(cites & prompt_cites) or any(q in key for q in quoted)
                factual += 1
                prompt_quoted += from_prompt
                from_sources += bool(cites - prompt_cites) and not from_prompt
    return Placement(factual, from_sources, prompt_quoted, duplicated, left_out)


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
