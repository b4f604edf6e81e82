"""Agent answers and the ledger: the tri-state knowledge search (`ask`), cited answers
(`answer`), `replay`, `turns` and `provenance`.

`ask` and `answer` take an open `OpenHome` (the CLI opens one per command, ``kbflow
serve`` holds one): they turn an agent id into its scope (`tasks.query.scopes`), pick the
knowledge model from the settings, run `tasks.answer.knowledge_search` or
`tasks.answer.cited_answer`, and record every turn in the ledger before the result is returned:
an answer that cannot be recorded is not served. Replay and provenance read the ledger.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, cast

from core import faults
from core.errors import ConfigError, KbflowError, NotFound
from core.models import DocStatus, Turn
from core.settings import Settings
from kbflow.services.query.context import OpenHome
from kbflow.services.query.types import AnswerTurn, AskTurn, CitingAnswer, TurnSummary
from sinks.ledger import Ledger
from sinks.registry import SqlRegistry
from tasks.answer.cited_answer import answer as cited_answer
from tasks.answer.claude import ClaudeKnowledgeModel
from tasks.answer.contract import KnowledgeModel
from tasks.answer.extractive import EXTRACTIVE_MODEL_IDS, ExtractiveKnowledgeModel
from tasks.answer.knowledge_search import knowledge_search
from tasks.answer.replay import Replay, check_replayable
from tasks.answer.replay import replay as replay_synthesis
from tasks.answer.turns import AnswerConfig
from tasks.llm import ChatModel
from tasks.llm_choice import chat_model, client_provider, provider_of
from tasks.query.bounds import CheckedQuery, check_queries, check_query
from tasks.query.public_uri import publish_uris
from tasks.query.scopes import agent_scope

STALE_STATUSES = (
    DocStatus.REJECTED.value,
    DocStatus.SUPERSEDED.value,
    DocStatus.WITHDRAWN.value,
)


def answer_config(settings: Settings) -> AnswerConfig:
    return AnswerConfig(
        threshold=settings.answers.answer_min_confidence,
        top_k=settings.answers.answer_top_k,
        reveal_contacts=settings.answers.agent_contact_data == "reveal",
        thresholds=settings.answers.answer_thresholds(),
        floor=settings.answers.answer_evidence_floor,
    )


def knowledge_model(
    settings: Settings,
    *,
    client: Any | None = None,
    model_id: str | None = None,
    threshold: float | None = None,
    chat: ChatModel | None = None,
) -> tuple[KnowledgeModel | None, str | None]:
    """The configured knowledge model, or None and why none can be used.

    ``KBFLOW_ANSWER_MODEL`` decides: ``extractive`` (offline), ``anthropic`` or ``openai`` (that
    provider), ``auto`` (the provider ``KBFLOW_LLM_PROVIDER`` picks: `tasks.llm.provider_of`,
    else offline).

    Args:
        client: a provider SDK client to use (tests, proxies); implies its provider.
        model_id: this model, whatever the settings say (replay of a recorded turn): Claude for
            a ``claude-*`` id, else the configured OpenAI-compatible server.
        threshold: the offline model's triage threshold (the turn's, `AnswerConfig.for_query`);
            ``KBFLOW_ANSWER_MIN_CONFIDENCE`` by default.
        chat: this chat model, whatever the settings say (MCP sampling: the calling agent's
            own model, `tasks.llm.SampledChat`).
    """
    if chat is not None:
        return ClaudeKnowledgeModel(chat), None
    choice = settings.answers.answer_model
    forced: str | None = None
    if model_id is not None:
        forced = "anthropic" if model_id.startswith("claude") else "openai"
    elif client is not None:
        forced = client_provider(client)
    elif choice in ("anthropic", "openai"):
        forced = choice
    elif choice == "extractive":
        forced = "none"
    if provider_of(settings, forced) == "none":
        chosen = settings.answers.answer_min_confidence if threshold is None else threshold
        return ExtractiveKnowledgeModel(chosen), None
    try:
        made = chat_model(settings, provider=forced, model_id=model_id, client=client)
    except ConfigError as exc:
        return None, str(exc)
    assert made is not None  # not "none": checked above
    return ClaudeKnowledgeModel(made), None


def _agent_org(registry: SqlRegistry, agent_id: str) -> str:
    return registry.catalog.get_agent(agent_id).org_id


def ask(
    ctx: OpenHome,
    agent_id: str,
    queries: Sequence[str],
    *,
    client: Any | None = None,
    ledger: Ledger | None = None,
    chat: ChatModel | None = None,
) -> AskTurn:
    """``research_knowledge_search`` for an agent; the turn is recorded, then returned.
    ``chat``: the model that reads, instead of the configured one (`knowledge_model`).

    The queries' one check (`check_queries`): every surface (``kbflow ask``, ``POST
    /v1/agent/ask``, MCP and ``kbflow tools call``) comes here, and the turn and its retrieval
    take the `CheckedQuery`s as they are."""
    checked = check_queries(queries)
    turn = _agent_turn(ctx, agent_id, knowledge_search, checked, client, ledger, chat)
    return cast("AskTurn", turn)


def answer(
    ctx: OpenHome,
    agent_id: str,
    question: str,
    *,
    client: Any | None = None,
    ledger: Ledger | None = None,
    chat: ChatModel | None = None,
) -> AnswerTurn:
    """Answer for an agent with a citation on every claim, or refuse; recorded, then returned.
    ``chat``: the model that reads, instead of the configured one (`knowledge_model`).

    The question's one check (`check_query`): every surface (``kbflow answer``, ``POST
    /v1/agent/answer``, MCP) comes here, and the turn and its retrieval take the `CheckedQuery`
    as it is."""
    checked = check_query(question, "question")
    turn = _agent_turn(ctx, agent_id, cited_answer, checked, client, ledger, chat)
    return cast("AnswerTurn", turn)


def _agent_turn(
    ctx: OpenHome,
    agent_id: str,
    run: Callable[..., Turn],
    asked: CheckedQuery | list[CheckedQuery],
    client: Any | None,
    ledger: Ledger | None,
    chat: ChatModel | None = None,
) -> dict[str, Any]:
    """Run ``run`` (`answer` or `knowledge_search`) for the agent, record the turn, return it.

    Raises:
        SamplingNeeded: ``chat`` is the agent's own model and must read a prompt first
            (nothing is recorded; the MCP tool asks the agent and runs the turn again)."""
    config = answer_config(ctx.settings)
    # The offline model triages at the threshold the turn records (its queries' form's).
    queries = [asked.text] if isinstance(asked, CheckedQuery) else [q.text for q in asked]
    threshold = config.for_query(*queries).threshold if queries else None  # none: the turn says
    model, why = knowledge_model(ctx.settings, client=client, threshold=threshold, chat=chat)
    org_id = _agent_org(ctx.registry, agent_id)
    turn = run(
        asked,
        agent_scope(ctx.registry, agent_id),
        org_id=org_id,
        agent_id=agent_id,
        retrieve_fn=lambda q, scope, k: ctx.retrieve(q, scope, mode=config.mode, top_k=k),
        registry=ctx.registry,
        embedder=ctx.embedder,
        model=model,
        config=config,
        no_model_reason=why,
    )
    faults.point("answer.before_record")
    (ledger or Ledger(ctx.settings.home, url=ctx.settings.stores.warehouse_url)).record(turn)
    # The ledger keeps the sources' own URIs (provenance, replay); the agent gets public ones.
    result = turn.delivered if turn.delivered is not None else turn.output
    return dict(publish_uris(result, org_id))


def replay(
    settings: Settings,
    turn_id: str,
    prompt: str | None = None,
    *,
    client: Any | None = None,
    ledger: Ledger | None = None,
) -> tuple[Replay, str | None]:
    """Re-run a recorded turn's synthesis with its recorded model; returns a note when
    ``prompt`` cannot apply (the offline model has no prompt)."""
    turn = (ledger or Ledger(settings.home, url=settings.stores.warehouse_url)).get_turn(turn_id)
    check_replayable(turn)
    recorded = turn.replay_input
    model: KnowledgeModel | None
    if recorded["model"] in EXTRACTIVE_MODEL_IDS:
        model = ExtractiveKnowledgeModel(float(recorded["threshold"]), str(recorded["model"]))
    else:
        model, why = knowledge_model(settings, client=client, model_id=str(recorded["model"]))
        if model is None:
            raise ConfigError(f"cannot replay {turn_id} with {recorded['model']}: {why}")
    note = None
    if prompt is not None and isinstance(model, ExtractiveKnowledgeModel):
        note = "--prompt ignored: the offline extractive model has no prompt"
        prompt = None
    return replay_synthesis(turn, model, system=prompt), note


def _trace(
    settings: Settings,
    registry: SqlRegistry,
    *,
    doc_id: str | None = None,
    since: dt.datetime | None = None,
    stale_only: bool = False,
    ledger: Ledger | None = None,
    org_id: str | None = None,
) -> list[CitingAnswer]:
    """Answers that cited a document (or any), each with whether it needs revisiting;
    ``org_id``: only answers given for that org (and a document of another org is unknown).

    An answer is stale when a document it cited is now rejected, superseded or withdrawn, or
    the cited
    chunk no longer belongs to the document's current content: it was approved when cited
    (citations are checked), so it changed later.

    Raises:
        NotFound: ``doc_id`` is neither in the registry nor cited by any recorded answer (a
            document deleted after it was cited is still traced, its answers flagged stale).
    """
    ledger = ledger or Ledger(settings.home, url=settings.stores.warehouse_url)
    rows = ledger.citations(doc_ids=[doc_id] if doc_id else None, org_id=org_id, since=since)
    known = registry.documents.get_documents([doc_id]) if doc_id else {}
    if org_id is not None:
        known = {k: d for k, d in known.items() if d.org_id == org_id}
    if (
        doc_id
        and not rows
        and not known
        and (since is None or not ledger.citations(doc_ids=[doc_id], org_id=org_id))
    ):
        raise NotFound(
            f"no document {doc_id!r}: the registry has no document with that id and no "
            "recorded answer cites it — check the id (`kbflow docs list --org ORG` lists an "
            "org's documents)"
        )
    docs = registry.documents.get_documents({r["doc_id"] for r in rows})
    owners = registry.chunks.chunk_owners([r["chunk_id"] for r in rows])
    out: list[CitingAnswer] = []
    for row in rows:
        doc = docs.get(row["doc_id"])
        current = owners.get(row["chunk_id"], (None, False))[1]
        if doc is None:
            stale = "document deleted"
        elif doc.status in STALE_STATUSES:
            stale = f"document {doc.status}"
        elif not current:
            stale = "document content changed"
        else:
            stale = None
        if stale_only and stale is None:
            continue
        traced = row | {"doc_status": doc.status if doc else None, "stale": stale}
        out.append(cast("CitingAnswer", traced))
    return out


def parse_since(value: str | None, *, now: dt.datetime | None = None) -> dt.datetime | None:
    """``7d``, ``12h``, ``30m`` or an ISO date/time → the moment it names (UTC)."""
    if value is None:
        return None
    now = now or dt.datetime.now(dt.UTC)
    text = value.strip().lower()
    units = {"d": "days", "h": "hours", "m": "minutes", "w": "weeks"}
    if text[:-1].isdigit() and text[-1:] in units:
        return now - dt.timedelta(**{units[text[-1]]: int(text[:-1])})
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError as exc:
        raise ConfigError(
            f"--since must be like 7d, 12h, 30m, 2w or an ISO date. Currently {value!r}."
        ) from exc
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def turns(
    settings: Settings, *, org: str | None, since: str | None, limit: int
) -> list[TurnSummary]:
    """Recent turns from the ledger, newest first (``since``: 7d, 12h, 30m, 2w or a date)."""
    ledger = Ledger(settings.home, url=settings.stores.warehouse_url)
    rows = ledger.turns(org_id=org, since=parse_since(since), limit=limit)
    return cast("list[TurnSummary]", rows)


def provenance(
    settings: Settings,
    *,
    doc: str | None,
    since: str | None,
    stale: bool,
    org: str | None = None,
) -> list[CitingAnswer]:
    """The recorded answers that cited ``doc`` (or, with ``stale``, any answer to revisit),
    each flagged when its document was rejected, superseded, withdrawn or changed since;
    ``org``: only answers given for that org.

    Raises:
        KbflowError: neither ``doc`` nor ``stale``.
        NotFound: ``doc`` is unknown to the registry and the ledger.
    """
    from sinks.connect import open_registry

    if doc is None and not stale:
        raise KbflowError("say what to trace: --doc DOC_ID, or --stale for every answer to revisit")
    with open_registry(settings) as registry:
        return _trace(
            settings,
            registry,
            doc_id=doc,
            since=parse_since(since),
            stale_only=stale,
            org_id=org,
        )
