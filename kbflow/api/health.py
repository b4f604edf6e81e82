"""The health routes: the process is up (``/healthz``), ready to serve (``/readyz``), and what
it has counted (``/metrics``, for Prometheus). No token needed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kbflow.api.auth import ServiceDep
from kbflow.api.schemas import Health, Readiness

router = APIRouter(tags=["health"])

METRICS_MEDIA_TYPE = CONTENT_TYPE_LATEST.partition(";")[0]  # text/plain, with a version


@router.get("/healthz", response_model=Health)
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", response_model=Readiness)
def readyz(service: ServiceDep) -> dict[str, Any]:
    """The registry answers and the vector store is open (else degraded: keyword only);
    ``shared``: this machine's other kbflow processes reach the embedded store through
    this service."""
    service.ctx.registry.list_orgs()
    store = "open" if service.ctx.store is not None else "unavailable"
    return {
        "status": "ready" if store == "open" else "degraded",
        "vector_store": store,
        "shared": service.steward.sharing,
    }


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
    outcomes (answered / refused; yes / maybe / no), the research budget spent."""
    registry = request.app.state.metrics.registry
    return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
