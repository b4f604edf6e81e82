"""Synced sources (`kbflow sources`, the source routes): add, list, show, update and remove
them (docs/SOURCES.md); syncing and scheduling, which run Prefect, are `source_runs`'.

Adding, changing, removing and syncing a source is the org's account manager's or a
superadmin's (`tasks.review.access.authorize_org_admin`, audited, a refusal too); what reaches
this machine or a server of the source's choosing — a local folder, a file-backed SQL
database, a custom S3 endpoint — is a superadmin's only (`tasks.sources.guard`). A source's
config is checked by its kind (`tasks.sources`) and never holds a secret: credentials come
from the environment, from the variables the operator allows the org
(``KBFLOW_SOURCES_SECRET_ENV``; a refusal is audited too), and a SQL source never reads
kbflow's own stores.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from core.contracts import SourceDict, SourceSettings
from core.errors import ConfigError, NotFound
from core.models import DocStatus
from core.settings import Settings

if TYPE_CHECKING:
    from sinks.registry import JobRecord, SourceRecord, SqlRegistry

ENTERING = (DocStatus.APPROVED.value, DocStatus.PENDING_REVIEW.value)
SOURCE_SYNC_KIND = "source-sync"
"""The kind of the background job that syncs a source (`submit_sync_job`)."""
REPO = Path(__file__).resolve().parents[2]


SourceFields = SourceSettings
"""A source's fields, each checked (`source_fields`): what `add_source` stores."""


class SourceItems(TypedDict):
    """A source's items by state."""

    present: int
    failed: int
    gone: int


class SourceView(SourceDict):
    """A source as `kbflow sources show --json` prints it, in this order: its fields, its last
    sync (as kept on it), whether a sync runs now, its items by state and its next run."""

    running: bool
    items: SourceItems
    next_run: str | None


class SourceRemoved(TypedDict):
    """A source removed (`kbflow sources remove --json`), with how many documents were withdrawn."""

    removed: str
    name: str
    org_id: str
    withdrawn: int


def source_fields(
    kind: str,
    config: Mapping[str, Any],
    *,
    collection: str,
    status: str,
    audience: str | None = None,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    max_items: int = 10_000,
    max_item_bytes: int = 50_000_000,
    schedule: str | None = None,
    timezone: str | None = None,
) -> SourceFields:
    """A source's fields, each checked (the config by its kind)."""
    from tasks.sources import kind_module

    checked = kind_module(kind).check_config(dict(config))
    common = _checked_common(
        collection=collection, status=status, audience=audience, include=include,
        exclude=exclude, max_items=max_items, max_item_bytes=max_item_bytes, schedule=schedule,
        timezone=timezone,
    )  # fmt: skip
    return SourceFields(
        kind=kind, config=checked, collection=common["collection"], status=common["status"],
        audience=common["audience"], include=common["include"], exclude=common["exclude"],
        max_items=common["max_items"], max_item_bytes=common["max_item_bytes"],
        schedule=common["schedule"], timezone=common["timezone"],
    )  # fmt: skip


def _checked_common(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "collection":
            if not value or not str(value).strip():
                raise ConfigError("a source needs a collection (e.g. --collection policies)")
            from sinks.registry import normalize_collection_path

            value = normalize_collection_path(str(value))
        elif name == "status":
            if value not in ENTERING:
                raise ConfigError(
                    f"status {value!r}: a source's documents enter as approved (a trusted "
                    "source) or pending_review (an AM approves each)"
                )
        elif name == "audience" and value:
            from core import ids

            value = ids.audience(value)  # the rule agents' and uploads' audiences follow
        elif name in ("include", "exclude"):
            value = [p for p in (value or []) if p and p.strip()]
        elif name in ("max_items", "max_item_bytes"):
            if int(value) < 1:
                raise ConfigError(f"{name} must be at least 1 (it is {value})")
            value = int(value)
        elif name == "schedule" and value:
            value = _checked_cron(str(value))
        elif name == "timezone" and value:
            _checked_timezone(str(value))
        out[name] = value or (None if name in ("audience", "schedule", "timezone") else value)
    return out


def _checked_cron(cron: str) -> str:
    from croniter import croniter

    cron = " ".join(cron.split())
    if not croniter.is_valid(cron):
        raise ConfigError(
            f"schedule {cron!r} is not a cron expression: write five fields, e.g. "
            "'0 6 * * *' (every day at 06:00)"
        )
    return cron


def _checked_timezone(name: str) -> None:
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(
            f"unknown timezone {name!r}: use an IANA name like Europe/London"
        ) from exc


def authorize_change(
    registry: SqlRegistry, actor: str | None, what: str, org: str, *, local: bool = False
) -> str:
    """The actor's id if they may ``what`` to ``org``'s sources: its account manager or a
    superadmin (``local``, a local folder: a superadmin); audited refusal otherwise."""
    from tasks.review.access import authorize_org_admin

    return authorize_org_admin(registry, actor, what, org, superadmin_only=local)


def _authorize_config(
    settings: Settings,
    registry: SqlRegistry,
    actor: str | None,
    what: str,
    org: str,
    kind: str,
    config: Mapping[str, Any],
    *,
    check_envs: bool = True,
) -> str:
    """`authorize_change` for a source with this config: a superadmin's only when it reaches
    this machine or a server of its choosing; then, for whoever may, the environment variables
    it names must be the operator's for ``org`` (``check_envs``) and a SQL database file must
    lie outside kbflow's stores. Each refusal is audited and changes nothing."""
    from core.errors import Forbidden
    from tasks.sources.guard import check_outside_home, check_secret_envs, superadmin_reason

    reason = superadmin_reason(kind, config)
    admin = authorize_change(registry, actor, what + (f" ({reason})" if reason else ""), org,
                             local=reason is not None)  # fmt: skip
    registry.people.get_org(org)  # a superadmin is told the org does not exist
    try:
        if check_envs:
            check_secret_envs(settings, org, config)
        if kind == "sql" and config.get("url"):
            from sqlalchemy.engine import make_url

            from tasks.sources.sql import database_file

            local = database_file(make_url(str(config["url"])))
            if local:
                check_outside_home(settings, local)
    except (Forbidden, ConfigError) as exc:
        registry.people.record_denied(admin, what, org_id=org, reason=str(exc))
        raise
    return admin


def add_source(
    settings: Settings, org: str, name: str, fields: Mapping[str, Any], *, actor: str | None
) -> SourceRecord:
    """Add a source to ``org`` (``fields`` from `source_fields`)."""
    from sinks.connect import open_registry

    _check_name(name)
    with open_registry(settings) as registry:
        admin = _authorize_config(settings, registry, actor, f"add source {name!r} to org {org!r}",
                                  org, fields["kind"], fields["config"])  # fmt: skip
        registry.people.get_org(org)
        return registry.sources.create_source(org, name, fields, actor=admin)


def _check_name(name: str) -> None:
    if not name or len(name) > 120 or not all(c.isalnum() or c in "-_." for c in name):
        raise ConfigError(
            f"source name {name!r}: use 1-120 letters, digits, '-', '_' or '.' (e.g. "
            "'policies-share')"
        )


def resolve(registry: SqlRegistry, ref: str, org: str | None) -> SourceRecord:
    """The source named ``ref`` (in ``org``) or with id ``ref``."""
    found = registry.sources.find_sources(ref, org)
    if not found:
        where = f" in org {org!r}" if org else ""
        raise NotFound(f"no source {ref!r}{where} — `kbflow sources list` shows them")
    if len(found) > 1:
        orgs = ", ".join(sorted(s.org_id for s in found))
        raise ConfigError(f"several orgs have a source named {ref!r} ({orgs}): add --org ORG")
    return found[0]


def get_source(settings: Settings, ref: str, org: str | None = None) -> SourceView:
    """One source as JSON, with its last sync, whether a sync runs now, its next scheduled
    run and its items' counts by state."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        source = resolve(registry, ref, org)
        counts = registry.sources.item_counts().get(source.id, {})
    return source_dict(settings, source, counts)


def list_sources(settings: Settings, org: str | None = None) -> list[SourceView]:
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        if org is not None:
            registry.people.get_org(org)
        sources = registry.sources.list_sources(org)
        counts = registry.sources.item_counts()
    return [source_dict(settings, s, counts.get(s.id, {})) for s in sources]


def source_dict(settings: Settings, source: SourceRecord, counts: Mapping[str, int]) -> SourceView:
    from tasks.sources.state import sync_running

    running = sync_running(settings.home, source.id)
    last = dict(source.last_sync or {})
    if last.get("outcome") == "running" and not running:
        last["outcome"] = "interrupted"  # its process died: the next sync finishes the job
    return SourceView(
        id=source.id,
        org_id=source.org_id,
        name=source.name,
        kind=source.kind,
        config=source.config,
        collection=source.collection,
        status=source.status,
        audience=source.audience,
        include=source.include,
        exclude=source.exclude,
        max_items=source.max_items,
        max_item_bytes=source.max_item_bytes,
        schedule=source.schedule,
        timezone=source.timezone,
        created_by=source.created_by,
        created_at=source.created_at.isoformat(),
        updated_at=source.updated_at.isoformat(),
        last_sync=last or None,
        running=running,
        items=SourceItems(
            present=counts.get("present", 0),
            failed=counts.get("failed", 0),
            gone=counts.get("gone", 0),
        ),
        next_run=next_run(source),
    )


def next_run(source: SourceRecord, now: dt.datetime | None = None) -> str | None:
    """When the source's schedule next fires (ISO, its timezone), or None without one."""
    if not source.schedule:
        return None
    import zoneinfo

    from croniter import croniter

    zone = zoneinfo.ZoneInfo(source.timezone or "UTC")
    start = (now or dt.datetime.now(dt.UTC)).astimezone(zone)
    return str(croniter(source.schedule, start).get_next(dt.datetime).isoformat())


def update_source(
    settings: Settings,
    ref: str,
    org: str | None,
    changes: Mapping[str, Any],
    *,
    actor: str | None,
) -> SourceRecord:
    """Change a source's fields (the config is checked again by its kind)."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        source = resolve(registry, ref, org)
        checked: dict[str, Any] = {}
        if "config" in changes:
            from tasks.sources import kind_module

            checked["config"] = kind_module(source.kind).check_config(
                {**source.config, **dict(changes["config"])}
            )
        common = {k: v for k, v in changes.items() if k != "config"}
        if common:
            checked |= _checked_common(**common)
        if not checked:
            raise ConfigError("nothing to change: give at least one option")
        config = checked.get("config", source.config)
        admin = _authorize_config(settings, registry, actor, f"change source {source.name!r}",
                                  source.org_id, source.kind, config,
                                  check_envs="config" in checked)  # fmt: skip
        return registry.sources.update_source(source.id, checked, actor=admin)


def remove_source(
    settings: Settings, ref: str, org: str | None, *, actor: str | None, withdraw: bool = False
) -> SourceRemoved:
    """Remove a source and its sync state. Its documents stay as they are unless
    ``withdraw``: then each is taken out of service first, audited "removed at source"."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        source = resolve(registry, ref, org)
        admin = authorize_change(registry, actor, f"remove source {source.name!r}", source.org_id)
        from tasks.sources.state import sync_running

        if sync_running(settings.home, source.id):
            raise ConfigError(
                f"a sync of source {source.name!r} is running: wait for it to finish, then "
                "remove the source (nothing was changed)"
            )
        withdrawn = 0
        if withdraw:
            withdrawn = _withdraw_all(settings, registry, source, admin)
        registry.sources.delete_source(source.id, actor=admin)
    return SourceRemoved(
        removed=source.id, name=source.name, org_id=source.org_id, withdrawn=withdrawn
    )


def _withdraw_all(
    settings: Settings, registry: SqlRegistry, source: SourceRecord, admin: str
) -> int:
    from sinks.connect import open_vector_store
    from tasks.sources.state import take_out_item

    note = f"removed at source: source {source.name!r} was removed by {admin}"
    return sum(
        take_out_item(
            registry,
            source,
            key,
            actor=admin,
            note=note,
            open_store=lambda: open_vector_store(settings),
        )
        for key in registry.sources.source_items(source.id)
    )


def resolve_source(settings: Settings, ref: str, org: str | None = None) -> SourceRecord:
    """The source named ``ref`` (in ``org``) or with id ``ref``."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        return resolve(registry, ref, org)


def submit_sync_job(settings: Settings, org: str, source_id: str, *, actor: str) -> JobRecord:
    """Record a PROCESSING job that syncs one source (`kbflow.services.sources.sync.sync`, the
    ``source-sync`` flow) and start it (`kbflow.services.jobs.queue.start_job`); returns at once.
    The job's report is the sync's summary. What the HTTP route starts (no Prefect here)."""
    from kbflow.services.jobs import start_job

    return start_job(settings, org, SOURCE_SYNC_KIND, [source_id], {"actor": actor})
