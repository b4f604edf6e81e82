"""The offline extractive synthesizer: quotes the research corpus, sentence by sentence, under each
draft's purposes, and cites every line."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from core.errors import ConfigError, SynthesisFailed
from core.models import DraftDocument, ResearchCorpus, SynthesisResult
from tasks.research import extractive_cues as cues
from tasks.research.extractive_corpus import Sentence, corpus_sentences, table_lines
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
from tasks.text.embed import Embedder

log = logging.getLogger(__name__)


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
        sentences = corpus_sentences(corpus, self.max_sentences)
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

    def _scores(self, sentences: Sequence[Sentence]) -> dict[str, list[float]]:
        """Per purpose, each sentence's score: max cosine over the purpose's phrases, plus a
        bonus for cues in the sentence and a smaller one for cues in its headings or header."""
        import numpy as np

        phrases = [(name, phrase) for name, group in cues.PURPOSES.items() for phrase in group]
        vectors = np.asarray(
            self.embedder.embed_documents([s.text for s in sentences] + [p for _, p in phrases]),
            dtype=np.float32,
        )
        cosine = vectors[: len(sentences)] @ vectors[len(sentences) :].T
        scores: dict[str, list[float]] = {}
        for name in cues.PURPOSES:
            best = cosine[:, [i for i, (owner, _) in enumerate(phrases) if owner == name]].max(1)
            cue = cues.CUES[name]
            bonus = [
                (cues.CUE_BONUS if cue.search(s.text) else 0.0)
                + (cues.HEADING_BONUS if cue.search(" | ".join((s.headings, *s.header))) else 0.0)
                for s in sentences
            ]
            # rounded so float noise can never reorder near-ties between runs
            scores[name] = [round(float(b) + x, 5) for b, x in zip(best, bonus, strict=True)]
        return scores


def _avoids_words(text: str) -> bool:
    """A rule against quoted wording: 'Avoid "synergy"', 'Don't say "cheap"'."""
    return bool(cues.AVOID.search(text) and cues.QUOTES_WORDS.search(text))


class _Plan:
    """Assigns sentences to purposes and lays out the four documents."""

    def __init__(
        self,
        corpus: ResearchCorpus,
        sentences: Sequence[Sentence],
        scores: dict[str, list[float]],
        doc_chars: int,
    ) -> None:
        self.corpus = corpus
        self.sentences = sentences
        self.scores = scores
        self.doc_chars = max(doc_chars, 400)  # always room for one line per section
        self.titles = {e.cite_id: e.title for e in corpus.entries}
        self.contact_like = {
            i
            for i, s in enumerate(sentences)
            if cues.EMAIL.search(s.text) or cues.PHONE.search(s.text)
        }
        self.purpose_of: dict[int, str] = {}
        tables: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for i, sentence in enumerate(sentences):
            if sentence.table is not None:
                tables.setdefault(sentence.table, []).append(i)
                continue
            best = self._purpose(i, max(cues.PURPOSES, key=lambda name: (scores[name][i], name)))
            if best is not None:
                self.purpose_of[i] = best
        for rows in tables.values():  # a table is one unit: all its rows go to one purpose
            if sum(i in self.contact_like for i in rows) * 2 > len(rows):
                continue  # a contact sheet: the contacts document takes its rows
            mean = {name: sum(scores[name][i] for i in rows) / len(rows) for name in cues.PURPOSES}
            best = max(cues.PURPOSES, key=lambda name: (mean[name], name))
            if mean[best] >= cues.MIN_SCORE:
                self.purpose_of.update(dict.fromkeys(rows, best))
        self.avoid = {  # rules against something; under a "Don't" heading, all but examples
            i
            for i, s in enumerate(sentences)
            if cues.AVOID.search(s.text)
            or (
                cues.AVOID_HEADING.search(s.headings.rsplit(" > ", 1)[-1])
                and not cues.EXAMPLE_LEAD.match(s.text)
            )
        }

    def _purpose(self, i: int, best: str) -> str | None:
        """Where sentence ``i`` goes, given the purpose it fits best; None: nowhere."""
        text = self.sentences[i].text
        legal = (
            cues.CUES["compliance"].search(text) and self.scores["compliance"][i] >= cues.MIN_SCORE
        )
        if self.scores[best][i] < cues.MIN_SCORE:
            return None
        if best in ("product", "audience", "status") and legal:
            return "compliance"  # "we only sell to customers aged 18 or over" is a legal duty
        if i in self.contact_like and best not in ("contacts", "compliance"):
            return None  # contact details belong in the contacts document (and a privacy
            # request address in the compliance notes too)
        if best in ("product", "audience", "status") and (
            _avoids_words(text) or cues.NEVER_QUOTED.search(text)
        ):
            return "voice"  # 'Don't say "cheap"' is about wording, not the product
        return best

    def ranked(self, purpose: str, pool: Iterable[int] | None = None) -> list[int]:
        """``pool`` (default: the sentences assigned to ``purpose``), best fit first."""
        if pool is None:
            pool = [i for i, p in self.purpose_of.items() if p == purpose]
        return sorted(pool, key=lambda i: (-self.scores[purpose][i], i))

    def lines(self, indices: Sequence[int], limit: int = cues.MAX_LINES) -> list[str]:
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
                if len(tables[key]) < cues.MAX_TABLE_ROWS:
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
            out.extend(table_lines([self.sentences[i] for i in sorted(item)]))
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
            return bool(cues.QUOTED.search(self.sentences[i].text))

        def avoid(i: int) -> bool:
            return i in self.avoid

        golden = [
            i
            for i in usable
            if not avoid(i)
            and (
                (quoted(i) and cues.CUES["voice"].search(self.sentences[i].text))
                or cues.EXAMPLE_LEAD.match(self.sentences[i].text)
                or self.sentences[i].source in cues.PUBLISHED
            )
        ]
        golden.sort(key=lambda i: (not quoted(i), -self.scores["voice"][i], i))
        anti = [i for i in voice if avoid(i)]
        anti += self.ranked(
            "voice", [i for i in usable if i not in anti and _avoids_words(self.sentences[i].text)]
        )
        shown = set(golden[: cues.MAX_LINES]) | set(anti[: cues.MAX_LINES])
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
                self.by_subheading(self.ranked("product"), cues.MAX_PRODUCT_LINES),
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
                (t for t, cue in cues.COMPLIANCE_TOPICS if cue.search(" | ".join(text))),
                cues.OTHER_RISKS,
            )
            for key, text in texts.items()
        }
        by_topic: dict[str, list[int]] = {}
        for i in ranked:
            by_topic.setdefault(topics[self.sentences[i].table or i], []).append(i)
        order = [topic for topic, _ in cues.COMPLIANCE_TOPICS] + [cues.OTHER_RISKS]
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
        known = {
            name for i in self.contact_like for name in cues.NAME.findall(self.sentences[i].text)
        }
        escalation = self.ranked(
            "contacts",
            [
                i
                for i, s in enumerate(self.sentences)
                if cues.ESCALATION.search(s.text)
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
                    cues.ROLE.search(s.text)
                    and cues.NAME.search(s.text)
                    and self.scores["contacts"][i] >= cues.MIN_SCORE
                )
            )
        ]
        if not people:  # no addresses or titled names: the sentences that fit best
            people = [i for i in self.ranked("contacts") if i not in escalation]
        sections = [
            ("People and roles", self.lines(people, cues.MAX_CONTACT_LINES)),
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
