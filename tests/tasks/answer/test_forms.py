"""Refusal thresholds per query form: `query_form`, `AnswerConfig.threshold_for` /
`for_query`, and answer and knowledge-search turns that record the threshold and form they
used and replay identically (docs/ANSWERS.md, "Thresholds per query form")."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError
from core.models import Scope, SearchMode, Turn
from sinks.registry import SqlRegistry
from tasks.answer.cited_answer import answer
from tasks.answer.confidence import query_form
from tasks.answer.extractive import ExtractiveKnowledgeModel
from tasks.answer.knowledge_search import knowledge_search
from tasks.answer.replay import replay
from tasks.answer.turns import AnswerConfig
from tasks.query.retrieve import retrieve
from tests.tasks.answer.handbook import HANDBOOK, checked, index_handbook

REPO = Path(__file__).resolve().parents[3]
SCIFACT_DEV = REPO.parent / "shared" / "datasets" / "scifact" / "dev" / "queries.jsonl"


@pytest.mark.parametrize(
    ("text", "form"),
    [
        ("What does the Meridian gravel bike sell for?", "question"),
        ("How heavy is the Aurora e-bike?", "question"),
        ("What bikes does Larkspur sell and at what price?", "question"),  # the demo's
        ("is the Rotterdam shop open on Sundays", "question"),  # a question word, no "?"
        ("Aurora e-bike price", "keywords"),
        ("Meridian gravel bike sell", "keywords"),
        ("opening hours Rotterdam shop", "keywords"),
        ("delivery to Germany", "keywords"),
        ("ALDH1 expression is associated with poorer prognosis for breast cancer.", "claim"),
        ("DUSP4 increases apoptosis.", "claim"),  # short, but a sentence
        ("DUSP4 downregulation deactivates the Ras-ERK pathway", "claim"),  # no ".", an article
        ("Cognitive behavioral therapy is an ineffective treatment for insomnia", "claim"),
        ("Employees submit expense reports within thirty days of purchase", "claim"),  # 9 words
    ],
)
def test_query_form_tells_questions_claims_and_keywords_apart(text: str, form: str) -> None:
    assert query_form(text) == form


def test_every_question_of_the_set_is_a_question() -> None:
    lines = (REPO / "evals" / "questions" / "questions.jsonl").read_text().splitlines()
    forms = {query_form(json.loads(line)["text"]) for line in lines if line.strip()}
    assert forms == {"question"}


@pytest.mark.skipif(not SCIFACT_DEV.is_file(), reason="needs ../shared/datasets/scifact")
def test_every_scifact_dev_claim_is_a_claim() -> None:
    lines = SCIFACT_DEV.read_text().splitlines()
    forms = {query_form(json.loads(line)["text"]) for line in lines if line.strip()}
    assert forms == {"claim"}


PER_FORM = AnswerConfig(threshold=0.5, thresholds={"question": 0.45, "keywords": 0.6})


def test_threshold_for_takes_the_forms_threshold_or_the_default() -> None:
    assert PER_FORM.threshold_for("Which class is standard for short flights?") == 0.45
    assert PER_FORM.threshold_for("economy class flights") == 0.6
    assert PER_FORM.threshold_for("Economy class is standard for short flights.") == 0.5  # none
    assert AnswerConfig(threshold=0.3).threshold_for("economy class flights") == 0.3


def test_for_query_sets_the_threshold_and_form_a_turn_records() -> None:
    asked = PER_FORM.for_query("Which class is standard for short flights?")
    assert (asked.threshold, asked.form) == (0.45, "question")
    # a search over several queries: the lowest of their forms' thresholds
    both = PER_FORM.for_query("economy class flights", "Which class is standard?")
    assert (both.threshold, both.form) == (0.45, "question")
    claim = PER_FORM.for_query("Economy class is standard.", "economy class flights")
    assert (claim.threshold, claim.form) == (0.5, "claim")
    assert asked.for_query("economy class flights").threshold == 0.6  # the forms stay
    with pytest.raises(ConfigError, match="at least one query"):
        PER_FORM.for_query()


def test_thresholds_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"for keywords is a cosine in \[-1, 1\]. Currently 2"):
        AnswerConfig(threshold=0.5, thresholds={"keywords": 2.0})
    with pytest.raises(ConfigError, match=r"per query form .* Currently also questions"):
        AnswerConfig(threshold=0.5, thresholds={"questions": 0.4})


@pytest.fixture
def kb(registry: SqlRegistry, edge_store: Any, embedder: Any) -> dict[str, Any]:
    index_handbook(registry, edge_store, embedder)

    def retrieve_fn(query: str, scope: Scope, top_k: int) -> Any:
        return retrieve(query, scope, store=edge_store, registry=registry, embedder=embedder,
                        mode=SearchMode.HYBRID, top_k=top_k)  # fmt: skip

    return {"retrieve_fn": retrieve_fn, "registry": registry, "embedder": embedder}


def run_answer(kb: dict[str, Any], question: str, config: AnswerConfig) -> Turn:
    turn = answer(question, HANDBOOK, org_id="acme", agent_id="helper",
                  retrieve_fn=kb["retrieve_fn"], registry=kb["registry"], embedder=kb["embedder"],
                  model=ExtractiveKnowledgeModel(config.threshold), config=config)  # fmt: skip
    checked(kb["registry"], turn)
    return turn


def run_search(kb: dict[str, Any], queries: list[str], config: AnswerConfig) -> Turn:
    # the offline model triages at the turn's threshold, as kbflow.services.query.answers builds it
    model = ExtractiveKnowledgeModel(config.for_query(*queries).threshold)
    turn = knowledge_search(queries, HANDBOOK, org_id="acme", agent_id="helper",
                            retrieve_fn=kb["retrieve_fn"], registry=kb["registry"],
                            embedder=kb["embedder"], model=model, config=config)  # fmt: skip
    checked(kb["registry"], turn)
    return turn


def recorded_model(turn: Turn) -> ExtractiveKnowledgeModel:
    """The model `kbflow.services.query.answers.replay` builds from a recorded turn."""
    data = turn.replay_input
    return ExtractiveKnowledgeModel(float(data["threshold"]), str(data["model"]))


def test_an_answer_uses_and_records_its_forms_threshold(kb: dict[str, Any]) -> None:
    question = "How many days ahead are flights booked?"
    best = run_answer(kb, question, AnswerConfig(threshold=0.5)).output["best_confidence"]
    # the question form's threshold just below the best support answers; the default above it
    # would refuse, and the keyword form's is never read for a question
    config = AnswerConfig(threshold=0.99, thresholds={"question": best - 0.01, "keywords": 0.99})
    said = run_answer(kb, question, config)
    assert said.output["status"] == "answered"
    assert said.output["threshold"] == said.replay_input["threshold"] == best - 0.01
    assert said.output["query_form"] == said.replay_input["query_form"] == "question"
    assert replay(said, recorded_model(said)).identical
    keywords = run_answer(kb, "flights booked days ahead", config)
    assert keywords.output["status"] == "refused"
    assert (keywords.output["threshold"], keywords.output["query_form"]) == (0.99, "keywords")
    assert "no chunk reached confidence 0.99" in keywords.output["refusal"]["reason"]


def test_a_knowledge_search_records_its_forms_threshold_and_replays(kb: dict[str, Any]) -> None:
    config = AnswerConfig(threshold=0.99, thresholds={"keywords": 0.3})
    said = run_search(kb, ["days to submit expense reports"], config)
    assert said.output["answer_status"] == "yes"
    assert said.output["query_form"] == said.replay_input["query_form"] == "keywords"
    assert said.replay_input["threshold"] == 0.3
    assert replay(said, recorded_model(said)).identical
    # at the default (no keyword threshold) the same search finds nothing that reaches it
    assert (
        run_search(kb, ["days to submit expense reports"], AnswerConfig(threshold=0.99)).output[
            "answer_status"
        ]
        == "no"
    )


def test_a_turn_recorded_before_per_form_thresholds_replays_identically(
    kb: dict[str, Any],
) -> None:
    """Turns in the ledger from before have no ``query_form`` and the single threshold: replay
    reads only the recorded threshold, so they replay as they did."""
    for turn in (
        run_answer(kb, "Which class is standard for short flights?", AnswerConfig(threshold=0.5)),
        run_search(kb, ["days to submit expense reports"], AnswerConfig(threshold=0.5)),
    ):
        before = {k: v for k, v in turn.replay_input.items() if k != "query_form"}
        old = dataclasses.replace(turn, replay_input=before)
        assert old.replay_input["threshold"] == 0.5
        assert replay(old, recorded_model(old)).identical


def test_the_service_records_and_replays_a_search_at_its_forms_threshold(
    settings: Any, registry: SqlRegistry, edge_store: Any, embedder: Any
) -> None:
    """Through `kbflow.services.query.answers`: the offline model triages at the threshold the turn
    records (the keyword form's here), so the ledger's turn replays identically."""
    from kbflow.services.query import answers
    from kbflow.services.query.context import OpenHome
    from sinks.ledger import Ledger

    index_handbook(registry, edge_store, embedder)
    registry.catalog.create_agent("acme", "helper")
    tuned = settings.replace(
        answer_min_confidence=0.99, answer_min_confidence_keywords=0.3, answer_evidence_floor=None
    )  # below 0.99: refused, not maybe
    ctx = OpenHome(settings=tuned, registry=registry, store=edge_store, embedder=embedder)
    out = answers.ask(ctx, "helper", ["days to submit expense reports"])
    assert (out["answer_status"], out["query_form"]) == ("yes", "keywords")
    turn = Ledger(tuned.home).get_turn(out["turn_id"])
    assert turn.replay_input["threshold"] == 0.3
    result, _ = answers.replay(tuned, out["turn_id"])
    assert result.identical
    said = answers.answer(
        ctx, "helper", "How many days do employees have to submit expense reports?"
    )
    assert (said["status"], said["threshold"], said["query_form"]) == ("refused", 0.99, "question")
