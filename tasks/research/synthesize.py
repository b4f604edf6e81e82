"""Research corpus -> the four draft KB documents, every claim cited.

The contract every synthesizer meets (checked by :func:`validate_drafts`):

* exactly the four documents of ``KB_FILENAMES``, each non-empty Markdown;
* each ends with a ``---`` / ``## Citations`` footer listing one ``- [<id>] <title>`` line per
  id its body cites;
* every citation (``[doc:<id>]``, ``[url:<url>]``, ``[search:<query>]``) is an id of the corpus,
  and every document cites at least once;
* in ``brand-voice-playbook.md`` every list item under an "example" heading (golden or anti)
  carries its own citation.

Two implementations of the ``Synthesizer`` protocol (STYLE habit 4):

* :class:`ExtractiveSynthesizer` — offline and deterministic: it quotes corpus sentences,
  chosen by MiniLM similarity to what each document is for. It never writes a claim of its own.
* :class:`AnthropicSynthesizer` — one Claude Messages request (plus at most one repair request),
  with this module as the only retry layer (the SDK gets ``max_retries=0``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from core.errors import ConfigError, LlmError, SynthesisFailed, SynthesisInvalid
from core.models import KB_FILENAMES, DraftDocument, ResearchCorpus, SynthesisResult
from tasks.llm import AnthropicChat
from tasks.text.embed import Embedder
from tasks.text.sentences import HEADING, LIST_ITEM, split_sentences

log = logging.getLogger(__name__)

BRAND_VOICE, PRODUCT, COMPLIANCE, CONTACTS = KB_FILENAMES
DEFAULT_MODEL = "claude-haiku-4-5"
MODEL_ENV = "KB_RESEARCH_MODEL"
FOOTER = "---\n## Citations\n"
_FOOTER_RE = re.compile(r"(?:^|\n)---\n## Citations[ \t]*(?:\n|$)")

DOC_TITLES: dict[str, str] = {
    BRAND_VOICE: "Brand voice playbook",
    PRODUCT: "Product context",
    COMPLIANCE: "Compliance notes",
    CONTACTS: "Key contacts",
}

# An opening of a citation; the id runs to the closing bracket (see _citations_in).
_CITE_OPEN = re.compile(r"\[(?:doc|url|search):")


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


# --- validation ----------------------------------------------------------------------------


def _citations_in(text: str, known: frozenset[str]) -> list[str]:
    """Every cited id in ``text``, in order.

    Ids may themselves contain brackets (URLs, search queries), so at each opening the longest
    known id followed by ``]`` wins; an unknown id runs to the next ``]``.
    """
    found: list[str] = []
    for match in _CITE_OPEN.finditer(text):
        start = match.start() + 1
        rest = text[start:]
        hits = [cid for cid in known if rest.startswith(cid + "]")]
        if hits:
            found.append(max(hits, key=len))
        else:
            end = rest.find("]")
            found.append(rest if end < 0 else rest[:end])
    return found


def _short(text: str, limit: int = 80) -> str:
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
                f"{name}: footer line {_short(line)!r} is not a '- [<id>] <title>' citation"
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
                f"{name} line {number}: example {_short(line.strip())!r} has no citation"
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
    footer = "\n".join(f"- [{cid}] {_short(titles.get(cid, cid), 200)}" for cid in cited)
    return f"{body}\n{FOOTER}{footer}\n"


# --- extractive (offline) ------------------------------------------------------------------

# What each part of the KB is for; a sentence scores the max cosine over its purpose's phrases.
PURPOSES: dict[str, tuple[str, ...]] = {
    "voice": (
        "how the company talks to customers: tone, style, words to use and avoid",
        "our tone of voice and writing style",
        "words and phrases to use or avoid when we write",
    ),
    "product": (
        "products, services, prices, target customers, availability",
        "the products and services the company sells",
        "product prices and plans",
        "what the product does and its features",
    ),
    "audience": ("the target customers and audience", "who buys and uses our products"),
    "status": (
        "where and when the product is available",
        "launch dates, roadmap and current status",
    ),
    "compliance": (
        "legal, regulatory, privacy, safety, warranty obligations and risks",
        "privacy and personal data protection",
        "legal and regulatory requirements",
        "warranty terms and liability",
        "safety risks and obligations",
    ),
    "contacts": (
        "people, names, roles, email, phone, escalation",
        "a person's name, job title and email address",
        "who to contact or escalate problems to",
    ),
}

# Words that make a purpose more likely; MiniLM alone misreads e.g. "processed under GDPR".
_CUES: dict[str, re.Pattern[str]] = {
    "voice": re.compile(
        r"\b(tone|voice|style|wording|jargon|phrases?|words?|writ\w*|language|emoji\w*|"
        r"exclamation|formal|casual|friendly|say|greet\w*|sign[- ]off|sign off|tagline|slogan|"
        r"headline|subject lines?|repl(?:y|ies))\b",
        re.I,
    ),
    "product": re.compile(
        r"(\$|€|£|\b(price[sd]?|pricing|plans?|subscriptions?|features?|products?|services?|"
        r"sells?|offers?|models?|kits?)\b)",
        re.I,
    ),
    "audience": re.compile(
        r"\b(customers?|audiences?|users?|segments?|buyers?|clients?|homeowners?|"
        r"businesses|families|persona)\b",
        re.I,
    ),
    "status": re.compile(
        r"\b(available|availability|launch\w*|beta|roadmap|coming|discontinu\w*|"
        r"regions?|ships?|shipping|waitlist)\b",
        re.I,
    ),
    "compliance": re.compile(
        r"\b(privacy|personal data|data protection|gdpr|ccpa|hipaa|consent|regulat\w*|legal|"
        r"laws?|complian\w*|warrant\w*|guarantee\w*|liabil\w*|safety|hazard\w*|recalls?|"
        r"certif\w*|licen[cs]\w*|refunds?|disclaim\w*|insurance|risks?|prohibit\w*|fda|ftc)\b",
        re.I,
    ),
    "contacts": re.compile(r"\b(escalat\w*|on-call|contact\w*|reach (?:out|us)|call)\b", re.I),
}
_CUE_BONUS = 0.15
_MIN_SCORE = 0.25  # below this (cosine + cue bonus) a sentence is off-topic for every purpose

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_PHONE = re.compile(  # +1 503 555 0142, (503) 555-0142, 020 7946 0958 — not "2015-2020"
    r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)|\d{2,4})[\s.-]\d{3,4}[\s.-]\d{3,4}"
    r"(?:[\s.-]\d{2,4})?(?!\w)"
)
_ROLE = re.compile(
    r"\b(CEO|CTO|CFO|COO|CMO|founder|co-founder|head of|director|manager|lead|VP|"
    r"vice president|chief|owner|president|coordinator|officer|specialist|partner)\b",
    re.I,
)
_NAME = re.compile(r"\b[A-Z][a-z]+(?:[ -][A-Z][a-z]+)+\b")
_ESCALATION = re.compile(
    r"\b(escalat\w*|on-call|on call|urgent|emergenc\w*|out of hours|after hours)\b", re.I
)
# A rule against something (imperative or "we never ..."), not a story that mentions "never".
_AVOID = re.compile(
    r"^(?:please\s+)?(?:avoid|never|don't|do not|stop|steer clear|refrain)\b"
    r"|\b(?:we|you|staff|agents?)\s+(?:should\s+)?(?:never|don't|do not|must not|avoid)\b"
    r"|\b(?:instead of|rather than|not say|banned|forbidden|off-limits)\b",
    re.I,
)
_QUOTED = re.compile(r"\"[^\"]{12,}\"|“[^”]{12,}”")  # quoted copy, long enough to be an example
_QUOTES_WORDS = re.compile(
    r"\"[^\"]+\"|“[^”]+”|(?<!\w)'[^'\n]+'(?!\w)|‘[^’]+’"
)  # 'avoid "synergy"'
_EXAMPLE_LEAD = re.compile(r"^(example|e\.g\.|say|sample|for instance)\b", re.I)
_PUBLISHED = ("public_homepage", "public_x")  # sources that *are* the client's own copy

_COMPLIANCE_TOPICS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "Privacy and personal data",
        re.compile(r"\b(privacy|personal|data|gdpr|ccpa|consent|cookies?|retention|pii)\b", re.I),
    ),
    (
        "Warranty, refunds and liability",
        re.compile(r"\b(warrant\w*|guarantee\w*|refunds?|returns?|liabil\w*)\b", re.I),
    ),
    (
        "Safety",
        re.compile(r"\b(safety|safe|hazard\w*|injur\w*|fire|recalls?|electrician)\b", re.I),
    ),
    (
        "Legal and regulatory",
        re.compile(r"\b(laws?|legal|regulat\w*|complian\w*|licen[cs]\w*|permits?|claims?)\b", re.I),
    ),
)

_OTHER_RISKS = "Other flagged risks"

_MAX_SENTENCE_CHARS = 400
_MAX_LINES = 8  # per section; contact lists get more
_MAX_CONTACT_LINES = 30


@dataclass(frozen=True)
class _Sentence:
    text: str
    cite_id: str
    source: str

    @property
    def line(self) -> str:
        return f"- {self.text} [{self.cite_id}]"


def _clean(sentence: str) -> str:
    """One line of text; a quoted "[doc:..." in the corpus must not read as a citation."""
    text = " ".join(sentence.split())
    text = _CITE_OPEN.sub(lambda m: "(" + m.group()[1:], text)
    if len(text) > _MAX_SENTENCE_CHARS:
        text = text[:_MAX_SENTENCE_CHARS].rsplit(" ", 1)[0] + "…"
    return text


def _corpus_sentences(corpus: ResearchCorpus, limit: int) -> list[_Sentence]:
    """Distinct, informative sentences of the corpus, each with its entry's citation id."""
    seen: set[str] = set()
    out: list[_Sentence] = []
    for entry in corpus.entries:
        for raw in split_sentences(entry.text):
            text = _clean(raw)
            key = text.casefold()
            contact = _EMAIL.search(text) or _PHONE.search(text)
            if key in seen or (len(re.findall(r"\w+", text)) < 4 and not contact):
                continue
            seen.add(key)
            out.append(_Sentence(text, entry.cite_id, entry.source))
            if len(out) >= limit:
                log.warning("corpus has more than %d sentences; the rest are not used", limit)
                return out
    return out


class ExtractiveSynthesizer:
    """Offline synthesizer: quotes the corpus sentences that best fit each document.

    Sentences are embedded once (one batch) and scored against short descriptions of what each
    document is for (max cosine over a purpose's phrases, plus a small bonus for telling
    keywords); each sentence goes to the one purpose it fits best, or nowhere when it fits none
    (off-topic text is dropped). Golden examples are quoted copy with a voice cue ("Sign off with
    "..."), "Example: ..." lines and the client's own published copy (which may also inform the
    product context);
    anti-examples are voice sentences that say what to avoid. Contacts are the lines with
    e-mail addresses, phone numbers or named job titles. Every line is a corpus sentence
    (whitespace normalised, very long ones shortened with "…") followed by its entry's citation:
    the output says nothing the corpus does not.

    Args:
        embedder: the dense embedder (normalised vectors), e.g. ``get_embedder()``.
        max_sentences: the most corpus sentences considered (bounds embedding time).
    """

    model_id = "extractive-minilm"

    def __init__(self, embedder: Embedder, *, max_sentences: int = 5000) -> None:
        if max_sentences <= 0:
            raise ConfigError(
                f"max_sentences must be greater than 0. Currently it is {max_sentences}."
            )
        self.embedder = embedder
        self.max_sentences = max_sentences

    def synthesize(self, corpus: ResearchCorpus, *, max_output_tokens: int) -> SynthesisResult:
        if max_output_tokens <= 0:
            raise ConfigError(
                f"max_output_tokens must be greater than 0. Currently it is {max_output_tokens}."
            )
        started = time.perf_counter()
        sentences = _corpus_sentences(corpus, self.max_sentences)
        if not sentences:
            raise SynthesisFailed(
                f"the research corpus for {corpus.client_name!r} has no usable text "
                f"({len(corpus.entries)} entries): add sources before synthesizing"
            )
        # 4 characters per token, shared by four documents: max_output_tokens characters each.
        plan = _Plan(corpus, sentences, self._scores(sentences), doc_chars=max_output_tokens)
        docs = validate_drafts(
            [plan.brand_voice(), plan.product(), plan.compliance(), plan.contacts()], corpus
        )
        consumed = estimate_tokens(corpus.render()) + sum(estimate_tokens(d.content) for d in docs)
        log.info(
            "extractive synthesis: %d entries, %d sentences, %.1fs",
            len(corpus.entries),
            len(sentences),
            time.perf_counter() - started,
        )
        return SynthesisResult(documents=docs, consumed_tokens=consumed, model=self.model_id)

    def _scores(self, sentences: Sequence[_Sentence]) -> dict[str, list[float]]:
        """Per purpose, each sentence's score: max cosine over the purpose's phrases + cue bonus."""
        import numpy as np

        phrases = [(name, phrase) for name, group in PURPOSES.items() for phrase in group]
        vectors = np.asarray(
            self.embedder.embed_documents([s.text for s in sentences] + [p for _, p in phrases]),
            dtype=np.float32,
        )
        cosine = vectors[: len(sentences)] @ vectors[len(sentences) :].T
        scores: dict[str, list[float]] = {}
        for name in PURPOSES:
            best = cosine[:, [i for i, (owner, _) in enumerate(phrases) if owner == name]].max(1)
            bonus = [_CUE_BONUS if _CUES[name].search(s.text) else 0.0 for s in sentences]
            # rounded so float noise can never reorder near-ties between runs
            scores[name] = [round(float(b) + x, 5) for b, x in zip(best, bonus, strict=True)]
        return scores


def _avoids_words(text: str) -> bool:
    """A rule against quoted wording: 'Avoid "synergy"', 'Don't say "cheap"'."""
    return bool(_AVOID.search(text) and _QUOTES_WORDS.search(text))


class _Plan:
    """Assigns sentences to purposes and lays out the four documents."""

    def __init__(
        self,
        corpus: ResearchCorpus,
        sentences: Sequence[_Sentence],
        scores: dict[str, list[float]],
        doc_chars: int,
    ) -> None:
        self.corpus = corpus
        self.sentences = sentences
        self.scores = scores
        self.doc_chars = max(doc_chars, 400)  # always room for one line per section
        self.titles = {e.cite_id: e.title for e in corpus.entries}
        self.contact_like = {
            i for i, s in enumerate(sentences) if _EMAIL.search(s.text) or _PHONE.search(s.text)
        }
        self.purpose_of: dict[int, str] = {}
        for i in range(len(sentences)):
            best = max(PURPOSES, key=lambda name: (scores[name][i], name))
            if scores[best][i] < _MIN_SCORE:
                continue
            if i in self.contact_like and best != "contacts":
                continue  # contact details belong in the contacts document only
            text = sentences[i].text
            if best in ("product", "audience", "status") and _avoids_words(text):
                best = "voice"  # 'Don't say "cheap"' is about wording, not the product
            self.purpose_of[i] = best

    def ranked(self, purpose: str, pool: Iterable[int] | None = None) -> list[int]:
        """``pool`` (default: the sentences assigned to ``purpose``), best fit first."""
        if pool is None:
            pool = [i for i, p in self.purpose_of.items() if p == purpose]
        return sorted(pool, key=lambda i: (-self.scores[purpose][i], i))

    def lines(self, indices: Sequence[int], limit: int = _MAX_LINES) -> list[str]:
        return [self.sentences[i].line for i in indices[:limit]]

    def nothing_found(self, what: str, purpose: str) -> list[str]:
        """One explicit, cited line saying the corpus lacks ``what``."""
        nearest = self.sentences[self.ranked(purpose, range(len(self.sentences)))[0]]
        return [
            f"- No {what} found in the research corpus. Nearest passage: "
            f"“{nearest.text}” [{nearest.cite_id}]"
        ]

    def document(
        self, filename: str, intro: str, sections: list[tuple[str, list[str]]]
    ) -> DraftDocument:
        title = f"{DOC_TITLES[filename]} — {self.corpus.client_name}"
        note = (
            f"> Extractive draft: {intro} Each line quotes the research corpus and cites its "
            "source; edit before approving."
        )
        content = render_document(title, [("", [note]), *self._fit(sections)], self.titles)
        return DraftDocument(filename=filename, title=title, content=content)

    def _fit(self, sections: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
        """Drop the lowest-ranked lines of the longest sections until the document fits."""
        fitted = [(heading, list(lines)) for heading, lines in sections]
        while sum(len(line) + 1 for _, lines in fitted for line in lines) > self.doc_chars:
            longest = max(fitted, key=lambda section: len(section[1]))[1]
            if len(longest) <= 1:
                break
            longest.pop()
        return fitted

    # the four documents

    def brand_voice(self) -> DraftDocument:
        voice = self.ranked("voice")
        # an example may come from anywhere but the compliance and contacts material
        usable = [
            i
            for i in range(len(self.sentences))
            if self.purpose_of.get(i) not in ("compliance", "contacts")
            and i not in self.contact_like
        ]

        def quoted(i: int) -> bool:
            return bool(_QUOTED.search(self.sentences[i].text))

        def avoid(i: int) -> bool:
            return bool(_AVOID.search(self.sentences[i].text))

        golden = [
            i
            for i in usable
            if not avoid(i)
            and (
                (quoted(i) and _CUES["voice"].search(self.sentences[i].text))
                or _EXAMPLE_LEAD.match(self.sentences[i].text)
                or self.sentences[i].source in _PUBLISHED
            )
        ]
        golden.sort(key=lambda i: (not quoted(i), -self.scores["voice"][i], i))
        anti = [i for i in voice if avoid(i)]
        anti += self.ranked(
            "voice", [i for i in usable if i not in anti and _avoids_words(self.sentences[i].text)]
        )
        shown = set(golden[:_MAX_LINES]) | set(anti[:_MAX_LINES])
        tone = [i for i in voice if i not in shown]
        sections = [
            ("Tone and style", self.lines(tone) or self.nothing_found("tone guidance", "voice")),
            ("Golden examples", self.lines(golden) or self.nothing_found("example copy", "voice")),
            ("Anti-examples", self.lines(anti) or self.nothing_found("phrasing to avoid", "voice")),
        ]
        return self.document(
            BRAND_VOICE, "how the client writes, with examples to follow and to avoid.", sections
        )

    def product(self) -> DraftDocument:
        sections = [
            (heading, self.lines(self.ranked(purpose)))
            for heading, purpose in (
                ("Products and services", "product"),
                ("Audience", "audience"),
                ("Status and availability", "status"),
            )
        ]
        sections = [s for s in sections if s[1]] or [
            ("Products and services", self.nothing_found("product information", "product"))
        ]
        return self.document(PRODUCT, "what the client sells, to whom, and its status.", sections)

    def compliance(self) -> DraftDocument:
        by_topic: dict[str, list[int]] = {}
        for i in self.ranked("compliance"):
            text = self.sentences[i].text
            topic = next((t for t, cue in _COMPLIANCE_TOPICS if cue.search(text)), _OTHER_RISKS)
            by_topic.setdefault(topic, []).append(i)
        order = [topic for topic, _ in _COMPLIANCE_TOPICS] + [_OTHER_RISKS]
        sections = [(topic, self.lines(by_topic[topic])) for topic in order if topic in by_topic]
        if not sections:
            sections = [
                ("Flagged topics", self.nothing_found("compliance or risk topic", "compliance"))
            ]
        return self.document(
            COMPLIANCE,
            "only the risk topics the corpus itself raises; nothing is added, and none of it is "
            "legal advice.",
            sections,
        )

    def contacts(self) -> DraftDocument:
        escalation = self.ranked(
            "contacts",
            [
                i
                for i, s in enumerate(self.sentences)
                if _ESCALATION.search(s.text)
                and (i in self.contact_like or self.purpose_of.get(i) in (None, "contacts"))
            ],
        )
        people = [  # in corpus order: a contact list reads best as written
            i
            for i, s in enumerate(self.sentences)
            if i not in escalation
            and (
                i in self.contact_like
                or (
                    _ROLE.search(s.text)
                    and _NAME.search(s.text)
                    and self.scores["contacts"][i] >= _MIN_SCORE
                )
            )
        ]
        if not people:  # no addresses or titled names: the sentences that fit best
            people = [i for i in self.ranked("contacts") if i not in escalation]
        sections = [
            ("People and roles", self.lines(people, _MAX_CONTACT_LINES)),
            ("Escalation and contact paths", self.lines(escalation)),
        ]
        sections = [s for s in sections if s[1]] or [
            ("People and roles", self.nothing_found("named contact", "contacts"))
        ]
        return self.document(
            CONTACTS,
            "the people, roles, contact details and escalation paths the corpus names.",
            sections,
        )


# --- Anthropic -----------------------------------------------------------------------------

SYSTEM_PROMPT = f"""\
You write the first draft of a client's knowledge base, which AI agents will use when they \
speak for the client. Using only the research corpus in the user message, write exactly four \
Markdown documents:

1. {BRAND_VOICE} — how the client talks to customers: tone, style, words to use and avoid. \
It must have a "## Golden examples" section (copy to imitate) and a "## Anti-examples" section \
(phrasing to avoid). Every list item in those sections is an example taken from the corpus and \
ends with its citation.
2. {PRODUCT} — the products and services, prices or plans where stated, the target audience, \
and the current status and availability.
3. {COMPLIANCE} — only the risk topics the corpus itself raises (privacy, legal, regulatory, \
safety, warranty, claims). Never add a risk, law or advice the corpus does not mention; if it \
mentions none, say so in one sentence citing the closest entry.
4. {CONTACTS} — the people the corpus names, with roles, contact details and escalation \
paths exactly as stated. Never invent a name, e-mail address or phone number.

Rules:
- Cite every claim with the id of the corpus entry it comes from, in square brackets exactly as \
listed, e.g. [doc:abc123]. Use only the listed ids; never invent or alter one.
- Every document cites at least once. If the corpus has nothing for a document, say so in one \
sentence citing the closest entry.
- End every document with this footer, and nothing after it:
---
## Citations
- [<id>] <entry title>
with one line for each id the document cites.
- Reply with ONE JSON object and nothing else (no prose, no code fence):
{{"documents": [{{"filename": "...", "title": "...", "content": "..."}}]}}
with the four filenames above, in that order; "content" is the whole Markdown document.
"""

REPAIR_PROMPT = """\
Your reply could not be used: {error}
Reply with the corrected JSON object only — all four documents, every problem fixed — and \
nothing else."""


def user_message(corpus: ResearchCorpus) -> str:
    """The user turn: the allowed citation ids, then the rendered corpus."""
    ids = "\n".join(f"- {e.citation} {_short(e.title, 200)}" for e in corpus.entries)
    return (
        f"Client: {corpus.client_name}\n\n"
        f"Citation ids you may use:\n{ids}\n\n"
        f"Research corpus (each entry starts with its citation id):\n"
        f"<corpus>\n{corpus.render()}\n</corpus>"
    )


def parse_drafts(reply: str) -> list[DraftDocument]:
    """The documents in a model reply: one JSON object, optionally inside a ```json fence.

    Raises:
        SynthesisInvalid: the reply is not that JSON object, or an item lacks a field.
    """
    text = reply.strip()
    fence = re.search(r"```(?:json)?\s*\n(.*?)\n?```", text, re.S)
    if fence:
        text = fence.group(1).strip()
    if not text.startswith("{") and "{" in text:  # tolerate a sentence before/after the object
        text = text[text.find("{") : text.rfind("}") + 1]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SynthesisInvalid(
            f"the reply is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from exc
    items = data.get("documents") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise SynthesisInvalid(
            'the reply must be a JSON object with a "documents" list; '
            f"got {type(data).__name__} with keys {sorted(data) if isinstance(data, dict) else []}"
        )
    docs = []
    for n, item in enumerate(items):
        if not isinstance(item, dict) or not all(
            isinstance(item.get(key), str) for key in ("filename", "content")
        ):
            raise SynthesisInvalid(
                f'documents[{n}] must be an object with string "filename", "title" and "content"'
            )
        filename = item["filename"].strip()
        title = item.get("title")
        if not isinstance(title, str) or not title.strip():
            title = DOC_TITLES.get(filename, filename)
        docs.append(DraftDocument(filename=filename, title=title.strip(), content=item["content"]))
    return docs


@dataclass(frozen=True)
class _Reply:
    text: str
    tokens: int  # input + output, from the response's usage
    truncated: bool  # stopped at max_tokens


class AnthropicSynthesizer:
    """Claude writes the drafts: one Messages request, and at most one repair request.

    Transient failures (429, 408/409, 5xx incl. 529 overloaded, connection errors and timeouts)
    are retried with exponential backoff (``backoff_s * 2**n``, or the server's ``retry-after``
    when longer) by `tasks.llm.AnthropicChat`, the one retry layer (the SDK's own retries are
    switched off). A reply that is not valid JSON or breaks :func:`validate_drafts` gets one repair
    request carrying the exact error; a second failure raises :class:`SynthesisFailed`.

    Args:
        api_key: the Anthropic API key (unused when ``client`` is given).
        model: the model id; resolve overrides with :func:`resolve_model`.
        client: an ``anthropic.Anthropic`` to use instead of building one (tests, proxies).
        max_retries: retries per request after the first attempt, for transient errors only.
        backoff_s: the first retry's delay; each later retry doubles it.
        sleep: how to wait between retries (injected by tests).
        timeout_s: per-request timeout (explicit, so large ``max_output_tokens`` is allowed
            without streaming).
    """

    def __init__(
        self,
        api_key: str,
        model: str = DEFAULT_MODEL,
        *,
        client: Any | None = None,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        timeout_s: float = 600.0,
    ) -> None:
        if not model.strip():
            raise ConfigError("model must be a model id such as 'claude-haiku-4-5'. It is empty.")
        if max_retries < 0:
            raise ConfigError(f"max_retries must be 0 or more. Currently it is {max_retries}.")
        if backoff_s < 0:
            raise ConfigError(f"backoff_s must be 0 or more. Currently it is {backoff_s}.")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be greater than 0. Currently it is {timeout_s}.")
        if client is None and not api_key:
            raise ConfigError(
                "the Anthropic API key is empty: set ANTHROPIC_API_KEY, or use the extractive "
                "synthesizer to work offline."
            )
        self.model_id = model.strip()
        self._chat = AnthropicChat(
            api_key,
            self.model_id,
            client=client,
            attempts=max_retries + 1,
            backoff_s=backoff_s,
            timeout_s=timeout_s,
            sleep=sleep,
        )

    def _call(self, messages: list[dict[str, str]], max_output_tokens: int) -> _Reply:
        """One Messages request; transient errors are retried by `AnthropicChat.create`."""
        import anthropic

        started = time.perf_counter()
        try:
            response, _ = self._chat.create(
                purpose="synthesis",
                system=SYSTEM_PROMPT,
                messages=messages,
                max_tokens=max_output_tokens,
            )
        except LlmError as exc:
            cause = exc.__cause__
            if not isinstance(cause, anthropic.APIError):
                raise (cause or exc) from None  # not the API's answer: a bug, raised as it came
            if not exc.transient:
                raise SynthesisFailed(
                    f"Anthropic rejected the synthesis request for model {self.model_id!r} "
                    f"(HTTP {getattr(cause, 'status_code', None)}): {cause} — check the API key, "
                    "the model id and max_output_tokens; this error is not retried"
                ) from cause
            raise SynthesisFailed(
                f"Anthropic still failing after {exc.attempts} attempt(s) "
                f"(model {self.model_id!r}): {cause} — try again later",
                transient=True,
            ) from cause
        usage = response.usage
        log.info(
            "anthropic %s: %d tokens in, %d out, stop=%s, %.1fs",
            self.model_id,
            usage.input_tokens,
            usage.output_tokens,
            response.stop_reason,
            time.perf_counter() - started,
        )
        return _Reply(
            text="".join(b.text for b in response.content if getattr(b, "type", "") == "text"),
            tokens=int(usage.input_tokens or 0) + int(usage.output_tokens or 0),
            truncated=response.stop_reason == "max_tokens",
        )

    def _drafts(
        self, reply: _Reply, corpus: ResearchCorpus, max_output_tokens: int
    ) -> tuple[DraftDocument, ...]:
        try:
            return validate_drafts(parse_drafts(reply.text), corpus)
        except SynthesisInvalid as exc:
            if reply.truncated:
                raise SynthesisInvalid(
                    f"{exc} (the reply was cut off at max_tokens={max_output_tokens}: "
                    "write shorter documents)"
                ) from exc
            raise

    def synthesize(self, corpus: ResearchCorpus, *, max_output_tokens: int) -> SynthesisResult:
        if max_output_tokens <= 0:
            raise ConfigError(
                f"max_output_tokens must be greater than 0. Currently it is {max_output_tokens}."
            )
        messages = [{"role": "user", "content": user_message(corpus)}]
        reply = self._call(messages, max_output_tokens)
        consumed = reply.tokens
        try:
            docs = self._drafts(reply, corpus, max_output_tokens)
        except SynthesisInvalid as first:
            log.warning("synthesis reply invalid; sending one repair request")
            messages += [
                {"role": "assistant", "content": reply.text},
                {"role": "user", "content": REPAIR_PROMPT.format(error=first)},
            ]
            repaired = self._call(messages, max_output_tokens)
            consumed += repaired.tokens
            try:
                docs = self._drafts(repaired, corpus, max_output_tokens)
            except SynthesisInvalid as second:
                raise SynthesisFailed(
                    f"{self.model_id} wrote invalid KB drafts for {corpus.client_name!r} twice "
                    f"({consumed} tokens spent). First reply: {first}. After repair: {second}"
                ) from second
        return SynthesisResult(documents=docs, consumed_tokens=consumed, model=self.model_id)
