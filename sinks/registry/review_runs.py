"""Decision proofs and the review runs kbflow started (see :mod:`tasks.review.codes`).

- :meth:`ReviewRunsRepository.redeem_review_proof` uses up the review code that signed a run's
  decisions, in one compare-and-set, once the caller's check of the signature holds;
- :meth:`ReviewRunsRepository.record_review_run` is written by the review flow before it pauses
  (and by the research flow as soon as its drafts are stored, for the moment until its review
  subflow has paused), and :meth:`ReviewRunsRepository.review_runs_holding` is how the inbox
  finds a run to hand a decision to: only runs recorded here, never one planted through the
  Prefect API.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

from sqlalchemy import select, update

from core.errors import Unauthorized
from core.models import AuditAction
from sinks.registry.audit import admin_audit
from sinks.registry.base import Repository
from sinks.registry.logins import GET_CODE, code_refused
from sinks.registry.schema import ReviewCodeRow, ReviewRunRow, aware, utcnow


class ReviewRunsRepository(Repository):
    """Decision proofs (used-up review codes) and the review runs kbflow started."""

    def redeem_review_proof(
        self,
        tag: str,
        verify: Callable[[str], bool],
        *,
        org_id: str,
        flow_run_id: str,
        tag_of: Callable[[str], str],
    ) -> str:
        """Use up the review code whose proof tag is ``tag`` and whose key (its stored hash)
        ``verify`` accepts for run ``flow_run_id`` of ``org_id``; returns its user.

        Raises:
            Unauthorized: no such live code for this org and run, or the signature does not
                hold (decisions or run other than the signed ones); audited, the code unused.
        """
        now = utcnow()
        with self.session() as s:
            rows = s.scalars(
                select(ReviewCodeRow).where(
                    ReviewCodeRow.org_id == org_id,
                    (ReviewCodeRow.flow_run_id.is_(None))
                    | (ReviewCodeRow.flow_run_id == flow_run_id),
                )
            ).all()
        mine = [r for r in rows if tag and tag_of(r.code_hash) == tag]
        why: str | None = None
        if not mine:
            why = (
                f"the decision proof names no review code issued for this org and run; {GET_CODE}."
            )
        else:
            row = mine[0]
            if row.used_at is not None:
                why = f"the review code that signed these decisions was already used; {GET_CODE}."
            elif aware(row.expires_at) <= now:
                why = f"the review code that signed these decisions expired; {GET_CODE}."
            elif not verify(row.code_hash):
                why = (
                    "the decisions this run received are not the ones the review code signed "
                    "(they were changed after they were sent, or signed for another run): "
                    "nothing was applied. Decide again in the review inbox."
                )
            else:
                with self.session() as s, s.begin():
                    done = s.execute(
                        update(ReviewCodeRow)
                        .where(
                            ReviewCodeRow.code_hash == row.code_hash,
                            ReviewCodeRow.used_at.is_(None),
                        )
                        .values(used_at=now, used_by_run=flow_run_id)
                    )
                    if done.rowcount == 1:  # type: ignore[attr-defined]
                        s.add(
                            admin_audit(
                                row.user_id, AuditAction.REVIEW_CODE_USED, org_id, None,
                                {"flow_run_id": flow_run_id, "proof": True},
                            )
                        )  # fmt: skip
                        return row.user_id
                why = f"the review code that signed these decisions was already used; {GET_CODE}."
        self.refuse_review_code(org_id, flow_run_id, why)
        raise Unauthorized(why)

    def refuse_review_code(self, org_id: str, flow_run_id: str, reason: str) -> None:
        """Audit a refused proof or code for run ``flow_run_id``."""
        with self.session() as s, s.begin():
            s.add(code_refused(org_id, flow_run_id, reason))

    def record_review_run(
        self,
        flow_run_id: str,
        org_id: str,
        doc_ids: Sequence[str],
        *,
        synthesis_run_id: str | None = None,
    ) -> None:
        """Record a run of kbflow's own that holds ``doc_ids`` for review (idempotent): a review
        run about to pause, or a research run (holding every draft of ``synthesis_run_id``,
        recorded before they are stored) whose review subflow is on its way."""
        with self.session() as s, s.begin():
            row = s.get(ReviewRunRow, flow_run_id)
            if row is None:
                s.add(ReviewRunRow(flow_run_id=flow_run_id, org_id=org_id, doc_ids=list(doc_ids),
                                   synthesis_run_id=synthesis_run_id,
                                   created_at=utcnow()))  # fmt: skip
            else:
                row.doc_ids = list(doc_ids)
                row.synthesis_run_id = synthesis_run_id or row.synthesis_run_id

    def review_runs_holding(
        self,
        org_id: str,
        doc_id: str,
        limit: int = 50,
        *,
        synthesis_run_id: str | None = None,
        since: dt.datetime | None = None,
    ) -> list[str]:
        """The recorded runs of ``org_id`` whose drafts include ``doc_id`` (or, given the
        draft's ``synthesis_run_id``, that hold every draft of that run), newest first,
        recorded at ``since`` or later when given; whether each is still paused, or on its way
        to pausing, is the Prefect server's to say."""
        query = select(ReviewRunRow).where(ReviewRunRow.org_id == org_id)
        if since is not None:
            query = query.where(ReviewRunRow.created_at >= since)
        with self.session() as s:
            rows = s.scalars(query.order_by(ReviewRunRow.created_at.desc()).limit(limit)).all()
        return [
            r.flow_run_id
            for r in rows
            if doc_id in (r.doc_ids or [])
            or (synthesis_run_id is not None and r.synthesis_run_id == synthesis_run_id)
        ]
