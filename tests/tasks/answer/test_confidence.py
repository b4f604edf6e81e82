"""The answer confidence's term coverage: a question's value words ("price", "phone") count
when the chunk holds a value of that kind; a claim's words are matched as words."""

from __future__ import annotations

from collections import Counter

import pytest

from tasks.answer.confidence import TermStats, coverage
from tasks.text.sparse import analyze

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
    assert coverage("What is the phone of the Meridian team?", "Meridian team since 2021.", STATS) < 1
