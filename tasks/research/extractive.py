"""The offline extractive synthesizer: quotes the research corpus, sentence by sentence, under each
draft's purposes, and cites every line."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from core.errors import ConfigError, SynthesisFailed
from core.models import DraftDocument, ResearchCorpus, SynthesisResult
from tasks.research.synthesize import (
    BRAND_VOICE,
    COMPLIANCE,
    CONTACTS,
    DOC_TITLES,
    PRODUCT,
    estimate_tokens,
    render_document,
    validate_drafts,
)
from tasks.text.citations import CITE_OPEN
from tasks.text.embed import Embedder
from tasks.text.sentences import HEADING, MarkdownTable, split_sentences, split_tables

log = logging.getLogger(__name__)

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
        r"headline|subject lines?|repl(?:y|ies)|talk\w*|speak\w*)\b",
        re.I,
    ),
    "product": re.compile(
        r"(\$|€|£|\b(price[sd]?|pricing|plans?|subscriptions?|features?|products?|services?|"
        r"sells?|offers?|models?|kits?|EUR|USD|GBP|CHF|CAD|AUD|SEK|NOK|DKK)\b)",
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
        r"certif\w*|licen[cs]\w*|refunds?|disclaim\w*|insurance|risks?|prohibit\w*|fda|ftc|"
        r"statutes?|directives?|retention|retain\w*|deletion|erasure|allergens?|"
        r"health claims?|responsibly|minors?|age limit|proof of age|"
        r"not (?:a )?(?:substitute|replace\w*) (?:for )?(?:a |your )?(?:diagnos\w*|advice)|"
        r"(?:carr(?:y|ies)|display|show|include)s? (?:the|a|this) "
        r"(?:note|line|notice|statement|warning|label))\b"
        r"|(?-i:\b[A-Z]\w+ Act\b)"  # a law by its name: "the Dutch Alcohol Act"
        r"|\b(?:aged|over|under)\s+(?:the age of\s+)?1\d\b|\b1\d\s*(?:\+|or (?:over|older)\b)",
        re.I,
    ),
    "contacts": re.compile(r"\b(escalat\w*|on-call|contact\w*|reach (?:out|us)|call)\b", re.I),
}


_CUE_BONUS = 0.15


_MIN_SCORE = 0.25  # below this (cosine + cue bonus) a sentence is off-topic for every purpose


_MONEY = re.compile(  # 85 EUR, €85, $1,299.00, 12.50 GBP
    r"(?:[$€£]\s?\d|\d(?:[\d,.]*\d)?\s?(?:[$€£]|(?:EUR|USD|GBP|CHF|CAD|AUD|SEK|NOK|DKK)\b))"
)


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
    r"\b(escalat\w*|on-call|on call|urgent|emergenc\w*|out of hours|after hours|complaints?|"
    r"(?:goes?|sent|send|forward\w*|rout\w*|passe?s?) (?:straight |directly )?to|same day|"
    r"immediately|right away|straight away|at once|without delay)\b",
    re.I,
)


# A rule against something (imperative or "we never ..."), not a story that mentions "never".
_AVOID = re.compile(
    r"^(?:please\s+)?(?:avoid|never|don't|do not|stop|steer clear|refrain)\b"
    r"|\b(?:we|you|staff|agents?)\s+(?:should\s+)?(?:never|don't|do not|must not|avoid)\b"
    r"|\b(?:instead of|rather than|not say|banned|forbidden|off-limits)\b",
    re.I,
)


# A do-rule that names wording to avoid: 'call it by its name, never "the product"'.
_NEVER_QUOTED = re.compile(r"\bnever\s+(?=[\"“‘'])", re.I)


# A section of rules against something: "## Don't", "Things to avoid", "Never say".
_AVOID_HEADING = re.compile(
    r"^(?:don'?t|do not|avoid|never|not to)\b|\b(?:to avoid|don'?ts|anti-examples?)\b", re.I
)


_QUOTED = re.compile(r"\"[^\"]{12,}\"|“[^”]{12,}”")  # quoted copy, long enough to be an example


_QUOTES_WORDS = re.compile(
    r"\"[^\"]+\"|“[^”]+”|(?<!\w)'[^'\n]+'(?!\w)|‘[^’]+’"
)  # 'avoid "synergy"'


_EXAMPLE_LEAD = re.compile(
    r"^(?:(?:an?|one|another|here is an?) )?(example|e\.g\.|say|sample|for instance)\b", re.I
)


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
        re.compile(
            r"\b(laws?|legal|regulat\w*|complian\w*|licen[cs]\w*|permits?|claims?|statutes?|"
            r"directives?|aged?|minors?|advertis\w*|labels?|allergens?|disclaim\w*)\b"
            r"|(?-i:\b[A-Z]\w+ Act\b)|\bunder\s+1\d\b",
            re.I,
        ),
    ),
)


_OTHER_RISKS = "Other flagged risks"


_MAX_SENTENCE_CHARS = 400


_MAX_LINES = 8  # items per section (a table is one item); contact lists and products get more


_MAX_CONTACT_LINES = 30


_MAX_PRODUCT_LINES = 12


_MAX_TABLE_ROWS = 30  # rows of one table kept in a section (the size budget may drop more)


_HEADING_BONUS = 0.10  # a purpose's cue in the headings above a sentence, or its table's header


@dataclass(frozen=True)
class _Sentence:
    """A corpus sentence, or a row of one of its tables (``header`` and ``cells`` set)."""

    text: str
    cite_id: str
    source: str
    header: tuple[str, ...] = ()
    cells: tuple[str, ...] = ()
    headings: str = ""  # the headings above it, " > "-joined (context, never quoted)

    @property
    def line(self) -> str:
        return f"- {self.text} [{self.cite_id}]"

    @property
    def table(self) -> tuple[str, tuple[str, ...]] | None:
        """Which table the row belongs to (entry and header), or None for a sentence."""
        return (self.cite_id, self.header) if self.header else None


def _table_lines(rows: Sequence[_Sentence]) -> list[str]:
    """Rows of one table as Markdown, a line per row with its citation in a Source column;
    the header and separator rows lead the first row's line, so that dropping rows to fit a
    budget never leaves a table without rows."""
    width = max(len(rows[0].header), *(len(r.cells) for r in rows))
    header = [*rows[0].header, *[""] * (width - len(rows[0].header)), "Source"]
    head = "| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n"
    lines = []
    for row in rows:
        cells = [*row.cells, *[""] * (width - len(row.cells)), f"[{row.cite_id}]"]
        lines.append("| " + " | ".join(cells) + " |")
    lines[0] = head + lines[0]
    return lines


def _clean(sentence: str) -> str:
    """One line of text; a quoted "[doc:..." in the corpus must not read as a citation."""
    text = " ".join(sentence.split())
    text = CITE_OPEN.sub(lambda m: "(" + m.group()[1:], text)
    if len(text) > _MAX_SENTENCE_CHARS:
        text = text[:_MAX_SENTENCE_CHARS].rsplit(" ", 1)[0] + "…"
    return text


def _sections(text: str) -> list[tuple[str, str]]:
    """``text`` as (heading path, body) pairs: each heading starts a section, and its path is
    the headings above it by level, " > "-joined."""
    out: list[tuple[str, str]] = []
    path: list[tuple[int, str]] = []
    body: list[str] = []
    for line in text.splitlines():
        heading = HEADING.match(line)
        if heading is None:
            body.append(line)
            continue
        out.append((" > ".join(t for _, t in path), "\n".join(body)))
        level = len(heading.group(1))
        path = [(lv, t) for lv, t in path if lv < level] + [(level, heading.group(2))]
        body = []
    out.append((" > ".join(t for _, t in path), "\n".join(body)))
    return [(headings, body) for headings, body in out if body.strip()]


def _corpus_sentences(corpus: ResearchCorpus, limit: int) -> list[_Sentence]:
    """Distinct, informative sentences of the corpus, each with its entry's citation id and the
    headings above it; a table's rows come as sentences that keep their cells and the table's
    header. A lead-in ("How long we keep it:") says nothing without what follows: dropped."""
    seen: set[str] = set()
    out: list[_Sentence] = []
    for entry in corpus.entries:
        for headings, section in _sections(entry.text):
            found = []
            for part in split_tables(section):
                if isinstance(part, MarkdownTable):
                    header = tuple(_clean(c) for c in part.header)
                    for row in part.rows:
                        cells = tuple(_clean(c) for c in row)
                        text = " | ".join(c for c in cells if c)
                        found.append(
                            _Sentence(text, entry.cite_id, entry.source, header, cells, headings)
                        )
                else:
                    found.extend(
                        _Sentence(_clean(raw), entry.cite_id, entry.source, headings=headings)
                        for raw in split_sentences(part)
                    )
            for sentence in found:
                text = sentence.text
                key = text.casefold()
                contact = _EMAIL.search(text) or _PHONE.search(text)
                short = len(re.findall(r"\w+", text)) < 4 or text.endswith(":")
                if key in seen or (short and not (contact or _MONEY.search(text))):
                    continue
                seen.add(key)
                out.append(sentence)
                if len(out) >= limit:
                    log.warning("corpus has more than %d sentences; the rest are not used", limit)
                    return out
    return out


class ExtractiveSynthesizer:
    """Offline synthesizer: quotes the corpus sentences that best fit each document.

    Sentences are embedded once (one batch) and scored against short descriptions of what each
    document is for (max cosine over a purpose's phrases, plus a small bonus for telling
    keywords in the sentence and a smaller one for keywords in the headings above it or in its
    table's header); each sentence goes to the one purpose it fits best, or nowhere when it fits
    none (off-topic text is dropped), and a table's rows all go where the table fits best and
    stay one table. A sentence with a legal cue (a named Act, an age limit, retention, ...) goes
    to the compliance notes even when it reads like a product sentence. The product context
    groups its items under the seeds' own subheadings (a price list's product names).

    Golden examples are quoted copy with a voice cue ("Sign off with "..."), "Example: ..."
    lines and the client's own published copy (which may also inform the product context);
    anti-examples are voice sentences that say what to avoid, or stand under a "Don't" heading.
    Contacts are the lines with e-mail addresses, phone numbers or named job titles; routing to
    a person named with contact details elsewhere is an escalation path. Every line is a corpus
    sentence (whitespace normalised, very long ones shortened with "…") followed by its entry's
    citation: the output says nothing the corpus does not.

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
        """Per purpose, each sentence's score: max cosine over the purpose's phrases, plus a
        bonus for cues in the sentence and a smaller one for cues in its headings or header."""
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
            cue = _CUES[name]
            bonus = [
                (_CUE_BONUS if cue.search(s.text) else 0.0)
                + (_HEADING_BONUS if cue.search(" | ".join((s.headings, *s.header))) else 0.0)
                for s in sentences
            ]
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
        tables: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for i, sentence in enumerate(sentences):
            if sentence.table is not None:
                tables.setdefault(sentence.table, []).append(i)
                continue
            best = self._purpose(i, max(PURPOSES, key=lambda name: (scores[name][i], name)))
            if best is not None:
                self.purpose_of[i] = best
        for rows in tables.values():  # a table is one unit: all its rows go to one purpose
            if sum(i in self.contact_like for i in rows) * 2 > len(rows):
                continue  # a contact sheet: the contacts document takes its rows
            mean = {name: sum(scores[name][i] for i in rows) / len(rows) for name in PURPOSES}
            best = max(PURPOSES, key=lambda name: (mean[name], name))
            if mean[best] >= _MIN_SCORE:
                self.purpose_of.update(dict.fromkeys(rows, best))
        self.avoid = {  # rules against something; under a "Don't" heading, all but examples
            i
            for i, s in enumerate(sentences)
            if _AVOID.search(s.text)
            or (
                _AVOID_HEADING.search(s.headings.rsplit(" > ", 1)[-1])
                and not _EXAMPLE_LEAD.match(s.text)
            )
        }

    def _purpose(self, i: int, best: str) -> str | None:
        """Where sentence ``i`` goes, given the purpose it fits best; None: nowhere."""
        text = self.sentences[i].text
        legal = _CUES["compliance"].search(text) and self.scores["compliance"][i] >= _MIN_SCORE
        if self.scores[best][i] < _MIN_SCORE:
            return None
        if best in ("product", "audience", "status") and legal:
            return "compliance"  # "we only sell to customers aged 18 or over" is a legal duty
        if i in self.contact_like and best not in ("contacts", "compliance"):
            return None  # contact details belong in the contacts document (and a privacy
            # request address in the compliance notes too)
        if best in ("product", "audience", "status") and (
            _avoids_words(text) or _NEVER_QUOTED.search(text)
        ):
            return "voice"  # 'Don't say "cheap"' is about wording, not the product
        return best

    def ranked(self, purpose: str, pool: Iterable[int] | None = None) -> list[int]:
        """``pool`` (default: the sentences assigned to ``purpose``), best fit first."""
        if pool is None:
            pool = [i for i, p in self.purpose_of.items() if p == purpose]
        return sorted(pool, key=lambda i: (-self.scores[purpose][i], i))

    def lines(self, indices: Sequence[int], limit: int = _MAX_LINES) -> list[str]:
        """A list item per sentence, the first ``limit`` items; the rows of one table count as one
        item (where its first row ranks): a Markdown table, rows in corpus order, with their
        citations in a Source column, set off by blank lines."""
        return self._render(self._items(indices, limit))

    def _items(self, indices: Sequence[int], limit: int) -> list[list[int]]:
        """The first ``limit`` items of ``indices``: a sentence, or all rows of one table."""
        items: list[list[int]] = []
        tables: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for i in indices:
            key = self.sentences[i].table
            if key is not None and key in tables:
                if len(tables[key]) < _MAX_TABLE_ROWS:
                    tables[key].append(i)
            elif len(items) < limit:
                items.append([i])
                if key is not None:
                    tables[key] = items[-1]
        return items

    def _render(self, items: Sequence[list[int]]) -> list[str]:
        out: list[str] = []
        for item in items:
            if self.sentences[item[0]].table is None:
                out.append(self.sentences[item[0]].line)
                continue
            if out:
                out.append("")
            out.extend(_table_lines([self.sentences[i] for i in sorted(item)]))
            out.append("")
        while out and not out[-1]:
            out.pop()
        return out

    def by_subheading(self, indices: Sequence[int], limit: int) -> list[str]:
        """Like `lines`, but items under a seed's own subheading ("## Initial assessment" in a
        price list) are grouped under it as a ``###`` heading, in corpus order: a product whose
        name is only in its heading keeps it. Items above any subheading come first."""
        items = self._items(indices, limit)
        groups: dict[str, list[list[int]]] = {}
        for item in items:
            headings = self.sentences[item[0]].headings
            sub = headings.rsplit(" > ", 1)[1] if " > " in headings else ""
            groups.setdefault(sub, []).append(item)
        if not any(groups.keys()):
            return self._render(items)
        out = self._render(groups.pop("", []))
        for sub, group in sorted(groups.items(), key=lambda g: min(min(i) for i in g[1])):
            if out:
                out.append("")
            out += [f"### {sub}", "", *self._render(sorted(group, key=min))]
        return out

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
            while longest and (not longest[-1] or longest[-1].startswith("### ")):
                longest.pop()  # the blank line after a table, or a subheading, that is gone
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
            return i in self.avoid

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
            (
                "Products and services",
                self.by_subheading(self.ranked("product"), _MAX_PRODUCT_LINES),
            ),
            ("Audience", self.lines(self.ranked("audience"))),
            ("Status and availability", self.lines(self.ranked("status"))),
        ]
        sections = [s for s in sections if s[1]] or [
            ("Products and services", self.nothing_found("product information", "product"))
        ]
        return self.document(PRODUCT, "what the client sells, to whom, and its status.", sections)

    def compliance(self) -> DraftDocument:
        ranked = self.ranked("compliance")
        texts: dict[object, list[str]] = {}  # a table's rows share one topic: its whole text's
        for i in ranked:
            sentence = self.sentences[i]
            key = sentence.table or i
            texts.setdefault(key, list(sentence.header)).append(sentence.text)
        topics = {
            key: next(
                (t for t, cue in _COMPLIANCE_TOPICS if cue.search(" | ".join(text))), _OTHER_RISKS
            )
            for key, text in texts.items()
        }
        by_topic: dict[str, list[int]] = {}
        for i in ranked:
            by_topic.setdefault(topics[self.sentences[i].table or i], []).append(i)
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
        # a full name given with contact details elsewhere: "complaints go to Amira Haddad"
        known = {name for i in self.contact_like for name in _NAME.findall(self.sentences[i].text)}
        escalation = self.ranked(
            "contacts",
            [
                i
                for i, s in enumerate(self.sentences)
                if _ESCALATION.search(s.text)
                and s.table is None  # a contact sheet's row stays in its table
                and (
                    i in self.contact_like
                    or self.purpose_of.get(i) in (None, "contacts")
                    or any(name in s.text for name in known)
                )
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
