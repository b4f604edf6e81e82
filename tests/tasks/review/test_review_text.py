"""What a review decision serves to agents, as text: the offline draft's banner is said to the
reviewer only (approved as it is or edited with it left in), and a line an account manager added
without a citation is served as hers, not as if it had a source (issue 44)."""

from __future__ import annotations

from typing import Any

import pytest

from core.models import (
    KB_FILENAMES,
    CorpusEntry,
    DocStatus,
    ResearchCorpus,
    Role,
    Scope,
    SearchMode,
    SourceRef,
)
from sinks.registry import SqlRegistry
from tasks.query.retrieve import search
from tasks.research.extractive import ExtractiveSynthesizer
from tasks.research.run import persist_drafts
from tasks.review import machine as review
from tasks.review.inspection import draft_markdown
from tasks.review.markup import citations_of, render_draft
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
    ids = persist_drafts(result.documents, corpus, ORG, "run-1", **ctx).doc_ids
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


CITED = """# Voice

## How we write

- Write plainly and warmly [doc:hb01].
- Prefer short sentences [doc:hb01].
- Never promise delivery dates [url:https://greenleaf.example/legal].

## Prices

| Model | Price |
|---|---|
| Leaf | $149 [doc:pr02] |
| Solar Kit | $2,900 [doc:pr02] |

---
## Citations
- [doc:hb01] Brand handbook
- [doc:pr02] Product one-pager
- [url:https://greenleaf.example/legal] Privacy
"""


def _draft(ctx: dict[str, Any], key: str, text: str) -> str:
    from tests.conftest import index_records

    record = {"key": key, "title": "Voice", "text": text, "markdown": True}
    return index_records([record], org=ORG, status=DocStatus.PENDING_REVIEW, **ctx)[0]


@pytest.mark.parametrize("added", ["- Say hello first.", "| Wren | $99 |"])
def test_a_line_added_without_a_citation_is_listed_as_the_editors(
    ctx: dict[str, Any], added: str
) -> None:
    doc_id = _draft(ctx, "voice", CITED)
    anchor = "- Prefer short sentences" if added.startswith("-") else "| Leaf |"
    lines = CITED.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith(anchor)) + 1
    edited = "".join([*lines[:at], added + "\n", *lines[at:]])
    done = review.edit_and_approve(
        doc_id, AM, edited, registry=ctx["registry"], open_store=review.held(ctx["store"]),
        embedder=ctx["embedder"],
    )  # fmt: skip
    day = done.edited_at.date().isoformat() if done.edited_at else ""
    mine = f"added by {AM} on {day}"
    assert SourceRef(f"am:{AM}/{day}", mine, None) in done.citations
    text = draft_markdown(done, ctx["store"])
    listed = [c.title for c in citations_of(text, done.citations, lambda _: None)]
    assert sorted(listed) == sorted(["Brand handbook", "Privacy", "Product one-pager", mine])
    body = text.split("## Citations")[0]
    tagged = [line for line in body.splitlines() if f"[am:{AM}/{day}]" in line]
    assert len(tagged) == 1 and added.rstrip("|").strip() in tagged[0]
    html = render_draft(body, citations_of(text, done.citations, lambda _: None))
    assert html.count(mine) == 1
    for cited in ("Write plainly", "Prefer short", "Never promise", "Solar Kit", "Leaf"):
        line = next(part for part in html.split("\n") if cited in part)
        assert mine not in line, line
    hits = [
        h for h in search("say hello wren price", Scope(org_id=ORG), top_k=20, **ctx)
        if f"[am:{AM}/{day}]" in h.text
    ]  # fmt: skip
    assert hits and all(SourceRef(f"am:{AM}/{day}", mine, None) in h.sources for h in hits)


def test_an_uncited_document_and_unchanged_lines_get_no_attribution(ctx: dict[str, Any]) -> None:
    plain = "# Hours\n\nWe open at nine.\n"
    doc_id = _draft(ctx, "plain", plain)
    done = review.edit_and_approve(
        doc_id, AM, plain + "\nWe close at five.\n", registry=ctx["registry"],
        open_store=review.held(ctx["store"]), embedder=ctx["embedder"],
    )  # fmt: skip
    assert done.citations == () and "[am:" not in draft_markdown(done, ctx["store"])
    cited = _draft(ctx, "cited", CITED)
    same = review.edit_and_approve(
        cited, AM, CITED.replace("Voice", "Our voice", 1), registry=ctx["registry"],
        open_store=review.held(ctx["store"]), embedder=ctx["embedder"],
    )  # fmt: skip
    assert "[am:" not in draft_markdown(same, ctx["store"])
    assert all(not c.cite_id.startswith("am:") for c in same.citations)


def test_a_draft_stored_with_its_banner_inline_is_not_approved_as_it_is(
    ctx: dict[str, Any], drafts: dict[str, tuple[str, str]]
) -> None:
    """A draft stored before the banner was kept apart (migration 0015) has it in its chunks:
    approving it as it is would serve it to agents. The approval is refused with what to do,
    nothing changes, and an edit of the same text approves it without the banner."""
    from core.errors import ConfigError
    from core.models import DocStatus, SourceTag
    from tests.conftest import index_records

    _, written = drafts[KB_FILENAMES[1]]
    assert NOTE_OPENING in written
    (old,) = index_records(
        [{"key": "synthesis:greenleaf:old-draft.md", "title": "Old draft", "text": written,
          "markdown": True}],
        org=ORG, collection="kb", status=DocStatus.PENDING_REVIEW,
        source_tag=SourceTag.AGENT_SYNTHESIS.value, **ctx,
    )  # fmt: skip
    opener = review.held(ctx["store"])
    with pytest.raises(ConfigError, match="approve it with an edit"):
        review.approve(old, AM, registry=ctx["registry"], open_store=opener)
    assert ctx["registry"].documents.get_document(old).status == DocStatus.PENDING_REVIEW.value
    done = review.edit_and_approve(old, AM, written, registry=ctx["registry"],
                                   open_store=opener, embedder=ctx["embedder"])  # fmt: skip
    assert done.status == DocStatus.APPROVED.value
    assert not [t for t in _served_texts(ctx) if BANNER in t or "Edit before approving" in t]
    # a draft whose banner was kept apart is approved as it is, as before
    brand_id, _ = drafts[KB_FILENAMES[0]]
    assert review.approve(brand_id, AM, registry=ctx["registry"], open_store=opener).status == (
        DocStatus.APPROVED.value
    )
