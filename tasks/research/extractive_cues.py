"""The offline extractive synthesizer's tables: what each draft is for (its purposes), the cues
that point a sentence at one, the patterns of money, contacts and examples, and the limits."""

from __future__ import annotations

import re

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
CUES: dict[str, re.Pattern[str]] = {
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
        r"statutes?|directives?|restrict(?:ed|ions?)|retention|retain\w*|deletion|erasure|allergens?|"
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


# Compliance cues that also describe offers ("certified torque testing", "a safety
# inspection service"): legal only with an obligation in the same sentence.
WEAK_LEGAL = re.compile(
    r"(?:certif\w*|safety|safe|hazard\w*|insurance|risks?|licen[cs]\w*|guarantee\w*|recalls?)",
    re.I,
)


OBLIGATION = re.compile(
    r"\b(?:must|shall|required?|requires|mandatory|obliged|prohibit\w*|may (?:only|not)|"
    r"cannot|can't|not allowed|never|only if|at least)\b",
    re.I,
)


def legal_cue(text: str) -> bool:
    """A compliance cue that makes ``text`` a legal point: a strong one (a law, privacy,
    retention, an age limit, a warranty, ...), or a weak one with an obligation."""
    found = [m.group() for m in CUES["compliance"].finditer(text)]
    if any(not WEAK_LEGAL.fullmatch(word) for word in found):
        return True
    return bool(found) and OBLIGATION.search(text) is not None


CUE_BONUS = 0.15


MIN_SCORE = 0.25  # below this (cosine + cue bonus) a sentence is off-topic for every purpose


MIN_FILED_SCORE = 0.15  # enough for compliance under a legal or safety heading of the seed


MONEY = re.compile(  # 85 EUR, €85, $1,299.00, 12.50 GBP
    r"(?:[$€£]\s?\d|\d(?:[\d,.]*\d)?\s?(?:[$€£]|(?:EUR|USD|GBP|CHF|CAD|AUD|SEK|NOK|DKK)\b))"
)


EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


PHONE = re.compile(  # +1 503 555 0142, (503) 555-0142, 020 7946 0958 — not "2015-2020"
    r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)|\d{2,4})[\s.-]\d{3,4}[\s.-]\d{3,4}"
    r"(?:[\s.-]\d{2,4})?(?!\w)"
)


_GROUPED_NUMBER = re.compile(r"\d{1,3}(?:([ .,])\d{3})(?:\1\d{3})*")


def has_phone(text: str) -> bool:
    """A phone number in ``text``; a figure in thousands ("14 200 000", "14.200.000") is not."""
    return any(
        m.group().lstrip().startswith("+") or not _GROUPED_NUMBER.fullmatch(m.group().strip())
        for m in PHONE.finditer(text)
    )


ROLE = re.compile(
    r"\b(CEO|CTO|CFO|COO|CMO|founder|co-founder|head of|director|manager|lead|VP|"
    r"vice president|chief|owner|president|coordinator|officer|specialist|partner|"
    r"consultant|engineer|analyst|advis[eo]r|architect|administrator|representative)\b",
    re.I,
)
BIO = re.compile(
    r"^(?:(?:Dr|Prof|Mr|Mrs|Ms)\.? )?[A-Z][a-z'’]+(?:[ -][A-Z][a-z'’]+)+,? "
    r"(?:is|was|serves as|works as|joined [\w ]{1,40} as) (?:a|an|the|our|its)\b"
)
"""A sentence that introduces a named person by what they are ("Jim Bainbridge is a senior
DB2 consultant on …"): a person and their role, however the role is worded."""


NAME = re.compile(r"\b[A-Z][a-z]+(?:[ -][A-Z][a-z]+)+\b")


ESCALATION = re.compile(
    r"\b(escalat\w*|on-call|on call|urgent|emergenc\w*|out of hours|after hours|complaints?|"
    r"(?:goes?|sent|send|forward\w*|rout\w*|pass(?:es|ed)?) (?:straight |directly )?to|same day|"
    r"immediately|right away|straight away|at once|without delay)\b",
    re.I,
)


# A rule against something (imperative or "we never ..."), not a story that mentions "never".
AVOID = re.compile(
    r"^(?:please\s+)?(?:avoid|never|don't|do not|stop|steer clear|refrain)\b"
    r"|\b(?:we|you|staff|agents?)\s+(?:should\s+)?(?:never|don't|do not|must not|avoid)\b"
    r"|\b(?:instead of|rather than|not say|banned|forbidden|off-limits)\b",
    re.I,
)


# A do-rule that names wording to avoid: 'call it by its name, never "the product"'.
NEVER_QUOTED = re.compile(r"\bnever\s+(?=[\"“‘'])", re.I)


# A section of rules against something: "## Don't", "Things to avoid", "Never say".
AVOID_HEADING = re.compile(
    r"^(?:don'?t|do not|avoid|never|not to)\b|\b(?:to avoid|don'?ts|anti-examples?)\b", re.I
)


QUOTED = re.compile(r"\"[^\"]{12,}\"|“[^”]{12,}”")  # quoted copy, long enough to be an example


QUOTES_WORDS = re.compile(r"\"[^\"]+\"|“[^”]+”|(?<!\w)'[^'\n]+'(?!\w)|‘[^’]+’")  # 'avoid "synergy"'


EXAMPLE_LEAD = re.compile(
    r"^(?:(?:an?|one|another|here is an?) )?(example|e\.g\.|say|sample|for instance)\b"
    r"(?!\s+(?-i:(?:[A-Z]-?)?\d+(?:[-.]\d+)*)(?:\s|$))",  # a caption: "Example 3-9 Creating…"
    re.I,
)


PUBLISHED = ("public_homepage", "public_x")  # sources that *are* the client's own copy


COMPLIANCE_TOPICS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "Privacy and personal data",
        re.compile(r"\b(privacy|personal|data|gdpr|ccpa|consent|cookies?|retention|pii)\b", re.I),
    ),
    (
        "Warranty, refunds and liability",
        re.compile(r"\b(warrant\w*|guarantee\w*|refunds?|return(?:s|ed)?|liabil\w*)\b", re.I),
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


OTHER_RISKS = "Other flagged risks"


MAX_SENTENCE_CHARS = 400


MAX_LINES = 8  # items per section (a table is one item); contact lists and products get more


MAX_CONTACT_LINES = 30


MAX_PRODUCT_LINES = 12


MAX_TABLE_ROWS = 30  # rows of one table kept in a section (the size budget may drop more)


HEADING_BONUS = 0.10  # a purpose's cue in the headings above a sentence, or its table's header


def purpose_cue(purpose: str, text: str) -> bool:
    """Whether a sentence holds ``purpose``'s cue; for compliance a legal one ("certified"
    alone describes an offer as often as a duty)."""
    if purpose == "compliance":
        return legal_cue(text)
    return CUES[purpose].search(text) is not None


def avoids_words(text: str) -> bool:
    """A rule against quoted wording: 'Avoid "synergy"', 'Don't say "cheap"'."""
    return bool(AVOID.search(text) and QUOTES_WORDS.search(text))
