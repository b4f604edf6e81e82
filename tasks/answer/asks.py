"""What a question asks for (`ask_of`), and whether a text holds a value of a kind
(`holds_kind`): the reading of a question that the support check (`tasks.answer.support`) and
the table answers (`tasks.answer.table_answers`) share.

A question asks for a kind of value through its words ("price", "total", "when", "how many",
"sells for", and the commonest value words of German, French, Spanish, Dutch, Italian and
Korean), may ask for a superlative ("highest", "cheapest", "the most"), and names things
("Aurora", "Sheryl Baxter", "DB2", "2021") that the passage answering it names too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tasks.text.pii import find_pii
from tasks.text.sparse import STOPWORDS, analyze, words
from tasks.text.values import _DATE, _DURATION, _MASS, _MONEY

_NUMBER_WORDS = (
    "one two three four five six seven eight nine ten eleven twelve fifteen twenty thirty "
    "forty fifty hundred thousand million billion dozen half"
)
NUMBER = re.compile(rf"\d|\b(?:{'|'.join(_NUMBER_WORDS.split())})\b", re.I)
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
    "number": NUMBER,
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
MOST_EXPENSIVE = re.compile(r"\bmost expensive\b", re.I)
LEAST_EXPENSIVE = re.compile(r"\bleast expensive\b", re.I)
_QUESTION_TEXT = (
    "what which who whom whose when where why how is are was were do does did can could will "
    "would should may must has have name called call tell give list show"
)
_GENERIC_TEXT = (
    "get gets got give gives make makes take takes need needs want know find use used go goes "
    "come comes came say says mean means kind type exactly currently actually usually"
)
QUESTION_WORDS = frozenset(_QUESTION_TEXT.split()) | frozenset(analyze(_GENERIC_TEXT))


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
        if not token or low in QUESTION_WORDS or low in STOPWORDS:
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
    if MOST_EXPENSIVE.search(question):
        extreme, superlative = "max", "expensive"
    elif LEAST_EXPENSIVE.search(question):
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
        if t not in QUESTION_WORDS and len(t) > 1
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
    text = _unlabelled(text, kind)
    if kind == "date" and _MONTH_OR_SEASON.search(text):
        return True
    return KIND_PATTERNS[kind].search(text) is not None


# Numbers that label rather than state: "Figure 2", "Table 3.1", "Section 4", a heading's
# "2 Row and Column Access …" or "(2) …", and, for a count, the digit of a code ("DB2").
_LABEL = re.compile(
    r"\b(?:Figure|Fig\.|Table|Tab\.|Section|Sec\.|Chapter|Appendix|Listing|Equation|Eq\.|"
    r"Step|Part|Abb\.|Abbildung|Tabelle|그림|표)\s*\d+(?:\.\d+)*[a-z]?\b"
    r"|^\s*(?:\(\d+\)|\d+(?:\.\d+)*[.)]?)\s+(?=[A-Z\uac00-\ud7a3])",
    re.M,
)
_CODE_DIGITS = re.compile(r"\b[A-Za-z]+\d+\b")


def _unlabelled(text: str, kind: str) -> str:
    """``text`` without the numbers that label a figure, table or section (`_LABEL`), and for
    a plain number without codes' digits: they answer no "how many"."""
    text = _LABEL.sub(" ", text)
    return _CODE_DIGITS.sub(" ", text) if kind == "number" else text
