"""The health routes: the process is up (``/healthz``), ready to serve (``/readyz``), and what
it has counted (``/metrics``, for Prometheus). No token needed."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core.settings import Settings
from kbflow.api.auth import ServiceDep
from kbflow.api.metrics import Metrics
from kbflow.api.schemas import Health, Readiness
from kbflow.services.backup.backups import BACKUPS_DIR, latest_backup
from kbflow.services.query.context import OpenHome

router = APIRouter(tags=["health"])

METRICS_MEDIA_TYPE = CONTENT_TYPE_LATEST.partition(";")[0]  # text/plain, with a version


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness)
def readyz(service: ServiceDep) -> Readiness:
    """The registry answers and the vector store is open (else degraded: keyword only);
    ``shared``: this machine's other kbflow processes reach the embedded store through
    this service."""
    service.ctx.registry.people.list_orgs()
    store: Literal["open", "unavailable"] = (
        "open" if service.ctx.store is not None else "unavailable"
    )
    return Readiness(
        status="ready" if store == "open" else "degraded",
        vector_store=store,
        shared=service.steward.sharing,
    )


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {
            "description": f"Prometheus' text format ({CONTENT_TYPE_LATEST}).",
            "content": {METRICS_MEDIA_TYPE: {"schema": {"type": "string"}}},
        }
    },
)
def prometheus(request: Request) -> PlainTextResponse:
    """Prometheus metrics: request latency by route, refusals, degraded searches, agent
    outcomes (answered / refused; yes / maybe / no), requests by org and by agent, MCP tool
    calls, the review backlog, the store's size, the research budget spent."""
    registry = request.app.state.metrics.registry
    return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def watch_knowledge(metrics: Metrics, ctx: OpenHome, settings: Settings) -> None:
    """Export the review backlog (from the registry), each org's points in the vector store
    (its exact count, with the org's filter), the embedded store's bytes on disk and the age of
    the newest backup in ``<home>/backups``."""

    def points() -> dict[str, int]:
        store = ctx.store  # None while the service runs degraded; the steward may open it later
        if store is None:
            return {}
        return {org.id: store.count(org.id) for org in ctx.registry.people.list_orgs()}

    def disk_bytes() -> int | None:
        return None if settings.stores.qdrant_url else folder_bytes(settings.vectors_dir)

    def backup_at() -> dt.datetime | None:
        newest = latest_backup(settings.home / BACKUPS_DIR)
        return None if newest is None else dt.datetime.fromisoformat(newest[1]["created_at"])

    metrics.watch_knowledge(ctx.registry.documents.review_backlog, points, disk_bytes, backup_at)


def folder_bytes(folder: Path) -> int:
    """The size of the files under ``folder`` (0 when it does not exist); links not followed."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:  # the store removed a segment meanwhile
                continue
    return total
