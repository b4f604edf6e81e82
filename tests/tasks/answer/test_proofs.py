"""The offline model says "answered" only where a structure proves it (`tasks.answer.proofs`):
a table cell under the asked row and column, or the asked kind of value in one sentence that
holds the question's subject. Everything else is "maybe", with a reason in plain English."""

from __future__ import annotations

import pytest

from tasks.answer.asks import ask_of
from tasks.answer.contract import Evidence
from tasks.answer.extractive import dedupe_quotes, evidence_quotes, proving_answer
from tasks.answer.proofs import PROOF_CELL, PROOF_SENTENCE, judge_proved, prove, unproven

SHEET = (
    "## Aurora e-bike\n\nThe Aurora e-bike weighs 23.8 kg and has a range of up to 110 km.\n\n"
    "## Prices\n\n| Model | Price | Weight |\n|---|---|---|\n| Aurora | 3,490 EUR | 23.8 kg |\n"
    "| Meridian gravel | 2,190 EUR | 9.4 kg |\n"
)
BILL = "Bill no. 3139, issued 4 March 2024 to Hotel Adler.\n\nTotal amount due: CHF 2,930.05."
OFFICE = "Our office in Ghent opens at 9:00. The Ghent team answers calls until 17:00."


def _ev(text: str, cid: str = "c1", title: str = "Product sheet") -> Evidence:
    return Evidence(cid, "d1", "kb://d1", title, text, 0.8)


def _proved(question: str, *texts: str) -> tuple[object, str]:
    evidence = [_ev(t, f"c{i}") for i, t in enumerate(texts, 1)]
    return prove(ask_of(question), evidence)


def test_a_table_cell_under_the_named_row_and_column_is_proved() -> None:
    got, why = _proved("What is the price of the Meridian gravel?", SHEET)
    assert got is not None and got.proof == PROOF_CELL and why == ""
    assert "2,190 EUR" in got.claim.quote and "| Model | Price | Weight |" in got.claim.quote


def test_a_row_that_names_only_part_of_the_question_proves_nothing() -> None:
    # A near-miss: there is an "Aurora", but no "Aurora Mini".
    got, why = _proved("What is the price of the Aurora Mini?", SHEET)
    assert got is None and "Aurora Mini" in why


def test_a_value_in_a_sentence_that_holds_the_subject_is_proved() -> None:
    got, _ = _proved("How much does the Aurora e-bike weigh?", SHEET.split("## Prices")[0])
    assert got is not None and got.proof == PROOF_SENTENCE and "23.8 kg" in got.claim.quote


def test_the_asked_value_beside_another_number_is_not_the_number_asked_for() -> None:
    # "bill no. 3139" names the bill; the total is an amount of money in another line.
    got, _ = _proved("What is the total amount due on bill no. 3139?", BILL)
    assert got is None or "2,930.05" in got.claim.quote


def test_two_passages_that_disagree_prove_nothing() -> None:
    got, why = _proved("When does the Ghent office open?", OFFICE,
                       "The Ghent office opens at 8:30 on weekdays.")  # fmt: skip
    assert got is None and "different values" in why


def test_a_question_that_asks_for_no_value_is_maybe_with_a_reason() -> None:
    got, why = _proved("Why does the Aurora have a range of 110 km?", SHEET)
    assert got is None and why.startswith("the question asks why or how")
    got, why = _proved("What makes the Aurora a good commuter bike?", SHEET)
    assert got is None and why.startswith("the question asks for more than a value")


@pytest.mark.parametrize(
    ("question", "says"),
    [
        ("How much does the Zephyr cost?", "states an amount of money for “Zephyr”"),
        ("When is the Zephyr delivered?", "a date or year or a duration or a time of day"),
    ],
)
def test_reasons_are_english_and_name_what_is_missing(question: str, says: str) -> None:
    why = unproven(ask_of(question))
    assert says in why and "  " not in why and "no a " not in why


def test_maybe_hands_over_each_quote_once_however_many_chunks_hold_it() -> None:
    text = "Returns are accepted within 30 days. Refunds take five working days."
    evidence = [_ev(text, "c1"), _ev(text, "c2"), _ev("Refunds take five working days.", "c3")]
    quotes = [c.quote for c in evidence_quotes("How do returns work?", evidence)]
    assert len(quotes) == len(set(quotes)) and len(quotes) <= 3
    assert dedupe_quotes([]) == []


def test_the_offline_model_answers_only_what_is_proved() -> None:
    evidence = [_ev(SHEET)]
    claims = proving_answer("What is the price of the Meridian gravel?", evidence)
    assert claims[0].proof == PROOF_CELL
    verdict = judge_proved("What is the price of the Meridian gravel?", claims, evidence)
    assert verdict.answered and all(c.proof for c in verdict.claims)
    unsure = proving_answer("Is the Aurora good for commuting?", evidence)
    verdict = judge_proved("Is the Aurora good for commuting?", unsure, evidence)
    assert not verdict.answered and verdict.claims and verdict.missing


LINEUP = (
    "## 2026 range\n\nThree bikes, sold in our Utrecht and Ghent stores.\n\n"
    "| Model | Frame | Weight | Price |\n|---|---|---|---|\n"
    "| Aurora E-Bike | aluminium | 23.8 kg | 3,190 EUR |\n"
    "| Meridian Gravel | carbon | 9.4 kg | 2,190 EUR |\n"
    "| Sparrow City | steel | 13.2 kg | 1,290 EUR |\n"
)


def test_a_maybe_hands_a_table_over_whole_and_first_for_a_superlative() -> None:
    """v5: where v4 quoted one row (the agent could not read the lightest bike off it), the
    "maybe" quotes the table whole, header and every row, verbatim from the chunk."""
    evidence = [_ev(LINEUP)]
    question = "Which bike in the range has the lowest weight?"
    v4 = evidence_quotes(question, evidence)
    v5 = evidence_quotes(question, evidence, whole_tables=True)
    assert not any("Meridian" in c.quote and "Sparrow" in c.quote for c in v4)
    table = v5[0].quote  # first: a superlative reads the extreme off the whole table
    assert table.splitlines()[0] == "| Model | Frame | Weight | Price |"
    assert all(name in table for name in ("Aurora E-Bike", "Meridian Gravel", "Sparrow City"))
    lines = LINEUP.splitlines()
    assert all(line in lines for c in v5 for line in c.quote.splitlines())  # exact lines
    assert sum("| Model |" in c.quote for c in v5) == 1  # the table once
    long_table = LINEUP + "".join(f"| Model {i} | steel | 1{i} kg | {i},000 EUR |\n"
                                  for i in range(80))  # fmt: skip
    quotes = evidence_quotes(question, [_ev(long_table)], whole_tables=True)
    assert all(len(c.quote) <= 2_000 for c in quotes)  # too long to quote whole: rows, as v4


def test_a_phone_number_in_the_subjects_sentence_is_proved_and_two_differ() -> None:
    # The "exactly one value" rule reads phone numbers as the PII finder finds them (it read
    # an attribute the finding does not have, and failed on every phone or email question).
    line = "The phone number of the Ghent office is +32 9 224 18 70."
    got, _ = _proved("What is the phone number of the Ghent office?", line)
    assert got is not None and "+32 9 224 18 70" in got.claim.quote
    other = "The Ghent office phone number for returns is +32 9 224 99 11."
    got, why = _proved("What is the phone number of the Ghent office?", line, other)
    assert got is None and "different values" in why


FLOOR_PLAN = (
    "The second floor is laid out as below.\n\n"
    "| Wing | Rooms |\n|---|---|\n| West | 2.01 2.02 Lab A Lab B |\n\n"
    "| North | South |\n|---|---|\n| Lab A | Lab B |\n| Lab C | Lab D |\n\n"
    "The grid of labs on the second floor is shown above."
)


def test_a_lone_passage_hands_over_its_next_best_units_too() -> None:
    """v6: v5 quoted one unit per passage, so a "maybe" on one passage gave one line (here
    the line under the grid, not the row the agent needs); v6 fills the quotes with the
    passage's next-best units, each once, never overlapping, verbatim."""
    question = "In the grid of labs on the second floor, which one sits south of Lab C?"
    evidence = [_ev(FLOOR_PLAN)]
    v5 = evidence_quotes(question, evidence, whole_tables=True)
    v6 = evidence_quotes(question, evidence, whole_tables=True, fill=True)
    assert len(v5) == 1 and not any("Lab D" in c.quote for c in v5)
    assert 1 < len(v6) <= 5 and any("| Lab C | Lab D |" in c.quote for c in v6)
    quotes = [c.quote for c in v6]
    assert len(quotes) == len(set(quotes))
    assert not any(a != b and a in b for a in quotes for b in quotes)  # none inside another
    lines = FLOOR_PLAN.splitlines()
    assert all(line in lines or line in FLOOR_PLAN for c in v6 for line in c.quote.splitlines())
    many = [_ev(FLOOR_PLAN, f"c{i}") for i in range(1, 7)]  # passages enough: one unit each
    assert len(evidence_quotes(question, many, fill=True)) <= 5
