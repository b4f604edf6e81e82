"""The account manager's prompts as steering for the offline synthesizer: what to focus on, what
to leave out, who the audience is. A prompt is an instruction, never a source: no prompt
sentence is ever quoted in a draft.

A prompt is read sentence by sentence for three kinds of directive (any number per prompt):

- *focus*: "Focus on the handbook's safety rules and the price list", "Emphasise allergens",
  "Pay attention to ...", "Prioritise ...";
- *leave out*: "Leave out the revenue figures", "Don't include ...", "Exclude ...", "Omit ...",
  "Don't mention ...";
- *audience*: "Audience: site buyers", "Written for ...", "Aimed at ...".

Each directive's object is split into phrases ("the handbook's safety rules", "the price
list"). A phrase may name a seed, by its title or file name ("the handbook", "the price list")
or by its format ("the PDF", "the spreadsheet"); its other words are content terms that a
sentence (with the headings above it and its table's header) must all contain to match. Focus
and audience matches raise a sentence's scores; a leave-out match drops the sentence (or the
whole table, when its header or heading matches). Sentences of the prompt that are none of
these are not used.

Example::

    steering = Steering.from_corpus(corpus)
    steering.leaves_out(sentence)  # True for "Revenue | 2024 | ..." after "Leave out revenue"
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from core.models import CorpusEntry, ResearchCorpus
from tasks.text.sentences import split_sentences

PROMPT_SOURCE = "am_prompt"

FOCUS_BONUS = 0.15  # a sentence about a focus term
SEED_FOCUS_BONUS = 0.08  # a sentence of a seed the prompt names
AUDIENCE_BONUS = 0.05  # a sentence about the audience the prompt names

_VERB_FOCUS = (
    r"focus(?:ing)?\s+(?:on|upon)|concentrate\s+on|emphasi[sz]e|prioriti[sz]e|"
    r"pay\s+(?:special\s+|particular\s+|close\s+)?attention\s+to|highlight|"
    r"make\s+sure\s+(?:to|you)\s+(?:include|cover)|be\s+sure\s+to\s+(?:include|cover)"
)
_VERB_LEAVE_OUT = (
    r"leave\s+out|leave\s+aside|(?:do\s+not|don'?t|never)\s+(?:include|mention|use|cover|quote)|"
    r"exclude|omit|skip|ignore|nothing\s+(?:about|on)"
)
_VERB_AUDIENCE = (
    r"(?:target\s+)?audiences?\s*(?::|is|are)|written\s+for|aimed\s+at|"
    r"(?:the\s+)?readers?\s+(?:is|are)|for\s+an\s+audience\s+of"
)
_DIRECTIVE = re.compile(
    rf"\b(?:(?P<focus>{_VERB_FOCUS})|(?P<leave>{_VERB_LEAVE_OUT})|(?P<audience>{_VERB_AUDIENCE}))"
    r"(?:\s+|\s*(?=:)|$)",
    re.I,
)
_SPLIT_PHRASES = re.compile(r"\s*(?:[,;]|\band\b|\bor\b|\bas well as\b|\bplus\b|\bbut\b)\s*", re.I)
_WORD = re.compile(r"[a-z0-9]+(?:'s)?", re.I)

# words that say nothing about what a phrase is about
_STOP = frozenset(
    """a an the on in of about to for from at by with our their its his her your my this that
    these those all any some every each it them they we you anything everything section
    sections part parts rules rule information info details detail content contents material
    materials things stuff figures figure numbers number facts fact mentions mention points
    point topic topics bits items item text lines line page pages please also only too
    especially mostly mainly really very more most less least service services""".split()  # noqa: SIM905
)

# how an AM names a seed by its format
_FORMATS: dict[str, tuple[str, ...]] = {
    "pdf": (".pdf",),
    "pdfs": (".pdf",),
    "spreadsheet": (".xlsx", ".xls", ".csv", ".ods"),
    "spreadsheets": (".xlsx", ".xls", ".csv", ".ods"),
    "excel": (".xlsx", ".xls"),
    "xlsx": (".xlsx",),
    "workbook": (".xlsx", ".xls", ".ods"),
    "csv": (".csv",),
    "docx": (".docx",),
    "slides": (".pptx",),
    "deck": (".pptx",),
    "presentation": (".pptx",),
    "webpage": (".html", ".htm"),
}


def stem(word: str) -> str:
    """A crude stem, enough to match "handling" with "handle" and "prices" with "price"."""
    word = word.lower().removesuffix("'s")
    for suffix in ("ing", "es", "ed", "s", "e"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            return word[: -len(suffix)]
    return word


def stems(text: str) -> frozenset[str]:
    return frozenset(stem(w) for w in _WORD.findall(text))


def _name_stems(entry: CorpusEntry) -> tuple[frozenset[str], frozenset[str]]:
    """The stems of an entry's title and of its file name (without the extension)."""
    path = urlsplit(entry.uri).path if entry.uri else ""
    name = PurePosixPath(path).stem if path else ""
    return stems(entry.title) - _STOP_STEMS, stems(name.replace("-", " ").replace("_", " "))


_STOP_STEMS = frozenset(stem(w) for w in _STOP)


@dataclass(frozen=True)
class Term:
    """One phrase of a directive: the seeds it names, and the content stems a sentence must
    hold (all of them) to match. A term with no content stems matches its seeds' sentences."""

    seeds: frozenset[str]  # cite ids
    words: frozenset[str]

    def matches(self, cite_id: str, context: frozenset[str]) -> bool:
        if self.seeds and cite_id not in self.seeds:
            return False
        return bool(self.seeds or self.words) and self.words <= context


def _terms(obj: str, entries: Sequence[CorpusEntry]) -> list[Term]:
    """The phrases of a directive's object, each resolved against the seeds it may name."""
    out = []
    for phrase in _SPLIT_PHRASES.split(obj):
        words = [w.lower().removesuffix("'s") for w in _WORD.findall(phrase)]
        words = [w for w in words if w not in _STOP]
        if not words:
            continue
        wanted = frozenset(stem(w) for w in words)
        named: set[str] = set()
        used: set[str] = set()
        for entry in entries:
            title, filename = _name_stems(entry)
            suffix = PurePosixPath(urlsplit(entry.uri).path).suffix.lower() if entry.uri else ""
            for name in (title, filename):
                if name and name <= wanted:  # "the handbook's safety rules": handbook.pdf
                    named.add(entry.cite_id)
                    used |= name
                elif len(wanted) >= 2 and wanted <= name:  # "the call notes": Kickoff call notes
                    named.add(entry.cite_id)
                    used |= wanted
            for w in words:
                if suffix and suffix in _FORMATS.get(w, ()):
                    named.add(entry.cite_id)
                    used.add(stem(w))
        out.append(Term(frozenset(named), wanted - used - {stem(w) for w in _FORMATS}))
    return out


@dataclass(frozen=True)
class Steering:
    """What the prompts ask: focus terms, terms to leave out, audience terms."""

    focus: tuple[Term, ...] = ()
    leave_out: tuple[Term, ...] = ()
    audience: tuple[Term, ...] = ()

    @classmethod
    def from_corpus(cls, corpus: ResearchCorpus) -> Steering:
        """The steering of every prompt entry of ``corpus`` (none: no steering)."""
        sources = [e for e in corpus.entries if e.source != PROMPT_SOURCE]
        prompts = [e.text for e in corpus.entries if e.source == PROMPT_SOURCE]
        return cls.parse(prompts, sources)

    @classmethod
    def parse(cls, prompts: Iterable[str], entries: Sequence[CorpusEntry] = ()) -> Steering:
        """Directives of ``prompts``, their seed names resolved against ``entries``."""
        kinds: dict[str, list[Term]] = {"focus": [], "leave": [], "audience": []}
        for prompt in prompts:
            for sentence in _directive_sentences(prompt):
                marks = list(_DIRECTIVE.finditer(sentence))
                for n, mark in enumerate(marks):
                    end = marks[n + 1].start() if n + 1 < len(marks) else len(sentence)
                    obj = sentence[mark.end() : end].strip(" :.!?")
                    kinds[mark.lastgroup or "focus"].extend(_terms(obj, entries))
        return cls(tuple(kinds["focus"]), tuple(kinds["leave"]), tuple(kinds["audience"]))

    def __bool__(self) -> bool:
        return bool(self.focus or self.leave_out or self.audience)

    def bonus(self, cite_id: str, context: str) -> float:
        """What the prompts add to a sentence's scores (its text, headings and table header
        in ``context``)."""
        found = stems(context)
        total = 0.0
        if any(t.words and t.matches(cite_id, found) for t in self.focus):
            total += FOCUS_BONUS
        if any(cite_id in t.seeds for t in self.focus):
            total += SEED_FOCUS_BONUS
        if any(t.words and t.matches(cite_id, found) for t in self.audience):
            total += AUDIENCE_BONUS
        return total

    def focuses(self, cite_id: str, context: str) -> bool:
        """Whether a focus term (or a seed the prompt focuses on) matches the sentence."""
        found = stems(context)
        return any(t.matches(cite_id, found) for t in self.focus)

    def leaves_out(self, cite_id: str, context: str) -> bool:
        """Whether a prompt asks to leave this sentence (or its seed) out."""
        found = stems(context)
        return any(t.matches(cite_id, found) for t in self.leave_out)


def _directive_sentences(prompt: str) -> list[str]:
    """A prompt's sentences, a line or bullet each at least ("Audience: ..." on its own line)."""
    return [s for line in prompt.splitlines() for s in split_sentences(line) if s.strip()]
