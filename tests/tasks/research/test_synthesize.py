"""Synthesis: the draft contract, the offline extractive synthesizer on real MiniLM, and the
Anthropic synthesizer through the real SDK on an ``httpx2.MockTransport`` (no network)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from core.errors import ConfigError, KbflowError, SynthesisFailed, SynthesisInvalid
from core.models import KB_FILENAMES, CorpusEntry, DraftDocument, ResearchCorpus
from tasks.research.claude import SYSTEM_PROMPT, AnthropicSynthesizer, parse_drafts
from tasks.research.extractive import ExtractiveSynthesizer
from tasks.research.synthesize import DEFAULT_MODEL, estimate_tokens, resolve_model, validate_drafts
from tasks.text.sentences import split_sentences
from tests.anthropic_mock import Recorder, anthropic_client, api_error, message

BRAND, PRODUCT, COMPLIANCE, CONTACTS = KB_FILENAMES
LEGAL = "url:https://greenleaf.example/legal"
HOME = "url:https://greenleaf.example/"

HANDBOOK = """# GreenLeaf Home — Brand handbook

## Our voice
Our voice is warm, plain and confident. We write like a helpful neighbour, not a bank.
Use short sentences and everyday words, and always greet customers by name.

## Examples
- Example: "Hi Sam, thanks for reaching out. Here's how to fix that in two minutes."
- Sign off with "Happy to help — the GreenLeaf team."

## Things to avoid
- Avoid jargon such as "synergy" or "leverage".
- Never use exclamation marks in support replies.
- Don't say "cheap"; say "affordable" instead.

The office kitchen is cleaned every Friday afternoon.
"""
PRODUCTS = """GreenLeaf Home sells smart thermostats and solar battery kits for households.
The Leaf Thermostat costs $149 and the Solar Kit starts at $2,900.
Our customers are homeowners in the Pacific Northwest who want lower energy bills.
The Solar Kit is available in Oregon and Washington; California launches in spring 2027."""
POLICY = """Privacy and warranty.
We collect thermostat usage data only with explicit consent and delete it after
24 months. Customer data is processed under GDPR and CCPA.
All hardware carries a two-year limited warranty; batteries are covered for ten years.
Installation must be done by a licensed electrician to keep the warranty valid."""
CONTACT_LIST = """Key people
- Maria Lopez, Head of Marketing — maria.lopez@greenleaf.example
- Tom Becker, CTO — tom.becker@greenleaf.example, +1 503 555 0142
- Support desk: support@greenleaf.example
Escalate urgent outages to the on-call engineer at +1 503 555 0199."""
HOMEPAGE = """Power your home with sunshine, not worry.
Smart energy for every home in the Pacific Northwest.
Cookie settings"""
EMAILS = (
    "maria.lopez@greenleaf.example",
    "tom.becker@greenleaf.example",
    "support@greenleaf.example",
)


def make_corpus(*entries: CorpusEntry) -> ResearchCorpus:
    return ResearchCorpus(
        client_name="GreenLeaf Home",
        entries=entries
        or (
            CorpusEntry("doc:hb01", "Brand handbook", HANDBOOK, "am_file"),
            CorpusEntry("doc:pr02", "Product one-pager", PRODUCTS, "am_file"),
            CorpusEntry(LEGAL, "Privacy and warranty", POLICY, "am_url"),
            CorpusEntry("doc:ct03", "Contacts list", CONTACT_LIST, "am_file"),
            CorpusEntry(HOME, "GreenLeaf homepage", HOMEPAGE, "public_homepage"),
            CorpusEntry("search:greenleaf solar reviews", "Search results", "", "public_search"),
        ),
    )


@pytest.fixture
def corpus() -> ResearchCorpus:
    return make_corpus()


def draft(filename: str, body: str, footer_ids: tuple[str, ...]) -> DraftDocument:
    footer = "\n".join(f"- [{cid}] source" for cid in footer_ids)
    return DraftDocument(filename, filename, f"{body.rstrip()}\n\n---\n## Citations\n{footer}\n")


def good_drafts() -> list[DraftDocument]:
    return [
        draft(
            BRAND,
            "# Brand voice\n\nWarm, plain and confident [doc:hb01].\n\n"
            '## Golden examples\n- "Hi Sam, thanks for reaching out." [doc:hb01]\n'
            '- "Power your home with sunshine, not worry." [url:https://greenleaf.example/]\n\n'
            '## Anti-examples\n- "synergy", "leverage" [doc:hb01]\n',
            ("doc:hb01", HOME),
        ),
        draft(
            PRODUCT,
            "# Product context\n\nSmart thermostats from $149 [doc:pr02]; reviewers praise "
            "the kits [search:greenleaf solar reviews].",
            ("doc:pr02", "search:greenleaf solar reviews"),
        ),
        draft(
            COMPLIANCE,
            f"# Compliance notes\n\n## Privacy\n- Usage data only with consent [{LEGAL}].",
            (LEGAL,),
        ),
        draft(
            CONTACTS,
            "# Key contacts\n\n- Maria Lopez, Head of Marketing, maria.lopez@greenleaf.example "
            "[doc:ct03]",
            ("doc:ct03",),
        ),
    ]


def with_doc(target: str, **changes: Any) -> list[DraftDocument]:
    """The good drafts with ``changes`` applied to the one named ``target``."""
    return [replace(d, **changes) if d.filename == target else d for d in good_drafts()]


def normalised(text: str) -> str:
    return " ".join(text.split())


# --- validation ----------------------------------------------------------------------------


def test_validate_accepts_good_drafts_and_returns_them_in_kb_order(corpus: ResearchCorpus) -> None:
    docs = good_drafts()
    assert validate_drafts(list(reversed(docs)), corpus) == tuple(docs)


def test_synthesis_invalid_is_a_kbflow_value_error() -> None:
    assert issubclass(SynthesisInvalid, KbflowError) and issubclass(SynthesisInvalid, ValueError)
    assert issubclass(SynthesisFailed, KbflowError) and issubclass(SynthesisFailed, RuntimeError)


BAD_FOOTER = good_drafts()[1].content.replace("---\n## Citations", "## Sources")
UNCITED_EXAMPLE = good_drafts()[0].content.replace(
    '- "synergy", "leverage" [doc:hb01]', '- "synergy", "leverage"'
)
UNCITED_NESTED = good_drafts()[0].content.replace(
    "## Anti-examples\n", '## Anti-examples\n### In e-mail\n- "Dear valued customer"\n'
)


@pytest.mark.parametrize(
    ("docs", "message"),
    [
        (good_drafts()[:3], r"expected exactly 4 documents .* got 3"),
        ([*good_drafts(), good_drafts()[0]], r"expected exactly 4 documents .* got 5"),
        (with_doc(PRODUCT, filename="product.md"), r"unexpected filename 'product\.md'"),
        (
            [*good_drafts()[:3], good_drafts()[0]],
            rf"duplicate filename '{BRAND}'.*missing document\(s\): {CONTACTS}",
        ),
        (with_doc(CONTACTS, content="  \n"), rf"{CONTACTS}: content is empty"),
        (with_doc(PRODUCT, content=BAD_FOOTER), rf"{PRODUCT}: missing the citations footer"),
        (
            with_doc(BRAND, content=UNCITED_EXAMPLE),
            rf"{BRAND} line \d+: example '- \"synergy\", \"leverage\"' has no citation",
        ),
        (
            with_doc(BRAND, content=UNCITED_NESTED),
            rf"{BRAND} line \d+: example '- \"Dear valued customer\"' has no citation",
        ),
        (
            with_doc(
                COMPLIANCE,
                content=good_drafts()[2].content.replace(LEGAL, "url:https://invented.example"),
            ),
            rf"{COMPLIANCE}: cites \[url:https://invented\.example\], which is not an id",
        ),
        (
            with_doc(
                CONTACTS,
                content=draft(CONTACTS, "# Key contacts\n\nNobody is named.", ()).content,
            ),
            rf"{CONTACTS}: cites nothing",
        ),
        (
            with_doc(
                PRODUCT,
                content=draft(PRODUCT, "# Product\n\nThermostats [doc:pr02].", ()).content,
            ),
            rf"{PRODUCT}: cites \[doc:pr02\] but its Citations footer does not list it",
        ),
    ],
    ids=[
        "too-few",
        "too-many",
        "wrong-filename",
        "duplicate-filename",
        "empty-content",
        "missing-footer",
        "uncited-example",
        "uncited-example-under-subheading",
        "unknown-citation",
        "no-citation",
        "id-missing-from-footer",
    ],
)
def test_validate_rejects(docs: list[DraftDocument], message: str, corpus: ResearchCorpus) -> None:
    with pytest.raises(SynthesisInvalid, match=message):
        validate_drafts(docs, corpus)


def test_validate_reports_every_problem_at_once(corpus: ResearchCorpus) -> None:
    docs = with_doc(CONTACTS, content="")
    docs[0] = replace(docs[0], content=UNCITED_EXAMPLE)
    with pytest.raises(SynthesisInvalid, match=r"\(2 problems\)") as err:
        validate_drafts(docs, corpus)
    assert "content is empty" in str(err.value) and "has no citation" in str(err.value)


def test_list_items_outside_example_sections_need_no_citation(corpus: ResearchCorpus) -> None:
    docs = with_doc(
        BRAND,
        content=good_drafts()[0].content.replace(
            "## Golden examples", "## Principles\n- be kind\n\n## Golden examples"
        ),
    )
    validate_drafts(docs, corpus)


# --- small helpers ---------------------------------------------------------------------------


def test_estimate_tokens_is_chars_over_four_rounded_up() -> None:
    assert [estimate_tokens(t) for t in ("", "a", "abcd", "abcde", "x" * 400)] == [0, 1, 1, 2, 100]


def test_resolve_model_request_then_env_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KB_RESEARCH_MODEL", raising=False)
    assert resolve_model(None) == DEFAULT_MODEL == "claude-haiku-4-5"
    monkeypatch.setenv("KB_RESEARCH_MODEL", "claude-sonnet-4-5")
    assert resolve_model(None) == "claude-sonnet-4-5"
    assert resolve_model("  ") == "claude-sonnet-4-5"
    assert resolve_model("claude-opus-4-1") == "claude-opus-4-1"


def test_split_sentences_keeps_quotes_abbreviations_and_wrapped_lines_whole() -> None:
    text = (
        "# Heading\nWe sell kits, e.g. the Solar Kit. Ask J. Smith!\n"
        'Say "Hi. Thanks." Then stop.\nThis line is wrapped\nacross two lines.\n'
        "- item one\n- item two\n| Name | Role |\n|---|---|\n| Ann Lee | CEO |"
    )
    assert split_sentences(text) == [
        "We sell kits, e.g. the Solar Kit.",
        "Ask J. Smith!",
        'Say "Hi. Thanks."',
        "Then stop.",
        "This line is wrapped across two lines.",
        "item one",
        "item two",
        "Name | Role",
        "Ann Lee | CEO",
    ]


def test_split_sentences_keeps_a_numbered_reference_whole() -> None:
    text = "Health data falls under Art. 9 GDPR. See Sec. 4 below. We love art. The rest follows."
    assert split_sentences(text) == [
        "Health data falls under Art. 9 GDPR.",
        "See Sec. 4 below.",
        "We love art.",
        "The rest follows.",
    ]


def test_module_import_stays_light() -> None:
    code = (
        "import sys, tasks.research.synthesize; "
        "heavy = {'anthropic', 'sentence_transformers', 'torch', 'prefect'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- extractive ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def extractive(embedder: Any) -> ExtractiveSynthesizer:
    return ExtractiveSynthesizer(embedder)


def _drafts(
    extractive: ExtractiveSynthesizer, corpus: ResearchCorpus, max_output_tokens: int
) -> dict[str, str]:
    """The offline synthesizer's drafts of ``corpus``, by file name."""
    result = extractive.synthesize(corpus, max_output_tokens=max_output_tokens)
    return {d.filename: d.content for d in result.documents}


@pytest.fixture(scope="module")
def extracted(extractive: ExtractiveSynthesizer) -> dict[str, str]:
    result = extractive.synthesize(make_corpus(), max_output_tokens=4000)
    assert result.model == "extractive-minilm"
    assert result.consumed_tokens > estimate_tokens(make_corpus().render())
    return {d.filename: d.content for d in result.documents}


def content_lines(markdown: str) -> list[tuple[str, str]]:
    """(text, cite id) of each list item above the footer."""
    body = markdown.split("\n---\n## Citations\n")[0]
    items = re.findall(r"^- (.*) \[([^\]]+)\]$", body, re.M)
    assert len(items) == sum(line.startswith("- ") for line in body.splitlines())
    return items


def test_extractive_writes_four_valid_documents(
    extractive: ExtractiveSynthesizer, extracted: dict[str, str]
) -> None:
    corpus = make_corpus()
    result = extractive.synthesize(corpus, max_output_tokens=4000)
    assert [d.filename for d in result.documents] == list(KB_FILENAMES)
    assert validate_drafts(result.documents, corpus) == result.documents
    for content in extracted.values():
        assert content_lines(content), content
        assert all(cid in corpus.cite_ids() for _, cid in content_lines(content))


def test_extractive_is_deterministic(
    extractive: ExtractiveSynthesizer, extracted: dict[str, str]
) -> None:
    again = extractive.synthesize(make_corpus(), max_output_tokens=4000)
    assert {d.filename: d.content for d in again.documents} == extracted


def test_extractive_lines_quote_the_cited_entry(extracted: dict[str, str]) -> None:
    texts = {e.cite_id: normalised(e.text) for e in make_corpus().entries}
    for filename, content in extracted.items():
        for text, cid in content_lines(content):
            assert text in texts[cid], (filename, text, cid)


def test_extractive_brand_voice_has_cited_golden_and_anti_examples(
    extracted: dict[str, str],
) -> None:
    voice = extracted[BRAND]
    golden = voice.split("## Golden examples")[1].split("## Anti-examples")[0]
    anti = voice.split("## Anti-examples")[1].split("---")[0]
    assert "Hi Sam, thanks for reaching out. Here's how to fix that in two minutes." in golden
    assert "Power your home with sunshine, not worry. [url:https://greenleaf.example/]" in golden
    assert 'Avoid jargon such as "synergy" or "leverage". [doc:hb01]' in anti
    assert 'Don\'t say "cheap"; say "affordable" instead.' in anti
    assert "Our voice is warm, plain and confident. [doc:hb01]" in voice
    assert "kitchen" not in voice  # off-topic sentences go nowhere


def test_extractive_product_context(extracted: dict[str, str]) -> None:
    product = extracted[PRODUCT]
    assert (
        "The Leaf Thermostat costs $149 and the Solar Kit starts at $2,900. [doc:pr02]" in product
    )
    assert "homeowners in the Pacific Northwest" in product
    assert "California launches in spring 2027" in product
    assert "cheap" not in product and "@" not in product


def test_extractive_contacts_has_every_email_and_the_escalation_path(
    extracted: dict[str, str],
) -> None:
    contacts = extracted[CONTACTS]
    for email in EMAILS:
        assert email in contacts
    assert "Maria Lopez, Head of Marketing" in contacts
    escalation = contacts.split("## Escalation and contact paths")[1]
    assert "on-call engineer at +1 503 555 0199. [doc:ct03]" in escalation


TEAM_SHEET = """# Team sheet

Who to call at GreenLeaf:

| Name | Role | Email | Phone |
|---|---|---|---|
| Priya Natarajan | Head of Support | priya@greenleaf.example | +1 503 555 0150 |
| Tom Becker | Installation Lead | tom@greenleaf.example | +1 503 555 0151 |
| Ana Ruiz | Billing Manager | ana@greenleaf.example | +1 503 555 0152 |

Field crews:
- North crew lead: Jon Park, jon.park@greenleaf.example
- South crew lead: Eva Li, eva.li@greenleaf.example
"""


def test_extractive_contacts_keep_a_seed_table_and_list_on_their_lines(
    extractive: ExtractiveSynthesizer,
) -> None:
    corpus = make_corpus(CorpusEntry("doc:tb04", "Team sheet", TEAM_SHEET, "am_file"))
    docs = _drafts(extractive, corpus, 4000)
    contacts = docs[CONTACTS]
    assert (
        "| Name | Role | Email | Phone | Source |\n|---|---|---|---|---|\n"
        "| Priya Natarajan | Head of Support | priya@greenleaf.example | +1 503 555 0150 "
        "| [doc:tb04] |\n"
        "| Tom Becker | Installation Lead | tom@greenleaf.example | +1 503 555 0151 "
        "| [doc:tb04] |\n"
        "| Ana Ruiz | Billing Manager | ana@greenleaf.example | +1 503 555 0152 | [doc:tb04] |\n"
    ) in contacts
    lines = contacts.splitlines()
    assert "- North crew lead: Jon Park, jon.park@greenleaf.example [doc:tb04]" in lines
    assert "- South crew lead: Eva Li, eva.li@greenleaf.example [doc:tb04]" in lines


def test_extractive_drops_table_rows_to_fit_but_never_leaves_a_bare_header(
    extractive: ExtractiveSynthesizer,
) -> None:
    rows = "\n".join(
        f"| Person {n} Smith | Store manager | person{n}@greenleaf.example | +1 503 555 01{n:02d} |"
        for n in range(12)
    )
    sheet = "| Name | Role | Email | Phone |\n|---|---|---|---|\n" + rows
    corpus = make_corpus(CorpusEntry("doc:tb05", "Store managers", sheet, "am_file"))
    small = extractive.synthesize(corpus, max_output_tokens=60).documents
    validate_drafts(small, corpus)
    contacts = next(d.content for d in small if d.filename == CONTACTS)
    body = contacts.split("\n---\n## Citations")[0].splitlines()
    kept = [line for line in body if line.startswith("| Person ")]
    assert 1 <= len(kept) < 12  # rows were dropped to fit the budget, not the whole table
    head = body.index("| Name | Role | Email | Phone | Source |")
    assert body[head + 1] == "|---|---|---|---|---|" and body[head + 2] == kept[0]


PRICE_LIST = """# Treatments

## Initial assessment
A 60-minute first appointment with a written treatment plan. Price: 85 EUR.

## Sports massage
Deep-tissue massage for runners, 45 minutes, 60 EUR.

## Rules
We only treat patients aged 16 or over. Our clinic sells gift cards under the Consumer Rights Act.
"""

RANGE = """# Range

| Model | Use | Price |
|---|---|---|
| Kestrel | road | 1,990 EUR |
| Heron | touring bags and racks | 1,450 EUR |
| Wren | kids, 20 inch wheels | 390 EUR |
"""


def test_extractive_product_context_groups_items_under_the_seeds_subheadings(
    extractive: ExtractiveSynthesizer,
) -> None:
    corpus = make_corpus(CorpusEntry("doc:pl06", "Price list", PRICE_LIST, "am_file"))
    docs = _drafts(extractive, corpus, 4000)
    product = docs[PRODUCT]
    assert "### Initial assessment\n\n" in product and "### Sports massage\n\n" in product
    assert product.index("### Initial assessment") < product.index("- Price: 85 EUR. [doc:pl06]")
    assert product.index("- Price: 85 EUR.") < product.index("### Sports massage")
    # sentences with a legal cue go to the compliance notes, even when they mention selling
    assert "aged 16 or over" in docs[COMPLIANCE] and "aged 16" not in product
    assert "Consumer Rights Act" in docs[COMPLIANCE] and "Rights Act" not in product


def test_extractive_keeps_a_product_table_whole_even_when_rows_score_low(
    extractive: ExtractiveSynthesizer,
) -> None:
    corpus = make_corpus(CorpusEntry("doc:rg07", "Range", RANGE, "am_file"))
    product = next(
        d.content
        for d in extractive.synthesize(corpus, max_output_tokens=4000).documents
        if d.filename == PRODUCT
    )
    rows = [line for line in product.splitlines() if line.endswith("| [doc:rg07] |")]
    assert [row.split(" | ")[0] for row in rows] == ["| Kestrel", "| Heron", "| Wren"]


def test_extractive_compliance_only_echoes_corpus_risk_sentences(
    extracted: dict[str, str],
) -> None:
    compliance = extracted[COMPLIANCE]
    lines = content_lines(compliance)
    assert {cid for _, cid in lines} == {LEGAL}
    policy = normalised(POLICY)
    assert all(text in policy for text, _ in lines)
    assert (
        "We collect thermostat usage data only with explicit consent and delete it after 24 "
        in (compliance)
    )
    assert "two-year limited warranty" in compliance
    assert "## Privacy and personal data" in compliance
    assert "## Warranty, refunds and liability" in compliance


def test_extractive_says_so_when_the_corpus_lacks_a_topic(
    extractive: ExtractiveSynthesizer,
) -> None:
    corpus = make_corpus(CorpusEntry("doc:pr02", "Product one-pager", PRODUCTS, "am_file"))
    docs = _drafts(extractive, corpus, 2000)
    assert "No compliance or risk topic found in the research corpus." in docs[COMPLIANCE]
    assert "No example copy found in the research corpus." in docs[BRAND]
    assert "No phrasing to avoid found in the research corpus." in docs[BRAND]
    for content in docs.values():
        assert "[doc:pr02]" in content


def test_extractive_respects_the_output_budget(
    extractive: ExtractiveSynthesizer, extracted: dict[str, str]
) -> None:
    corpus = make_corpus()
    small = extractive.synthesize(corpus, max_output_tokens=50)
    validate_drafts(small.documents, corpus)
    assert sum(len(d.content) for d in small.documents) < sum(map(len, extracted.values()))


def test_extractive_rejects_empty_corpus_and_bad_budget(
    extractive: ExtractiveSynthesizer,
) -> None:
    empty = make_corpus(CorpusEntry("doc:x", "Blank", "  \n", "am_file"))
    with pytest.raises(SynthesisFailed, match="no usable text"):
        extractive.synthesize(empty, max_output_tokens=1000)
    with pytest.raises(ConfigError, match="max_output_tokens must be greater than 0"):
        extractive.synthesize(make_corpus(), max_output_tokens=0)


# --- Anthropic (real SDK, mocked HTTP) -----------------------------------------------------


def good_reply() -> str:
    return json.dumps(
        {
            "documents": [
                {"filename": d.filename, "title": d.title, "content": d.content}
                for d in good_drafts()
            ]
        }
    )


def synthesizer(
    recorder: Recorder, model: str = DEFAULT_MODEL, **kwargs: Any
) -> tuple[AnthropicSynthesizer, list[float]]:
    client = anthropic_client(recorder)
    sleeps: list[float] = []
    return AnthropicSynthesizer(
        "unused", model, client=client, sleep=sleeps.append, **kwargs
    ), sleeps


def test_anthropic_request_shape_and_result(corpus: ResearchCorpus) -> None:
    recorder = Recorder(message(good_reply(), 1200, 800))
    synth, sleeps = synthesizer(recorder)
    result = synth.synthesize(corpus, max_output_tokens=3000)

    assert result.documents == tuple(good_drafts())
    assert result.consumed_tokens == 2000 and result.model == "claude-haiku-4-5"
    (request,) = recorder.requests
    assert request.method == "POST" and request.url.path == "/v1/messages"
    auth = (request.headers.get("x-api-key"), request.headers.get("authorization"))
    assert auth in (("t", None), (None, "Bearer t"))  # the SDK's choice of header varies
    body = recorder.bodies[0]
    assert body["model"] == "claude-haiku-4-5" and body["max_tokens"] == 3000
    assert body["system"] == SYSTEM_PROMPT
    for needle in (*KB_FILENAMES, "## Golden examples", "## Anti-examples", "## Citations"):
        assert needle in body["system"]
    (user,) = body["messages"]
    assert user["role"] == "user" and corpus.render() in user["content"]
    for cid in corpus.cite_ids():
        assert f"[{cid}]" in user["content"]
    assert sleeps == []


def test_anthropic_model_comes_from_resolve_model(
    corpus: ResearchCorpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KB_RESEARCH_MODEL", "claude-sonnet-4-5")
    recorder = Recorder(message(good_reply()), message(good_reply()))
    synth, _ = synthesizer(recorder, resolve_model(None))
    assert synth.synthesize(corpus, max_output_tokens=1000).model == "claude-sonnet-4-5"
    synth, _ = synthesizer(recorder, resolve_model("claude-opus-4-1"))
    synth.synthesize(corpus, max_output_tokens=1000)
    assert [b["model"] for b in recorder.bodies] == ["claude-sonnet-4-5", "claude-opus-4-1"]


def test_anthropic_retries_429_then_529_then_succeeds(corpus: ResearchCorpus) -> None:
    recorder = Recorder(
        api_error(429, "rate_limit_error", {"retry-after": "5"}),
        api_error(529, "overloaded_error"),
        message(good_reply(), 100, 50),
    )
    synth, sleeps = synthesizer(recorder, backoff_s=1.0)
    result = synth.synthesize(corpus, max_output_tokens=1000)
    assert len(recorder.requests) == 3
    assert sleeps == [5.0, 2.0]  # retry-after when longer than the backoff, then 1 s * 2
    assert result.consumed_tokens == 150


def test_anthropic_retries_connection_errors(corpus: ResearchCorpus) -> None:
    import httpx2

    recorder = Recorder(httpx2.ConnectError("connection refused"), message(good_reply()))
    synth, sleeps = synthesizer(recorder, backoff_s=0.5)
    synth.synthesize(corpus, max_output_tokens=1000)
    assert len(recorder.requests) == 2 and sleeps == [0.5]


def test_anthropic_gives_up_after_max_retries(corpus: ResearchCorpus) -> None:
    recorder = Recorder(*(api_error(503, "api_error") for _ in range(3)))
    synth, sleeps = synthesizer(recorder, max_retries=2, backoff_s=1.0)
    with pytest.raises(SynthesisFailed, match=r"still failing after 3 attempt\(s\)"):
        synth.synthesize(corpus, max_output_tokens=1000)
    assert len(recorder.requests) == 3 and sleeps == [1.0, 2.0]


def test_anthropic_400_fails_at_once(corpus: ResearchCorpus) -> None:
    recorder = Recorder(api_error(400, "invalid_request_error"))
    synth, sleeps = synthesizer(recorder)
    with pytest.raises(SynthesisFailed, match=r"HTTP 400.*not retried") as err:
        synth.synthesize(corpus, max_output_tokens=1000)
    assert len(recorder.requests) == 1 and sleeps == []
    assert type(err.value.__cause__).__name__ == "BadRequestError"


def test_anthropic_repairs_a_malformed_reply(corpus: ResearchCorpus) -> None:
    bad = json.loads(good_reply())
    bad["documents"][2]["content"] = bad["documents"][2]["content"].replace(LEGAL, "doc:nope")
    recorder = Recorder(
        message(json.dumps(bad), 1000, 400),
        message(f"```json\n{good_reply()}\n```", 1500, 450),
    )
    synth, _ = synthesizer(recorder)
    result = synth.synthesize(corpus, max_output_tokens=2000)

    assert result.documents == tuple(good_drafts())
    assert result.consumed_tokens == 1000 + 400 + 1500 + 450
    first, repair = recorder.bodies
    assert repair["system"] == first["system"] and repair["max_tokens"] == 2000
    user, assistant, ask = repair["messages"]
    assert user == first["messages"][0]
    assert assistant == {"role": "assistant", "content": json.dumps(bad)}
    assert ask["role"] == "user"
    assert (
        f"{COMPLIANCE}: cites [doc:nope], which is not an id of the research corpus"
        in (ask["content"])
    )
    assert "corrected JSON object only" in ask["content"]


def test_anthropic_repairs_non_json(corpus: ResearchCorpus) -> None:
    recorder = Recorder(message("Here are your documents!"), message(good_reply()))
    synth, _ = synthesizer(recorder)
    synth.synthesize(corpus, max_output_tokens=2000)
    assert "the reply is not valid JSON" in recorder.bodies[1]["messages"][2]["content"]


def test_anthropic_fails_after_a_bad_repair(corpus: ResearchCorpus) -> None:
    missing_footer = json.loads(good_reply())
    missing_footer["documents"][1]["content"] = BAD_FOOTER
    recorder = Recorder(
        message("not json at all", 100, 10),
        message(json.dumps(missing_footer), 200, 20),
    )
    synth, _ = synthesizer(recorder)
    with pytest.raises(SynthesisFailed) as err:
        synth.synthesize(corpus, max_output_tokens=2000)
    assert len(recorder.requests) == 2  # one repair, no more
    text = str(err.value)
    assert "invalid KB drafts for 'GreenLeaf Home' twice (330 tokens spent)" in text
    assert "not valid JSON" in text and f"{PRODUCT}: missing the citations footer" in text


def test_anthropic_names_a_truncated_reply(corpus: ResearchCorpus) -> None:
    cut = good_reply()[:300]
    recorder = Recorder(message(cut, stop="max_tokens"), message(good_reply()))
    synth, _ = synthesizer(recorder)
    synth.synthesize(corpus, max_output_tokens=100)
    assert "cut off at max_tokens=100" in recorder.bodies[1]["messages"][2]["content"]


def test_anthropic_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="API key is empty"):
        AnthropicSynthesizer("")
    with pytest.raises(ConfigError, match=r"max_retries must be 0 or more\. Currently it is -1"):
        AnthropicSynthesizer("k", max_retries=-1)


def test_parse_drafts_tolerates_a_fence_and_names_bad_shapes() -> None:
    docs = parse_drafts(f"```json\n{good_reply()}\n```")
    assert docs == good_drafts()
    with pytest.raises(SynthesisInvalid, match='"documents" list'):
        parse_drafts('{"docs": []}')
    with pytest.raises(SynthesisInvalid, match=r"documents\[0\] must be an object"):
        parse_drafts('{"documents": [{"filename": "x.md"}]}')


# A technical PDF's text as kbflow extracts it: a contents page run together, a footer with
# the page number on every page, authors introduced by their role, SQL without fences (whose
# keyword line reads like a title) and example captions.
HANDBOOK_PDF = """\
Notices . . . . . . . . . . . . . . . . . . vii Trademarks . . . . . . . . . . . . . . viii

Chapter 1. Securing data . . . . . . . . . 1 1.1 Security fundamentals . . . . . . . . . 2

© Copyright Larkspur Corp. 2024. All rights reserved. iii

Ines Ortega is a senior database consultant on the Larkspur security team in Rotterdam.

Marek Havel is a Lead IT Specialist at Larkspur Lab Services. Write to mhavel@larkspur.example.

2 Row and Column Access Control at Larkspur

© Copyright Larkspur Corp. 2024. All rights reserved. xi

Example 3-9 Creating a mask on the TAX_ID column

RETURN CASE

WHEN VERIFY_GROUP_FOR_USER ( SESSION_USER , 'HR' ) = 1 THEN EMPLOYEES . TAX_ID ELSE NULL END ;

- Employees can see only their own unmasked TAX_ID under the privacy policy.

4 Row and Column Access Control at Larkspur

© Copyright Larkspur Corp. 2024. All rights reserved. 1

Personal data of employees is kept for six years after they leave, as the law requires.

6 Row and Column Access Control at Larkspur
"""


def test_an_evidence_pack_from_a_pdf_quotes_no_furniture_twice_nothing_and_names_roles(
    extractive: ExtractiveSynthesizer,
) -> None:
    from tasks.text.boilerplate import strip_boilerplate

    entry = CorpusEntry("doc:pdf1", "Handbook", strip_boilerplate(HANDBOOK_PDF), "am_file")
    docs = _drafts(extractive, make_corpus(entry), 4000)
    everything = "\n".join(docs.values())
    for furniture in (". . . .", "All rights reserved", "Row and Column Access Control at"):
        assert furniture not in everything, furniture
    assert "Example 3-9" not in docs[BRAND]  # a caption is no copy to imitate
    contacts = docs[CONTACTS]
    assert "Ines Ortega is a senior database consultant" in contacts  # name with role
    assert "Marek Havel is a Lead IT Specialist" in contacts
    for doc in docs.values():
        assert doc.startswith("# ") and "assembled without a model" in doc
    quoted = [text for doc in docs.values() for text, _ in content_lines(doc)]
    assert len(quoted) == len(set(quoted))  # no quote twice across the four drafts
    compliance = docs[COMPLIANCE]
    if "TAX_ID" in compliance:  # a code keyword ("RETURN") never files it under returns
        section = compliance.split("TAX_ID")[0].rsplit("\n## ", 1)[-1]
        assert not section.startswith("Warranty"), compliance
