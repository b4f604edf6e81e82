"""The offline extractive synthesizer: quotes the research corpus, sentence by sentence, under each
draft's purposes, and cites every line."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable, Sequence

from core.errors import ConfigError, SynthesisFailed
from core.models import DraftDocument, ResearchCorpus, SynthesisResult
from tasks.research import extractive_cues as cues
from tasks.research.extractive_corpus import Sentence, corpus_sentences, table_lines
from tasks.research.steering import Steering
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
from tasks.text.review_note import review_note_banner

log = logging.getLogger(__name__)


class ExtractiveSynthesizer:
    """Offline synthesizer: quotes the corpus sentences that best fit each document.

    Sentences are embedded once (one batch) and scored against short descriptions of what each
    document is for (max cosine over a purpose's phrases, plus a small bonus for telling
    keywords in the sentence and a smaller one for keywords in the headings above it, its
    list's lead-in or its table's header); each sentence goes to the one purpose it fits best,
    or nowhere when it fits none (off-topic text is dropped), and a table's rows all go where
    the table fits best and stay one table. A sentence with a legal cue (a named Act, an age
    limit, retention, or a weaker cue such as "certified" with an obligation) goes to the
    compliance notes even when it reads like a product sentence. The product context groups its
    items under the seeds' own subheadings (a price list's product names).

    The AM's prompts steer and are never quoted (`tasks.research.steering`): a sentence about a
    focus term, or from a seed the prompt names, scores higher; one the prompt asks to leave
    out is dropped. Every sentence and table is placed once across the four drafts.

    Golden examples are quoted copy with a voice cue ("Sign off with "..."), "Example: ..."
    lines and the client's own published copy; anti-examples are voice sentences that say what
    to avoid, or stand under a "Don't" heading. Contacts are the lines with e-mail addresses,
    phone numbers or named job titles; routing to a person named with contact details
    elsewhere is an escalation path. Every line is a corpus sentence (whitespace normalised,
    very long ones shortened with "…") followed by its entry's citation: the output says
    nothing the corpus does not.

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
        steering = Steering.from_corpus(corpus)
        sentences = [
            s
            for s in corpus_sentences(corpus, self.max_sentences)
            if not steering.leaves_out(s.cite_id, f"{s.text} | {s.context}")
        ]
        if not sentences:
            raise SynthesisFailed(
                f"the research corpus for {corpus.client_name!r} has no usable text "
                f"({len(corpus.entries)} entries, prompts left out): add sources before "
                "synthesizing"
            )
        scores = self._scores(sentences, steering)
        focused = {
            i
            for i, s in enumerate(sentences)
            if steering.focuses(s.cite_id, f"{s.text} | {s.context}")
        }
        # 4 characters per token, shared by four documents: max_output_tokens characters each.
        plan = _Plan(corpus, sentences, scores, doc_chars=max_output_tokens, focused=focused)
        docs = validate_drafts(plan.drafts(), corpus)
        consumed = estimate_tokens(corpus.render()) + sum(estimate_tokens(d.content) for d in docs)
        log.info(
            "extractive synthesis: %d entries, %d sentences, steered=%s, %.1fs",
            len(corpus.entries),
            len(sentences),
            bool(steering),
            time.perf_counter() - started,
        )
        return SynthesisResult(documents=docs, consumed_tokens=consumed, model=self.model_id)

    def _scores(self, sentences: Sequence[Sentence], steering: Steering) -> dict[str, list[float]]:
        """Per purpose, each sentence's score: max cosine over the purpose's phrases, plus a
        bonus for cues in the sentence, a smaller one for cues in its context (headings,
        lead-in, table header), and what the prompts' focus adds (the same for every purpose:
        it ranks a sentence higher without moving it)."""
        import numpy as np

        phrases = [(name, phrase) for name, group in cues.PURPOSES.items() for phrase in group]
        vectors = np.asarray(
            self.embedder.embed_documents([s.text for s in sentences] + [p for _, p in phrases]),
            dtype=np.float32,
        )
        cosine = vectors[: len(sentences)] @ vectors[len(sentences) :].T
        focus = [steering.bonus(s.cite_id, f"{s.text} | {s.context}") for s in sentences]
        scores: dict[str, list[float]] = {}
        for name in cues.PURPOSES:
            best = cosine[:, [i for i, (owner, _) in enumerate(phrases) if owner == name]].max(1)
            cue = cues.CUES[name]
            bonus = [
                (cues.CUE_BONUS if cues.purpose_cue(name, s.text) else 0.0)
                + (cues.HEADING_BONUS if s.context and cue.search(s.context) else 0.0)
                + extra
                for s, extra in zip(sentences, focus, strict=True)
            ]
            # rounded so float noise can never reorder near-ties between runs
            scores[name] = [round(float(b) + x, 5) for b, x in zip(best, bonus, strict=True)]
        return scores


class _Plan:
    """Assigns sentences to purposes and lays out the four documents, placing each sentence or
    table once: the drafts claim in `drafts`' order and skip what an earlier one took."""

    def __init__(
        self,
        corpus: ResearchCorpus,
        sentences: Sequence[Sentence],
        scores: dict[str, list[float]],
        doc_chars: int,
        focused: Collection[int] = (),
    ) -> None:
        self.corpus = corpus
        self.focused = frozenset(focused)  # what the prompts ask to focus on ranks first
        self.sentences = sentences
        self.scores = scores
        self.doc_chars = max(doc_chars, 400)  # always room for one line per section
        self.titles = {e.cite_id: e.title for e in corpus.entries}
        self.used: set[int] = set()  # placed in some draft already
        self.pending: list[tuple[list[str], str, str]] = []  # "nothing found" lines to fill
        self.contact_like = {
            i
            for i, s in enumerate(sentences)
            if cues.EMAIL.search(s.text) or cues.has_phone(s.text)
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
        # the seed filed it under a legal or safety heading ("Legal points", "Storage safety")
        filed = cues.CUES["compliance"].search(self.sentences[i].headings.rsplit(" > ", 1)[-1])
        if filed and self.scores["compliance"][i] >= cues.MIN_FILED_SCORE:
            return "contacts" if best == "contacts" else "compliance"
        legal = cues.legal_cue(text) and self.scores["compliance"][i] >= cues.MIN_SCORE
        if self.scores[best][i] < cues.MIN_SCORE:
            return None
        if best in ("product", "audience", "status") and legal:
            return "compliance"  # "we only sell to customers aged 18 or over" is a legal duty
        if i in self.contact_like and best not in ("contacts", "compliance"):
            return None  # contact details belong in the contacts (or compliance) document
        if best in ("product", "audience", "status") and (
            cues.avoids_words(text) or cues.NEVER_QUOTED.search(text)
        ):
            return "voice"  # 'Don't say "cheap"' is about wording, not the product
        return best

    def ranked(self, purpose: str, pool: Iterable[int] | None = None) -> list[int]:
        """``pool`` (default: the sentences assigned to ``purpose``), best fit first."""
        if pool is None:
            pool = [i for i, p in self.purpose_of.items() if p == purpose]
        return sorted(pool, key=lambda i: (i not in self.focused, -self.scores[purpose][i], i))

    def lines(self, indices: Sequence[int], limit: int = cues.MAX_LINES) -> list[str]:
        """A list item per sentence, the first ``limit`` items not placed yet (now placed); the
        rows of one table count as one item (where its first row ranks): a Markdown table,
        rows in corpus order, with their citations in a Source column, set off by blank
        lines."""
        return self._render(self._items(indices, limit))

    def _items(self, indices: Sequence[int], limit: int) -> list[list[int]]:
        """The first ``limit`` sentences of ``indices`` not placed yet, and every table among
        them (the rows of one, its first `MAX_TABLE_ROWS` in corpus order), now placed. A table
        is never cut for the limit (its bare rows rank low one by one; a price sheet is what a
        product context is for): only the size budget trims its rows."""
        items: list[list[int]] = []
        tables: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        sentences = 0
        for i in indices:
            if i in self.used:
                continue
            key = self.sentences[i].table
            if key is not None and key in tables:
                tables[key].append(i)
            elif key is not None:
                items.append([i])
                tables[key] = items[-1]
            elif sentences < limit:
                items.append([i])
                sentences += 1
        for rows in tables.values():
            rows[:] = sorted(rows)[: cues.MAX_TABLE_ROWS]
        self.used.update(i for item in items for i in item)
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
        """One explicit, cited line saying the corpus lacks ``what``, filled in by
        `_fill_pending` once every draft has placed its lines (so that its nearest passage is
        one no draft quotes)."""
        lines: list[str] = []
        self.pending.append((lines, what, purpose))
        return lines

    def _fill_pending(self) -> None:
        for lines, what, purpose in self.pending:
            ranked = self.ranked(purpose, range(len(self.sentences)))
            free = [i for i in ranked if i not in self.used and self.sentences[i].table is None]
            if free:
                self.used.add(free[0])
                nearest = self.sentences[free[0]]
                lines.append(
                    f"- No {what} found in the research corpus. Nearest passage: "
                    f"“{nearest.text}” [{nearest.cite_id}]"
                )
            else:  # every passage is placed: name the closest source without quoting it
                cite = self.sentences[ranked[0]].cite_id
                lines.append(
                    f"- No {what} found in the research corpus. Closest source: "
                    f"{self.titles.get(cite, cite)} [{cite}]"
                )

    def document(
        self, filename: str, intro: str, sections: list[tuple[str, list[str]]]
    ) -> DraftDocument:
        title = f"{DOC_TITLES[filename]} — {self.corpus.client_name}"
        note = review_note_banner(  # for the reviewer only: never chunked nor served
            f"{intro} Each line is quoted from the research corpus as written and cites its "
            "source; nothing is paraphrased. Edit before approving."
        )
        content = render_document(title, [("", [note]), *self._fit(sections)], self.titles)
        return DraftDocument(filename=filename, title=title, content=content)

    def _fit(self, sections: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
        """Drop the lowest-ranked lines of the longest sections until the document fits."""
        fitted = [(heading, list(lines)) for heading, lines in sections if lines]
        while sum(len(line) + 1 for _, lines in fitted for line in lines) > self.doc_chars:
            longest = max(fitted, key=lambda section: len(section[1]))[1]
            if len(longest) <= 1:
                break
            longest.pop()
            while longest and (not longest[-1] or longest[-1].startswith("### ")):
                longest.pop()  # the blank line after a table, or a subheading, that is gone
        return fitted

    # the four documents

    def drafts(self) -> list[DraftDocument]:
        """The four drafts. They claim lines in this order, so a line that fits two goes
        where its kind belongs: escalation paths that name a known contact; compliance; the
        contacts; example copy and phrasing to avoid; the product context; tone. "Nothing
        found" lines come last."""
        escalation = self.escalation()
        compliance = self.compliance()
        contacts = self.contacts(escalation)
        golden, anti = self.examples()
        product = self.product()
        voice = self.brand_voice(golden, anti)
        self._fill_pending()
        return [
            self.document(BRAND_VOICE, "how the client writes, with examples to follow and to "
                          "avoid.", voice),
            self.document(PRODUCT, "what the client sells, to whom, and its status.", product),
            self.document(COMPLIANCE, "only the risk topics the corpus itself raises; nothing "
                          "is added, and none of it is legal advice.", compliance),
            self.document(CONTACTS, "the people, roles, contact details and escalation paths "
                          "the corpus names.", contacts),
        ]  # fmt: skip

    def examples(self) -> tuple[list[str], list[str]]:
        """Golden examples and anti-examples, never the same sentence: a rule against
        something is never copy to imitate."""
        # an example may come from anywhere but the compliance and contacts material
        usable = [
            i
            for i in range(len(self.sentences))
            if self.purpose_of.get(i) not in ("compliance", "contacts")
            and i not in self.contact_like
            and i not in self.used
        ]

        def quoted(i: int) -> bool:
            return bool(cues.QUOTED.search(self.sentences[i].text))

        golden = [
            i
            for i in usable
            if i not in self.avoid
            and (
                (quoted(i) and cues.CUES["voice"].search(self.sentences[i].text))
                or cues.EXAMPLE_LEAD.match(self.sentences[i].text)
                or self.sentences[i].source in cues.PUBLISHED
            )
        ]
        golden.sort(key=lambda i: (not quoted(i), -self.scores["voice"][i], i))
        anti = [i for i in self.ranked("voice") if i in self.avoid]
        anti += self.ranked(
            "voice",
            [i for i in usable if i not in anti and cues.avoids_words(self.sentences[i].text)],
        )
        return self.lines(golden), self.lines([i for i in anti if i not in golden])

    def brand_voice(self, golden: list[str], anti: list[str]) -> list[tuple[str, list[str]]]:
        return [
            (
                "Tone and style",
                self.lines(self.ranked("voice")) or self.nothing_found("tone guidance", "voice"),
            ),
            ("Golden examples", golden or self.nothing_found("example copy", "voice")),
            ("Anti-examples", anti or self.nothing_found("phrasing to avoid", "voice")),
        ]

    def product(self) -> list[tuple[str, list[str]]]:
        sections = [
            (
                "Products and services",
                self.by_subheading(self.ranked("product"), cues.MAX_PRODUCT_LINES),
            ),
            ("Audience", self.lines(self.ranked("audience"))),
            ("Status and availability", self.lines(self.ranked("status"))),
        ]
        return [s for s in sections if s[1]] or [
            ("Products and services", self.nothing_found("product information", "product"))
        ]

    def compliance(self) -> list[tuple[str, list[str]]]:
        ranked = self.ranked("compliance")
        texts: dict[object, list[str]] = {}  # a table's rows share one topic: its whole text's
        for i in ranked:
            sentence = self.sentences[i]
            key = sentence.table or i
            texts.setdefault(key, list(sentence.header)).append(sentence.text)
        contexts: dict[object, str] = {
            self.sentences[i].table or i: self.sentences[i].headings for i in ranked
        }
        topics = {  # by its own words first, else by the headings above it
            key: next(
                (
                    t
                    for scope in (" | ".join(text), contexts[key])
                    for t, cue in cues.COMPLIANCE_TOPICS
                    if cue.search(scope)
                ),
                cues.OTHER_RISKS,
            )
            for key, text in texts.items()
        }
        by_topic: dict[str, list[int]] = {}
        for i in ranked:
            by_topic.setdefault(topics[self.sentences[i].table or i], []).append(i)
        order = [topic for topic, _ in cues.COMPLIANCE_TOPICS] + [cues.OTHER_RISKS]
        sections = [(topic, self.lines(by_topic[topic])) for topic in order if topic in by_topic]
        return [s for s in sections if s[1]] or [
            ("Flagged topics", self.nothing_found("compliance or risk topic", "compliance"))
        ]

    def _known_names(self) -> set[str]:
        """Full names given with contact details somewhere in the corpus."""
        return {
            name for i in self.contact_like for name in cues.NAME.findall(self.sentences[i].text)
        }

    def escalation(self) -> list[int]:
        """Routing to a person or line ("complaints … go straight to Amira Haddad"), best
        first; a compliance point stays one unless it names a known contact."""
        known = self._known_names()
        return self.ranked(
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
                and (
                    self.purpose_of.get(i) != "compliance" or any(name in s.text for name in known)
                )
            ],
        )

    def contacts(self, escalation: list[int]) -> list[tuple[str, list[str]]]:
        paths = self.lines(escalation)
        people = [  # in corpus order: a contact list reads best as written
            i
            for i, s in enumerate(self.sentences)
            if i not in escalation
            and (
                i in self.contact_like
                or (s.table is None and cues.BIO.match(s.text))  # a person, by their role
                or (
                    cues.ROLE.search(s.text)
                    and cues.NAME.search(s.text)
                    and self.scores["contacts"][i] >= cues.MIN_SCORE
                )
            )
        ]
        if not [i for i in people if i not in self.used]:  # the sentences that fit best
            people = [i for i in self.ranked("contacts") if i not in escalation]
        sections = [
            ("People and roles", self.lines(people, cues.MAX_CONTACT_LINES)),
            ("Escalation and contact paths", paths),
        ]
        return [s for s in sections if s[1]] or [
            ("People and roles", self.nothing_found("named contact", "contacts"))
        ]
