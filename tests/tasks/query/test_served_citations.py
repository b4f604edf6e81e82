"""Citation tags in served chunks resolve to their sources, and never through the gate.

A draft cites an account manager's seed (never served), a rejected draft, another org's
document, a look-alike of the seed's id, and a web page. Whatever path serves it (hybrid and
keyword search, the keyword fallback, cited answers, the tri-state knowledge search), each tag
resolves from the draft's own Citations footer: the seed to the footer's title and the URI the
research corpus knew, the others to what the footer itself says, the look-alike to nothing, and
no cited document's own title, URI or text ever comes out. Real Edge, SQLite and MiniLM.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.models import DocStatus, Scope, SearchMode, SourceRef
from sinks.registry import SqlRegistry
from tasks.answer.cited_answer import answer
from tasks.answer.extractive import ExtractiveKnowledgeModel
from tasks.answer.knowledge_search import knowledge_search
from tasks.answer.turns import AnswerConfig
from tasks.query.fallback import KeywordFallback
from tasks.query.retrieve import retrieve
from tests.conftest import index_records

SECRETS = (
    "Acme brand brief",  # the seed's own title (the footer calls it otherwise)
    "Initech",
    "Globex merger plan",
    "file:///globex",
    "Rejected pricing draft",
    "999 EUR",
    "Pending launch secret",
    "test://acme/brief",  # the seed's own URI: only the corpus's URI may be given
)
QUESTION = "When does the Zephyr gravel bike launch?"


@pytest.fixture
def world(registry: SqlRegistry, edge_store: Any, embedder: Any) -> dict[str, Any]:
    kw: dict[str, Any] = {"store": edge_store, "registry": registry, "embedder": embedder}
    seed = index_records(
        [{"key": "brief", "title": "Acme brand brief", "text": "Brief: the Zephyr in March."}],
        collection="am-inputs", source_tag="am_file", **kw,
    )[0]  # fmt: skip
    globex = index_records(
        [{"key": "plan", "title": "Globex merger plan", "text": "Globex merges with Initech."}],
        org="globex", **kw,
    )[0]  # fmt: skip
    rejected = index_records(
        [{"key": "memo", "title": "Rejected pricing draft", "text": "Zephyr costs 999 EUR."}],
        status=DocStatus.REJECTED, **kw,
    )[0]  # fmt: skip
    lookalike = seed[:-1] + ("0" if seed[-1] != "0" else "1")
    draft = f"""# Zephyr launch notes

## Launch

- The Zephyr gravel bike launches in March at every Acme store [doc:{seed}]
- Wholesale terms for the Zephyr follow the pricing memo [doc:{rejected}]
- Partner news about the Zephyr launch [doc:{globex}]
- The Zephyr launch date was confirmed in the brief [doc:{lookalike}]
- The Zephyr launch page has the details [url:https://acme.example/zephyr]

---
## Citations
- [doc:{seed}] Brand brief (seed)
- [doc:{rejected}] Pricing memo
- [doc:{globex}] Partner news
- [url:https://acme.example/zephyr] Zephyr launch page
"""
    notes = index_records(
        [{"key": "zephyr", "title": "Zephyr launch notes", "text": draft, "markdown": True}],
        cite_uris={f"doc:{seed}": "upload:acme/brief.pdf"}, **kw,
    )[0]  # fmt: skip
    pending = f"# Pending launch secret\n\nZephyr launch moved [doc:{seed}].\n\n---\n" + (
        f"## Citations\n- [doc:{seed}] Pending launch secret\n"
    )
    index_records(
        [{"key": "pending", "title": "Pending launch secret", "text": pending, "markdown": True}],
        status=DocStatus.PENDING_REVIEW, **kw,
    )  # fmt: skip
    expected = [
        SourceRef(f"doc:{seed}", "Brand brief (seed)", "upload:acme/brief.pdf"),
        SourceRef(f"doc:{rejected}", "Pricing memo", None),
        SourceRef(f"doc:{globex}", "Partner news", None),
        SourceRef(
            "url:https://acme.example/zephyr", "Zephyr launch page", "https://acme.example/zephyr"
        ),
    ]
    return {**kw, "notes": notes, "expected": expected, "lookalike": lookalike}


def _retrieve(world: dict[str, Any], scope: Scope, **kw: Any) -> Any:
    return retrieve(QUESTION, scope, store=kw.pop("store", world["store"]),
                    registry=world["registry"], embedder=world["embedder"], top_k=10,
                    **kw)  # fmt: skip


def _no_secret(payload: Any) -> None:
    dumped = json.dumps(payload, default=str)
    assert not [s for s in SECRETS if s in dumped], dumped


@pytest.mark.parametrize("mode", [SearchMode.HYBRID, SearchMode.KEYWORD])
def test_search_hits_resolve_tags_from_their_own_footer(
    world: dict[str, Any], mode: SearchMode
) -> None:
    result = _retrieve(world, Scope("acme"), mode=mode)
    assert {h.doc_id for h in result.hits} == {world["notes"]}  # nothing else is servable
    [hit] = result.hits
    assert hit.sources == world["expected"]
    assert f"[doc:{world['lookalike']}]" in hit.text  # the look-alike is in the text, unresolved
    assert "- The Zephyr gravel bike launches in March" in hit.text.splitlines()[0]
    assert "Citations" not in hit.text and "Brand brief (seed)" not in hit.text
    _no_secret(result.to_dict())


def test_the_keyword_fallback_resolves_them_the_same_way(world: dict[str, Any]) -> None:
    result = _retrieve(world, Scope("acme"), store=None, fallback=KeywordFallback())
    assert result.degraded
    [hit] = [h for h in result.hits if h.doc_id == world["notes"]]
    assert hit.sources == world["expected"]
    _no_secret(result.to_dict())


def test_another_org_sees_none_of_it(world: dict[str, Any]) -> None:
    for store in (world["store"], None):
        result = _retrieve(world, Scope("globex"), store=store, fallback=KeywordFallback())
        assert all(h.doc_id != world["notes"] and not h.sources for h in result.hits)


def test_answers_and_knowledge_search_give_each_citation_its_sources(
    world: dict[str, Any],
) -> None:
    def retrieve_fn(query: str, scope: Scope, top_k: int) -> Any:
        return retrieve(query, scope, store=world["store"], registry=world["registry"],
                        embedder=world["embedder"], top_k=top_k)  # fmt: skip

    common: dict[str, Any] = {
        "org_id": "acme", "agent_id": "helper", "retrieve_fn": retrieve_fn,
        "registry": world["registry"], "embedder": world["embedder"],
        "model": ExtractiveKnowledgeModel(0.3), "config": AnswerConfig(threshold=0.3),
    }  # fmt: skip
    turn = answer(QUESTION, Scope("acme"), **common)
    assert turn.outcome == "answered", turn.output
    expected = [s.to_dict() for s in world["expected"]]
    assert [c["sources"] for c in turn.output["citations"]] == [expected]
    assert turn.output["claims"][0]["citations"][0]["sources"] == expected
    _no_secret(turn.output)
    assert all("sources" not in c.to_dict() for c in turn.citations)  # the ledger's rows

    asked = knowledge_search(["Zephyr launch date"], Scope("acme"), **common)
    assert asked.output["answer_status"] == "yes", asked.output
    assert [c["sources"] for c in asked.output["citations"]] == [expected]
    _no_secret(asked.output)
