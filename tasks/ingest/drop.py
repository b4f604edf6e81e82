"""What an ``ingest`` *deployment* run may read and publish (issue 41 #5).

A deployment run's parameters come from whoever reaches the Prefect API, so they are no proof of
anything: such a run reads only the operator's drop folder (``KBFLOW_INGEST_DROP_DIR``, default
``<home>/drop``; the operator put the files there), and what it ingests enters pending_review
as ``prefect-deployment``, so an account manager decides before any agent sees it. ``kbflow
ingest`` and background jobs (whose terms come from the registry) are not confined.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from core.errors import Forbidden
from core.models import DocStatus
from core.settings import Settings

DEPLOYMENT_ACTOR = "prefect-deployment"
"""Who a deployment run's documents are recorded as coming from (no person is proven)."""


def drop_dir(settings: Settings) -> Path:
    """The folder an ``ingest`` deployment run reads."""
    return (settings.ingest.ingest_drop_dir or settings.home / "drop").resolve()


def confine_to_drop(drop: Path, paths: Sequence[str]) -> list[str]:
    """``paths`` (files, folders or globs; relative ones are relative to ``drop``) as absolute
    paths inside ``drop``.

    Raises:
        Forbidden: a path that leaves the drop folder (absolute elsewhere, or through ``..``).
            Symbolic links inside it are never followed by discovery.
    """
    out = []
    for raw in paths:
        if not str(raw).strip():
            continue
        candidate = Path(raw).expanduser()
        joined = Path(os.path.normpath(drop / candidate))  # an absolute one replaces drop
        if joined != drop and drop not in joined.parents:
            raise Forbidden(
                f"an ingest deployment run reads only the drop folder {drop}; {raw!r} is "
                "outside it. Put the files there (KBFLOW_INGEST_DROP_DIR), or run `kbflow "
                "ingest` on the machine."
            )
        out.append(str(joined))
    return out


def deployment_terms(
    settings: Settings, paths: Sequence[str], status: DocStatus | None
) -> tuple[list[str], DocStatus, str]:
    """The paths, status and actor an ``ingest`` deployment run really gets: paths confined to
    the drop folder, pending_review whatever was asked (nobody proven may publish), and
    `DEPLOYMENT_ACTOR`."""
    return confine_to_drop(drop_dir(settings), paths), DocStatus.PENDING_REVIEW, DEPLOYMENT_ACTOR
