"""The citation check of model-written drafts: a sentence its cited source does not hold is
dropped and reported; what the sources hold is kept word for word."""

from __future__ import annotations

from core.models import CorpusEntry, DraftDocument, ResearchCorpus
from tasks.research.cite_check import check_draft, why_not_held

CORPUS = ResearchCorpus(
    "Acme Bikes",
    (
        CorpusEntry(
            "doc:price",
            "Price list",
            "The Aurora e-bike sells for 3,490 EUR. The Meridian gravel bike sells for 2,190 EUR.",
            "am_file",
        ),
        CorpusEntry(
            "doc:team", "Team", "Dana Reyes is head of support (dana@acme.example).", "am_file"
        ),
        CorpusEntry(
            "url:https://acme.example/",
            "Acme homepage",
            "Acme builds e-bikes in Ghent since 2011.",
            "public_homepage",
        ),
    ),
)
FOOTER = "\n\n---\n## Citations\n- [doc:price] Price list\n- [doc:team] Team\n"


def _draft(body: str) -> DraftDocument:
    return DraftDocument("product.md", "Product context", f"# Product context\n\n{body}{FOOTER}")


def test_a_sentence_its_source_holds_is_kept_word_for_word() -> None:
    body = (
        "## Range\n\n- The Aurora e-bike sells for 3,490 EUR [doc:price].\n"
        "- Acme builds e-bikes in Ghent [url:https://acme.example/]."
    )
    checked, dropped = check_draft(_draft(body), CORPUS)
    assert dropped == [] and checked.content == _draft(body).content


def test_a_value_the_cited_source_does_not_state_is_dropped_and_reported() -> None:
    body = (
        "The Aurora e-bike sells for 3,490 EUR [doc:price]. It weighs 23 kg [doc:price].\n\n"
        "- Support is led by Dana Reyes [doc:team].\n"
        "- Call support on +32 9 555 0101 [doc:team]."
    )
    checked, dropped = check_draft(_draft(body), CORPUS)
    assert [d.sentence for d in dropped] == [
        "It weighs 23 kg.",
        "Call support on +32 9 555 0101.",
    ]
    assert all("does not state" in d.why for d in dropped)
    text = checked.content
    assert "3,490 EUR [doc:price]." in text and "23 kg" not in text
    assert "- Support is led by Dana Reyes [doc:team]." in text and "555 0101" not in text
    assert text.endswith(FOOTER)  # the footer is left as it was
    assert "product.md: dropped “It weighs 23 kg.”" in dropped[0].note()


def test_a_sentence_citing_the_wrong_source_is_dropped() -> None:
    # True of the corpus, but not of the entry it cites: the citation must hold the sentence.
    body = "The Meridian gravel bike sells for 2,190 EUR [doc:team]."
    _, dropped = check_draft(_draft(body), CORPUS)
    assert len(dropped) == 1 and dropped[0].cites == ("doc:team",)


def test_one_of_several_cited_sources_holding_it_is_enough() -> None:
    body = "Dana Reyes answers questions about the Aurora e-bike [doc:price] [doc:team]."
    _, dropped = check_draft(_draft(body), CORPUS)
    assert dropped == []


def test_words_the_source_does_not_hold_fail_even_without_numbers() -> None:
    assert (
        why_not_held(
            "Acme is the market leader in cargo trikes worldwide",
            [("Acme homepage", "Acme builds e-bikes in Ghent since 2011.")],
        )
        is not None
    )
    assert why_not_held("Acme builds e-bikes in Ghent", [("Acme homepage",
                        "Acme builds e-bikes in Ghent since 2011.")]) is None  # fmt: skip
