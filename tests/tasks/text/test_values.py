"""What a question asks for, and whether a text holds a value of that kind."""

from __future__ import annotations

import pytest

from tasks.text.values import asks_for_value, holds_value_for, is_question


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What is the price of Arctic Breakfast?", True),
        ("how long is the warranty", True),
        ("Does the Aurora come in blue", True),
        ("ALDH1 expression is associated with poorer prognosis.", False),
        ("expense deadline", False),
        ("", False),
    ],
)
def test_is_question(text: str, expected: bool) -> None:
    assert is_question(text) is expected


@pytest.mark.parametrize(
    ("term", "text"),
    [
        ("price", "14.50 EUR"),
        ("price", "€ 3,450"),
        ("cost", "USD 12"),
        ("fee", "a fee of 25 euros"),
        ("phone", "call +31 30 123 4567"),
        ("contact", "write to sales@larkspur-cycles.example"),
        ("weigh", "9.4 kg"),
        ("heavi", "it is 21 lbs"),
        ("deadlin", "within 72 hours"),
        ("date", "on 1 March 2027"),
    ],
)
def test_a_value_of_the_asked_kind_is_found(term: str, text: str) -> None:
    assert asks_for_value(term)
    assert holds_value_for(term, text)


@pytest.mark.parametrize(
    ("term", "text"),
    [
        ("price", "version 3.2 of the price list"),
        ("price", "Eureka 5"),
        ("phone", "order 12345678"),
        ("weigh", "gear 11 of 12"),
        ("contact", "root@localhost"),
        ("arctic", "14.50 EUR"),  # a topic word asks for no value
    ],
)
def test_a_value_of_another_kind_or_none_is_not(term: str, text: str) -> None:
    assert not holds_value_for(term, text)
