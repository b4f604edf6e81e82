# Over 500 lines: six kinds' patterns, their checksums and the one pass that must see them all.
"""Find and scrub personal data in agent answers and audit-ledger payloads.

Six kinds are recognised (`KINDS`): e-mail addresses, phone numbers, payment-card numbers,
IBANs, IP addresses and US social-security numbers. Each kind has a candidate regex plus, where
the format has one, a checksum or range check, because precision matters as much as recall: a
scrubbed citation (``[doc:3f2a9c:12]``), date, version or token count breaks an answer as surely
as a leaked phone number breaks the ledger.

Decisions worth knowing:

* **email** needs a dotted domain with an alphabetic TLD: ``root@localhost`` is a host account,
  not a person, and is left alone. ASCII addresses only; ``git@github.com`` is scrubbed (it is
  indistinguishable from a mailbox).
* **card** is 13–19 digits, unbroken or in groups (first group of 4, later groups of 3–6, one
  consistent separator: a space or a hyphen), passing Luhn *and* starting with 2–6 (every major
  network: Visa, Mastercard, Amex, Discover, JCB, Diners, UnionPay, Maestro). The prefix rule
  keeps 13-digit millisecond timestamps (``1714550400000``) and similar ids from being scrubbed
  whenever they happen to pass Luhn (one in ten does).
* **iban** is upper-case only (lower-case runs are usually hex hashes), must pass ISO 7064
  mod-97, and must have its country's registered length when the country is in `IBAN_LENGTHS`;
  an unlisted country falls back to the generic 15–34 characters.
* **phone** covers ``+<country> …`` and ``00<country> …`` numbers (8–15 digits after the
  prefix; the ``00`` form needs separators) and three national shapes: North
  American ``(555) 123-4567`` / ``555-123-4567`` / ``555 123 4567`` (area code 2–9), and
  trunk-prefixed ``0…`` numbers written with separators (``020 7946 0958``, ``06-12345678``,
  9–12 digits). An extension (``x718``, ``ext. 12``) is part of the number. Unseparated
  national numbers are not matched: they are indistinguishable from order numbers.
  Date-shaped and SSN-shaped runs are never phones.
* **ip** is IPv4 with octets 0–255 (no leading zeros) and IPv6 in full, compressed or
  IPv4-embedded form, checked with :mod:`ipaddress`. Loopback, unspecified (``0.0.0.0``, ``::``),
  broadcast and netmasks (``255.255.255.0``) are left alone: they identify nobody and are common
  in technical answers. A dotted quad glued to a letter (``v1.2.3.4``) or right after a word like
  "version", "release", "build", "section", "paragraph", "clause", "figure" or "§" is a
  version or heading number (``Paragraph 1.2.3.1``), not an address.
  An IPv6 candidate needs a digit and at least three groups, so ``a[1::2]`` and
  ``dead:beef::cafe`` survive.
* **ssn** is ``AAA-GG-SSSS`` only, excluding area 000, 666 and 9xx, group 00 and serial 0000.

A card- or IBAN-shaped run of the right length that fails its checksum (and is not the tail of
a longer run) is *inert*: a candidate that cuts through it (overlaps it without covering it) is
dropped, so a mistyped IBAN does not come back as a phone number made of its middle digits,
while a valid IBAN still wins over the Luhn-failing "card" made of its digit groups.

Overlaps are settled longest first, then by specificity (email, iban, card, ssn, ip), except
that phones, the loosest pattern, always yield: every group-aligned prefix of a phone candidate
is tried, so ``+44 20 7946 0958 8.8.8.8`` is a phone and an address, not one 15-digit phone.
`scrub` repeats until nothing is found, so it is idempotent even where a placeholder frees a
neighbour that an adjacent digit had shielded.

A number or address that a single line break cuts in two (a hard-wrapped line: chunks keep
their line breaks) is scrubbed as if the break were a space; blank lines, list items and table
rows are never bridged (`_wrapped`).

Known trade-offs: an international number swallows a directly following short number
(``+1 555 123 4567 2 times``); a trunk-prefixed number right after another number and a space
(``room 12 020 7946 0958``) is not matched, because that is how thousands are grouped
(``3 012 345 678``); four-part version strings without a "version" word before them
(``upgrade to 1.2.3.4``) are scrubbed as addresses.
"""

from __future__ import annotations

import bisect
import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

KINDS: tuple[str, ...] = ("email", "phone", "card", "iban", "ip", "ssn")

PLACEHOLDERS: dict[str, str] = {kind: f"[{kind.upper()}]" for kind in KINDS}

# Tie-break on equal length: the more specific (checksummed, narrower) kind wins. Phones come
# last whatever their length (see `_precedence`).
_SPECIFICITY: dict[str, int] = {"email": 0, "iban": 1, "card": 2, "ssn": 3, "ip": 4, "phone": 5}

# Registered IBAN lengths (SWIFT IBAN registry), used to reject right-checksum-wrong-length runs.
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22,
    "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32,
    "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19,
    "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23, "PK": 24,
    "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24, "SC": 31,
    "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28, "TL": 23,
    "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}  # fmt: skip

# Every pattern is compiled with re.ASCII: ``\d`` must not match Arabic-Indic or other Unicode
# digits (ipaddress and int() would then reject or misread them), and an address glued to a
# non-ASCII letter is still an address.
_EMAIL = re.compile(
    r"(?<![\w.%+\-])"
    r"[A-Za-z0-9_%+\-]+(?:\.[A-Za-z0-9_%+\-]+)*"
    r"@(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}"
    r"(?![\w\-]|\.[A-Za-z0-9])",
    re.ASCII,
)

# Digits glued to a letter, a dot, a slash, a colon... belong to some other token (an id, a
# version, a path, a chunk id), so every numeric kind refuses to start or end against one. A
# comma is allowed (CSV rows) wherever the digit grouping rules out a thousands separator.
_CARD = re.compile(
    r"(?<![\w./:@+\-])"
    r"(?:\d{13,19}|\d{4}(?P<sep>[ \-])\d{3,6}(?:(?P=sep)\d{3,6}){1,3})"
    r"(?![\w@]|[./:\-]\d)",
    re.ASCII,
)
_IBAN = re.compile(
    r"(?<![\w\-/])[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?(?!\w)", re.ASCII
)
_SSN = re.compile(
    r"(?<![\w\-./:])(?!000|666|9)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\w\-]|[./:]\d)", re.ASCII
)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\w.])(?:{_OCTET}\.){{3}}{_OCTET}(?!\w|\.\d)", re.ASCII)
_IPV6 = re.compile(
    r"(?<![\w:.])[0-9A-Fa-f:][0-9A-Fa-f:.]*(?<=[0-9A-Fa-f:])(?![\w:]|\.\w)", re.ASCII
)
_PHONE_EXT = r"(?:[ ]?(?:[xX]|[eE]xt\.?)[ ]?\d{1,6})?"  # "x718", " ext. 12": part of the number
_PHONE_END = _PHONE_EXT + r"(?![\w@]|[./:\-]\d)"
# Digit runs are separated by a separator or a bracketed area code, never by nothing, so the
# patterns cannot split one run two ways (no catastrophic backtracking on long digit runs).
_PHONE_GROUPS = r"(?:(?:[ .\-]|[ .\-]?\(\d{1,4}\)[ .\-]?)\d{1,15})"
_PHONE_INTL = re.compile(
    r"(?<![\w+])\+\d{1,15}\)?" + _PHONE_GROUPS + "{0,7}" + _PHONE_END, re.ASCII
)
# "00" is the international prefix from most countries; written out, it needs separators, so
# zero-padded ids ("00123456789") stay ids.
_PHONE_INTL_00 = re.compile(
    r"(?<![\w+\-./:])(?<!\d )00[1-9]\d{0,3}" + _PHONE_GROUPS + "{1,7}" + _PHONE_END, re.ASCII
)
_PHONE_NANP = re.compile(
    r"(?<![\w+\-./:])(?:1[ .\-])?"
    r"(?:\([2-9]\d\d\) ?\d{3}[ .\-]|[2-9]\d\d(?P<sep>[ .\-])\d{3}(?P=sep))\d{4}" + _PHONE_END,
    re.ASCII,
)
# "0" then a non-zero digit: "000 000" and "3 012 345 678" are thousands groups, not numbers.
_PHONE_TRUNK = re.compile(
    r"(?<![\w+\-./:])(?<!\d )(?:\(0[1-9]\d{0,3}\)|0[1-9]\d{0,3})(?:[ .\-]\d{2,8}){1,4}"
    + _PHONE_END,
    re.ASCII,
)
_DATE_LIKE = re.compile(
    r"(?<!\d)(?:(?:19|20)\d\d[./\-]\d{1,2}[./\-]\d{1,2}|\d{1,2}[./\-]\d{1,2}[./\-](?:19|20)\d\d)"
    r"(?!\d)",
    re.ASCII,
)
_SSN_SHAPE = re.compile(r"\d{3}-\d{2}-\d{4}", re.ASCII)
_EXTENSION = re.compile(_PHONE_EXT + "$", re.ASCII)
_NOT_AN_IP_BEFORE = re.compile(
    r"(?:\b(?:ver|version|release|build|section|sect|chapter|paragraph|para|clause|article|art"
    r"|appendix|annex|figure|fig)\.?|§)\s*$",
    re.IGNORECASE | re.ASCII,
)
_GROUP_END = re.compile(r"[0-9A-Za-z)](?=[ .\-(]|$)", re.ASCII)


@dataclass(frozen=True)
class Finding:
    """One piece of personal data in a text.

    Attributes:
        kind: one of `KINDS`.
        start: offset of its first character.
        end: offset just past its last character (``text[start:end]`` is the finding).
    """

    kind: str
    start: int
    end: int


@dataclass(frozen=True)
class ScrubReport:
    """A scrubbed text and how many findings of each kind were replaced.

    Attributes:
        text: the text with every finding replaced by its placeholder.
        counts: every kind in `KINDS` (in that order) mapped to its number of replacements;
            zero for kinds that were not found, so the shape is the same for every report.
    """

    text: str
    counts: dict[str, int]


def find_pii(text: str) -> list[Finding]:
    """Find the personal data in ``text``.

    Args:
        text: any text.

    Returns:
        Non-overlapping findings in order of position. Where candidates overlap, the longest
        wins, then the most specific kind (email, iban, card, ssn, ip); a phone, the loosest
        pattern, yields to any other kind and is cut back to its longest prefix that fits.
    """
    candidates: list[Finding] = []
    inert: list[tuple[int, int]] = []
    for finder in _FINDERS:
        for kind, start, end, valid in finder(text):
            if valid:
                candidates.append(Finding(kind, start, end))
            else:
                inert.append((start, end))
    if inert:
        candidates = _drop_cut_through(candidates, inert)
    # Greedy, best first; chosen spans never overlap, so sorted by start they are sorted by end
    # too and a new span only has to be checked against its two neighbours.
    chosen: list[Finding] = []
    starts: list[int] = []
    for finding in sorted(candidates, key=_precedence):
        at = bisect.bisect_right(starts, finding.start)
        if at and chosen[at - 1].end > finding.start:
            continue
        if at < len(chosen) and chosen[at].start < finding.end:
            continue
        chosen.insert(at, finding)
        starts.insert(at, finding.start)
    return chosen


def scrub(text: str) -> str:
    """Replace every finding in ``text`` with its placeholder (``[EMAIL]``, ``[PHONE]``, ...).

    Args:
        text: any text.

    Returns:
        The scrubbed text; ``scrub(scrub(text)) == scrub(text)``.
    """
    return scrub_with_report(text).text


def scrub_with_report(text: str) -> ScrubReport:
    """Scrub ``text`` and count what was replaced.

    Replacement repeats until a pass finds nothing: a placeholder can unshield a neighbour that
    an adjacent digit or letter had hidden (``10.0.0.1(555) 123-4567``). Every pass removes at
    least one digit or ``@`` and adds none, so this ends, usually after one extra pass.

    Args:
        text: any text.

    Returns:
        The scrubbed text and the number of replacements per kind.
    """
    counts = dict.fromkeys(KINDS, 0)
    while findings := _findings(text):
        parts: list[str] = []
        position = 0
        for finding in findings:
            parts += [text[position : finding.start], PLACEHOLDERS[finding.kind]]
            position = finding.end
            counts[finding.kind] += 1
        parts.append(text[position:])
        text = "".join(parts)
    return ScrubReport(text=text, counts=counts)


def scrub_payload(value: Any) -> Any:
    """Scrub every string inside a JSON-like value, leaving the input untouched.

    Dicts, lists, tuples, sets and frozensets are rebuilt as new plain containers of the same
    kind (dict keys are kept as they are); strings are scrubbed; anything else is returned
    as-is. A string with nothing to scrub is returned unchanged (the same object), so ``str``
    subclasses such as enum members keep their type. Sets are scrubbed too, although the brief
    only named dicts, lists and tuples: a set of strings leaking personal data would defeat the
    point.

    Args:
        value: a ledger payload, answer record or any nested structure of them.

    Returns:
        A scrubbed copy.
    """
    return map_strings(value, scrub)


def map_strings(value: Any, change: Callable[[str], str]) -> Any:
    """``value`` with ``change`` applied to every string inside it (see `scrub_payload`)."""
    if isinstance(value, str):
        changed = change(value)
        return value if changed == value else changed
    if isinstance(value, dict):
        return {key: map_strings(item, change) for key, item in value.items()}
    if isinstance(value, list):
        return [map_strings(item, change) for item in value]
    if isinstance(value, tuple):
        return tuple(map_strings(item, change) for item in value)
    if isinstance(value, set | frozenset):
        items = {map_strings(item, change) for item in value}
        return frozenset(items) if isinstance(value, frozenset) else items
    return value


CONTACT_KINDS: frozenset[str] = frozenset({"email", "phone"})
_NUMBERED = re.compile(r"\[(EMAIL|PHONE)_(\d+)\]")


class Pseudonyms:
    """Contact data masked for a model and restored for the org's own agent (one turn).

    `mask` scrubs a text as `scrub` does, except that each e-mail address and phone number
    becomes a numbered placeholder (``[EMAIL_1]``, ``[PHONE_2]``; the same value keeps its
    number), so what a model writes from the masked text can be given back with the values
    restored (`restore`). Only values this instance masked are restored: a numbered
    placeholder that arrived from elsewhere stays a placeholder. The numbered placeholders
    hold no personal data, so what is recorded or leaves the org may carry them.
    """

    def __init__(self) -> None:
        self._tokens: dict[tuple[str, str], str] = {}
        self._values: dict[str, str] = {}

    def mask(self, text: str) -> str:
        parts: list[str] = []
        position = 0
        for finding in find_pii(text):
            if finding.kind not in CONTACT_KINDS:
                continue
            value = text[finding.start : finding.end]
            token = self._tokens.get((finding.kind, value))
            if token is None:
                token = f"[{finding.kind.upper()}_{len(self._tokens) + 1}]"
                self._tokens[(finding.kind, value)] = token
                self._values[token] = value
            parts += [text[position : finding.start], token]
            position = finding.end
        parts.append(text[position:])
        return scrub("".join(parts))

    def restore(self, text: str) -> str:
        return _NUMBERED.sub(lambda m: self._values.get(m.group(0), m.group(0)), text)


_LINE_BREAK = re.compile(r"[ \t]*\n[ \t]*")


def _findings(text: str) -> list[Finding]:
    """`find_pii`'s findings and those across a line break (`_wrapped`), the longest winning
    where they overlap, in order of position."""
    found = find_pii(text)
    wrapped = _wrapped(text)
    if not wrapped:
        return found
    chosen: list[Finding] = []
    for f in sorted([*wrapped, *found], key=lambda f: (f.start - f.end, f.start)):
        if all(f.end <= c.start or c.end <= f.start for c in chosen):
            chosen.append(f)
    return sorted(chosen, key=lambda f: f.start)


def _wrapped(text: str) -> list[Finding]:
    """Findings that one line break cuts in two (``+31 30\\n555 0142``), as spans of ``text``.

    Chunks keep their line breaks, and a hard-wrapped line can break a number or an address
    wherever a space could stand: each single line break (with the blank space around it) is
    read as one space, and what is found across one is scrubbed. Blank lines (paragraphs) and
    list or table lines are not bridged: a marker or a ``|`` stands between them.
    """
    if "\n" not in text:
        return []
    flat: list[str] = []
    origin: list[int] = []  # each character of ``flat``: its offset in ``text``
    position = 0
    for match in _LINE_BREAK.finditer(text):
        if text.count("\n", match.start(), match.end()) != 1:
            continue
        flat.append(text[position : match.start()])
        origin.extend(range(position, match.start()))
        flat.append(" ")
        origin.append(match.start())
        position = match.end()
    flat.append(text[position:])
    origin.extend(range(position, len(text)))
    origin.append(len(text))
    return [
        Finding(f.kind, origin[f.start], origin[f.end - 1] + 1)
        for f in find_pii("".join(flat))
        if "\n" in text[origin[f.start] : origin[f.end - 1] + 1]
    ]


# --- the finders: each yields (kind, start, end, valid); invalid spans make their span inert ---

_Candidate = tuple[str, int, int, bool]


def _emails(text: str) -> Iterator[_Candidate]:
    for match in _EMAIL.finditer(text):
        yield "email", match.start(), match.end(), True


def _cards(text: str) -> Iterator[_Candidate]:
    for match, ends, nested in _valid_prefixes(_CARD, text, _is_card):
        if ends:
            yield "card", match.start(), ends[0], True
        elif not nested and 13 <= sum(ch.isdigit() for ch in match.group()) <= 19:
            yield "card", match.start(), match.end(), False


def _ibans(text: str) -> Iterator[_Candidate]:
    for match, ends, nested in _valid_prefixes(_IBAN, text, _is_iban):
        if ends:
            yield "iban", match.start(), ends[0], True
        elif not nested and 15 <= len(match.group().replace(" ", "")) <= 34:
            yield "iban", match.start(), match.end(), False


def _ssns(text: str) -> Iterator[_Candidate]:
    for match in _SSN.finditer(text):
        yield "ssn", match.start(), match.end(), True


def _ipv4s(text: str) -> Iterator[_Candidate]:
    for match in _IPV4.finditer(text):
        if _NOT_AN_IP_BEFORE.search(text, max(0, match.start() - 12), match.start()):
            continue
        address = ipaddress.IPv4Address(match.group())
        if not (address.is_loopback or address.is_unspecified or _is_netmask(address)):
            yield "ip", match.start(), match.end(), True


def _ipv6s(text: str) -> Iterator[_Candidate]:
    for match in _IPV6.finditer(text):
        candidate = match.group()
        if candidate.count(":") < 2 or not any(ch.isdigit() for ch in candidate):
            continue
        groups = [part for part in candidate.split(":") if part]
        if len(groups) + ("." in candidate) < 3:
            continue
        try:
            address = ipaddress.IPv6Address(candidate)
        except ValueError:
            continue
        if not (address.is_loopback or address.is_unspecified):
            yield "ip", match.start(), match.end(), True


def _phones(text: str) -> Iterator[_Candidate]:
    # Every valid prefix is a candidate: phones yield to every other kind in `find_pii`, and a
    # phone that ran on into an address or a card must still be found without the tail.
    for pattern, low, high, prefix in (
        (_PHONE_INTL, 8, 15, "+"),
        (_PHONE_INTL_00, 8, 15, "00"),
        (_PHONE_NANP, 10, 11, ""),
        (_PHONE_TRUNK, 9, 12, ""),
    ):
        is_valid = partial(_is_phone, low=low, high=high, prefix=prefix)
        for match, ends, _ in _valid_prefixes(pattern, text, is_valid):
            for end in ends:
                yield "phone", match.start(), end, True


_FINDERS: tuple[Callable[[str], Iterator[_Candidate]], ...] = (
    _emails,
    _ibans,
    _cards,
    _ssns,
    _ipv4s,
    _ipv6s,
    _phones,
)


# --- checks ------------------------------------------------------------------------------------


def _precedence(finding: Finding) -> tuple[bool, int, int, int]:
    """Sort key for overlap resolution: phones last, then longest, most specific, first."""
    return (
        finding.kind == "phone",
        finding.start - finding.end,
        _SPECIFICITY[finding.kind],
        finding.start,
    )


def _drop_cut_through(candidates: list[Finding], spans: list[tuple[int, int]]) -> list[Finding]:
    """The candidates that do not cut through one of ``spans`` (overlap it without covering it)."""
    spans = sorted(spans)
    starts = [start for start, _ in spans]
    longest = max(end - start for start, end in spans)
    kept = []
    for finding in candidates:
        low = bisect.bisect_left(starts, finding.start - longest)
        high = bisect.bisect_left(starts, finding.end)
        if not any(
            end > finding.start and not (finding.start <= start and end <= finding.end)
            for start, end in spans[low:high]
        ):
            kept.append(finding)
    return kept


def _valid_prefixes(
    pattern: re.Pattern[str], text: str, is_valid: Callable[[str], bool]
) -> Iterator[tuple[re.Match[str], list[int], bool]]:
    """Each match of ``pattern``, the ends of its valid prefixes (longest first), and whether it
    starts inside an earlier match.

    Candidate patterns are greedy, so a card followed by a year (``4111 1111 1111 1111 2024``)
    or a phone followed by an address is first seen with the extra groups; dropping whole
    trailing groups recovers it without ever cutting a group in half. Scanning resumes just past
    each match's start, not at its end, so overlapping candidates are all seen (``01 020 7946
    0958`` yields both ``01 020 7946`` and ``020 7946 0958``) and `find_pii` picks among them;
    the patterns' look-behinds keep starts to token boundaries, so this stays linear in practice.
    """
    position = 0
    covered = 0
    while (match := pattern.search(text, position)) is not None:
        candidate = match.group()
        ends = [m.end() for m in _GROUP_END.finditer(candidate)]
        valid = [match.start() + end for end in reversed(ends) if is_valid(candidate[:end])]
        yield match, valid, match.start() < covered
        covered = max(covered, match.end())
        position = match.start() + 1


def _is_card(candidate: str) -> bool:
    digits = [int(ch) for ch in candidate if ch.isdigit()]
    if not 13 <= len(digits) <= 19 or not 2 <= digits[0] <= 6:
        return False
    total = 0
    for index, digit in enumerate(reversed(digits)):
        if index % 2:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


def _is_iban(candidate: str) -> bool:
    compact = candidate.replace(" ", "")
    expected = IBAN_LENGTHS.get(compact[:2])
    if expected is not None and len(compact) != expected:
        return False
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    # ISO 7064 mod 97-10: letters count as 10..35; a valid IBAN leaves remainder 1.
    return int("".join(str(int(ch, 36)) for ch in rearranged)) % 97 == 1


def _is_phone(candidate: str, low: int, high: int, prefix: str) -> bool:
    """Whether ``candidate`` has ``low``..``high`` digits, not counting the international
    ``prefix`` or an extension, and is not shaped like a date or an SSN."""
    number = _EXTENSION.sub("", candidate.removeprefix(prefix))
    if _DATE_LIKE.search(number) or _SSN_SHAPE.fullmatch(number):
        return False
    return low <= sum(ch.isdigit() for ch in number) <= high


def _is_netmask(address: ipaddress.IPv4Address) -> bool:
    bits = int(address)
    inverted = ~bits & 0xFFFFFFFF
    # A netmask is ones then zeros: its complement plus one is a power of two.
    return bits >> 24 == 0xFF and inverted & (inverted + 1) == 0
