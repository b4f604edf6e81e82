"""What a question asks for, and whether a text holds a value of that kind.

A question names its topic ("Arctic Breakfast") and, often, the kind of value it wants ("the
price"). A document that answers it states the value ("14.50 EUR"), rarely the word: "price",
"cost" and "fee" are answered by an amount, "phone" and "reach" by a number or an address,
"weigh" and "heavy" by a mass. Matching the question's words alone counts such a word as
missing from the very passage that answers it; this module lets the answer confidence
(`tasks.answer.confidence.coverage`) count it as present when the text holds a value of the
asked kind, so a paraphrase is answered while a passage about the right product that states no
price still lacks the word.

Only questions ask for values (`is_question`): a claim or a keyword query ("mortality rate in
trial cohorts") names a topic, and its "rate" must be matched as a word.

Each kind is recognised by a pattern: amounts with a currency (symbol or ISO code, either
side), phone numbers and e-mail addresses (the PII finder's own rules, `tasks.text.pii`),
masses, durations and dates.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

from tasks.text.pii import find_pii
from tasks.text.sparse import analyze, words

_CURRENCY = (
    r"(?:€|\$|£|¥|₹|CHF|EUR|USD|GBP|SEK|NOK|DKK|PLN|CZK|JPY|CAD|AUD|euros?|dollars?|pounds?)"
)
_AMOUNT = r"\d[\d.,' ]*\d|\d"
_MONEY = re.compile(
    rf"{_CURRENCY}\s?(?:{_AMOUNT})|(?:{_AMOUNT})\s?{_CURRENCY}(?![A-Za-z])|\bfree of charge\b",
    re.IGNORECASE,
)
_MASS = re.compile(r"\d(?:[.,]\d+)?\s?(?:kg|kilo(?:gram)?s?|g|grams?|lbs?|pounds?|oz)\b", re.I)
_DURATION = re.compile(
    r"\b(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|twelve|twenty|thirty)"
    r"[\s-](?:(?:working|business|calendar)\s)?"
    r"(?:seconds?|minutes?|hours?|days?|weeks?|months?|years?)\b",
    re.I,
)
_MONTHS = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
    r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_DATE = re.compile(
    rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}[/.]\d{{1,2}}[/.]\d{{2,4}}\b"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s{_MONTHS}\b|\b{_MONTHS}\s\d{{1,2}}(?:st|nd|rd|th)?\b"
    rf"|\b(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)s?\b"
    rf"|\b(?:19|20)\d\d\b",
    re.I,
)


def _has_money(text: str) -> bool:
    return _MONEY.search(text) is not None


def _has_pii(kinds: frozenset[str]) -> Callable[[str], bool]:
    def holds(text: str) -> bool:
        return any(f.kind in kinds for f in find_pii(text))

    return holds


def _has(pattern: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda text: pattern.search(text) is not None


def _has_date(text: str) -> bool:
    return _DATE.search(text) is not None or _DURATION.search(text) is not None


# The words that ask for a kind of value, and how to tell that a text holds one. Keys are
# written as a user writes them and analysed (stemmed) once, so they match `analyze`'s terms.
_ASKING_WORDS: dict[str, Callable[[str], bool]] = {
    **dict.fromkeys(
        (
            "price",
            "prices",
            "priced",
            "cost",
            "costs",
            "fee",
            "fees",
            "charge",
            "charged",
            "tariff",
            "expensive",
            "cheap",
            "pay",
        ),
        _has_money,
    ),
    **dict.fromkeys(
        ("phone", "telephone", "number", "call", "ring", "mobile", "hotline", "dial"),
        _has_pii(frozenset({"phone"})),
    ),
    **dict.fromkeys(("email", "mail"), _has_pii(frozenset({"email"}))),
    **dict.fromkeys(("contact", "reach"), _has_pii(frozenset({"phone", "email"}))),
    **dict.fromkeys(("weigh", "weighs", "weight", "heavy", "heavier", "mass"), _has(_MASS)),
    **dict.fromkeys(("duration", "period"), _has(_DURATION)),
    **dict.fromkeys(("date", "deadline", "day", "days"), _has_date),
}

_INTERROGATIVES = frozenset(
    ("what", "who", "whom", "whose", "when", "where", "which", "why", "how", "is", "are", "was",
     "were", "do", "does", "did", "can", "could", "will", "would", "should", "may", "must",
     "has", "have")
)  # fmt: skip


@cache
def _checks() -> dict[str, Callable[[str], bool]]:
    out: dict[str, Callable[[str], bool]] = {}
    for word, check in _ASKING_WORDS.items():
        for term in analyze(word):
            out.setdefault(term, check)
    return out


def is_question(text: str) -> bool:
    """``text`` is phrased as a question: it ends with "?" or opens with a question word."""
    said = words(text)
    return text.rstrip().endswith("?") or bool(said and said[0] in _INTERROGATIVES)


def asks_for_value(term: str) -> bool:
    """``term`` (an analysed term) names a kind of value rather than a topic."""
    return term in _checks()


def value_kind(term: str) -> int | None:
    """An opaque key for the kind of value ``term`` asks for: "cost" and "price" share one
    (an amount), so a question that says both asks for one value. None for a topic word."""
    check = _checks().get(term)
    return None if check is None else id(check)


def holds_value_for(term: str, text: str) -> bool:
    """``text`` holds a value of the kind ``term`` asks for (False when it asks for none)."""
    check = _checks().get(term)
    return check is not None and check(text)
