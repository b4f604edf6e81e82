"""The answer confidence's term coverage: a question's value words ("price", "phone") count
when the chunk holds a value of that kind; a claim's words are matched as words."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from core.models import Scope, SearchMode
from core.settings import Settings
from sinks.registry import SqlRegistry
from tasks.answer.cited_answer import answer
from tasks.answer.confidence import TermStats, coverage
from tasks.answer.knowledge import Evidence, ExtractiveKnowledgeModel
from tasks.answer.turns import AnswerConfig
from tasks.query.retrieve import retrieve
from tasks.text.sparse import analyze
from tests.conftest import index_records

# Flat statistics (every term equally rare), so a coverage is the share of terms present.
STATS = TermStats(n=1000, df=Counter())


@pytest.mark.parametrize(
    ("question", "answering", "silent"),
    [
        (
            "What is the price of Arctic Breakfast?",
            "Arctic Breakfast: oat porridge with lingonberries and coffee, 14.50 EUR.",
            "Arctic Breakfast is oat porridge with lingonberries, served until ten.",
        ),
        (
            "How much does the Arctic Breakfast cost?",
            "The Arctic Breakfast is €14.50 per guest.",
            "The Arctic Breakfast is served from 7 to 10 every morning.",
        ),
        (
            "What is the phone number of the Ghent store manager?",
            "Ghent store manager: Els Maes, +32 9 123 45 67.",
            "Ghent store manager: Els Maes, since 2021.",
        ),
        (
            "How can I reach the Ghent store manager?",
            "Ghent store manager Els Maes: els.maes@larkspur-cycles.example",
            "Ghent store manager Els Maes leads a team of six.",
        ),
        (
            "How heavy is the Meridian gravel bike?",
            "The Meridian gravel bike weighs 9.4 kg with pedals.",
            "The Meridian gravel bike has a carbon frame and wide tyres.",
        ),
        (
            "What is the deadline for expense claims?",
            "Expense claims are filed within 30 days of purchase.",
            "Expense claims are filed through the finance portal.",
        ),
    ],
)
def test_a_question_s_value_word_counts_when_the_chunk_states_such_a_value(
    question: str, answering: str, silent: str
) -> None:
    assert coverage(question, answering, STATS) == pytest.approx(1.0)
    # the passage about the same thing that states no such value still lacks the word
    assert coverage(question, silent, STATS) < 1.0


def test_a_value_word_is_a_topic_word_outside_questions() -> None:
    claim = "Treatment cost in elderly patients rises with dose"
    chunk = "Treatment in elderly patients rises with dose: 40 USD per month."
    assert "cost" in analyze(claim)
    assert coverage(claim, chunk, STATS) < 1.0
    assert coverage(claim + "?", chunk, STATS) == pytest.approx(1.0)


def test_a_value_of_another_kind_does_not_answer() -> None:
    # a mass is no price, a date is no phone number
    assert coverage("What is the price of the Meridian?", "The Meridian weighs 9.4 kg.", STATS) < 1
    no_phone = "Meridian team since 2021."
    assert coverage("What is the phone of the Meridian team?", no_phone, STATS) < 1


MENU = [
    ("arctic", "Arctic Breakfast", "Arctic Breakfast: oat porridge with lingonberries, smoked "
     "salmon on rye bread and filter coffee. 14.50 EUR per guest, served 7:00 to 10:30."),
    ("fjord", "Fjord Lunch", "Fjord Lunch: a bowl of fish soup with dill, sourdough and a glass "
     "of cloudberry juice. Served from noon in the harbour room."),
    ("sauna", "Sauna evening", "Sauna evenings run every Friday from 18:00. Towels and slippers "
     "are provided; book at the front desk by Thursday."),
]  # fmt: skip


def test_the_price_of_a_menu_item_is_answered_from_its_amount_at_the_default_threshold(
    registry: SqlRegistry, edge_store: Any, embedder: Any
) -> None:
    """The paraphrase the issue found refused (support 0.499): the document says "14.50 EUR",
    the question says "price"."""
    index_records(
        [{"key": k, "title": t, "text": x} for k, t, x in MENU],
        store=edge_store, registry=registry, embedder=embedder, collection="menu",
    )  # fmt: skip
    turn = answer(
        "What is the price of Arctic Breakfast?", Scope("acme", collections=("menu",)),
        org_id="acme", agent_id="concierge", registry=registry, embedder=embedder,
        retrieve_fn=lambda q, scope, k: retrieve(
            q, scope, store=edge_store, registry=registry, embedder=embedder,
            mode=SearchMode.HYBRID, top_k=k,
        ),
        model=ExtractiveKnowledgeModel(Settings().answer_min_confidence),
        config=AnswerConfig(threshold=Settings().answer_min_confidence),
    )  # fmt: skip
    assert turn.output["status"] == "answered", turn.output["refusal"]
    assert "14.50 EUR" in turn.output["answer"]


def test_the_offline_model_quotes_the_sentence_with_the_asked_value_and_v1_replays_as_before() -> (
    None
):
    evidence = [Evidence("c1", "d1", "test://menu", "Arctic Breakfast", MENU[0][2], 0.7)]
    question = "What is the price of Arctic Breakfast?"
    v2 = ExtractiveKnowledgeModel(0.59).answer(question, evidence, [])
    assert "14.50 EUR" in v2[0].text and "Arctic Breakfast" in v2[0].text
    v1 = ExtractiveKnowledgeModel(0.59, "extractive-v1")
    assert v1.model_id == "extractive-v1"
    assert "14.50 EUR" not in v1.answer(question, evidence, [])[0].text  # as recorded then
    with pytest.raises(ValueError, match="unknown offline model"):
        ExtractiveKnowledgeModel(0.59, "extractive-v9")


def test_one_stated_value_answers_one_ask_even_when_the_question_names_it_twice() -> None:
    # "cost" and "price" ask for the same amount: one ask, weighed once, covered by 3,190 EUR
    # (the demo's near-miss about the 2027 price was answered with today's price otherwise)
    question = "What will the Aurora cost after the 2027 price increase?"
    assert analyze(question) == ["aurora", "cost", "2027", "price", "increas"]
    assert coverage(question, "Aurora: 3,190 EUR.", STATS) == pytest.approx(2 / 4)
