"""The synthesis contract: what a synthesizer is, the four drafts' names, their citation footer and
how they are validated; token estimates and the research model.

Synthesizers: :mod:`tasks.research.extractive` (offline) and :mod:`tasks.research.claude`."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import Protocol

from core.errors import SynthesisInvalid
from core.models import KB_FILENAMES, DraftDocument, ResearchCorpus, SynthesisResult
from tasks.text.citations import FOOTER, cite_ids_in
from tasks.text.sentences import HEADING, LIST_ITEM

log = logging.getLogger(__name__)


BRAND_VOICE, PRODUCT, COMPLIANCE, CONTACTS = KB_FILENAMES


DEFAULT_MODEL = "claude-haiku-4-5"


MODEL_ENV = "KB_RESEARCH_MODEL"


_FOOTER_RE = re.compile(r"(?:^|\n)---\n## Citations[ \t]*(?:\n|$)")


DOC_TITLES: dict[str, str] = {
    BRAND_VOICE: "Brand voice playbook",
    PRODUCT: "Product context",
    COMPLIANCE: "Compliance notes",
    CONTACTS: "Key contacts",
}


def estimate_tokens(text: str) -> int:
    """Rough token count of ``text``: characters / 4, rounded up.

    An *estimate* for budgets (English prose averages ~4 characters per token with Claude's
    and MiniLM's tokenizers); never use it where an exact count matters.
    """
    return (len(text) + 3) // 4


def resolve_model(request_model: str | None) -> str:
    """The synthesis model to use: the request's, else ``$KB_RESEARCH_MODEL``, else the default."""
    for candidate in (request_model, os.environ.get(MODEL_ENV)):
        if candidate and candidate.strip():
            return candidate.strip()
    return DEFAULT_MODEL


class Synthesizer(Protocol):
    """Writes the four draft KB documents from a research corpus."""

    model_id: str

    def synthesize(self, corpus: ResearchCorpus, *, max_output_tokens: int) -> SynthesisResult: ...


def _citations_in(text: str, known: frozenset[str]) -> list[str]:
    """Every cited id in ``text``, in order (`tasks.text.citations.cite_ids_in`)."""
    return cite_ids_in(text, known)


def short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _check_document(doc: DraftDocument, known: frozenset[str]) -> list[str]:
    name = doc.filename
    if not doc.content.strip():
        return [f"{name}: content is empty"]
    footers = list(_FOOTER_RE.finditer(doc.content))
    if not footers:
        return [
            f"{name}: missing the citations footer — end the document with "
            f"'---' and '## Citations' lines, then one '- [<id>] <title>' line per cited id"
        ]
    body, footer = doc.content[: footers[-1].start()], doc.content[footers[-1].end() :]
    problems: list[str] = []
    body_ids = _citations_in(body, known)
    footer_ids = _citations_in(footer, known)
    for cid in dict.fromkeys(body_ids + footer_ids):
        if cid not in known:
            problems.append(f"{name}: cites [{cid}], which is not an id of the research corpus")
    if not body_ids:
        problems.append(f"{name}: cites nothing — every document needs at least one citation")
    for cid in dict.fromkeys(body_ids):
        if cid in known and cid not in footer_ids:
            problems.append(f"{name}: cites [{cid}] but its Citations footer does not list it")
    for line in footer.splitlines():
        if line.strip() and not _citations_in(line, known):
            problems.append(
                f"{name}: footer line {short(line)!r} is not a '- [<id>] <title>' citation"
            )
    if name == BRAND_VOICE:
        problems.extend(_check_examples(name, body, known))
    return problems


def _check_examples(name: str, body: str, known: frozenset[str]) -> list[str]:
    """Every list item under a heading that mentions "example" must cite its source."""
    problems = []
    path: list[tuple[int, str]] = []  # (level, heading text) of the enclosing headings
    for number, line in enumerate(body.splitlines(), start=1):
        heading = HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            path = [(lv, text) for lv, text in path if lv < level] + [(level, heading.group(2))]
            continue
        in_examples = any("example" in text.lower() for _, text in path)
        if in_examples and LIST_ITEM.match(line) and not _citations_in(line, known):
            problems.append(
                f"{name} line {number}: example {short(line.strip())!r} has no citation"
            )
    return problems


def validate_drafts(
    docs: Sequence[DraftDocument], corpus: ResearchCorpus
) -> tuple[DraftDocument, ...]:
    """Check drafts against the synthesis contract; return them in ``KB_FILENAMES`` order.

    Raises:
        SynthesisInvalid: naming every problem found (count, file names, empty content, footer,
            unknown or missing citations, uncited brand-voice examples).
    """
    known = corpus.cite_ids()
    problems: list[str] = []
    if len(docs) != len(KB_FILENAMES):
        problems.append(
            f"expected exactly {len(KB_FILENAMES)} documents ({', '.join(KB_FILENAMES)}), "
            f"got {len(docs)}"
        )
    seen: dict[str, DraftDocument] = {}
    for doc in docs:
        if doc.filename not in KB_FILENAMES:
            problems.append(
                f"unexpected filename {doc.filename!r}: use exactly {', '.join(KB_FILENAMES)}"
            )
        elif doc.filename in seen:
            problems.append(f"duplicate filename {doc.filename!r}")
        else:
            seen[doc.filename] = doc
            problems.extend(_check_document(doc, known))
    missing = [name for name in KB_FILENAMES if name not in seen]
    if missing and len(docs) == len(KB_FILENAMES):
        problems.append(f"missing document(s): {', '.join(missing)}")
    if problems:
        raise SynthesisInvalid(
            f"draft KB documents for {corpus.client_name!r} are invalid "
            f"({len(problems)} problem{'s' if len(problems) > 1 else ''}): " + "; ".join(problems)
        )
    return tuple(seen[name] for name in KB_FILENAMES)


def render_document(
    title: str, sections: Sequence[tuple[str, Sequence[str]]], titles: dict[str, str]
) -> str:
    """Markdown for one document: ``# title``, ``## section`` blocks, then the citation footer.

    ``titles`` maps each corpus id to its entry title; the footer lists the ids the body cites,
    in order of first citation.
    """
    parts = [f"# {title}\n"]
    for heading, lines in sections:
        block = "\n".join(lines)
        parts.append(f"## {heading}\n\n{block}\n" if heading else f"{block}\n")
    body = "\n".join(parts)
    cited = dict.fromkeys(_citations_in(body, frozenset(titles)))
    footer = "\n".join(f"- [{cid}] {short(titles.get(cid, cid), 200)}" for cid in cited)
    return f"{body}\n{FOOTER}{footer}\n"
