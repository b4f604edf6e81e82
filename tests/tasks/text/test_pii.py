"""PII scrubbing: recall on real-looking formats, precision on what KB answers are full of.

Answers carry citations (``[doc:abc123:4]``), dates, versions, token counts, prices and hex ids
next to the occasional e-mail or phone number; the ledger stores them verbatim. Every positive
is checked in a sentence (so boundaries matter) and must come back as exactly one finding that
covers exactly the sample; every negative must come back untouched.
"""

from __future__ import annotations

import copy
import csv
import io
import itertools
import string

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tasks.text.pii import (
    KINDS,
    PLACEHOLDERS,
    Finding,
    ScrubReport,
    find_pii,
    scrub,
    scrub_payload,
    scrub_with_report,
)
from tests.conftest import datasets_dir

PROPERTY = hsettings(max_examples=300, derandomize=True, database=None, deadline=None)

POSITIVES: list[tuple[str, str]] = [
    # email
    ("email", "anna.schmidt@example.com"),
    ("email", "anna.schmidt+billing@example.de"),
    ("email", "ops@mail.eu-west.example.co.uk"),
    ("email", "J_Doe-1987@Example.ORG"),
    ("email", "x@y.io"),
    # phone: international
    ("phone", "+44 20 7946 0958"),
    ("phone", "+1 (555) 123-4567"),
    ("phone", "+32 9 123 45 67"),
    ("phone", "+1-202-555-0143"),
    ("phone", "+1.202.555.0143"),
    ("phone", "+33 1 23 45 67 89"),
    ("phone", "+49 30 901820"),
    ("phone", "+4915112345678"),
    ("phone", "+44 (0)20 7946 0958"),
    ("phone", "+353 1 234 5678"),
    # phone: national, with separators
    ("phone", "(555) 123-4567"),
    ("phone", "202-555-0143"),
    ("phone", "202.555.0143"),
    ("phone", "1-800-555-0199"),
    ("phone", "020 7946 0958"),
    ("phone", "(020) 7946 0958"),
    ("phone", "07700 900123"),
    ("phone", "01 23 45 67 89"),
    ("phone", "0471 12 34 56"),
    ("phone", "06-12345678"),
    # phone: "00" international prefix and extensions (the Faker/CRM export shapes)
    ("phone", "0032 9 123 45 67"),
    ("phone", "001-808-617-6467x12895"),
    ("phone", "686-620-1820x944"),
    ("phone", "(496)978-3969x58947"),
    ("phone", "+1 202 555 0143 ext. 12"),
    # card: Luhn-valid test numbers, grouped and not
    ("card", "4111 1111 1111 1111"),
    ("card", "4111111111111111"),
    ("card", "5500-0000-0000-0004"),
    ("card", "378282246310005"),
    ("card", "3782 822463 10005"),
    ("card", "6011 1111 1111 1117"),
    ("card", "3530111333300000"),
    ("card", "2223003122003222"),
    ("card", "4222222222222"),
    # iban: ISO 7064 mod-97-valid
    ("iban", "GB82 WEST 1234 5698 7654 32"),
    ("iban", "GB82WEST12345698765432"),
    ("iban", "DE89370400440532013000"),
    ("iban", "DE89 3704 0044 0532 0130 00"),
    ("iban", "FR14 2004 1010 0505 0001 3M02 606"),
    ("iban", "NL91 ABNA 0417 1643 00"),
    ("iban", "NL91ABNA0417164300"),
    ("iban", "BE68 5390 0754 7034"),
    # ip
    ("ip", "192.168.1.100"),
    ("ip", "10.0.0.1"),
    ("ip", "203.0.113.42"),
    ("ip", "8.8.8.8"),
    ("ip", "2001:db8:85a3::8a2e:370:7334"),
    ("ip", "2001:0db8:85a3:0000:0000:8a2e:0370:7334"),
    ("ip", "fe80::1ff:fe23:4567:890a"),
    ("ip", "::ffff:192.0.2.128"),
    ("ip", "2001:db8::1"),
    # ssn
    ("ssn", "123-45-6789"),
    ("ssn", "078-05-1120"),
    ("ssn", "665-01-0001"),
]

NEGATIVES: list[str] = [
    # numbers KB answers are full of
    "67500 tokens",
    "3,450 EUR",
    "$1,234,567.89",
    "1 234 567 EUR",
    "3 000 000 000 tokens",
    "1,714,550,400,000",
    "call 1234 or 123456",
    "ticket #12345",
    "+5 points",
    "+15%",
    # dates, times, ranges
    "2024-05-01",
    "2024-05-01T10:30:45Z",
    "2024/05/01",
    "01/05/2024",
    "05.01.2024",
    "01.05.2024 12:30",
    "+2024-05-01",
    "10:30:45",
    "10:30:45.123",
    "between 10:00-12:00",
    "2019-2021",
    "pages 120-135",
    "ports 8000-8080",
    "open 0800-1200",
    "3-5 business days",
    # versions, standards, sections
    "v1.2.3",
    "2.14.1",
    "Python 3.11.4",
    "1.2.3",
    "version 1.2.3.4",
    "v1.2.3.4",
    "build 10.0.19041.1",
    "see section 4.2.1.3",
    "Paragraph 1.2.3.1",
    "clause 2.1.1.1",
    "ISO 27001",
    "ISO 27001:2022",
    "RFC 5322",
    "ISBN 978-3-16-148410-0",
    "1.5e-10",
    "50.8503, 4.3517",
    # citations, ids, hashes
    "[doc:3f2a9c:12]",
    "doc:3f2a9c:12",
    "[doc:abc123:4]",
    "550e8400-e29b-41d4-a716-446655440000",
    "12345678-1234-1234-1234-123456789012",
    "d41d8cd98f00b204e9800998ecf8427e",
    "da39a3ee5e6b4b0d3255bfef95601890afd80709",
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "1714550400000",
    "00123456789",
    "1,234,567,890",
    "00:1A:2B:3C:4D:5E",
    # phone-like order numbers inside words
    "ORD5551234567",
    "ORD-555-123-4567",
    "INV-020-7946-0958",
    "SKU4111111111111111X",
    "order ORD-2024-000123",
    # checksums that fail
    "4111 1111 1111 1112",
    "4111111111111112",
    "1234 5678 9012 3456",
    "5500-0000-0000-0005",
    "GB82 WEST 1234 5698 7654 33",
    "DE89 3704 0044 0532 0130 01",
    "NL91ABNA0417164301",
    "de89370400440532013000",  # lower case: a hex-ish id, not an IBAN
    # addresses that identify nobody, and code
    "127.0.0.1",
    "0.0.0.0",
    "255.255.255.0",
    "255.255.0.0",
    "::1",
    "192.168.1.256",
    "1.2.3.4.5",
    "std::vector<int>",
    "a[1::2]",
    # e-mail look-alikes
    "user@localhost",
    "root@example",
    "@alice said hi",
    "a@b",
    # SSN exclusions
    "000-12-3456",
    "666-12-3456",
    "900-12-3456",
    "123-00-6789",
    "123-45-0000",
]


def spans(text: str) -> list[tuple[str, str]]:
    return [(f.kind, text[f.start : f.end]) for f in find_pii(text)]


# --- positives and negatives -------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "sample"), POSITIVES)
def test_each_positive_is_found_exactly_in_a_sentence(kind: str, sample: str) -> None:
    text = f"Please contact {sample}, thanks."
    assert spans(text) == [(kind, sample)]
    assert scrub(text) == f"Please contact {PLACEHOLDERS[kind]}, thanks."


@pytest.mark.parametrize(("kind", "sample"), POSITIVES)
def test_each_positive_is_found_alone_and_at_a_sentence_end(kind: str, sample: str) -> None:
    assert spans(sample) == [(kind, sample)]
    assert scrub(f"It is {sample}.") == f"It is {PLACEHOLDERS[kind]}."


@pytest.mark.parametrize("text", NEGATIVES)
def test_each_negative_is_left_alone(text: str) -> None:
    assert find_pii(text) == []
    assert scrub(text) == text
    in_sentence = f"Per [doc:abc123:4], see {text} (updated 2024-05-01)."
    assert scrub(in_sentence) == in_sentence


def test_kinds_and_placeholders() -> None:
    assert KINDS == ("email", "phone", "card", "iban", "ip", "ssn")
    assert {kind for kind, _ in POSITIVES} == set(KINDS)
    assert PLACEHOLDERS == {
        "email": "[EMAIL]",
        "phone": "[PHONE]",
        "card": "[CARD]",
        "iban": "[IBAN]",
        "ip": "[IP]",
        "ssn": "[SSN]",
    }


# --- overlaps and boundaries -------------------------------------------------------------------


def test_a_valid_iban_wins_over_the_digit_groups_inside_it() -> None:
    assert spans("credit IBAN DE89 3704 0044 0532 0130 00 within 5-7 days") == [
        ("iban", "DE89 3704 0044 0532 0130 00")
    ]


def test_a_mistyped_iban_does_not_leak_as_a_phone_or_card() -> None:
    # On its own, the tail of that IBAN reads as a trunk-prefixed phone number...
    assert spans("0532 0130 01") == [("phone", "0532 0130 01")]
    # ...but inside an IBAN-shaped run that fails mod-97 it is nobody's number.
    assert find_pii("IBAN DE89 3704 0044 0532 0130 01, thanks") == []


def test_a_card_followed_by_a_year_keeps_the_year() -> None:
    assert scrub("card 4111 1111 1111 1111 2024 on file") == "card [CARD] 2024 on file"


def test_embedded_ipv4_in_ipv6_is_one_finding() -> None:
    assert spans("from ::ffff:192.0.2.128 today") == [("ip", "::ffff:192.0.2.128")]


def test_ip_with_port_prefix_and_range() -> None:
    assert scrub("10.0.0.1:8080, 203.0.113.7/24, 10.0.0.1-10.0.0.255") == (
        "[IP]:8080, [IP]/24, [IP]-[IP]"
    )
    assert scrub("[2001:db8::1]:8080") == "[[IP]]:8080"


def test_email_in_mailto_and_angle_brackets() -> None:
    assert scrub("mailto:ops@example.com?subject=x") == "mailto:[EMAIL]?subject=x"
    assert scrub("Anna <anna@example.com>") == "Anna <[EMAIL]>"


def test_findings_are_in_order_and_do_not_overlap() -> None:
    text = "a@b.co 123-45-6789 +44 20 7946 0958 8.8.8.8 4111111111111111 NL91ABNA0417164300"
    found = find_pii(text)
    assert [f.kind for f in found] == ["email", "ssn", "phone", "ip", "card", "iban"]
    assert all(a.end <= b.start for a, b in itertools.pairwise(found))
    assert found[0] == Finding("email", 0, 6)


def test_a_phone_yields_to_an_address_it_ran_into() -> None:
    assert spans("call +44 20 7946 0958 8.8.8.8") == [
        ("phone", "+44 20 7946 0958"),
        ("ip", "8.8.8.8"),
    ]


def test_a_placeholder_can_free_a_neighbour_and_scrub_still_gets_it() -> None:
    # The "1" of the address shields the bracket; after one pass it is "]" and the phone shows.
    report = scrub_with_report("10.0.0.1(555) 123-4567")
    assert report.text == "[IP][PHONE]"
    assert report.counts["ip"] == 1 and report.counts["phone"] == 1


def test_unicode_digits_are_not_numbers_here() -> None:
    assert scrub("١.١.١.١ and ٤١١١١١١١١١١١١١١١") == "١.١.١.١ and ٤١١١١١١١١١١١١١١١"


def test_csv_fields_glued_by_commas_are_scrubbed() -> None:
    row = "3,Roy,+1-539-402-0259,(496)978-3969x58947,beckycarr@hogan.com,2020-03-25,1,234"
    assert scrub(row) == "3,Roy,[PHONE],[PHONE],[EMAIL],2020-03-25,1,234"


def test_a_real_crm_export_keeps_ids_dates_and_urls() -> None:
    """The Faker customer CSV in real-docs: contacts go, everything else stays."""
    path = datasets_dir("real-docs", "sources", "csv-comma.csv")
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    assert rows
    for row in rows:
        scrubbed = {key: scrub(value) for key, value in row.items()}
        assert scrubbed["Email"] == "[EMAIL]"
        for column in ("Phone 1", "Phone 2"):
            # Unseparated national numbers ("5153435776") are deliberately not matched.
            if not row[column].isdigit():
                assert scrubbed[column] == "[PHONE]", row[column]
        for column in ("Index", "Customer Id", "Subscription Date", "Website", "Country"):
            assert scrubbed[column] == row[column]


# --- a realistic answer ------------------------------------------------------------------------

ANSWER = (
    "Hi Anna, thanks for reaching out. I checked the invoice against our refund policy "
    "[doc:abc123:4]: refunds above 3,450 EUR need approval (see [doc:9f8e7d:12], updated "
    "2024-05-01, policy v1.2.3, ISO 27001 scope). Your card 4111 1111 1111 1111 was charged "
    "twice, so we will credit IBAN GB82 WEST 1234 5698 7654 32 within 5-7 business days. If "
    "anything is unclear, mail anna.schmidt+billing@example.de or call +49 30 901820 (or our UK "
    "desk on 020 7946 0958); our logs show the request came from 203.0.113.42 at 10:30:45 and "
    "from 2001:db8::7 later. For the W-9 we still need the SSN (we have 123-45-6789 on file). "
    "The summary used 67500 tokens [doc:abc123:5] and request id "
    "550e8400-e29b-41d4-a716-446655440000."
)

SCRUBBED_ANSWER = (
    "Hi Anna, thanks for reaching out. I checked the invoice against our refund policy "
    "[doc:abc123:4]: refunds above 3,450 EUR need approval (see [doc:9f8e7d:12], updated "
    "2024-05-01, policy v1.2.3, ISO 27001 scope). Your card [CARD] was charged "
    "twice, so we will credit IBAN [IBAN] within 5-7 business days. If "
    "anything is unclear, mail [EMAIL] or call [PHONE] (or our UK "
    "desk on [PHONE]); our logs show the request came from [IP] at 10:30:45 and "
    "from [IP] later. For the W-9 we still need the SSN (we have [SSN] on file). "
    "The summary used 67500 tokens [doc:abc123:5] and request id "
    "550e8400-e29b-41d4-a716-446655440000."
)


def test_scrub_a_support_answer_keeps_citations_and_numbers() -> None:
    assert scrub(ANSWER) == SCRUBBED_ANSWER


def test_scrub_with_report_counts_every_kind() -> None:
    report = scrub_with_report(ANSWER)
    assert isinstance(report, ScrubReport)
    assert report.text == SCRUBBED_ANSWER
    assert report.counts == {"email": 1, "phone": 2, "card": 1, "iban": 1, "ip": 2, "ssn": 1}
    assert list(report.counts) == list(KINDS)


def test_scrub_with_report_on_clean_text_counts_zero() -> None:
    report = scrub_with_report("Nothing here [doc:abc123:4].")
    assert report.text == "Nothing here [doc:abc123:4]."
    assert report.counts == dict.fromkeys(KINDS, 0)


# --- payloads ----------------------------------------------------------------------------------


def test_scrub_payload_scrubs_nested_strings_and_keeps_keys() -> None:
    payload = {
        "prompt": "Customer anna@example.com asks about [doc:abc123:4]",
        "anna@example.com": "keys are untouched",
        "reply": {
            "text": "Call +44 20 7946 0958",
            "citations": ["doc:abc123:4", "doc:9f8e7d:12"],
            "spans": ({"ip": "203.0.113.42"}, "card 4111111111111111"),
        },
        "tokens": 67500,
        "cost": 0.0123,
        "ok": True,
        "error": None,
        "raw": b"anna@example.com",
        "tags": {"vip", "ssn 123-45-6789"},
    }
    before = copy.deepcopy(payload)
    out = scrub_payload(payload)
    assert payload == before  # not mutated
    assert out == {
        "prompt": "Customer [EMAIL] asks about [doc:abc123:4]",
        "anna@example.com": "keys are untouched",
        "reply": {
            "text": "Call [PHONE]",
            "citations": ["doc:abc123:4", "doc:9f8e7d:12"],
            "spans": ({"ip": "[IP]"}, "card [CARD]"),
        },
        "tokens": 67500,
        "cost": 0.0123,
        "ok": True,
        "error": None,
        "raw": b"anna@example.com",  # bytes are not text: returned as-is
        "tags": {"vip", "ssn [SSN]"},
    }
    assert isinstance(out["reply"]["spans"], tuple)
    assert out is not payload and out["reply"] is not payload["reply"]
    assert out["reply"]["citations"] is not payload["reply"]["citations"]


@pytest.mark.parametrize("value", [42, 3.5, None, True, b"a@b.co", "no pii here", ""])
def test_scrub_payload_returns_scalars_and_clean_strings_as_they_are(value: object) -> None:
    assert scrub_payload(value) is value


def test_scrub_payload_keeps_str_subclasses_with_nothing_to_scrub() -> None:
    class Status(str):
        pass

    status = Status("approved")
    assert scrub_payload([status])[0] is status
    assert scrub_payload("mail a@b.co") == "mail [EMAIL]"


# --- idempotence and properties ----------------------------------------------------------------


@pytest.mark.parametrize("text", [sample for _, sample in POSITIVES] + [ANSWER, *NEGATIVES])
def test_scrub_is_idempotent(text: str) -> None:
    once = scrub(text)
    assert scrub(once) == once
    assert find_pii(once) == []


NO_DIGITS_OR_AT = st.text(
    alphabet=st.characters(blacklist_categories=("Nd", "Cs"), blacklist_characters="@")
)
# Hex letters, separators and brackets: the raw material of IPv6 and ids, minus the digits.
TECHNICAL_NO_DIGITS = st.text(alphabet="abcdefABCDEFxyz:.-+() []/_%#\n", max_size=80)
PII_ISH = st.text(alphabet=string.digits + " -.:+()@abcdefXY[]/_", max_size=80)


@PROPERTY
@given(st.text())
def test_scrub_never_raises(text: str) -> None:
    report = scrub_with_report(text)
    assert set(report.counts) == set(KINDS)


@PROPERTY
@given(st.one_of(NO_DIGITS_OR_AT, TECHNICAL_NO_DIGITS))
def test_text_without_digits_or_at_is_unchanged(text: str) -> None:
    assert scrub(text) == text


@PROPERTY
@given(PII_ISH)
def test_findings_are_well_formed_and_scrub_is_idempotent(text: str) -> None:
    found = find_pii(text)
    assert all(f.kind in KINDS and 0 <= f.start < f.end <= len(text) for f in found)
    assert all(a.end <= b.start for a, b in itertools.pairwise(found))
    once = scrub(text)
    assert scrub(once) == once


WORDS = st.lists(
    st.sampled_from(["Please", "call", "mail", "me", "at", "or", "Anna", "today", "thanks", "x"]),
    max_size=5,
).map(" ".join)


@PROPERTY
@given(st.sampled_from(POSITIVES), WORDS, WORDS)
def test_a_planted_sample_is_found_between_words(
    planted: tuple[str, str], before: str, after: str
) -> None:
    kind, sample = planted
    text = f"{before} {sample} {after}"
    assert scrub(text) == f"{before} {PLACEHOLDERS[kind]} {after}"


# --- chunks keep their line breaks ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("Call +31 30\n555 0142 today", "Call [PHONE] today"),
        ("card 4111 1111\n  1111 1111 on file", "card [CARD] on file"),
        ("IBAN NL91 ABNA\n0417 1643 00, thanks", "IBAN [IBAN], thanks"),
        ("Room 12\n020 7946 0958", "Room 12\n[PHONE]"),
    ],
)
def test_a_number_cut_by_a_line_break_is_still_scrubbed(text: str, scrubbed: str) -> None:
    assert scrub(text) == scrubbed
    assert scrub(scrubbed) == scrubbed


def test_list_items_table_rows_and_paragraphs_are_not_bridged() -> None:
    table = "| Ana | +31 30 555 0142 |\n| Bo | 020 7946 0958 |"
    assert scrub(table) == "| Ana | [PHONE] |\n| Bo | [PHONE] |"
    assert scrub("- floor 12\n- 555 0142") == "- floor 12\n- 555 0142"
    assert scrub("Built in 2024\n\n555 0142 units") == "Built in 2024\n\n555 0142 units"


def test_pseudonyms_mask_contacts_with_numbers_and_restore_only_their_own() -> None:
    from tasks.text.pii import Pseudonyms

    pseudonyms = Pseudonyms()
    text = "Mail jo@acme-corp.com or +44 20 7946 0958; card 4111 1111 1111 1111; jo@acme-corp.com"
    masked = pseudonyms.mask(text)
    assert masked == "Mail [EMAIL_1] or [PHONE_2]; card [CARD]; [EMAIL_1]"
    assert pseudonyms.restore(masked) == text.replace("4111 1111 1111 1111", "[CARD]")
    # a numbered placeholder this instance did not make stays one; so does a plain one
    assert pseudonyms.restore("[EMAIL_9] [EMAIL] [PHONE_2]") == "[EMAIL_9] [EMAIL] +44 20 7946 0958"
    assert Pseudonyms().restore(masked) == masked
