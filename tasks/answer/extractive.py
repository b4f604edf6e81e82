"""The offline knowledge model, `ExtractiveKnowledgeModel`: deterministic, and it never writes
a sentence of its own.

It quotes the knowledge's sentences, each with its chunk id. Sentences are chosen by IDF-weighted
overlap with the question (IDF over the sentences it was given), so a replay on the recorded
knowledge needs no model at all and is byte-identical. Its triage keeps the candidates whose
support reaches the calibrated confidence threshold. The contract: `tasks.answer.contract`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from core.models import AnswerStatus, LlmCall
from tasks.answer.asks import ask_of, holds_kind
from tasks.answer.contract import Candidate, Claim, Evidence, KnowledgeDoc, Synthesis
from tasks.answer.proofs import prove
from tasks.answer.quotes import Span, Table, Unit, quote_text, units
from tasks.answer.table_answers import table_answer
from tasks.text.sentences import split_sentences
from tasks.text.sparse import analyze
from tasks.text.values import holds_value_for, is_question

EXTRACTIVE_MODEL_ID = "extractive-v6"
EXTRACTIVE_PROMPT_VERSION = "extractive-v2"  # the offline model has no prompt: its rules
# Every version a recorded turn may name; each replays byte-identically. v2 adds value words
# (`tasks.text.values`) to the sentence choice: "the price" picks the sentence with "14.50 EUR".
# v3 quotes exact spans (a table row with its header), answers a table's cell or superlative
# (`tasks.answer.table_answers`), and prefers units that state the value a question asks for;
# its answers go through the support check (`tasks.answer.support`).
# v4 says "answered" only where a structure proves it (`tasks.answer.proofs`: a table cell, a
# value in a sentence that holds the question's subject); otherwise it hands over the passages'
# best units, each quote once ("maybe"). Its syntheses are v3's.
# v5 is v4 whose "maybe" hands a table over whole (its header and every row, when it is short
# enough to quote) where v4 quoted one row of it, tables first for a superlative: the agent
# reads the row or computes the extreme itself.
# v6 is v5 whose "maybe" hands over more of what it was given: when its passages are fewer than
# the quotes a "maybe" may give, it quotes their next-best units too (v5 quoted one unit per
# passage, so a lone passage gave one line), and the closest passages below the confidence an
# answer needs, down to the evidence floor, are quoted beside those that reached it (they never
# prove anything: `tasks.answer.cited_answer.settle`).
PROVING_MODEL_IDS = ("extractive-v4", "extractive-v5", "extractive-v6")
WHOLE_TABLE_MODEL_IDS = ("extractive-v5", "extractive-v6")  # named: a bump keeps their replays
FILLING_MODEL_IDS = ("extractive-v6",)
"""Offline models whose "maybe" fills its quotes from the passages' next-best units and quotes
the closest passages below the confidence an answer needs (v6)."""
UNIT_SCORING_MODEL_IDS = ("extractive-v5", "extractive-v6")
"""Offline models that weigh each unit's meaning as well as its words (the evidence records
the scores, so a replay needs no embedder)."""
QUOTING_MODEL_IDS = ("extractive-v3", *PROVING_MODEL_IDS)
EXTRACTIVE_MODEL_IDS = ("extractive-v1", "extractive-v2", *QUOTING_MODEL_IDS)
MAX_CLAIMS = 3  # sentences an extractive answer quotes (v1 to v3)
EVIDENCE_QUOTES = 5  # quotes a "maybe" hands over (v4, and a model's "maybe")
WHOLE_TABLE_CHARS = 2_000  # a table a "maybe" quotes whole, at most (v5)
SENTENCES_PER_QUERY = 2  # sentences an extractive synthesis quotes per query
_MIN_SENTENCE_CHARS = 20
_QUOTE_CHARS = 400
_TOKEN = re.compile(r"[a-z0-9]+")
_STOPWORD_TEXT = (
    "a an the and or but if of to in on at by for with from as is are was were be been being "
    "do does did have has had what which who whom whose when where why how this that these "
    "those it its i you we they he she our your their my me us them can could should would "
    "will shall may might must not no yes any all some than then there here about into over "
    "under up down out so such very just also more most other only own same too"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def content_terms(text: str) -> list[str]:
    """Lower-cased word tokens without stopwords (what lexical overlap counts).

    Deliberately not the BM25 analyser (`tasks.text.sparse.analyze`): this is no retrieval
    path but the offline model's sentence choice, and recorded answers are replayed under the
    model id they were recorded with (``extractive-v1``, ``extractive-v2``) and must come out
    byte-identical. Changing these terms means a new model id.
    """
    return [t for t in _TOKEN.findall(text.lower()) if t not in _STOPWORDS]


def _sentences(text: str) -> list[str]:
    found = [s for s in split_sentences(text) if len(s) >= _MIN_SENTENCE_CHARS]
    if found:
        return found
    flat = " ".join(text.split())
    return [flat[:_QUOTE_CHARS]] if flat else []


class _Overlap:
    """IDF-weighted share of a query's terms that a sentence contains (IDF over the pool).

    With ``value_words`` (extractive-v2), a question's word that asks for a kind of value
    ("price") counts in a sentence that states such a value ("14.50 EUR").
    """

    def __init__(self, pool: Sequence[str], *, value_words: bool = False) -> None:
        self._pool = list(pool)
        self._value_words = value_words
        self._terms = [set(content_terms(s)) for s in pool]
        df: dict[str, int] = {}
        for terms in self._terms:
            for t in terms:
                df[t] = df.get(t, 0) + 1
        n = max(len(pool), 1)
        self._idf = {t: math.log(1 + n / d) for t, d in df.items()}
        self._unseen = math.log(1 + n)

    def score(self, query: str, index: int, span: int = 1) -> float:
        """The share for the sentences ``index`` .. ``index + span - 1`` taken together."""
        terms = set(content_terms(query))
        if not terms:
            return 0.0
        weights = {t: self._idf.get(t, self._unseen) for t in terms}
        present = set().union(*self._terms[index : index + span])
        text = " ".join(self._pool[index : index + span])
        asks = self._value_words and is_question(query)
        hit = sum(w for t, w in weights.items() if t in present or (asks and _holds_value(t, text)))
        return hit / sum(weights.values())


def _holds_value(word: str, sentence: str) -> bool:
    """``sentence`` states a value of the kind ``word`` asks for ("price": an amount)."""
    return any(holds_value_for(term, sentence) for term in analyze(word))


def _quote(sentence: str) -> str:
    flat = " ".join(sentence.split())
    return flat if len(flat) <= _QUOTE_CHARS else flat[: _QUOTE_CHARS - 1] + "…"


class ExtractiveKnowledgeModel:
    """Offline: triage by calibrated support, answers and syntheses that quote and cite.

    Args:
        threshold: the confidence a chunk needs to count as support (the calibrated
            ``KBFLOW_ANSWER_MIN_CONFIDENCE``); it decides triage and yes / maybe / no.
    """

    def __init__(self, threshold: float, model_id: str = EXTRACTIVE_MODEL_ID) -> None:
        if model_id not in EXTRACTIVE_MODEL_IDS:
            raise ValueError(
                f"unknown offline model {model_id!r}: one of {', '.join(EXTRACTIVE_MODEL_IDS)}"
            )
        self.threshold = threshold
        self.model_id = model_id
        self.prompt_version = model_id
        self._value_words = model_id != "extractive-v1"

    def with_system(self, system: str | None) -> ExtractiveKnowledgeModel:
        """Itself: the offline model has no prompt to replace."""
        return self

    def _record(self, purpose: str, payload: dict[str, Any], reply: str) -> LlmCall:
        return LlmCall(
            purpose=purpose,
            model=self.model_id,
            prompt_version=self.prompt_version,
            system="",
            messages=({"role": "user", "content": json.dumps(payload, sort_keys=True)},),
            reply=reply,
        )

    def triage(
        self, queries: Sequence[str], candidates: Sequence[Candidate], calls: list[LlmCall]
    ) -> list[int]:
        chosen = [i for i, c in enumerate(candidates) if c.support >= self.threshold]
        calls.append(
            self._record(
                "triage",
                {"queries": list(queries), "threshold": self.threshold,
                 "support": [round(c.support, 6) for c in candidates]},
                str(chosen),
            )
        )  # fmt: skip
        return chosen

    def synthesize(
        self, queries: Sequence[str], docs: Sequence[KnowledgeDoc], calls: list[LlmCall]
    ) -> Synthesis:
        split = _units_with_headers if self.model_id in QUOTING_MODEL_IDS else _sentences
        pool: list[tuple[str, str]] = [
            (cid, s) for d in docs for cid, text in d.chunks for s in split(text)
        ]
        overlap = _Overlap([s for _, s in pool], value_words=self._value_words)
        lines: list[str] = []
        cited: dict[str, str] = {}
        supported = 0
        for query in queries:
            if any(d.support.get(query, 0.0) >= self.threshold for d in docs):
                supported += 1
            scores = [overlap.score(query, i) for i in range(len(pool))]
            ranked = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
            picks = [i for i in ranked if scores[i] > 0][:SENTENCES_PER_QUERY]
            if not picks:
                lines.append(f"{query}: no sentence of the knowledge mentions it.")
                continue
            quoted = " ".join(f"“{_quote(pool[i][1])}” [chunk:{pool[i][0]}]" for i in picks)
            lines.append(f"{query}: {quoted}")
            for i in picks:
                cited.setdefault(pool[i][0], _quote(pool[i][1]))
        if not cited or supported == 0:
            status = AnswerStatus.NO
        elif supported == len(queries):
            status = AnswerStatus.YES
        else:
            status = AnswerStatus.MAYBE
        text = "\n".join(lines)
        calls.append(
            self._record(
                "synthesis",
                {"queries": list(queries), "docs": [d.doc_id for d in docs]},
                text,
            )
        )
        return Synthesis(status, text, tuple(cited.items()))

    def answer(
        self, question: str, evidence: Sequence[Evidence], calls: list[LlmCall]
    ) -> list[Claim]:
        if self.model_id in QUOTING_MODEL_IDS:
            if self.model_id in PROVING_MODEL_IDS:
                whole = self.model_id in WHOLE_TABLE_MODEL_IDS
                fill = self.model_id in FILLING_MODEL_IDS
                claims = proving_answer(question, evidence, whole_tables=whole, fill=fill)
            else:
                claims = _quoting_answer(question, evidence)
            calls.append(self._answered(question, evidence, claims))
            return claims
        per_chunk = [[s for s in _sentences(e.text)] for e in evidence]
        flat = [s for sentences in per_chunk for s in sentences]
        overlap = _Overlap(flat, value_words=self._value_words)
        best: list[tuple[float, int, str]] = []  # (score, evidence rank, sentence)
        position = 0
        # v2 also weighs each pair of neighbouring sentences, so a value stated in the sentence
        # after the one that names the subject ("Arctic Breakfast: …. 14.50 EUR per guest.")
        # is quoted with it; a pair wins only when it covers more than either sentence.
        spans = (1, 2) if self._value_words else (1,)
        for rank, sentences in enumerate(per_chunk):
            scored = [
                (overlap.score(question, position + j, n), -n, -j)
                for n in spans
                for j in range(len(sentences) - n + 1)
            ]
            position += len(sentences)
            if not sentences:
                continue
            score, neg_n, neg_j = max(scored)
            best.append((score, rank, " ".join(sentences[-neg_j : -neg_j - neg_n])))
        # Best-supported first; a chunk that shares no word with the question still passed the
        # calibrated threshold, so it may be quoted, after any that do share words.
        best.sort(key=lambda b: (-b[0], b[1]))
        claims = [
            Claim(f"“{_quote(sentence)}”", (evidence[rank].chunk_id,))
            for _, rank, sentence in best[:MAX_CLAIMS]
        ]
        calls.append(self._answered(question, evidence, claims))
        return claims

    def _answered(
        self, question: str, evidence: Sequence[Evidence], claims: list[Claim]
    ) -> LlmCall:
        """The record of an answer call: each claim, its chunk and (v3) its quote's spans."""
        return self._record(
            "answer",
            {"question": question, "evidence": [e.chunk_id for e in evidence]},
            "\n".join(
                f"{c.text} [{c.chunk_ids[0]}]" + (f" {list(c.spans)}" if c.spans else "")
                for c in claims
            ),
        )


def _quoting_answer(
    question: str, evidence: Sequence[Evidence], limit: int = MAX_CLAIMS, *, fill: bool = False
) -> list[Claim]:
    """extractive-v3: a table's cell or superlative when the question reads one off a table,
    then the best-covering unit (sentence, list item, or table row with its header) of each
    chunk, or two neighbouring sentences together; units that state a value of the asked kind
    first among equals. Every claim quotes exact spans of its chunk. ``fill`` (v6): when the
    chunks' best units leave room under ``limit``, each chunk's next-best units follow, best
    first (a lone passage is quoted by more than its one best line)."""
    ask = ask_of(question)
    claims: list[Claim] = []
    table = table_answer(ask, [(e.chunk_id, e.text) for e in evidence])
    if table is not None:
        text = next(e.text for e in evidence if e.chunk_id == table.chunk_id)
        claims.append(Claim(table.text, (table.chunk_id,), quote_text(text, table.spans),
                            table.spans, table.computed))  # fmt: skip
    per_chunk = [units(e.text) for e in evidence]
    flat = [quote_text(e.text, u.spans) for e, us in zip(evidence, per_chunk, strict=True)
            for u in us]  # fmt: skip
    overlap = _Overlap(flat, value_words=True)
    best: list[tuple[float, int, tuple[tuple[int, int], ...]]] = []
    more: list[tuple[float, int, tuple[tuple[int, int], ...]]] = []  # the runners-up (fill)
    position = 0
    for rank, (e, us) in enumerate(zip(evidence, per_chunk, strict=True)):
        options: list[tuple[float, int, int, tuple[tuple[int, int], ...]]] = []
        for j, unit in enumerate(us):
            if table is not None and unit.table is not None and e.chunk_id == table.chunk_id:
                continue  # the table was read: its other rows answer nothing more
            for n in (1, 2):
                if j + n > len(us) or (n == 2 and not _joinable(e.text, unit, us[j + 1])):
                    continue
                spans = unit.spans if n == 1 else ((unit.span[0], us[j + 1].span[1]),)
                said = quote_text(e.text, spans)
                score = overlap.score(question, position + j, n)
                if e.unit_scores:  # meaning as well as words: "lawyers" / "legal professionals"
                    score = 0.5 * score + 0.5 * max(e.unit_scores[j : j + n])
                if ask.kinds and any(holds_kind(k, _values_of(unit, said)) for k in ask.kinds):
                    score += 0.25
                options.append((score, -n, -j, spans))
        position += len(us)
        if options:
            ranked = sorted(options, reverse=True)
            score, _, _, spans = ranked[0]
            best.append((score, rank, spans))
            if fill:
                more.extend((o[0], rank, o[3]) for o in ranked[1:] if o[0] > 0)
    best.sort(key=lambda b: (-b[0], b[1]))
    more.sort(key=lambda b: (-b[0], b[1]))
    for _, rank, spans in [*best, *more]:
        if len(claims) >= limit:
            break
        e = evidence[rank]
        if claims and claims[0].chunk_ids[0] == e.chunk_id and claims[0].spans[-1:] == spans[-1:]:
            continue  # the table answer already quotes this row
        if fill and any(c.chunk_ids[0] == e.chunk_id and _overlaps(c.spans, spans) for c in claims):
            continue  # a runner-up that repeats part of a quote already given
        said = quote_text(e.text, spans)
        claims.append(Claim(f"“{said}”", (e.chunk_id,), said, spans))
    return claims


def _overlaps(a: tuple[Span, ...], b: tuple[Span, ...]) -> bool:
    """Two quotes of one chunk share text beyond a table's header line (which every row of a
    table repeats)."""
    return any(s < e2 and s2 < e for s, e in a[-1:] for s2, e2 in b[-1:])


def proving_answer(
    question: str, evidence: Sequence[Evidence], *, whole_tables: bool = False, fill: bool = False
) -> list[Claim]:
    """extractive-v4 to v6: the claim a structure proves (`tasks.answer.proofs`), if any,
    then the passages' best units as evidence, each quote once, `EVIDENCE_QUOTES` in all (v5:
    ``whole_tables``, v6: ``fill``, see `evidence_quotes`)."""
    proved, _ = prove(ask_of(question), evidence)
    claims = [proved.claim] if proved is not None else []
    for claim in evidence_quotes(question, evidence, whole_tables=whole_tables, fill=fill):
        if len(claims) >= EVIDENCE_QUOTES:
            break
        said = " ".join(claim.quote.split())
        if any(said and said in " ".join(c.quote.split()) for c in claims):
            continue  # the proved claim already quotes it
        claims.append(claim)
    return claims


def evidence_quotes(
    question: str, evidence: Sequence[Evidence], *, whole_tables: bool = False, fill: bool = False
) -> list[Claim]:
    """The passages' own best text for ``question``, as a "maybe" hands it to the agent: the
    units extractive-v3 would quote (`_quoting_answer`), each quote once however many
    overlapping chunks hold it. ``whole_tables`` (v5): a quoted table row becomes its whole
    table (header and every row, up to `WHOLE_TABLE_CHARS`), each table once, and for a
    superlative the tables come first. ``fill`` (v6): fewer passages than quotes leave room
    for their next-best units (`_quoting_answer`)."""
    claims = _quoting_answer(question, evidence, EVIDENCE_QUOTES + 2, fill=fill)
    if whole_tables:
        claims = _whole_tables(claims, evidence, first=ask_of(question).extreme is not None)
    return dedupe_quotes(claims)[:EVIDENCE_QUOTES]


def _whole_tables(
    claims: Sequence[Claim], evidence: Sequence[Evidence], *, first: bool
) -> list[Claim]:
    texts = {e.chunk_id: e.text for e in evidence}
    tables_of: dict[str, dict[tuple[Span, ...], Table]] = {}  # by chunk: a row's spans -> table
    tables: list[Claim] = []
    rest: list[Claim] = []
    for claim in claims:
        cid = claim.chunk_ids[0]
        text = texts.get(cid, "")
        if cid not in tables_of:
            tables_of[cid] = {u.spans: u.table for u in units(text) if u.table is not None}
        table = tables_of[cid].get(claim.spans)
        if table is None:
            rest.append(claim)
            continue
        spans = (table.header_span, *(r.span for r in table.rows))
        said = quote_text(text, spans)
        if len(said) > WHOLE_TABLE_CHARS:
            rest.append(claim)
            continue
        whole = Claim(f"“{said}”", claim.chunk_ids, said, spans)
        (tables if first else rest).append(whole)
    return [*tables, *rest]


def dedupe_quotes(claims: Sequence[Claim]) -> list[Claim]:
    """``claims`` without a quote already given (the same text from overlapping chunks, or a
    quote inside another one already kept); the first one of each stays."""
    kept: list[Claim] = []
    seen: list[str] = []
    for claim in claims:
        said = " ".join((claim.quote or claim.text).split()).casefold()
        if any(said in s or s in said for s in seen if said and s):
            continue
        seen.append(said)
        kept.append(claim)
    return kept


def _units_with_headers(text: str) -> list[str]:
    """extractive-v3's quotable units of a chunk: a table row comes with its header line."""
    return [quote_text(text, u.spans) for u in units(text)] or _sentences(text)


def _joinable(text: str, unit: Unit, after: Unit) -> bool:
    """Two neighbouring prose sentences of one paragraph may be quoted together (not table
    rows, not across a blank line or a heading)."""
    between = text[unit.span[1] : after.span[0]]
    return (
        unit.table is None and after.table is None and "\n\n" not in between and "#" not in between
    )


def _values_of(unit: Unit, said: str) -> str:
    """Where a unit's values are: a table row's own line, not its header."""
    return said.splitlines()[-1] if unit.table is not None else said
