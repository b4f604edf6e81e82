"""The agent routes: the knowledge tools and answers, as ``kbflow tools call``, ``kbflow ask``
and ``kbflow answer`` give them (same functions, same JSON), for the agent the token names."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from kbflow.api.auth import AgentId, ServiceDep
from kbflow.services import answers, tools
from kbflow.services.tool_models import ResearchInput, SearchInput

MAX_QUESTION_CHARS = 2000

router = APIRouter(prefix="/v1/agent", tags=["agent"])


class SearchBody(SearchInput):
    """``search_knowledge_base``'s arguments, as strict as the tool's own check: ``true`` or
    ``5.0`` is not a ``top_k``."""

    model_config = ConfigDict(extra="forbid", strict=True)


class AskBody(ResearchInput):
    """``research_knowledge_search``'s arguments, as strict as the tool's own check."""

    model_config = ConfigDict(extra="forbid", strict=True)


class AnswerBody(BaseModel):
    """A question for the agent's knowledge base."""

    model_config = ConfigDict(extra="forbid", strict=True)

    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)


@router.get("/collections")
def list_collections(agent: AgentId, service: ServiceDep) -> dict[str, Any]:
    """``list_knowledge_collections``: what the agent may read."""
    return tools.call_tool(service.read(), "list_knowledge_collections", agent, {})


@router.post("/search")
async def search(body: SearchBody, agent: AgentId, service: ServiceDep) -> dict[str, Any]:
    """``search_knowledge_base``: gated hybrid search in the agent's collections."""
    arguments = body.model_dump(exclude_unset=True)
    result = await service.within_deadline(
        lambda: tools.call_tool(service.read(), "search_knowledge_base", agent, arguments)
    )
    if result.get("degraded"):
        service.metrics.degraded.inc()
    return result


@router.post("/ask")
async def ask(body: AskBody, agent: AgentId, service: ServiceDep) -> dict[str, Any]:
    """``research_knowledge_search``: yes / maybe / no with a cited synthesis."""
    result = await service.within_deadline(lambda: answers.ask(service.read(), agent, body.queries))
    service.count_outcome("ask", result)
    return result


@router.post("/answer")
async def answer(body: AnswerBody, agent: AgentId, service: ServiceDep) -> dict[str, Any]:
    """A cited answer from approved knowledge, or a refusal; recorded in the ledger."""
    result = await service.within_deadline(
        lambda: answers.answer(service.read(), agent, body.question)
    )
    service.count_outcome("answer", result)
    return result
