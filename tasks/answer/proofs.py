"""What a passage's structure proves without a model: the only two ways the offline model
(``extractive-v4`` and ``-v5``) says "answered".

- **A table cell.** The question names one row of a table (every name it gives is in that row)
  and one column (the column's header holds a word of the question, or the row has exactly one
  cell of the asked kind); the quote is the header line and that row. A superlative ("the
  cheapest") is proved by computing it over the column's numbers (`table_answer`).
- **A value in a sentence.** The question asks for a kind of value (an amount, a date, a weight,
  a count, a phone number, a name after "who" …: `tasks.answer.asks`), and one sentence, list
  item or record line states exactly one value of that kind and holds the question's subject:
  every word of every name the question gives and most of its other content words, in the
  sentence, the heading it sits under or its document's title. A count ("how many days") is
  the number followed by what it counts ("30 days"). When two passages state different values
  for it, nothing is proved.

Everything else is "maybe": the calling agent is a language model and reads the quoted
passages better than a rule would, so it gets them, each quote once, and `unproven` says in
plain English what no passage showed. Pure and deterministic: a replay re-runs it on the
recorded evidence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tasks.answer.asks import (
    _ASKING,
    KIND_NAMES,
    KIND_PATTERNS,
    QUESTION_WORDS,
    Ask,
    ask_of,
    holds_kind,
)
from tasks.answer.contract import Claim, Evidence
from tasks.answer.quotes import Unit, quote_text, units
from tasks.answer.table_answers import table_answer
from tasks.text.pii import find_pii
from tasks.text.sparse import STOPWORDS, analyze

PROOF_CELL = "table-cell"
PROOF_COMPUTED = "table-computed"
PROOF_SENTENCE = "value-in-sentence"
MIN_SUBJECT_SHARE = 0.75
"""The share of the question's subject terms (beyond its names, all required) a proving
sentence and its heading must hold."""

_VALUE_WORDS = frozenset(t for w in _ASKING for t in analyze(w))
_WHOLE_NUMBER = re.compile(
    r"\d+(?:[.,' ]\d{3})*(?:[.,]\d+)?|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|"
    r"eleven|twelve|fifteen|twenty|thirty|forty|fifty|hundred|thousand|million|billion|dozen|"
    r"half)\b",
    re.I,
)
_LABELS = re.compile(
    r"\b(?:Figure|Fig\.|Table|Tab\.|Section|Sec\.|Chapter|Appendix|Listing|Equation|Eq\.|Step|"
    r"Part|Page|p\.|No\.|no\.|Nr\.|Abb\.|Abbildung|Tabelle)\s*\d+(?:\.\d+)*[a-z]?\b"
)
"""Numbers that label rather than state ("Table 3.1", "bill no. 3139"): never the value."""
_CODES = re.compile(r"\b[A-Za-z]+[-_]?\d+\b|\b\d+[A-Za-z]+\d*\b")
_HEADING_LINE = re.compile(r"^\s*#{1,6}\s+(.*\S)\s*$")


@dataclass(frozen=True)
class Proved:
    """A claim a structure proves, and which structure (`PROOF_CELL` …)."""

    claim: Claim
    proof: str


def subject_terms(ask: Ask) -> set[str]:
    """The question's content terms that name what it is about: not its question words, not
    the words that ask for a kind of value ("price", "when")."""
    return {t for t in ask.terms if t not in _VALUE_WORDS and t not in QUESTION_WORDS}


def _names_held(ask: Ask, terms: set[str]) -> bool:
    return all(all(w in terms for w in group) for group in ask.name_groups)


def _subject_held(ask: Ask, terms: set[str]) -> bool:
    subject = subject_terms(ask)
    if not _names_held(ask, terms):
        return False
    if not subject and ask.name_groups:
        return True  # only names: all of them are there
    if not subject:  # it asks in value words alone ("the total amount of the bill"): half
        asked = {t for t in ask.terms if t not in QUESTION_WORDS}
        return bool(asked) and len(asked & terms) / len(asked) >= 0.5
    return len(subject & terms) / len(subject) >= MIN_SUBJECT_SHARE


def _heading_before(text: str, at: int) -> str:
    """The Markdown heading ``text`` puts over offset ``at`` (the nearest one above it)."""
    found = ""
    offset = 0
    for line in text.splitlines(keepends=True):
        if offset > at:
            break
        m = _HEADING_LINE.match(line)
        if m:
            found = m.group(1)
        offset += len(line)
    return found


_COUNTED = re.compile(r"\bhow\s+many\s+([\w-]+)|\bnumber\s+of\s+([\w-]+)", re.I)


def counted(ask: Ask) -> str | None:
    """The stem of what a count question counts ("how many days" -> "day"), or None."""
    m = _COUNTED.search(ask.question)
    if not m:
        return None
    stems = analyze(m.group(1) or m.group(2))
    return stems[0] if stems else None


def _counts(text: str, value: str, noun: str) -> bool:
    """``value`` (a number ``text`` states) is followed, within three words, by ``noun``:
    "30 days" counts days; "six distinct categories" does not count pages."""
    for m in re.finditer(re.escape(value), text, re.I):
        after = text[m.end() :].split()[:3]
        if noun in analyze(" ".join(after)):
            return True
    return False


def _values(kind: str, text: str, question: str) -> set[str]:
    """The distinct values of ``kind`` that ``text`` states (normalised), for the "exactly one"
    rule; a name counts as one when any is there (names are not told apart here)."""
    if kind == "name":
        return {"name"} if holds_kind(kind, text, question) else set()
    if kind in ("phone", "email"):
        return {
            " ".join(text[f.start : f.end].split()).lower()
            for f in find_pii(text)
            if f.kind == kind
        }
    if kind == "date":
        return {"date"} if holds_kind(kind, text, question) else set()
    text = _LABELS.sub(" ", text)
    if kind == "number":
        text = _CODES.sub(" ", text)
    pattern = _WHOLE_NUMBER if kind == "number" else KIND_PATTERNS[kind]
    return {" ".join(m.group().split()).lower() for m in pattern.finditer(text)}


def _sentence_proof(ask: Ask, evidence: Sequence[Evidence]) -> tuple[Proved | None, str | None]:
    """The first sentence that proves the asked value, or None and why not (ambiguity)."""
    hits: list[tuple[Evidence, Unit, str, frozenset[str]]] = []
    noun = counted(ask)
    for e in evidence:
        for unit in units(e.text):
            if unit.table is not None:
                continue  # a table row proves a cell, with its header (`table_answer`)
            said = quote_text(e.text, unit.spans)
            context = f"{said}\n{_heading_before(e.text, unit.span[0])}\n{e.title}"
            if not _subject_held(ask, set(analyze(context))):
                continue
            for kind in sorted(ask.kinds):
                values = _values(kind, said, ask.question)
                if kind == "number" and noun is not None:
                    values = {v for v in values if _counts(said, v, noun)}
                if len(values) == 1:
                    hits.append((e, unit, said, frozenset(values)))
                    break
    if not hits:
        return None, None
    distinct = {v for *_, v in hits}
    if len(distinct) > 1:
        shown = sorted({next(iter(v)) for v in distinct})[:3]
        return None, f"the passages state different values for it ({', '.join(shown)})"
    e, unit, said, _ = hits[0]
    claim = Claim(f"“{said}”", (e.chunk_id,), said, unit.spans, proof=PROOF_SENTENCE)
    return Proved(claim, PROOF_SENTENCE), None


def _column_asked(ask: Ask, claim: str, row_terms: set[str]) -> bool:
    """The chosen column's header holds every word the question asks with beyond the row's
    (``claim`` starts with that header: `table_answer`); words that only ask for a kind of
    value ("cost" against a "Price" column) may be missing from it."""
    header = set(analyze(claim.split(" (", 1)[0]))
    asked = {t for t in ask.terms if t not in row_terms and t not in QUESTION_WORDS}
    missing = asked - header
    return not missing or (missing <= _VALUE_WORDS and not (asked - _VALUE_WORDS - header))


def _table_proof(ask: Ask, evidence: Sequence[Evidence]) -> Proved | None:
    got = table_answer(ask, [(e.chunk_id, e.text) for e in evidence])
    if got is None:
        return None
    text = next(e.text for e in evidence if e.chunk_id == got.chunk_id)
    quoted = quote_text(text, got.spans)
    if not got.computed:
        row = quoted.splitlines()[-1]
        title = next(e.title for e in evidence if e.chunk_id == got.chunk_id)
        context = f"{row}\n{_heading_before(text, got.spans[-1][0])}\n{title}"
        if not _names_held(ask, set(analyze(context))):
            return None  # the row names only part of what the question names
        if not _column_asked(ask, got.text, set(analyze(context))):
            return None  # the column holds only part of what the question asks
    proof = PROOF_COMPUTED if got.computed else PROOF_CELL
    claim = Claim(got.text, (got.chunk_id,), quoted, got.spans, got.computed, proof=proof)
    return Proved(claim, proof)


_EXPLAINS = re.compile(
    r"^\s*(?:why\b|how\s+(?:do|does|did|can|could|should|would|is|are|was|were|to)\b)", re.I
)


def explains(ask: Ask) -> bool:
    """The question asks for an explanation or a way ("why …", "how does …"): no value or
    cell is its whole answer, whatever values it mentions."""
    return _EXPLAINS.search(ask.question) is not None


def prove(ask: Ask, evidence: Sequence[Evidence]) -> tuple[Proved | None, str]:
    """The claim a structure of ``evidence`` proves for ``ask``, or None; and, when none, what
    no passage showed (`unproven`)."""
    if explains(ask):
        return None, unproven(ask)
    table = _table_proof(ask, evidence)
    if table is not None:
        return table, ""
    if ask.kinds and not ask.extreme:
        found, ambiguous = _sentence_proof(ask, evidence)
        if found is not None:
            return found, ""
        if ambiguous:
            return None, ambiguous
    return None, unproven(ask)


def _subject_words(ask: Ask) -> str:
    """The question's own words for its subject, in its order ("Meridian gravel bike")."""
    subject = subject_terms(ask) | {w for g in ask.name_groups for w in g}
    said = [w for w in re.findall(r"[\w][\w'’.-]*", ask.question)
            if set(analyze(w)) & subject and w.lower() not in STOPWORDS]  # fmt: skip
    return " ".join(dict.fromkeys(said))


def unproven(ask: Ask) -> str:
    """Why nothing is proved, in plain English, naming what is missing."""
    subject = _subject_words(ask)
    about = f" for “{subject}”" if subject else ""
    if explains(ask):
        return (
            "the question asks why or how, which kbflow answers only with a model to read; "
            "read the quoted passages"
        )
    if ask.extreme:
        return (
            f"no table of the passages lets kbflow compute the {ask.superlative}{about}; "
            "read the quoted passages"
        )
    if ask.kinds:
        wanted = " or ".join(sorted(KIND_NAMES[k] for k in ask.kinds))
        return (
            f"no sentence or table row of the passages states {wanted}{about}; "
            "read the quoted passages"
        )
    return (
        "the question asks for more than a value or a table cell, which kbflow proves only "
        "with a model to read; read the quoted passages"
    )


def judge_proved(question: str, claims: Sequence[Claim], evidence: Sequence[Evidence]) -> Any:
    """The offline model's verdict: "answered" with the proved claims when a structure proves
    one, else "maybe" with every claim as evidence and what no passage showed."""
    from tasks.answer.support import Judgement

    proved = tuple(c for c in claims if c.proof)
    if proved:
        return Judgement(True, proved)
    _, why = prove(ask_of(question), evidence)
    return Judgement(False, tuple(claims), why or unproven(ask_of(question)))
