"""Does a quote hold the answer? The check that decides "answered" or "maybe".

An answer is "answered" only when the exact text it quotes holds what the question asks for:

- a **value question** (a price, a total, a date, a phone number, a share, a count …) needs a
  value of the asked kind in the quote (`asked_kinds`);
- a quote that is only a table's **header row** holds no value at all;
- a **superlative** ("highest", "cheapest", "most") is either stated by the quote itself
  ("the world's smallest breed") or computed over a table's rows (`table_answer`); a row picked
  by word overlap is never claimed to be the highest;
- a question that names a **row and a column** of a table is answered with that cell, its row
  and its column header (`table_answer`), and a column the question names only in part ("date
  of birth" against "Subscription Date") is missing unless its other words are in the chunk.

Otherwise the answer is "maybe": the best evidence, and `Verdict.missing` saying what the quote
lacks. Pure and deterministic: a replay re-runs it on the recorded evidence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tasks.answer.contract import Claim
from tasks.answer.quotes import Table, TableRow, is_header_only, tables
from tasks.text.pii import find_pii
from tasks.text.sparse import STOPWORDS, analyze, words
from tasks.text.values import _DATE, _DURATION, _MASS, _MONEY

_NUMBER_WORDS = (
    "one two three four five six seven eight nine ten eleven twelve fifteen twenty thirty "
    "forty fifty hundred thousand million billion dozen half"
)
_NUMBER = re.compile(rf"\d|\b(?:{'|'.join(_NUMBER_WORDS.split())})\b", re.I)
_PERCENT = re.compile(r"\d\s?%|\bper ?cent\b|\bpercent(?:age)?\b|\d\s?(?:pp|bps)\b", re.I)
_TIME = re.compile(
    r"\b\d{1,2}[:.h]\d{2}\b|\b\d{1,2}\s?(?:am|pm|a\.m\.|p\.m\.)|\bnoon\b|\bmidnight\b", re.I
)
_LENGTH = re.compile(
    r"\d(?:[.,]\d+)?\s?(?:km|kilomet(?:er|re)s?|m|met(?:er|re)s?|cm|mm|mi|miles?|ft|feet|in"
    r"|inch(?:es)?|px|pixels?)\b|\d+\s?[x×]\s?\d+",
    re.I,
)


_MONTH_OR_SEASON = re.compile(
    r"\b(?:January|February|March|April|May|June|July|August|September|October|November|"
    r"December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\b|\bQ[1-4]\b"
    r"|\b(?:spring|summer|autumn|fall|winter)\b|\b(?:today|tomorrow|yesterday)\b"
    r"|\b(?:Januar|Februar|März|Mai|Juni|Juli|Oktober|Dezember|janvier|février|mars|avril|mai|"
    r"juin|juillet|août|septembre|octobre|novembre|décembre)\b|\d+\s?(?:년|월|일)"
)
KIND_PATTERNS: dict[str, re.Pattern[str]] = {
    "money": _MONEY,
    "mass": _MASS,
    "duration": _DURATION,
    "date": _DATE,
    "time": _TIME,
    "percent": _PERCENT,
    "number": _NUMBER,
    "length": _LENGTH,
}
_MASKED = re.compile(r"\[[A-Z]+(?:_\d+)?\]")
_PLACEHOLDER = re.compile(r"\[(PHONE|EMAIL)(?:_\d+)?\]")
KIND_NAMES = {
    "money": "an amount of money", "mass": "a weight", "duration": "a duration",
    "date": "a date or year", "time": "a time of day", "percent": "a percentage",
    "number": "a number", "length": "a length or size", "phone": "a phone number",
    "email": "an e-mail address", "name": "a name",
}  # fmt: skip

# Words that ask for a kind of value, and the kinds that answer them (any one will do).
_ASKING: dict[str, frozenset[str]] = {}
for _words, _kinds in (
    ("price prices priced cost costs costing fee fees charge charged tariff expensive cheap "
     "pay spend spent salary wage budget revenue turnover invoice bill billed", "money"),
    ("total amount sum subtotal balance due", "money number"),
    ("phone telephone mobile hotline dial ring", "phone"),
    ("email e-mail mail", "email"),
    ("contact reach", "phone email"),
    ("weigh weighs weight heavy heavier mass", "mass number"),
    ("duration period", "duration number"),
    ("date deadline year", "date duration"),
    ("when", "date time duration"),
    ("percent percentage rate share proportion vat ratio", "percent money number"),
    ("discount", "percent money"),
    ("size resolution dimension dimensions long far distance range tall wide high",
     "length number duration"),
    ("count", "number"),
    ("version release", "number"),
    # Other languages' most common value words (the question in a document's own language).
    ("preis kosten kostet prix coût coûte precio cuesta prijs kost prezzo costo gebühr", "money"),
    ("wann quand cuándo cuando wanneer quando 언제 いつ", "date time duration"),
    ("gesamt gesamtbetrag summe totale totaal betrag montant importe bedrag 합계 총액",
     "money number"),
    ("mwst ust tva iva btw", "percent money number"),
    ("얼마 몇 wieviel wie viele combien cuántos cuántas hoeveel quanti quante", "number money"),
):  # fmt: skip
    for _w in _words.split():
        _ASKING[_w] = frozenset(_kinds.split())
_HOW: dict[str, frozenset[str]] = {
    "many": frozenset({"number"}),
    "much": frozenset({"money", "number", "mass", "percent"}),
    "long": frozenset({"duration", "length"}),
    "far": frozenset({"length"}),
    "old": frozenset({"number", "date", "duration"}),
    "often": frozenset({"number", "duration", "date"}),
    "big": frozenset({"length", "number", "mass"}),
    "large": frozenset({"length", "number", "mass"}),
    "fast": frozenset({"number", "length", "duration"}),
    "heavy": frozenset({"mass", "number"}),
    "tall": frozenset({"length", "number"}),
    "quick": frozenset({"number", "duration"}),
    "quicker": frozenset({"number", "duration"}),
    "soon": frozenset({"duration", "date", "number"}),
}
_WHAT_TIME = re.compile(r"\b(?:what|which) time\b|\bat what hour\b|\bopening hours\b", re.I)
_WHAT_YEAR = re.compile(r"\b(?:what|which) year\b|\bin what year\b", re.I)
_NUMBER_OF = re.compile(r"\bnumber of\b", re.I)
_SELLS_FOR = re.compile(r"\b(?:sells?|sold|selling|go(?:es)?|retails?)\s+for\b|\bworth\b", re.I)
_WHO = re.compile(r"^\s*(?:who|whom|whose)\b", re.I)

_MAX_WORDS = (
    "highest most largest biggest greatest maximum max top priciest longest heaviest latest "
    "newest fastest best busiest"
)
_MIN_WORDS = (
    "lowest least smallest minimum min cheapest fewest shortest lightest earliest oldest slowest"
)
SUPERLATIVES: dict[str, str] = {
    **dict.fromkeys(_MAX_WORDS.split(), "max"),
    **dict.fromkeys(_MIN_WORDS.split(), "min"),
}
_MOST_EXPENSIVE = re.compile(r"\bmost expensive\b", re.I)
_LEAST_EXPENSIVE = re.compile(r"\bleast expensive\b", re.I)
_QUESTION_TEXT = (
    "what which who whom whose when where why how is are was were do does did can could will "
    "would should may must has have name called call tell give list show"
)
_GENERIC_TEXT = (
    "get gets got give gives make makes take takes need needs want know find use used go goes "
    "come comes say says mean means kind type exactly currently actually usually"
)
_QUESTION_WORDS = frozenset(_QUESTION_TEXT.split()) | frozenset(analyze(_GENERIC_TEXT))


@dataclass(frozen=True)
class Ask:
    """What a question asks for.

    Attributes:
        kinds: the value kinds that would answer it (any one); empty for no value question.
        extreme: "max" / "min" for a superlative, with ``superlative`` its word.
        terms: its content terms (analysed, stemmed), question words left out.
    """

    question: str
    kinds: frozenset[str]
    extreme: str | None
    superlative: str | None
    terms: tuple[str, ...]
    names: tuple[str, ...] = ()
    name_groups: tuple[tuple[str, ...], ...] = ()


def _name_words(text: str) -> set[str]:
    """Words and their stems ("Thursdays" names "Thursday")."""
    said = words(text)
    return set(said) | set(analyze(" ".join(said)))


def _labels(chunk: str) -> str:
    """What labels a chunk's text: its headings, heading-like lines and table headers."""
    from tasks.answer.quotes import is_heading

    lines = [ln.strip().lstrip("#").strip() for ln in chunk.splitlines()]
    heads = [ln for ln in lines if ln and is_heading(ln)]
    heads += [" ".join(t.header) for t in tables(chunk)]
    heads += [m.group(1) for m in re.finditer(r"^#{1,6}\s+(.+)$", chunk, re.M)]
    return "\n".join(heads)


def _name_groups(question: str) -> tuple[tuple[str, ...], ...]:
    """The names a question gives, each as its words (lower-cased stems): runs of capitalised
    words other than its first and its question words ("Aurora", "Sheryl Baxter"), and codes
    and numbers ("DB2", "2025-0412", "2021"). The passage that answers it names each of them,
    by at least one of its words ("Hernando" for "Hernando Bedoya")."""
    groups: list[list[str]] = []
    run = False
    tokens = re.findall(r"[\w][\w'’./-]*", _MASKED.sub(" ", question))
    for i, token in enumerate(tokens):
        token = re.sub(r"['’]s$", "", token).strip(".-/")
        low = token.lower()
        if not token or low in _QUESTION_WORDS or low in STOPWORDS:
            run = False
            continue
        capital = token[:1].isupper() and i > 0 and token[:1].isalpha()
        code = any(ch.isdigit() for ch in token) and (
            any(ch.isalpha() for ch in token) or sum(ch.isdigit() for ch in token) >= 3
        )
        stems = [w for w in analyze(token) if w not in STOPWORDS]
        if (capital or code) and stems:
            if run and capital:
                groups[-1].extend(stems)
            else:
                groups.append(stems)
            run = capital
        else:
            run = False
    return tuple(tuple(dict.fromkeys(g)) for g in groups)


def ask_of(question: str) -> Ask:
    """What ``question`` asks for (see `Ask`)."""
    question = _MASKED.sub(" ", question)  # "[EMAIL]": the asker's own data, masked, no ask
    said = words(question)
    named: set[str] = set()  # kinds the question's own words ask for ("cost": an amount)
    how: set[str] = set()  # what "how much", "how long" … ask for: looser
    for i, w in enumerate(said):
        named |= _ASKING.get(w, frozenset())
        if w == "how" and i + 1 < len(said) and said[i + 1] in _HOW:
            how |= _HOW[said[i + 1]]
    kinds = (named & how or named) if named else how
    if _WHAT_TIME.search(question):
        kinds = {"time"}
    if _WHAT_YEAR.search(question):
        kinds = {"date"}
    if _NUMBER_OF.search(question):
        kinds |= {"number"}
    if _SELLS_FOR.search(question):
        kinds = {"money"}
    if _WHO.search(question) and not kinds:
        kinds = {"name"}
    dialled = {"call", "phone", "dial"} & set(said)
    if "number" in said and not _NUMBER_OF.search(question) and dialled:
        kinds |= {"phone"}
    extreme, superlative = None, None
    if _MOST_EXPENSIVE.search(question):
        extreme, superlative = "max", "expensive"
    elif _LEAST_EXPENSIVE.search(question):
        extreme, superlative = "min", "expensive"
    else:
        for w in said:
            loose = w in ("most", "least", "max", "min") and _adverbial(said, w)
            if w in SUPERLATIVES and not loose:
                extreme, superlative = SUPERLATIVES[w], w
                break
    if superlative in ("expensive", "priciest", "cheapest"):
        kinds |= {"money"}
    after_how = {said[i + 1] for i, w in enumerate(said[:-1]) if w == "how"}
    terms = tuple(
        t for t in analyze(" ".join(w for w in said if w not in after_how))
        if t not in _QUESTION_WORDS and len(t) > 1
    )  # fmt: skip
    groups = _name_groups(question)
    names = tuple(dict.fromkeys(w for g in groups for w in g))
    return Ask(question, frozenset(kinds), extreme, superlative, terms, names, groups)


def _adverbial(said: list[str], word: str) -> bool:
    """ "most" in "at most", "most of", "the most" before nothing: not a superlative."""
    i = said.index(word)
    before = said[i - 1] if i else ""
    after = said[i + 1] if i + 1 < len(said) else ""
    return before == "at" or after in ("", "of", "likely", "recent", "common", "important")


def holds_kind(kind: str, text: str, question: str = "") -> bool:
    """``text`` states a value of ``kind`` (`KIND_NAMES`); a "name" is a capitalised word
    that is not the start of a sentence and not already in ``question``."""
    if kind == "name":
        asked = set(words(question))
        return (
            any(
                w[:1].isupper() and w.lower() not in asked and w.lower() not in STOPWORDS
                for w in re.findall(r"(?<![.!?:]\s)(?<!^)\b[A-Z][\w'-]+", text.strip())
            )
            or _PLACEHOLDER.search(text) is not None
            or any(f.kind == "email" for f in find_pii(text))
        )
    if kind in ("phone", "email"):
        if any(m.group(1).lower() == kind for m in _PLACEHOLDER.finditer(text)):
            return True
        return any(f.kind == kind for f in find_pii(text))
    if kind == "date" and _MONTH_OR_SEASON.search(text):
        return True
    return KIND_PATTERNS[kind].search(text) is not None


@dataclass(frozen=True)
class Verdict:
    """The support check's finding on one quote: ``ok``, or what is ``missing``."""

    ok: bool
    missing: str | None = None


def check(ask: Ask, quote: str, chunk: str, *, computed: bool = False, title: str = "") -> Verdict:
    """Whether ``quote`` (exact text of ``chunk``) holds the answer to ``ask``.

    Args:
        computed: the quote is a superlative computed over a table's rows (`table_answer`).
        title: the chunk's document title (a question's words may be there, not in the chunk).
    """
    if not quote.strip():
        return Verdict(False, "the answer quotes nothing")
    flat = " ".join(chunk.split())
    if any(" ".join(ln.split()) not in flat for ln in quote.splitlines() if ln.strip()):
        return Verdict(False, "the quote is not in the cited passage")
    if is_header_only(quote, chunk):
        return Verdict(False, "the quote is a table's header row, which holds no value")
    body = _rows_only(quote, chunk)
    if ask.kinds and not any(holds_kind(k, body, ask.question) for k in ask.kinds):
        wanted = " or ".join(sorted(KIND_NAMES[k] for k in ask.kinds))
        return Verdict(False, f"the quoted text states no {wanted}")
    if ask.extreme and not computed and not _states_superlative(ask, quote):
        return Verdict(
            False,
            f"the question asks for the {ask.superlative} and the quote does not compare "
            "(no table to compute it over)",
        )
    named = _name_words(f"{quote}\n{title}\n{_labels(chunk)}")
    absent = [" ".join(g) for g in ask.name_groups if not any(w in named for w in g)]
    if absent:
        return Verdict(False, f"the quote never names {', '.join(absent)!r}")
    if computed:
        return Verdict(True)
    is_row = any(ln.strip().startswith("|") for ln in quote.splitlines())
    missing = (
        _unnamed_attribute(ask, quote, chunk, title)
        or (None if is_row else _uncounted(ask, quote))
        or (_unnamed_column(ask, quote, chunk, title) if is_row else _untied(ask, chunk, title))
    )
    return Verdict(False, missing) if missing else Verdict(True)


_AUX = (
    "is are was were do does did can could will would should has have had may might must "
    "the a an of in on for to at by from with"
)
_ATTRIBUTE = re.compile(
    rf"^\s*(?:what|which)\s+((?:(?!(?:{'|'.join(_AUX.split())})\b)[\w-]+\s+){{1,3}})", re.I
)
_COUNTED = re.compile(
    rf"\bhow many\s+((?:(?!(?:{'|'.join(_AUX.split())})\b)[\w-]+\s*){{1,3}})", re.I
)


def _unnamed_attribute(ask: Ask, quote: str, chunk: str, title: str) -> str | None:
    """ "What colours …", "Which frame sizes …": the thing asked for is named in the chunk (or
    its title), or, for a table row, by a column header. Not for value kinds ("what time")."""
    m = _ATTRIBUTE.search(ask.question)
    if not m or ask.kinds - {"name"}:
        return None
    asked = [t for t in analyze(m.group(1)) if t not in _QUESTION_WORDS and t not in ask.names]
    if not asked:
        return None
    head = asked[-1]
    headers = {t for tb in tables(chunk) for cell in tb.header for t in analyze(cell)}
    if any(ln.strip().startswith("|") for ln in quote.splitlines()):
        return (
            None
            if head in headers
            else f"no column of the table is the {m.group(1).strip()!r} asked for"
        )
    if head in set(analyze(chunk)) | set(analyze(title)):
        return None
    return f"the cited passage never mentions {m.group(1).strip()!r}"


def _uncounted(ask: Ask, quote: str) -> str | None:
    """ "How many pages …": a number in the quote counts that thing ("80863 … pages")."""
    m = _COUNTED.search(ask.question)
    if not m:
        return None
    nouns = [t for t in analyze(m.group(1)) if t not in ask.names] or analyze(m.group(1))
    if not nouns:
        return None
    said = words(quote)
    stems = _stems_aligned(said)
    for i, stem in enumerate(stems):  # any of the asked words, the verb among them too
        if stem in nouns and any(_NUMBER.search(w) for w in said[max(0, i - 4) : i]):
            return None
    return f"no number in the quote counts the {m.group(1).strip()!r} asked for"


def _stems_aligned(said: list[str]) -> list[str]:
    """Each word's stem, position for position (stop words kept as they are)."""
    return [(analyze(w) or [w])[0] for w in said]


def _untied(ask: Ask, chunk: str, title: str) -> str | None:
    """ "How many weeks of maternity leave": a word tied by "of" to what is asked, found
    nowhere in the chunk or its title, is a fact the passage does not hold."""
    linked = re.findall(r"\bof\s+(?:the\s+|a\s+|an\s+)?(\w+)", ask.question)
    tied = [t for t in analyze(" ".join(linked)) if t not in _QUESTION_WORDS]
    known = set(analyze(chunk)) | set(analyze(title))
    absent = [t for t in tied if t not in known]
    return f"the cited passage never mentions {', '.join(absent)!r}" if absent else None


def _rows_only(quote: str, chunk: str) -> str:
    """The quote without its tables' header lines: values sit in rows, not in column names."""
    headers = {" ".join(chunk[s:e].split()) for t in tables(chunk) for s, e in (t.header_span,)}
    return "\n".join(ln for ln in quote.splitlines() if " ".join(ln.split()) not in headers)


_CAP = re.compile(
    r"\b(?:up to|at most|maximum|max\.?|no more than|not more than|limit(?:ed)? (?:of|to)"
    r"|capped at|ceiling)\b",
    re.I,
)
_FLOOR = re.compile(r"\b(?:at least|minimum|min\.|no less than|not less than|from)\b", re.I)


def _states_superlative(ask: Ask, quote: str) -> bool:
    said = set(words(quote))
    if ask.superlative in ("most", "max", "maximum") and _CAP.search(quote):
        return True  # "the most I can spend" is a cap: "up to 140 EUR"
    if ask.superlative in ("least", "min", "minimum") and _FLOOR.search(quote):
        return True
    if ask.superlative == "expensive":
        return bool(_MOST_EXPENSIVE.search(quote) or _LEAST_EXPENSIVE.search(quote))
    same = {w for w, d in SUPERLATIVES.items() if d == ask.extreme}
    return ask.superlative in said or bool(said & same & {ask.superlative or ""})


def _unnamed_column(ask: Ask, quote: str, chunk: str, title: str) -> str | None:
    """For a quoted table row: what the question asks of the row must be a column.

    When kbflow's own reading of the table picks this row and a column (`table_answers`), only
    a word tied to the column's name by "of" and found nowhere in the chunk is missing ("date
    of birth" of a customer list whose only date is "Subscription Date"). Otherwise (a row
    quoted for its words), every question word that names neither the row nor a column and
    appears nowhere in the chunk or its title is missing ("job title" of the same list).
    """
    quoted = [ln for ln in quote.splitlines() if ln.strip().startswith("|")]
    if not quoted:
        return None
    from tasks.answer.table_answers import table_answer  # it reads tables with this module

    known = set(analyze(chunk)) | set(analyze(title))
    acting = " ".join(w for w in words(ask.question) if w.endswith(("ed", "ing")))
    loose = set(analyze(" ".join(SUPERLATIVES) + " " + acting))
    absent = [t for t in dict.fromkeys(ask.terms) if t not in known and t not in loose]
    if not absent:
        return None
    read = table_answer(ask, [("", chunk)])
    rows = {" ".join(q.split()) for q in quoted}
    if read is not None and any(" ".join(chunk[s:e].split()) in rows for s, e in read.spans[1:]):
        tied = set(
            analyze(" ".join(re.findall(r"\bof\s+(?:the\s+|a\s+|an\s+)?(\w+)", ask.question)))
        )
        absent = [t for t in absent if t in tied]
    if absent:
        return f"no column or row of the table matches the question's {', '.join(absent)!r}"
    return None


def _row_of(table: Table, chunk: str, quoted: Sequence[str]) -> TableRow | None:
    lines = {" ".join(q.split()) for q in quoted}
    for row in table.rows:
        if " ".join(chunk[row.span[0] : row.span[1]].split()) in lines:
            return row
    return None


@dataclass(frozen=True)
class Judgement:
    """The support check over an answer's claims: ``answered`` with the claims whose quotes
    hold the answer (in order), or not, with the claims as evidence and what is ``missing``."""

    answered: bool
    claims: tuple[Claim, ...]
    missing: str | None = None


def judge(
    question: str,
    claims: Sequence[Claim],
    texts: dict[str, str],
    titles: dict[str, str] | None = None,
) -> Judgement:
    """Check each claim's quote against the chunk it quotes (``texts``: chunk id -> the text
    the model saw; ``titles``: chunk id -> its document's title). Answered when at least one
    quote holds the answer; those claims are kept, the rest dropped. Otherwise every claim is
    kept as evidence, with the first one's gap."""
    ask = ask_of(question)
    held: list[Claim] = []
    gaps: list[str] = []
    for claim in claims:
        chunk = texts.get(claim.chunk_ids[0], "") if claim.chunk_ids else ""
        if not claim.quote:
            gaps.append("the answer quotes nothing")
            continue
        title = (titles or {}).get(claim.chunk_ids[0], "")
        verdict = check(ask, claim.quote, chunk, computed=claim.computed, title=title)
        if verdict.ok:  # it cites what it quotes: an unquoted second chunk is not checked
            held.append(replace(claim, chunk_ids=claim.chunk_ids[:1]))
        else:
            gaps.append(verdict.missing or "")
    if held:
        return Judgement(True, tuple(held))
    return Judgement(False, tuple(claims), gaps[0] if gaps else "no claim quotes the passage")
