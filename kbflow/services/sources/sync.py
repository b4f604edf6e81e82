"""Synced sources run: a sync now (the ``source-sync`` flow in this process) and the schedules
of the ``source-sync`` deployment (docs/SOURCES.md). Apart from
`kbflow.services.sources.definitions` so that what reads and changes sources (the HTTP routes)
never loads Prefect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict

from core.contracts import SyncReport
from core.errors import KbflowError
from core.settings import Settings
from kbflow.services.sources.definitions import REPO, authorize_change, next_run, resolve

if TYPE_CHECKING:
    from sinks.registry import SourceRecord

DEPLOYMENT = "source-sync/source-sync"
"""The parameterised deployment (prefect.yaml) whose schedules `schedule` sets, one a source."""
SCHEDULE_SLUG = "source-"


class ScheduledSource(TypedDict):
    """A source's schedule as `schedule` put it on the deployment (`kbflow sources schedule
    --json`)."""

    source: str
    org_id: str
    id: str
    cron: str
    timezone: str
    slug: str
    next_run: str | None
    deployment: str


def sync(
    settings: Settings,
    ref: str,
    org: str | None = None,
    *,
    actor: str | None,
    progress: Callable[[str, int, int | None], None] | None = None,
    confirm_withdraw: bool = False,
) -> SyncReport:
    """Sync one source now, as the ``source-sync`` flow (this process's Prefect run); returns
    its report. ``confirm_withdraw``: the actor confirms (audited) that this sync may withdraw
    more of the source's items than the deletion-storm bound allows.

    Raises:
        SourceError: the source could not be listed (its summary is kept: `sources show`).
        ConfigError: a sync of it runs already.
    """
    from flows.source_sync import source_sync
    from kbflow.services.orchestration import prefect_starting, tracked
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        source = resolve(registry, ref, org)
        admin = authorize_change(registry, actor, f"sync source {source.name!r}", source.org_id)
        if confirm_withdraw:
            registry.sources.confirm_source_withdrawal(source.id, actor=admin)
    with prefect_starting():
        pass  # the embedder loads at the first changed item: an unchanged sync never needs it
    with tracked(settings.home, source_sync) as flow:
        named = flow.with_options(flow_run_name=f"sync {source.org_id}/{source.name}")
        if progress is None:
            return named(source_id=source.id)
        from core import progress as channel

        with channel.listening(progress):
            return named(source_id=source.id)


def schedule(
    settings: Settings, org: str | None = None, *, actor: str | None
) -> list[ScheduledSource]:
    """Put each scheduled source's cron on the ``source-sync`` deployment (one schedule a
    source, slug ``source-<id>``, its id as the parameter) and drop the schedules of sources
    removed or unscheduled since. Needs the Prefect server the workers use (and the
    deployment: ``prefect deploy -n source-sync`` from the repo creates it).

    ``org``: that org's sources only (an AM's); without it every org's (a superadmin's).
    """
    from kbflow.services.orchestration import require_prefect_server
    from sinks.connect import open_registry
    from tasks.review.access import authorize_admin

    require_prefect_server(
        "schedules live on a Prefect server: start one (`kbflow server`) or set "
        "PREFECT_API_URL to the server your workers use, then run this again"
    )
    with open_registry(settings) as registry:
        if org is None:
            authorize_admin(registry, actor, "schedule every org's sources")
        else:
            authorize_change(registry, actor, f"schedule the sources of org {org!r}", org)
        sources = registry.sources.list_sources(org)
    return _apply_schedules(sources, org)


def _apply_schedules(sources: list[SourceRecord], org: str | None) -> list[ScheduledSource]:
    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.exceptions import ObjectNotFound

    wanted = {f"{SCHEDULE_SLUG}{s.id}": s for s in sources if s.schedule}
    mine = {f"{SCHEDULE_SLUG}{s.id}" for s in sources}
    out: list[ScheduledSource] = []
    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(DEPLOYMENT)
        except ObjectNotFound:
            raise KbflowError(
                f"the Prefect server has no {DEPLOYMENT} deployment: run `prefect deploy -n "
                f"source-sync` in {REPO} (prefect.yaml), start a worker on its pool, then run "
                "this again"
            ) from None
        for existing in client.read_deployment_schedules(deployment.id):
            slug = existing.slug or ""
            if not slug.startswith(SCHEDULE_SLUG):
                continue
            # Each of these sources' schedules is replaced (or dropped); with ``org``, another
            # org's are left alone.
            if org is None or slug in mine:
                client.delete_deployment_schedule(deployment.id, existing.id)
        for slug, source in wanted.items():
            assert source.schedule is not None
            client.create_deployment_schedules(
                deployment.id,
                [
                    DeploymentScheduleCreate(
                        schedule=CronSchedule(cron=source.schedule,
                                              timezone=source.timezone or "UTC"),
                        active=True,
                        parameters={"source_id": source.id},
                        slug=slug,
                    )
                ],
            )  # fmt: skip
            out.append(
                ScheduledSource(
                    source=source.name,
                    org_id=source.org_id,
                    id=source.id,
                    cron=source.schedule,
                    timezone=source.timezone or "UTC",
                    slug=slug,
                    next_run=next_run(source),
                    deployment=DEPLOYMENT,
                )
            )
    return out
