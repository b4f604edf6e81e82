"""One review decision, whoever makes it and from wherever: `decide`, the one service function
the CLI (``kbflow review approve|reject|withdraw|restore|edit``), the HTTP routes
(``POST /v1/admin/documents/{id}/…``) and the inbox call.

In order, in one place:

1. the note rules (`tasks.review.decisions.checked_note`: a withdraw or a restore says why; a
   person at the inbox's form says why for a reject too);
2. who decides: the actor may decide for the document's org (`tasks.review.access`); a refusal
   is an audit row, whatever the surface;
3. what they saw: with ``seen`` (the ``version:status`` the page showed), a document changed
   since is a conflict, so a stale edit never lands over a decision the person did not see;
4. where it goes: a draft that a paused review run kbflow started (and recorded) waits for —
   found now, at decision time, whatever was started first (and waited for a moment when the
   drafts are stored but their run has not paused yet) — gets the decision through that
   run, as its human input with a proof that a one-time review code bound to the run and the
   person signed for exactly that decision (`tasks.review.codes`; the code never goes to
   Prefect); the run verifies it and applies it as that person. If the run ends without
   applying it, or no such run waits, it is applied directly
   (`tasks.review.decisions.apply_decision`, which the paused run's form reaches too).

`Decided` says which happened, for the surface to show.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from core.errors import Forbidden, JobRunnerUnavailable, NotFound, ReviewConflict
from core.models import DocStatus
from core.settings import Settings, export_prefect_credential
from kbflow.services.orchestration import prefect_api, running_server_url
from tasks.review.access import authorize_document
from tasks.review.codes import issue_code, sign_decisions
from tasks.review.decisions import FORM_VERBS, Verb, apply_decision, checked_note

if TYPE_CHECKING:
    from sinks.registry import DocRecord, SqlRegistry, UserRecord
    from tasks.review.machine import StoreOpener
    from tasks.text.embed import Embedder

Surface = Literal["cli", "http", "inbox"]
log = logging.getLogger(__name__)
RUN_APPLY_WAIT_S = 30.0
"""How long a decision sent to a paused run is waited for (the run polls every 2 s)."""
PAUSE_WAIT_S = 30.0
"""How long a decision waits for a run that holds the draft and is on its way to its pause
(a research run's drafts are in the inbox a moment before its review subflow pauses)."""
PAUSING_RECORDED_S = 300.0
"""Only a run recorded this recently is waited for: a research run reaches its pause within
seconds of storing its drafts, and one recorded long ago that still runs (a resumed review
applying its decisions, a process killed without a trace) is not about to pause."""


@dataclass(frozen=True)
class Decided:
    """What a decision did: the document's record after it, the paused run it went through
    (None: applied directly), and a line saying which."""

    doc: DocRecord
    via_run: str | None
    message: str


def decide(
    settings: Settings,
    registry: SqlRegistry,
    open_store: StoreOpener,
    embedder: Callable[[], Embedder],
    actor: str | None,
    doc_id: str,
    verb: Verb,
    *,
    surface: Surface,
    note: str | None = None,
    content: str | None = None,
    seen: str | None = None,
) -> Decided:
    """Apply one decision as ``actor`` (see the module's docstring for the steps).

    Raises:
        ConfigError: a note or an edit's text is missing (nothing was changed).
        Forbidden: ``actor`` may not decide for the document's org (audited).
        NotFound: no such document.
        ReviewConflict: someone decided first, or the document changed since ``seen``
            (nothing was changed).
    """
    verb = Verb(verb)
    note = checked_note(verb, note, content, at_form=surface == "inbox")
    attempted = f"{verb.value} {doc_id}" + (" (inbox)" if surface == "inbox" else "")
    try:
        user, doc = authorize_document(registry, actor, doc_id)
        if seen is not None and seen != f"{doc.version}:{doc.status}":
            raise ReviewConflict(
                f"{doc.title!r} changed since you opened it: it is now version {doc.version}, "
                f"{doc.status} (you saw {seen.replace(':', ', ')}). Nothing was changed: read "
                "it again and decide on what it is now."
            )
        if verb in FORM_VERBS and doc.status == DocStatus.PENDING_REVIEW.value:
            run = _paused_run_for(settings, registry, doc)
            if run is not None:
                through = _through_run(registry, user, doc, *run, verb, content, note)
                if through is not None:
                    return through
        done = apply_decision(
            verb, doc_id, user.id, registry=registry, open_store=open_store,
            embedder=embedder, note=note, content=content,
            max_words=settings.ingest.chunk_max_words,
            overlap_words=settings.ingest.chunk_overlap_words,
        )  # fmt: skip
    except Forbidden as exc:
        try:
            org_id: str | None = registry.documents.get_document(doc_id).org_id
        except NotFound:
            org_id = None
        registry.people.record_denied(actor or "(anonymous)", attempted, org_id=org_id,
                               reason=str(exc))  # fmt: skip
        raise
    return Decided(done, None, f"{verb.value} applied")


def _paused_run_for(
    settings: Settings, registry: SqlRegistry, doc: DocRecord
) -> tuple[str, str] | None:
    """The Prefect server and the paused review run whose form holds ``doc``: only a run that
    kbflow's review flow recorded (`review_runs`), never one planted through the Prefect API
    (None without a server, or when no recorded run waits for it). The server is this
    process's PREFECT_API_URL, else this home's running `kbflow server`, looked up now: a
    `kbflow serve` started before `kbflow server` finds it too. A recorded run still on its
    way to its pause (the research run whose review subflow is starting) is waited for, up
    to `PAUSE_WAIT_S`: deciding beside it would leave it paused on a decided draft."""
    runs = registry.review_runs
    synthesis = doc.synthesis_run_id
    recorded = runs.review_runs_holding(doc.org_id, doc.id, synthesis_run_id=synthesis)
    if not recorded:
        return None
    url = prefect_api.configured_url()
    if url is None:
        url = running_server_url(settings)
        if url is None:
            return None
        export_prefect_credential(settings)  # one `kbflow server --auth` made after this began
    deadline = time.monotonic() + PAUSE_WAIT_S
    try:
        while True:
            run = prefect_api.paused_review_run(url, recorded, doc.org_id, f"doc_{doc.id}")
            if run is not None:
                return url, run
            since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=PAUSING_RECORDED_S)
            fresh = runs.review_runs_holding(doc.org_id, doc.id, synthesis_run_id=synthesis,
                                             since=since)  # fmt: skip
            if time.monotonic() >= deadline or not prefect_api.pausing_soon(url, fresh):
                return None
            time.sleep(0.25)
            # the review subflow records itself just before it pauses
            recorded = runs.review_runs_holding(doc.org_id, doc.id, synthesis_run_id=synthesis)
    except JobRunnerUnavailable:  # an unreachable server: decide directly instead
        return None


def _through_run(
    registry: SqlRegistry,
    user: UserRecord,
    doc: DocRecord,
    url: str,
    run_id: str,
    verb: Verb,
    content: str | None,
    note: str | None,
) -> Decided | None:
    """Hand the decision to the paused run with a proof signed for exactly it and this run
    (the code itself never goes to Prefect); None when the run could not be resumed (the
    server gone, the run no longer paused) or ended without applying it (it refused input
    that was swapped after the resume, say): the caller applies it directly."""
    issued = issue_code(registry, user.id, doc.org_id, flow_run_id=run_id)
    row = {"action": verb.value, "content": content or "", "note": note or ""}
    run_input: dict[str, object] = {f"doc_{doc.id}": row}
    run_input["code"] = sign_decisions(issued.code, run_id, run_input)
    try:
        prefect_api.resume_run(url, run_id, run_input)
    except JobRunnerUnavailable as exc:  # gone, no longer paused, or refused: decide directly
        log.warning("review run %s could not be resumed with %s's decision on %s (%s): "
                    "applying it directly", run_id, user.id, doc.id, exc)  # fmt: skip
        return None
    deadline = time.monotonic() + RUN_APPLY_WAIT_S
    while time.monotonic() < deadline:
        now = registry.documents.get_document(doc.id)
        if now.status != DocStatus.PENDING_REVIEW.value:
            return Decided(now, run_id, f"applied by review run {run_id}")
        state = prefect_api.run_state(url, run_id)
        if state is not None and state.type in {*prefect_api.FAILED_TYPES, "COMPLETED"}:
            now = registry.documents.get_document(doc.id)
            if now.status != DocStatus.PENDING_REVIEW.value:
                return Decided(now, run_id, f"applied by review run {run_id}")
            log.warning(
                "review run %s ended %s without applying %s's decision on %s (%s): applying "
                "it directly", run_id, state.name, user.id, doc.id, state.message,
            )  # fmt: skip
            return None
        time.sleep(0.5)
    return Decided(
        registry.documents.get_document(doc.id),
        run_id,
        f"sent to review run {run_id}; it applies the decision in a moment (reload the page)",
    )
