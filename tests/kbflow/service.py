"""`kbflow serve` as a real process over a world of two orgs, for the HTTP tests (the ``served``
and ``served_once`` fixtures of tests/kbflow/conftest.py), and calling it as one of its people."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from core.settings import Settings
from kbflow.api.launch import REPO, launched
from tests import web
from tests.conftest import index_records

TOPIC = "quarterly expense reimbursement rules"
START_TIMEOUT_S = 180
DRAFTS = 6


@contextmanager
def _serving(
    settings: Settings, log: Path, options: dict[str, Any], embedder: Any
) -> Iterator[dict[str, Any]]:
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.registry import SqlRegistry

    options = dict(options)
    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)
    try:
        kw = {"store": store, "registry": registry, "embedder": embedder}
        registry.people.ensure_org("acme")
        registry.people.ensure_org("globex")
        registry.catalog.create_collection("acme", "hr", "People policies.", None)
        registry.catalog.create_collection("acme", "sales", "Sales playbooks.", None)
        docs = {
            name: index_records(
                [{"key": name, "title": f"{TOPIC} ({name})", "text": f"{TOPIC}: {name} copy."}],
                org=org,
                collection=coll,
                **kw,
            )[0]
            for name, org, coll in (
                ("hr", "acme", "hr"),
                ("sales", "acme", "sales"),
                ("globex", "globex", "default"),
            )
        }
        registry.catalog.create_agent("acme", "hr-bot", "answers staff")
        registry.catalog.set_allowed("hr-bot", ["hr"], allow=True)
        registry.catalog.create_agent("acme", "off-bot", "switched off", enabled=False)
        registry.catalog.set_allowed("off-bot", ["hr"], allow=True)
        registry.people.ensure_user("root", _superadmin())
        from core.models import DocStatus, Role

        registry.people.ensure_user("amy", Role.ACCOUNT_MANAGER)
        registry.people.assign_am("acme", "amy")
        registry.people.ensure_user("gus", Role.ACCOUNT_MANAGER)
        registry.people.assign_am("globex", "gus")
        registry.people.ensure_user("eve", Role.EXPERT, org_id="acme")
        drafts = index_records(
            [{"key": f"draft-{i}", "title": f"Draft {i}", "text": f"{TOPIC}: draft {i}."}
             for i in range(options.pop("_drafts", DRAFTS))],
            org="acme", collection="hr", status=DocStatus.PENDING_REVIEW, **kw,
        )  # fmt: skip
        soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
        secrets = {
            "agent": registry.tokens.create_token(
                agent_id="hr-bot", expires_at=None, created_by="root"
            ),
            "off": registry.tokens.create_token(
                agent_id="off-bot", expires_at=None, created_by="root"
            ),
            "user": registry.tokens.create_token(
                user_id="root", expires_at=None, created_by="root"
            ),
            "revoked": registry.tokens.create_token(
                agent_id="hr-bot", expires_at=None, created_by="root"
            ),
            "expired": registry.tokens.create_token(
                agent_id="hr-bot", expires_at=soon, created_by="root"
            ),
            **{
                who: registry.tokens.create_token(user_id=who, expires_at=None, created_by="root")
                for who in ("amy", "gus", "eve")
            },
        }
        registry.tokens.revoke_token(secrets["revoked"][0].id, actor="root")
    finally:
        store.close()
        registry.close()
    with running_service(settings.home, log, options) as base:
        yield {
            "base": base,
            "tokens": {k: v[1] for k, v in secrets.items()},
            "docs": docs,
            "drafts": drafts,
        }


@contextmanager
def running_service(
    home: Path, log: Path, env: dict[str, str], args: tuple[str, ...] = ()
) -> Iterator[str]:
    """``kbflow serve [args]`` on a free loopback port over the data in ``home``, until the
    block ends (ready or degraded); yields its base URL. Its output goes to ``log``."""
    with launched(home, log, env=env, args=args, require_ready=False, wait_s=START_TIMEOUT_S) as s:
        yield s.base


def _superadmin() -> Any:
    from core.models import Role

    return Role.SUPERADMIN


def _call(
    served: dict[str, Any], method: str, path: str, token: str | None = None, **kw: Any
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {served['tokens'][token]}"} if token else {}
    return web.request(method, served["base"] + path, headers=headers, timeout=60, **kw)


def _clean(response: httpx.Response) -> None:
    """No response carries a traceback or a path on the server's disk."""
    assert "Traceback" not in response.text
    assert "/tmp/" not in response.text and str(REPO) not in response.text


LIMITED = {"KBFLOW_API_RATE_BURST": "3", "KBFLOW_API_RATE_PER_MINUTE": "6",
           "KBFLOW_API_MAX_BODY_MB": "0.01", "KBFLOW_API_READ_TIMEOUT_S": "2"}  # fmt: skip
