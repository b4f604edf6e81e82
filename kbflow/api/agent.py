"""The agent routes: the knowledge tools and answers, as ``kbflow tools call``, ``kbflow ask``
and ``kbflow answer`` give them (same functions, same JSON), for the agent the token names.

A body is checked once, by its pydantic model (`kbflow.api.schemas`), and the tool runs with
it as it is (`kbflow.services.query.tools.run_tool`); what a route answers is checked once, by
its response model (for the tools, the output model they publish), which forbids any key it
does not declare. These routes hand FastAPI the service's typed dict rather than a model
instance: FastAPI checks a returned model again, and a search is the hottest route there is.
"""

from __future__ import annotations

from fastapi import APIRouter

from kbflow.api.auth import AgentId, ServiceDep
from kbflow.api.schemas import AnswerBody, AnswerResponse, AskBody, AskResponse, SearchBody
from kbflow.services.query import answers, tools
from kbflow.services.query.tool_models import ListInput, ListOutput, SearchOutput
from kbflow.services.query.types import AnswerTurn, AskTurn, ToolResult

router = APIRouter(prefix="/v1/agent", tags=["agent"])


@router.get("/collections", response_model=ListOutput)
def list_collections(agent: AgentId, service: ServiceDep) -> ListOutput:
    """``list_knowledge_collections``: what the agent may read."""
    result = tools.run_tool(service.read(), "list_knowledge_collections", agent, ListInput())
    return ListOutput.model_validate(result)


@router.post("/search", response_model=SearchOutput)
async def search(body: SearchBody, agent: AgentId, service: ServiceDep) -> ToolResult:
    """``search_knowledge_base``: gated hybrid search in the agent's collections."""
    result = await service.within_deadline(
        lambda: tools.run_tool(service.read(), "search_knowledge_base", agent, body)
    )
    if result.get("degraded"):
        service.count_degraded()
    return result


@router.post("/ask", response_model=AskResponse)
async def ask(body: AskBody, agent: AgentId, service: ServiceDep) -> AskTurn:
    """``research_knowledge_search``: yes / maybe / no with a cited synthesis."""
    result = await service.within_deadline(lambda: answers.ask(service.read(), agent, body.queries))
    service.count_outcome("ask", result)
    return result


@router.post("/answer", response_model=AnswerResponse)
async def answer(body: AnswerBody, agent: AgentId, service: ServiceDep) -> AnswerTurn:
    """A cited answer from approved knowledge, or a refusal; recorded in the ledger."""
    result = await service.within_deadline(
        lambda: answers.answer(service.read(), agent, body.question)
    )
    service.count_outcome("answer", result)
    return result
