"""The approval gate through HTTP: a generated world of documents (every status, audience,
effective date and collection), agents (allow-lists, audiences, on or off) and their tokens;
every chunk the service returns, on every agent route, must be one that agent may be served.

The oracle below is written from the rule (README, docs/SECURITY.md), not from the code that
enforces it.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core.models import DocStatus
from core.settings import Settings
from tests import web
from tests.conftest import index_records
from tests.kbflow.service import running_service

pytestmark = pytest.mark.integration  # each test starts or reaches a real service

TOPIC = "harbour crane maintenance schedule"
ORGS = ("north", "south")
COLLECTIONS = ("ops", "ops/cranes", "ops/cranes/night", "finance", "legal")
STATUSES = (*DocStatus, None)  # None: a legacy document without a status, served
AUDIENCES = (None, "staff", "partners")
TODAY = dt.date.today()
DATES = (None, TODAY - dt.timedelta(days=30), TODAY + dt.timedelta(days=30))
DOCS_PER_ORG = 36
AGENTS_PER_ORG = 5
SERVABLE = {DocStatus.APPROVED.value, None}


@dataclass(frozen=True)
class Doc:
    id: str
    org: str
    collection: str
    status: str | None
    audience: str | None
    effective: dt.date | None
    word: str  # a word only this document holds


@dataclass(frozen=True)
class Agent:
    id: str
    org: str
    enabled: bool
    allowed: tuple[str, ...]
    audiences: tuple[str, ...]

    def may_read(self, doc: Doc) -> bool:
        """The rule: the agent's org; approved or status-less; effective; for everyone or one
        of its audiences; filed under a collection it may read; its knowledge base on."""
        return (
            self.enabled
            and doc.org == self.org
            and doc.status in SERVABLE
            and (doc.effective is None or doc.effective <= TODAY)
            and (doc.audience is None or doc.audience in self.audiences)
            and any(doc.collection == c or doc.collection.startswith(c + "/") for c in self.allowed)
        )


def _world(seed: int, settings: Settings, embedder: Any) -> tuple[list[Doc], list[Agent]]:
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.registry import SqlRegistry

    rng = random.Random(seed)
    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)
    docs: list[Doc] = []
    agents: list[Agent] = []
    try:
        for org in ORGS:
            registry.people.ensure_org(org)
            for path in COLLECTIONS:
                parent, _, name = path.rpartition("/")
                registry.catalog.create_collection(org, name, f"{name} papers", parent or None)
            for i in range(DOCS_PER_ORG):
                status = rng.choice(STATUSES)
                audience = rng.choice(AUDIENCES)
                effective = rng.choice(DATES)
                collection = rng.choice(COLLECTIONS)
                word = f"zq{org[0]}{i:03d}x"
                (doc_id,) = index_records(
                    [{"key": f"d{i}", "title": f"{TOPIC} {i}",
                      "text": f"{TOPIC}: note {word} for the {collection} team."}],
                    store=store, registry=registry, embedder=embedder, org=org,
                    collection=collection, status=DocStatus(status) if status else None,
                    audience=audience, effective_date=effective,
                )  # fmt: skip
                docs.append(Doc(doc_id, org, collection, status, audience, effective, word))
            for j in range(AGENTS_PER_ORG):
                agent_id = f"{org}-agent-{j}"
                allowed = tuple(rng.sample(COLLECTIONS, rng.randint(1, 3)))
                audiences = tuple(a for a in ("staff", "partners") if rng.random() < 0.5)
                enabled = rng.random() < 0.85
                registry.catalog.create_agent(org, agent_id, "generated", enabled=enabled)
                registry.catalog.set_allowed(agent_id, list(allowed), allow=True)
                registry.catalog.set_audiences(agent_id, audiences)
                agents.append(Agent(agent_id, org, enabled, allowed, audiences))
    finally:
        store.close()
        registry.close()
    return docs, agents


@pytest.fixture(params=[7, 1234])
def world(
    request: pytest.FixtureRequest, settings: Settings, tmp_path: Path, embedder: Any
) -> Iterator[dict[str, Any]]:
    from sinks.registry import SqlRegistry

    docs, agents = _world(request.param, settings, embedder)
    registry = SqlRegistry.open(settings.registry_url)
    try:
        tokens = {
            a.id: registry.tokens.create_token(agent_id=a.id, expires_at=None, created_by="test")[1]
            for a in agents
        }
    finally:
        registry.close()
    env = {"KBFLOW_API_RATE_BURST": "100000"}
    with running_service(settings.home, tmp_path / "serve.log", env) as base:
        yield {
            "base": base,
            "docs": docs,
            "agents": agents,
            "tokens": tokens,
            "seed": request.param,
        }


def test_no_route_returns_a_chunk_its_agent_may_not_read(world: dict[str, Any]) -> None:
    docs: list[Doc] = world["docs"]
    by_id = {d.id: d for d in docs}
    rng = random.Random(world["seed"])
    leaks: list[str] = []
    served = 0
    for agent in world["agents"]:
        auth = {"Authorization": f"Bearer {world['tokens'][agent.id]}"}
        with web.client(base_url=world["base"], headers=auth, timeout=120) as client:
            # The topic (every document matches), and the private words of documents of every
            # kind: readable ones, drafts, other orgs' and other audiences'.
            queries = [TOPIC, *(d.word for d in rng.sample(docs, 6))]
            for query in queries:
                body = {"query": query, "top_k": 50}
                response = client.post("/v1/agent/search", json=body)
                assert response.status_code == 200, response.text
                for hit in response.json()["results"]:
                    served += 1
                    doc = by_id[hit["doc_id"]]
                    if not agent.may_read(doc):
                        leaks.append(f"search {query!r}: {agent} got {doc}")
            asked = client.post("/v1/agent/ask", json={"queries": queries[:3]})
            assert asked.status_code == 200, asked.text
            for citation in asked.json().get("citations", []):
                doc = by_id[citation["doc_id"]]
                if not agent.may_read(doc):
                    leaks.append(f"ask: {agent} cited {doc}")
            answered = client.post("/v1/agent/answer", json={"question": queries[1]})
            assert answered.status_code == 200, answered.text
            for citation in answered.json().get("citations", []):
                doc = by_id[citation["doc_id"]]
                if not agent.may_read(doc):
                    leaks.append(f"answer: {agent} cited {doc}")
    assert leaks == []
    assert served > 0  # the world was not vacuous: agents were served something
    # ...and every agent was served exactly what it may read of the topic.
    for agent in world["agents"]:
        auth = {"Authorization": f"Bearer {world['tokens'][agent.id]}"}
        response = web.post(world["base"] + "/v1/agent/search", headers=auth, timeout=120,
                              json={"query": TOPIC, "top_k": 50})  # fmt: skip
        got = {h["doc_id"] for h in response.json()["results"]}
        assert got == {d.id for d in docs if agent.may_read(d)}, agent
