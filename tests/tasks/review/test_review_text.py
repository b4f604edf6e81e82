"""What a review decision serves to agents, as text: the offline draft's banner is said to the
reviewer only, approved as it is or edited with it left in (issue 44)."""

from __future__ import annotations

from typing import Any

import pytest

from core.models import KB_FILENAMES, CorpusEntry, ResearchCorpus, Role, Scope, SearchMode
from sinks.registry import SqlRegistry
from tasks.query.retrieve import search
from tasks.research.extractive import ExtractiveSynthesizer
from tasks.research.run import persist_drafts
from tasks.review import machine as review
from tasks.review.inspection import draft_markdown
from tasks.text.review_note import NOTE_OPENING, split_review_note

ORG, AM = "greenleaf", "amy"
BANNER = "assembled without a model"
HANDBOOK = """# GreenLeaf Home — Brand handbook

## Our voice
Our voice is warm, plain and confident. We write like a helpful neighbour, not a bank.
Use short sentences and everyday words, and always greet customers by name.

## Things to avoid
- Avoid jargon such as "synergy" or "leverage".
- Never use exclamation marks in support replies.
"""
PRODUCTS = """GreenLeaf Home sells smart thermostats and solar battery kits for households.
The Leaf Thermostat costs $149 and the Solar Kit starts at $2,900.
Our customers are homeowners in the Pacific Northwest who want lower energy bills."""
POLICY = """Privacy and warranty.
We collect thermostat usage data only with explicit consent and delete it after
24 months. All hardware carries a two-year limited warranty."""
QUERIES = (
    "evidence pack assembled without a model",
    "each line is quoted from the research corpus as written and cites its source",
    "nothing is paraphrased edit before approving",
    "brand voice warm plain confident",
)


@pytest.fixture
def ctx(edge_store: Any, registry: SqlRegistry, embedder: Any) -> dict[str, Any]:
    registry.people.ensure_org(ORG, am_user_id=AM)
    registry.people.ensure_user(AM, Role.ACCOUNT_MANAGER)
    return {"store": edge_store, "registry": registry, "embedder": embedder}


@pytest.fixture
def drafts(ctx: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The offline synthesizer's four drafts, persisted as a research run persists them: by
    file name, each one's id and its text as the synthesizer wrote it (banner and all)."""
    corpus = ResearchCorpus(
        client_name="GreenLeaf Home",
        entries=(
            CorpusEntry("doc:hb01", "Brand handbook", HANDBOOK, "am_file"),
            CorpusEntry("doc:pr02", "Product one-pager", PRODUCTS, "am_file"),
            CorpusEntry("url:https://greenleaf.example/legal", "Privacy", POLICY, "am_url"),
        ),
    )
    result = ExtractiveSynthesizer(ctx["embedder"]).synthesize(corpus, max_output_tokens=4000)
    assert all(NOTE_OPENING in d.content for d in result.documents)
    ids, _ = persist_drafts(result.documents, corpus, ORG, "run-1", **ctx)
    return {
        d.filename: (doc_id, d.content) for d, doc_id in zip(result.documents, ids, strict=True)
    }


def _served_texts(ctx: dict[str, Any]) -> list[str]:
    return [
        hit.text
        for mode in SearchMode
        for query in QUERIES
        for hit in search(query, Scope(org_id=ORG), mode=mode, top_k=50, **ctx)
    ]


def test_the_banner_is_kept_for_the_reviewer_and_out_of_the_drafts_text(
    ctx: dict[str, Any], drafts: dict[str, tuple[str, str]]
) -> None:
    for doc_id, _ in drafts.values():
        doc = ctx["registry"].documents.get_document(doc_id)
        assert doc.review_note and doc.review_note.startswith("Evidence pack, " + BANNER)
        assert doc.review_note.endswith("Edit before approving.")
        assert "review_note" not in doc.to_dict()  # the record's JSON shape is unchanged
        assert BANNER not in draft_markdown(doc, ctx["store"])


def test_a_draft_approved_as_it_is_serves_no_banner(
    ctx: dict[str, Any], drafts: dict[str, tuple[str, str]]
) -> None:
    opener = review.held(ctx["store"])
    for doc_id, _ in drafts.values():
        review.approve(doc_id, AM, registry=ctx["registry"], open_store=opener)
    texts = _served_texts(ctx)
    assert texts, "the approved drafts are served"
    assert not [t for t in texts if BANNER in t or "Edit before approving" in t]


def test_an_edit_that_leaves_the_banner_in_serves_no_banner(
    ctx: dict[str, Any], drafts: dict[str, tuple[str, str]]
) -> None:
    opener = review.held(ctx["store"])
    brand_id, written = drafts[KB_FILENAMES[0]]
    edited = written.replace("\n## ", "\n## Checked by Amy\n\nThe voice is ours.\n\n## ", 1)
    assert NOTE_OPENING in edited
    done = review.edit_and_approve(
        brand_id, AM, edited, registry=ctx["registry"], open_store=opener,
        embedder=ctx["embedder"],
    )  # fmt: skip
    assert done.status == "approved"
    texts = _served_texts(ctx)
    assert any("The voice is ours." in t for t in texts)
    assert not [t for t in texts if BANNER in t or "Edit before approving" in t]
    # and an approved document edited again with a banner pasted back in
    again = review.edit_and_approve(
        done.id, AM, f"{NOTE_OPENING} pasted back.\n\n{edited}", registry=ctx["registry"],
        open_store=opener, embedder=ctx["embedder"],
    )  # fmt: skip
    assert again.version == done.version + 1
    assert not [t for t in _served_texts(ctx) if BANNER in t]


def test_split_review_note_takes_the_quoted_paragraph_wherever_it_stands() -> None:
    text = f"# T\n\n{NOTE_OPENING} a\n> b.\n\n## S\n\n> a quote stays\n"
    body, note = split_review_note(text)
    assert body == "# T\n\n## S\n\n> a quote stays\n"
    assert note == f"Evidence pack, {BANNER}: a b."
    assert split_review_note("# T\n\nplain\n") == ("# T\n\nplain\n", None)
