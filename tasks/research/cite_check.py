"""Does a draft sentence's citation hold it? The check a model-written draft passes sentence by
sentence before anyone reviews it.

A model writes prose and cites corpus entries (``[doc:…]``, ``[url:…]``); nothing makes it cite
the entry that says what the sentence says. `check_drafts` keeps a cited sentence only when one
of the entries it cites, together, hold it:

- every number, e-mail address and web address the sentence states is in the text of an entry
  it cites (a price, a date, a phone number no cited entry gives is never kept), and
- at least `MIN_TERM_SHARE` of the sentence's content terms (analysed: stemmed, stopwords out)
  are in the text or titles of the entries it cites.

A sentence that fails is removed from the draft and reported (`Dropped`), so the account
manager sees what the model said that its sources did not. Headings, uncited text and the
citations footer are left as they are. Pure and deterministic.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from core.models import DraftDocument, ResearchCorpus
from tasks.text.citations import CITE_OPEN, FOOTER, cite_ids_in
from tasks.text.sentences import HEADING, split_sentences
from tasks.text.sparse import analyze

MIN_TERM_SHARE = 0.5
"""The share of a sentence's content terms its cited entry must hold (numbers are held each)."""
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_WEB = re.compile(r"https?://[^\s\]\)>\"']+")


EMPTIED = (
    "> kbflow's citation check removed every cited sentence of this draft: the sources they "
    "cite do not hold them (the research run's notes list each one). Write it from the seeds."
)


@dataclass(frozen=True)
class Dropped:
    """A draft sentence its citations do not hold, and which draft it was in."""

    filename: str
    sentence: str
    cites: tuple[str, ...]
    why: str

    def note(self) -> str:
        said = " ".join(self.sentence.split())
        said = said if len(said) <= 160 else said[:159] + "…"
        return f"{self.filename}: dropped “{said}”: {self.why}"


def _without_tags(text: str, ids: Sequence[str]) -> str:
    """``text`` without its citation tags, as a reader would say it ("… 23 kg.")."""
    for cid in ids:
        text = text.replace(f"[{cid}]", " ")
    return re.sub(r"\s+([.,;:!?])", r"\1", " ".join(text.split()))


def _numbers(text: str) -> set[str]:
    return {n.replace(",", "").rstrip(".") for n in _NUMBER.findall(text)}


def why_not_held(sentence: str, cited: Sequence[tuple[str, str]]) -> str | None:
    """None when the entries ``sentence`` cites ((title, text) of each) hold it together: each
    value it states is in one of them, and they hold `MIN_TERM_SHARE` of its content terms;
    else what they do not hold. (Its citation tags are already taken out.)"""
    if not cited:
        return "it cites no source of the corpus"
    flat = " ".join(" ".join(text.split()) for _, text in cited)
    wanted = _numbers(sentence) | set(_EMAIL.findall(sentence)) | set(_WEB.findall(sentence))
    missing = sorted(v for v in wanted if v not in flat and v not in _numbers(flat))
    if missing:
        return f"the cited source does not state {', '.join(missing[:3])}"
    terms = set(analyze(sentence))
    known = set(analyze("\n".join(f"{title}\n{text}" for title, text in cited)))
    share = len(terms & known) / len(terms) if terms else 1.0
    if share < MIN_TERM_SHARE:
        return f"the cited source holds {share:.0%} of its words"
    return None


def check_draft(
    draft: DraftDocument, corpus: ResearchCorpus
) -> tuple[DraftDocument, list[Dropped]]:
    """``draft`` without the cited sentences its citations do not hold, and those sentences."""
    entries = {e.cite_id: (e.title, e.text) for e in corpus.entries}
    known = frozenset(entries)
    body, footer_at = draft.content, draft.content.find(FOOTER)
    tail = ""
    if footer_at >= 0:
        body, tail = draft.content[:footer_at], draft.content[footer_at:]
    dropped: list[Dropped] = []
    lines: list[str] = []
    for line in body.split("\n"):
        if not CITE_OPEN.search(line) or HEADING.match(line.strip()):
            lines.append(line)
            continue
        kept: list[str] = []
        for sentence in split_sentences(line) or [line]:
            ids = cite_ids_in(sentence, known)
            if not ids:
                kept.append(sentence)
                continue
            said = _without_tags(sentence, ids)
            why = why_not_held(said, [entries[c] for c in ids if c in entries])
            if why is None:
                kept.append(sentence)
            else:
                dropped.append(Dropped(draft.filename, said.strip(), tuple(ids), why))
        if kept:
            prefix = line[: len(line) - len(line.lstrip())]
            marker = re.match(r"\s*(?:[-*+]|\d+[.)])\s+", line)
            text = " ".join(s.strip() for s in kept)
            if marker and not text.lstrip().startswith(marker.group(0).strip()):
                text = marker.group(0).strip() + " " + text
            lines.append(prefix + text.lstrip())
    body_left = "\n".join(lines)
    if dropped and not CITE_OPEN.search(body_left):
        # Nothing cited is left: the draft says so rather than going out empty or uncited.
        body_left = body_left.rstrip() + f"\n\n{EMPTIED}\n\n"
    content = body_left + tail
    return (replace(draft, content=content) if dropped else draft), dropped


def check_drafts(
    drafts: Sequence[DraftDocument], corpus: ResearchCorpus
) -> tuple[tuple[DraftDocument, ...], list[Dropped]]:
    """Every draft through `check_draft`: the drafts kept, and every sentence dropped."""
    out: list[DraftDocument] = []
    dropped: list[Dropped] = []
    for draft in drafts:
        checked, gone = check_draft(draft, corpus)
        out.append(checked)
        dropped.extend(gone)
    return tuple(out), dropped
