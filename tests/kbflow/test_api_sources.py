"""`kbflow serve`'s source routes (`kbflow.api.sources`): an org's synced sources added, listed,
shown, changed, removed and synced over HTTP, who may do each (a local folder: a superadmin
only; another org's AM learns nothing, not even whether the org exists; an agent's token is
refused), and what /metrics says of a source after a sync.

The app runs in this process (FastAPI's TestClient, its lifespan included); a sync runs as a
background job in its own process, as under ``kbflow serve``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.models import Role
from core.settings import Settings
from kbflow.api.app import create_app
from sinks.registry import SqlRegistry

pytestmark = pytest.mark.integration

SOURCES = "/v1/admin/orgs/acme/sources"
LEAVE = "# Leave policy\n\nEvery employee gets 25 days of paid annual leave a year.\n"
PARKING = "# Parking\n\nVisitors park in the north car park by the loading bay.\n"
S3 = {"url": "s3://acme-docs/policies"}  # a custom endpoint_url is a superadmin's


@pytest.fixture
def api(settings: Settings, embedder: Any) -> Iterator[dict[str, Any]]:
    """Two orgs, their AMs, acme's expert, a superadmin and an agent, each with a token; then
    the app started on them."""
    registry = SqlRegistry.open(settings.registry_url)
    try:
        registry.people.ensure_user("root", Role.SUPERADMIN, bootstrap=True)
        for org, am in (("acme", "amy"), ("globex", "gus")):
            registry.people.ensure_org(org)
            registry.people.ensure_user(am, Role.ACCOUNT_MANAGER)
            registry.people.assign_am(org, am)
        registry.people.ensure_user("eve", Role.EXPERT, org_id="acme")
        registry.catalog.create_agent("acme", "bot", "answers staff")
        tokens = {
            who: registry.tokens.create_token(user_id=who, expires_at=None, created_by="root")[1]
            for who in ("root", "amy", "gus", "eve")
        }
        tokens["agent"] = registry.tokens.create_token(agent_id="bot", expires_at=None,
                                                created_by="root")[1]  # fmt: skip
    finally:
        registry.close()
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield {"client": client, "tokens": tokens, "settings": settings}


def _call(api: dict[str, Any], method: str, path: str, who: str | None, **kw: Any) -> Any:
    headers = {"Authorization": f"Bearer {api['tokens'][who]}"} if who else {}
    answer = api["client"].request(method, path, headers=headers, **kw)
    assert "Traceback" not in answer.text
    return answer


def _denials(settings: Settings, org: str) -> list[dict[str, Any]]:
    """The refusals audited in ``org``'s rows: what was attempted, by whom."""
    registry = SqlRegistry.open(settings.registry_url)
    try:
        return [
            {"actor": row.actor, **(row.after or {})}
            for row in registry.audit.audit_trail(org)
            if row.action == "kb.access.denied"
        ]
    finally:
        registry.close()


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "leave.md").write_text(LEAVE)
    (folder / "parking.md").write_text(PARKING)
    return folder


def test_an_am_adds_lists_shows_updates_and_removes_a_source(api: dict[str, Any]) -> None:
    body = {"name": "policies", "kind": "filesystem", "config": S3, "collection": "hr",
            "include": ["*.md"], "schedule": "0 6 * * *", "timezone": "Europe/London"}  # fmt: skip
    made = _call(api, "POST", SOURCES, "amy", json=body)
    assert made.status_code == 201, made.text
    source = made.json()
    assert (source["name"], source["org_id"], source["kind"]) == ("policies", "acme", "filesystem")
    assert source["config"] == {"glob": "**/*", **S3}
    assert (source["collection"], source["status"], source["created_by"]) == (
        "hr", "pending_review", "amy"
    )  # fmt: skip
    assert source["last_sync"] is None

    again = _call(api, "POST", SOURCES, "amy", json=body)
    assert again.status_code in (409, 422), again.text

    listed = _call(api, "GET", SOURCES, "eve")  # an expert of the org may look
    assert listed.status_code == 200, listed.text
    assert [s["name"] for s in listed.json()] == ["policies"]
    shown = _call(api, "GET", f"{SOURCES}/policies", "amy").json()
    assert shown["items"] == {"present": 0, "failed": 0, "gone": 0}
    assert shown["running"] is False and shown["next_run"] is not None
    assert _call(api, "GET", f"{SOURCES}/{source['id']}", "amy").json()["id"] == source["id"]
    assert _call(api, "GET", f"{SOURCES}/nope", "amy").status_code == 404

    changed = _call(
        api,
        "PATCH",
        f"{SOURCES}/policies",
        "amy",
        json={"status": "approved", "schedule": "", "config": {"url": "s3://b2/x"}},
    )
    assert changed.status_code == 200, changed.text
    done = changed.json()
    assert (done["status"], done["schedule"], done["config"]["url"]) == ("approved", None,
                                                                         "s3://b2/x")  # fmt: skip
    assert done["config"]["glob"] == "**/*"  # merged, as the CLI does
    assert _call(api, "PATCH", f"{SOURCES}/policies", "amy", json={}).status_code == 422
    bad_cron = _call(api, "PATCH", f"{SOURCES}/policies", "amy", json={"schedule": "daily"})
    assert bad_cron.status_code == 422 and "cron" in bad_cron.json()["detail"]
    for wrong in ({"colour": "red"}, {"max_items": None}, {"status": None}, {"max_items": 0}):
        refused = _call(api, "PATCH", f"{SOURCES}/policies", "amy", json=wrong)
        assert refused.status_code == 422, (wrong, refused.text)

    # an expert may look, not change
    assert _call(api, "PATCH", f"{SOURCES}/policies", "eve",
                 json={"status": "approved"}).status_code == 403  # fmt: skip
    assert _call(api, "DELETE", f"{SOURCES}/policies", "eve").status_code == 403

    removed = _call(api, "DELETE", f"{SOURCES}/policies", "amy", params={"withdraw": "false"})
    assert removed.status_code == 200, removed.text
    assert removed.json() == {"removed": source["id"], "name": "policies", "org_id": "acme",
                              "withdrawn": 0}  # fmt: skip
    assert _call(api, "GET", SOURCES, "amy").json() == []
    assert _call(api, "DELETE", f"{SOURCES}/policies", "amy").status_code == 404


def test_a_local_folder_is_a_superadmins(api: dict[str, Any], tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    body = {"name": "share", "kind": "filesystem", "config": {"url": str(folder)},
            "collection": "hr", "status": "approved"}  # fmt: skip
    refused = _call(api, "POST", SOURCES, "amy", json=body)
    assert refused.status_code == 403, refused.text
    assert "superadmin" in refused.json()["detail"]
    assert _call(api, "GET", SOURCES, "amy").json() == []  # nothing was made
    denied = _denials(api["settings"], "acme")
    assert [(d["actor"], d["attempted"]) for d in denied] == [
        ("amy", "add source 'share' to org 'acme' (a local folder)")
    ]
    made = _call(api, "POST", SOURCES, "root", json=body)
    assert made.status_code == 201, made.text
    assert made.json()["config"]["url"] == folder.resolve().as_uri()
    # pointing an AM's source at a local folder is refused the same way
    _call(api, "POST", SOURCES, "amy", json={"name": "remote", "kind": "filesystem",
                                             "config": S3, "collection": "hr"})  # fmt: skip
    moved = _call(
        api,
        "PATCH",
        f"{SOURCES}/remote",
        "amy",
        json={"config": {"url": str(folder), "endpoint_url": None}},
    )
    assert moved.status_code in (403, 422), moved.text
    assert _call(api, "GET", f"{SOURCES}/remote", "amy").json()["config"]["url"] == S3["url"]


def test_another_org_and_agents_learn_nothing(api: dict[str, Any]) -> None:
    body = {"name": "policies", "kind": "filesystem", "config": S3, "collection": "hr"}
    assert _call(api, "POST", SOURCES, "amy", json=body).status_code == 201
    for method, path, kw in (
        ("GET", SOURCES, {}),
        ("GET", f"{SOURCES}/policies", {}),
        ("POST", SOURCES, {"json": {**body, "name": "mine"}}),
        ("PATCH", f"{SOURCES}/policies", {"json": {"status": "approved"}}),
        ("DELETE", f"{SOURCES}/policies", {}),
        ("POST", f"{SOURCES}/policies/sync", {}),
    ):
        # globex's AM: refused as for an org that does not exist
        theirs = _call(api, method, path, "gus", **kw)
        ghost = _call(api, method, path.replace("/acme/", "/no-such-org/"), "gus", **kw)
        assert (theirs.status_code, ghost.status_code) == (403, 403), (method, path)
        assert theirs.json()["detail"].replace("acme", "X") == ghost.json()["detail"].replace(
            "no-such-org", "X"
        ), (method, path)
        assert "amy" not in theirs.text
        # an agent's token reaches no admin route; no token is a 401
        agent = _call(api, method, path, "agent", **kw)
        assert agent.status_code == 403 and "agent" in agent.json()["detail"], (method, path)
        assert _call(api, method, path, None, **kw).status_code == 401
    # a superadmin is told what does not exist
    assert _call(api, "GET", "/v1/admin/orgs/no-such-org/sources", "root").status_code == 404
    assert _call(api, "GET", SOURCES, "root").json()[0]["name"] == "policies"
    # credentials in a config are refused and never echoed back
    secret = "s3cr3t-Pa55word"
    leaky = _call(
        api,
        "POST",
        SOURCES,
        "amy",
        json={**body, "name": "leaky", "config": {"url": f"s3://AKIAEXAMPLE:{secret}@bucket/x"}},
    )
    assert leaky.status_code == 422 and secret not in leaky.text and "AKIAEXAMPLE" not in leaky.text
    odd = _call(
        api,
        "POST",
        SOURCES,
        "amy",
        json={**body, "name": "odd", "config": {**S3, "endpoint_url": f"ftp://me:{secret}@minio"}},
    )
    assert odd.status_code == 422 and secret not in odd.text, odd.text
    bad = _call(api, "POST", SOURCES, "amy", json={**body, "name": "bad", "max_items": 0,
                                                   "token": secret})  # fmt: skip
    assert bad.status_code == 422 and secret not in bad.text


def _job(api: dict[str, Any], accepted: Any, who: str = "amy") -> dict[str, Any]:
    """The sync job's status once it is no longer PROCESSING."""
    assert accepted.status_code == 202, accepted.text
    location = accepted.headers["location"]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        job: dict[str, Any] = _call(api, "GET", location, who).json()
        if job["status"] != "PROCESSING":
            return job
        time.sleep(0.5)
    raise AssertionError(f"sync job still PROCESSING: {job}")


def test_a_sync_over_http_runs_as_a_job_and_metrics_show_it(
    api: dict[str, Any], tmp_path: Path, prefect_harness: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import get_current_settings

    from kbflow.services.sources.definitions import resolve_source
    from tasks.sources.state import sync_lock

    # The job's process reports to the harness's Prefect server rather than starting its own.
    monkeypatch.setenv("PREFECT_API_URL", str(get_current_settings().api.url))
    folder = _folder(tmp_path)
    body = {"name": "share", "kind": "filesystem", "config": {"url": str(folder)},
            "collection": "hr", "status": "approved"}  # fmt: skip
    assert _call(api, "POST", SOURCES, "root", json=body).status_code == 201
    started = _call(api, "POST", f"{SOURCES}/share/sync", "amy")  # the org's AM may sync it
    assert started.json()["kind"] == "source-sync"
    job = _job(api, started)
    assert job["status"] == "COMPLETE" and job["error"] is None, job
    summary = job["result"]
    assert summary["outcome"] == "ok" and summary["complete"] is True
    assert summary["counts"] | {"new": 2, "failed": 0, "listed": 2} == summary["counts"]
    assert str(api["settings"].home.resolve()) not in json.dumps(job)  # no server path

    shown = _call(api, "GET", f"{SOURCES}/share", "eve").json()
    assert shown["items"] == {"present": 2, "failed": 0, "gone": 0}
    assert shown["last_sync"]["counts"] == summary["counts"]

    # a second sync while one runs: 409, and no job
    settings = api["settings"]
    source = resolve_source(settings, "share", "acme")
    with sync_lock(settings.home, source):
        busy = _call(api, "POST", f"{SOURCES}/share/sync", "amy")
    assert busy.status_code == 409 and "running already" in busy.json()["detail"]

    metrics = _call(api, "GET", "/metrics", None).text
    labels = 'org="acme",source="share"'
    assert f'kbflow_source_items{{{labels},state="present"}} 2.0' in metrics
    assert f'kbflow_source_items{{{labels},state="failed"}} 0.0' in metrics
    assert f"kbflow_source_last_sync_success{{{labels}}} 1.0" in metrics
    assert f"kbflow_source_last_sync_failed_items{{{labels}}} 0.0" in metrics
    stamp = re.search(rf"^kbflow_source_last_sync_timestamp_seconds\{{{labels}\}} (\S+)$",
                      metrics, re.M)  # fmt: skip
    assert stamp is not None and float(stamp.group(1)) > 1.7e9

    # every item gone at once looks like a source misconfigured: nothing withdrawn, the job
    # FAILED with the reason
    for item in folder.iterdir():
        item.unlink()
    failed = _job(api, _call(api, "POST", f"{SOURCES}/share/sync", "amy"))
    assert failed["status"] == "FAILED" and "listed no items" in failed["error"], failed
    assert _call(api, "GET", f"{SOURCES}/share", "amy").json()["items"]["present"] == 2


def test_the_source_gauges_cap_their_labels_and_say_each_outcome() -> None:
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest

    from kbflow.api import gauges

    def source(org: str, name: str, outcome: str | None, failed: int = 0) -> Any:
        """A source whose last sync ended with ``outcome`` ("running": one runs, none ended)."""
        last: dict[str, Any] | None = None
        if outcome is not None:
            last = {"started_at": "2026-01-01T00:00:00+00:00", "outcome": outcome}
        if outcome not in (None, "running"):
            assert last is not None
            last |= {"finished_at": "2026-01-01T00:00:00+00:00", "counts": {"failed": failed}}
        return SimpleNamespace(id=f"{org}-{name}", org_id=org, name=name, last_sync=last)

    again = source("acme", "again", "running")  # runs now; its previous sync was partial
    again.last_sync["previous"] = source("acme", "again", "partial", 2).last_sync
    listed = [source("acme", "ok", "ok"), source("acme", "some", "partial", 3),
              source("acme", "never", None), source("acme", "now", "running"), again,
              *(source("zeta", f"s{i}", "ok") for i in range(gauges.LABEL_CAP - 1))]  # fmt: skip
    counts = {"acme-ok": {"present": 4, "gone": 1}, "zeta-s98": {"present": 2}}
    registry = CollectorRegistry()
    registry.register(gauges.Sources(lambda: listed, lambda: counts))
    text = generate_latest(registry).decode()
    assert 'kbflow_source_items{org="acme",source="ok",state="present"} 4.0' in text
    assert 'kbflow_source_items{org="acme",source="ok",state="gone"} 1.0' in text
    assert 'kbflow_source_last_sync_success{org="acme",source="ok"} 1.0' in text
    assert 'kbflow_source_last_sync_success{org="acme",source="some"} 0.0' in text
    assert 'kbflow_source_last_sync_failed_items{org="acme",source="some"} 3.0' in text
    # a sync running: the previous one's figures stay
    assert 'kbflow_source_last_sync_failed_items{org="acme",source="again"} 2.0' in text
    assert 'kbflow_source_last_sync_success{org="acme",source="again"} 0.0' in text
    stamp = re.search(r'^kbflow_source_last_sync_timestamp_seconds\{org="acme",source="ok"\} '
                      r"(\S+)$", text, re.M)  # fmt: skip
    assert stamp is not None and float(stamp.group(1)) == 1_767_225_600
    for unfinished in ("never", "now"):  # items, but no last sync
        assert (
            f'kbflow_source_items{{org="acme",source="{unfinished}",state="present"}} 0.0' in text
        )
        assert f'source="{unfinished}"}}' not in text
    # past the cap: counted together
    assert 'kbflow_source_items{org="_other",source="_other",state="present"} 2.0' in text
    assert (
        len(re.findall(r"^kbflow_source_last_sync_success\{", text, re.M))
        == gauges.LABEL_CAP + 1 - 2
    )


def test_a_source_answers_as_its_record() -> None:
    """`SourceOut` is built from the registry's record (issue 43), field for field, and its JSON
    is the record's own (`SourceRecord.to_dict`, the CLI's ``--json``), key for key."""
    import dataclasses
    import datetime as dt

    from kbflow.api.sources import SourceOut
    from sinks.registry import SourceRecord

    at = dt.datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=dt.UTC)
    record = SourceRecord(
        id="src-1", org_id="acme", name="policies", kind="filesystem", config={"url": "s3://x"},
        collection="hr", status="approved", audience=None, include=["*.md"], exclude=[],
        max_items=10, max_item_bytes=100, schedule="0 6 * * *", timezone=None, created_by="amy",
        created_at=at, updated_at=at + dt.timedelta(hours=1),
        last_sync={"outcome": "ok", "counts": {"present": 1}},
    )  # fmt: skip
    assert list(SourceOut.model_fields) == [f.name for f in dataclasses.fields(record)]
    answered = SourceOut.of(record).model_dump(mode="json")
    assert json.dumps(answered) == json.dumps(record.to_dict())
