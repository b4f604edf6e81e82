"""Answers and the ledger, one call each (`kbflow ask`, `answer`, `replay`, `turns`,
`provenance`).

The work is `kbflow.answers` (which a long-lived server calls on its own open
`kbflow.wiring.SearchContext`); these functions open what one call needs and close it after.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from core.errors import KbflowError
from core.settings import Settings

if TYPE_CHECKING:
    from tasks.answer.replay import Replay


def ask(settings: Settings, agent: str, queries: Sequence[str]) -> dict[str, Any]:
    """The tri-state knowledge search for an agent (yes / maybe / no), recorded in the ledger."""
    from kbflow.answers import ask as knowledge_search
    from kbflow.wiring import search_context

    with search_context(settings, degrade=True) as ctx:
        return knowledge_search(ctx, agent, queries)


def answer(settings: Settings, agent: str, question: str) -> dict[str, Any]:
    """A cited answer for an agent, or the refusal; recorded in the ledger."""
    from kbflow.answers import answer_question
    from kbflow.wiring import search_context

    with search_context(settings, degrade=True) as ctx:
        return answer_question(ctx, agent, question)


def replay(settings: Settings, turn_id: str, prompt: str | None) -> tuple[Replay, str | None]:
    """Re-run a recorded turn's synthesis (``prompt``: another system prompt); returns the
    replay and a note when the prompt cannot apply."""
    from kbflow.answers import replay_turn

    return replay_turn(settings, turn_id, prompt=prompt)


def turns(
    settings: Settings, *, org: str | None, since: str | None, limit: int
) -> list[dict[str, Any]]:
    """Recent turns from the ledger, newest first (``since``: 7d, 12h, 30m, 2w or a date)."""
    from kbflow.answers import parse_since
    from sinks.ledger import Ledger

    ledger = Ledger(settings.home, url=settings.warehouse_url)
    return ledger.turns(org_id=org, since=parse_since(since), limit=limit)


def provenance(
    settings: Settings,
    *,
    doc: str | None,
    since: str | None,
    stale: bool,
    org: str | None = None,
) -> list[dict[str, Any]]:
    """The recorded answers that cited ``doc`` (or, with ``stale``, any answer to revisit),
    each flagged when its document was rejected, superseded, withdrawn or changed since;
    ``org``: only answers given for that org.

    Raises:
        KbflowError: neither ``doc`` nor ``stale``.
        NotFound: ``doc`` is unknown to the registry and the ledger.
    """
    from kbflow.answers import parse_since
    from kbflow.answers import provenance as trace
    from sinks.connect import open_registry

    if doc is None and not stale:
        raise KbflowError("say what to trace: --doc DOC_ID, or --stale for every answer to revisit")
    with open_registry(settings) as registry:
        return trace(
            settings,
            registry,
            doc_id=doc,
            since=parse_since(since),
            stale_only=stale,
            org_id=org,
        )
