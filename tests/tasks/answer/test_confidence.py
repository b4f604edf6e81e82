"""The answer confidence: support-v2 (best-sentence cosine, coverage, dropped-word gain) and
its term coverage, where a question's value words ("price", "phone") count when the chunk
holds a value of that kind and a claim's words are matched as words."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from core.models import Scope, SearchHit, SearchMode
from core.settings import ANSWER_THRESHOLD, Settings
from sinks.registry import SqlRegistry
from tasks.answer.cited_answer import answer
from tasks.answer.confidence import (
    SUPPORT_V2,
    SUPPORT_VERSION,
    TermStats,
    clear_vector_cache,
    coverage,
    dropped_word_queries,
    sentence_units,
    support_scores,
    support_scores_v1,
)
from tasks.answer.contract import Evidence
from tasks.answer.extractive import ExtractiveKnowledgeModel
from tasks.answer.replay import replay
from tasks.answer.turns import AnswerConfig
from tasks.query.retrieve import retrieve
from tasks.text.sparse import analyze
from tests.conftest import index_records

# Flat statistics (every term equally rare), so a coverage is the share of terms present.
STATS = TermStats(n=1000, df=Counter())
V2_THRESHOLD = ANSWER_THRESHOLD  # chosen with support-v2 on the even halves (bench/fit_support.py)


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


def _answer_from_menu(
    question: str, threshold: float, registry: SqlRegistry, store: Any, embedder: Any
) -> Any:
    """`MENU` indexed into org acme's "menu" collection, and the answer path's turn for
    ``question`` there (gated hybrid retrieval, the offline model, ``threshold``)."""
    index_records(
        [{"key": k, "title": t, "text": x} for k, t, x in MENU],
        store=store, registry=registry, embedder=embedder, collection="menu",
    )  # fmt: skip
    return answer(
        question, Scope("acme", collections=("menu",)),
        org_id="acme", agent_id="concierge", registry=registry, embedder=embedder,
        retrieve_fn=lambda q, scope, k: retrieve(
            q, scope, store=store, registry=registry, embedder=embedder,
            mode=SearchMode.HYBRID, top_k=k,
        ),
        model=ExtractiveKnowledgeModel(threshold), config=AnswerConfig(threshold=threshold),
    )  # fmt: skip


def test_the_price_of_a_menu_item_is_answered_from_its_amount_at_the_default_threshold(
    registry: SqlRegistry, edge_store: Any, embedder: Any
) -> None:
    """The paraphrase the issue found refused (support 0.499): the document says "14.50 EUR",
    the question says "price"."""
    turn = _answer_from_menu(
        "What is the price of Arctic Breakfast?", Settings().answers.answer_min_confidence,
        registry, edge_store, embedder,
    )  # fmt: skip
    assert turn.output["status"] == "answered", turn.output["refusal"]
    assert "14.50 EUR" in turn.output["answer"]


def test_the_offline_model_quotes_the_sentence_with_the_asked_value_and_v1_replays_as_before() -> (
    None
):
    evidence = [Evidence("c1", "d1", "test://menu", "Arctic Breakfast", MENU[0][2], 0.7)]
    question = "What is the price of Arctic Breakfast?"
    v3 = ExtractiveKnowledgeModel(0.59, "extractive-v3").answer(question, evidence, [])
    assert "14.50 EUR" in v3[0].text and "Arctic Breakfast" in v3[0].text
    v4 = ExtractiveKnowledgeModel(0.59).answer(question, evidence, [])  # the price, proved
    assert "14.50 EUR" in v4[0].quote and v4[0].proof == "value-in-sentence"
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


# --- support-v2 ------------------------------------------------------------------------------


def _hit(text: str, chunk_id: str = "c1") -> SearchHit:
    return SearchHit(doc_id="d1", chunk_id=chunk_id, title="", uri="test://kb", heading_path=[],
                     text=text, score=1.0, collection="kb")  # fmt: skip


def _support(question: str, text: str, embedder: Any, *, v1: bool = False) -> float:
    vector = embedder.embed_query(question)
    score = support_scores_v1 if v1 else support_scores
    return score(question, vector, [_hit(text)], embedder, STATS)[0]


REFUNDS = (
    "Refunds: we pay the purchase price back to your card within 14 days of receiving the "
    "returned item. The shop opens at 9:00 on weekdays. Parking behind the shop is free for "
    "customers."
)


def test_support_v2_ranks_a_paraphrase_above_a_near_miss_that_v1_ranked_above_it(
    embedder: Any,
) -> None:
    """The passage answers the paraphrase in other words; the near-miss shares its "refunds"
    but asks about an outlet the passage never names. v1 (whole-chunk cosine + coverage) put
    the near-miss first; v2's best sentence and dropped-word gain put the paraphrase first."""
    paraphrase = "How soon is my money returned after I send goods back?"
    near_miss = "How soon are refunds paid for items bought at the outlet in Lyon?"
    v1 = [_support(q, REFUNDS, embedder, v1=True) for q in (paraphrase, near_miss)]
    v2 = [_support(q, REFUNDS, embedder) for q in (paraphrase, near_miss)]
    assert v1[0] < v1[1]
    assert v2[0] > v2[1]


def test_dropping_the_word_the_chunk_lacks_brings_the_question_closer(embedder: Any) -> None:
    from tasks.answer.confidence import support_parts

    text = "The Kestrel tent weighs 2.1 kg and sleeps two people. Its poles are aluminium."
    asked = ["How heavy is the Kestrel tent?", "How heavy is the Kestrel tent's winter footprint?"]
    parts = [
        support_parts(q, embedder.embed_query(q), [_hit(text)], embedder, STATS)[0] for q in asked
    ]
    assert parts[0].dropped_word_gain < parts[1].dropped_word_gain
    assert parts[1].dropped_word_gain > 0
    assert parts[0].support() > parts[1].support()


def test_the_sentences_and_lines_of_a_chunk_are_scored_on_their_own() -> None:
    text = (
        "Opening hours.\nThe shop opens at 9:00. It closes at 18:00 on weekdays.\n| Sat | 10-16 |"
    )
    # "Opening hours." and the table row are too short to say anything alone
    assert sentence_units(text) == [
        "The shop opens at 9:00.",
        "It closes at 18:00 on weekdays.",
        "The shop opens at 9:00. It closes at 18:00 on weekdays.",
    ]
    assert sentence_units("Short.") == ["Short."]  # nothing says enough alone: the whole text


def test_dropped_word_queries_leave_out_one_content_word_at_a_time() -> None:
    assert dropped_word_queries("What does the ferry cost?") == [
        "What does the cost?",
        "What does the ferry",
    ]
    assert dropped_word_queries("What is it?") == []


class _Counting:
    """An embedder that counts the texts it embeds."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.embedded: list[str] = []

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        self.embedded += texts
        return list(self.inner.embed_documents(texts))

    def embed_query(self, text: str) -> list[float]:
        return list(self.inner.embed_query(text))


def test_support_embeds_each_text_once_per_process(embedder: Any) -> None:
    clear_vector_cache()
    counting = _Counting(embedder)
    question = "What do grown-ups pay to ride the harbour ferry?"
    hits = [_hit("Harbour ferry: adult tickets cost 4.20 EUR. It leaves every 20 minutes.")]
    vector = embedder.embed_query(question)
    first = support_scores(question, vector, hits, counting, STATS)
    embedded = len(counting.embedded)
    assert embedded == len(set(counting.embedded)) > 0  # one batch, no text twice
    assert support_scores(question, vector, hits, counting, STATS) == first
    assert len(counting.embedded) == embedded  # the second time, nothing is embedded


def test_the_default_threshold_is_support_v2_s() -> None:
    assert SUPPORT_VERSION == SUPPORT_V2.version == "support-v2"
    assert Settings().answers.answer_min_confidence == pytest.approx(V2_THRESHOLD)


def test_a_turn_recorded_under_support_v1_replays_unchanged(
    registry: SqlRegistry, edge_store: Any, embedder: Any
) -> None:
    """Replay re-runs synthesis on the recorded evidence, confidences and threshold: a turn
    recorded before support-v2 (no "support" key, v1's threshold) replays byte-identically."""
    turn = _answer_from_menu("When is the sauna evening?", 0.3, registry, edge_store, embedder)
    assert turn.output["status"] == "answered", turn.output["refusal"]
    assert turn.output["support"] == turn.replay_input["support"] == "support-v2"
    recorded_v1 = dataclasses.replace(
        turn,
        replay_input={k: v for k, v in turn.replay_input.items() if k != "support"}
        | {"threshold": 0.59},
        output={k: v for k, v in turn.output.items() if k != "support"} | {"threshold": 0.59},
    )
    result = replay(recorded_v1, ExtractiveKnowledgeModel(0.59))
    assert result.identical, result.diff()
