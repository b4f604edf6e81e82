"""The review inbox (`kbflow serve`, /review) over HTTP as a browser speaks it: logins, sessions,
CSRF, who may see and decide what, and each refusal leaving everything as it was.

One `kbflow serve` serves the module (a real process on a loopback port, SQLite and Qdrant
Edge in its own home); each test logs in afresh. The drafts are shaped like research drafts:
several list items, a table, citations, and a hostile one.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from core.models import AuditAction, DocStatus, JobStatus, Role
from core.settings import Settings
from kbflow.api.launch import launched
from sinks.registry import SqlRegistry
from sinks.registry.schema import WebSessionRow, utcnow
from tests import web
from tests.conftest import index_records

pytestmark = pytest.mark.integration

PASSWORDS = {  # none may contain its user id, be short or common (sinks/registry/passwords.py)
    "amy": "likes-long-kestrel-phrases",
    "gus": "has-another-org-in-wren-9",
    "ed": "is-an-engineer-of-gears-77",
    "lou": "will-be-locked-by-guesses-1",
    "root": "of-all-the-lantern-keepers-42",
}
DRAFT = """## Who we are

Larkspur Cycles builds city bikes in Leeds [doc:{seed}].

## How we write

- Write plainly and warmly.
- Prefer short sentences.
- Never promise delivery dates.

## Prices

| Model | Price | Warranty |
|---|---|---|
| Wren | 899 EUR | 5 years |
| Kestrel | 2,400 EUR | 5 years |

See the [press page](https://larkspur.example/press) [url:https://larkspur.example/about].
"""
FOOTER = """
---
## Citations
- [doc:{seed}] Larkspur brief
- [url:https://larkspur.example/about] About Larkspur
"""
NOTED = DRAFT + FOOTER
HOSTILE = (
    "Hostile <script>alert(1)</script> text <img src=x onerror=alert(2)>.\n\n"
    "[click](javascript:alert(3)) ![pic](http://evil.example/x.png)\n"
)


@pytest.fixture(scope="module")
def inbox(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Iterator[dict[str, Any]]:
    from sinks.qdrant_edge import QdrantEdgeStore

    home = tmp_path_factory.mktemp("inbox") / "home"
    settings = Settings(home=home)
    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=5)
    try:
        for org in ("larkspur", "globex"):
            registry.people.ensure_org(org)
        registry.people.ensure_user("root", Role.SUPERADMIN)
        registry.people.ensure_user("amy", Role.ACCOUNT_MANAGER)
        registry.people.ensure_user("gus", Role.ACCOUNT_MANAGER)
        registry.people.ensure_user("lou", Role.ACCOUNT_MANAGER)
        registry.people.ensure_user("ed", Role.ENGINEER, org_id="larkspur")
        registry.people.assign_am("larkspur", "amy")
        registry.people.assign_am("globex", "gus")
        for user, password in PASSWORDS.items():
            registry.logins.set_password(user, password, actor="root")
        kw = {"store": store, "registry": registry, "embedder": embedder}
        (seed,) = index_records(
            [{"key": "brief", "title": "Larkspur brief", "text": "Larkspur is in Leeds."}],
            org="larkspur", **kw,
        )  # fmt: skip
        drafts = index_records(
            [
                {"key": f"draft-{i}", "title": f"Brand voice {i}", "text": DRAFT.format(seed=seed)}
                for i in range(6)
            ]
            + [{"key": "hostile", "title": "Hostile page", "text": HOSTILE}],
            org="larkspur", status=DocStatus.PENDING_REVIEW, **kw,
        )  # fmt: skip
        (noted,) = index_records(
            [{"key": "noted", "title": "Brand voice noted", "markdown": True,
              "text": f"# Brand voice noted\n\n{NOTED.format(seed=seed)}",
              "review_note": "Evidence pack, assembled without a model: Edit before approving."}],
            org="larkspur", status=DocStatus.PENDING_REVIEW, **kw,
        )  # fmt: skip
        (other,) = index_records(
            [{"key": "g", "title": "Globex draft", "text": "Globex sells widgets."}],
            org="globex", status=DocStatus.PENDING_REVIEW, **kw,
        )  # fmt: skip
        library = _library_documents(registry, store, embedder)
        agent_token = registry.tokens.create_token(
            agent_id=registry.catalog.create_agent("larkspur", "bot").id, expires_at=None,
            created_by="root",
        )[1]  # fmt: skip
        user_token = registry.tokens.create_token(
            user_id="amy", expires_at=None, created_by="root"
        )[1]
    finally:
        store.close()
        registry.close()
    env = {"KBFLOW_LOGIN_MAX_FAILURES": "3", "KBFLOW_LOGIN_LOCK_S": "600"}
    # every test here logs in from 127.0.0.1: the per-client and global rates are for floods
    for rate in ("CLIENT_PER_MINUTE", "CLIENT_BURST", "GLOBAL_PER_MINUTE", "GLOBAL_BURST"):
        env[f"KBFLOW_LOGIN_{rate}"] = "10000"
    log = home.parent / "serve.log"
    with launched(home, log, env=env, require_ready=False) as served:
        yield {
            "base": served.base,
            "settings": settings,
            "seed": seed,
            "drafts": drafts,
            "noted": noted,
            "other": other,
            "library": library,
            "agent_token": agent_token,
            "user_token": user_token,
        }


BULK = 55  # more than one library page (`LIBRARY_PAGE`, 50)


def _library_documents(registry: SqlRegistry, store: Any, embedder: Any) -> dict[str, Any]:
    """What larkspur serves under ``lib/``: policies, a synced price list, a page of bulk notes,
    a seed input (never listed) and a draft (listed in the inbox, not the library)."""
    kw = {"store": store, "registry": registry, "embedder": embedder, "org": "larkspur"}
    travel, leave = index_records(
        [{"key": "travel", "title": "Travel policy", "text": "Claims within 30 days."},
         {"key": "leave", "title": "Leave policy", "text": "Twenty-five days of leave."}],
        collection="lib/handbook", **kw,
    )  # fmt: skip
    (prices,) = index_records(
        [{"key": "prices", "title": "Price list 2027", "text": "| Wren | 899 EUR |"}],
        collection="lib/pricing", source_tag="source:crm", **kw,
    )  # fmt: skip
    bulk = index_records(
        [{"key": f"note-{i:02d}", "title": f"Shop note {i:02d}", "text": f"Note {i}."}
         for i in range(BULK)],
        collection="lib/notes", **kw,
    )  # fmt: skip
    (seed,) = index_records(
        [{"key": "lib-seed", "title": "Seeded brief", "text": "A seed input."}],
        collection="lib/handbook", source_tag="am_file", **kw,
    )  # fmt: skip
    (draft,) = index_records(
        [{"key": "lib-draft", "title": "Draft policy", "text": "Not decided yet."}],
        collection="lib/handbook", status=DocStatus.PENDING_REVIEW, **kw,
    )  # fmt: skip
    return {"travel": travel, "leave": leave, "prices": prices, "bulk": bulk, "seed": seed,
            "draft": draft}  # fmt: skip


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:2000]
    return found.group(1)


def browser(inbox: dict[str, Any]) -> httpx.Client:
    return web.client(base_url=inbox["base"], follow_redirects=False, timeout=60)


def login(inbox: dict[str, Any], user: str, password: str | None = None) -> httpx.Client:
    client = browser(inbox)
    page = client.get("/review/login")
    answer = client.post(
        "/review/login",
        data={"user": user, "password": password or PASSWORDS[user], "csrf": _csrf(page.text)},
    )
    assert answer.status_code == 303, answer.text
    return client


def status(inbox: dict[str, Any], doc_id: str) -> str | None:
    registry = SqlRegistry.open(inbox["settings"].registry_url)
    try:
        return registry.documents.get_document(doc_id).status
    finally:
        registry.close()


def audit(inbox: dict[str, Any], org: str | None) -> list[Any]:
    registry = SqlRegistry.open(inbox["settings"].registry_url)
    try:
        return registry.audit.audit_trail(org)
    finally:
        registry.close()


def test_a_wrong_password_is_refused_and_the_limit_locks_the_login(inbox: dict[str, Any]) -> None:
    client = browser(inbox)
    for attempt in range(3):
        page = client.get("/review/login")
        answer = client.post(
            "/review/login",
            data={"user": "lou", "password": f"not lou's password {attempt}",
                  "csrf": _csrf(page.text)},
        )  # fmt: skip
        assert answer.status_code == 401
        assert "kbflow_session" not in answer.headers.get("set-cookie", "")
    page = client.get("/review/login")
    locked = client.post(
        "/review/login",
        data={"user": "lou", "password": PASSWORDS["lou"], "csrf": _csrf(page.text)},
    )
    assert locked.status_code == 401 and "too many failed logins" in locked.text
    rows = [r.action for r in audit(inbox, None) if r.actor == "lou"]
    assert rows.count(AuditAction.LOGIN_FAILED.value) >= 3
    assert AuditAction.LOGIN_LOCKED.value in rows


def test_the_session_cookie_and_logout(inbox: dict[str, Any]) -> None:
    client = browser(inbox)
    page = client.get("/review/login")
    answer = client.post(
        "/review/login",
        data={"user": "amy", "password": PASSWORDS["amy"], "csrf": _csrf(page.text)},
        headers={"X-Forwarded-Proto": "https"},  # a TLS proxy on this machine
    )
    cookie = answer.headers["set-cookie"]
    assert "kbflow_session=" in cookie and "HttpOnly" in cookie and "Path=/review" in cookie
    assert "SameSite=strict" in cookie and "Secure" in cookie
    assert client.get("/review").status_code == 303  # a Secure cookie is not sent over http
    client = login(inbox, "amy")  # over plain http on loopback: not Secure, so it is sent
    assert client.get("/review").status_code == 200
    stolen = dict(client.cookies)
    home = client.get("/review")
    assert client.post("/review/logout", data={"csrf": _csrf(home.text)}).status_code == 303
    replay = browser(inbox)
    replay.cookies.update(stolen)  # the old cookie, after logout: dead on the server
    assert replay.get("/review").headers["location"].startswith("/review/login")
    draft = inbox["drafts"][1]
    refused = replay.post(f"/review/drafts/{draft}/approve", data={"csrf": "x"})
    assert refused.status_code == 401 and status(inbox, draft) == "pending_review"


def test_an_expired_session_is_sent_to_log_in_and_changes_nothing(inbox: dict[str, Any]) -> None:
    client = login(inbox, "amy")
    page = client.get(f"/review/drafts/{inbox['drafts'][1]}")
    csrf = _csrf(page.text)
    registry = SqlRegistry.open(inbox["settings"].registry_url)
    try:
        with registry.session() as s, s.begin():
            s.execute(update(WebSessionRow).where(WebSessionRow.user_id == "amy")
                      .values(expires_at=utcnow()))  # fmt: skip
    finally:
        registry.close()
    assert "/review/login" in client.get("/review").headers["location"]
    refused = client.post(f"/review/drafts/{inbox['drafts'][1]}/approve", data={"csrf": csrf})
    assert refused.status_code == 401
    assert status(inbox, inbox["drafts"][1]) == "pending_review"


def test_a_post_without_the_csrf_token_or_from_another_origin_changes_nothing(
    inbox: dict[str, Any],
) -> None:
    client = login(inbox, "amy")
    draft = inbox["drafts"][2]
    csrf = _csrf(client.get(f"/review/drafts/{draft}").text)
    assert client.post(f"/review/drafts/{draft}/approve", data={}).status_code == 403
    assert (
        client.post(f"/review/drafts/{draft}/approve", data={"csrf": "forged"}).status_code == 403
    )
    evil = client.post(
        f"/review/drafts/{draft}/approve",
        data={"csrf": csrf},
        headers={"Origin": "https://evil.example"},
    )
    assert evil.status_code == 403
    assert status(inbox, draft) == "pending_review"
    # The login form wants its own cookie's token too (no login CSRF).
    bare = browser(inbox).post("/review/login", data={"user": "amy", "password": "x", "csrf": "y"})
    assert bare.status_code == 403


def test_other_orgs_engineers_and_tokens_are_refused(inbox: dict[str, Any]) -> None:
    draft = inbox["drafts"][3]
    gus = login(inbox, "gus")
    listing = gus.get("/review").text
    assert draft not in listing and inbox["other"] in listing  # his org only
    assert gus.get(f"/review/drafts/{draft}").status_code == 403
    csrf = _csrf(listing)
    refused = gus.post(f"/review/drafts/{draft}/approve", data={"csrf": csrf})
    assert refused.status_code == 403 and status(inbox, draft) == "pending_review"
    denied = [r for r in audit(inbox, "larkspur") if r.action == AuditAction.DENIED.value]
    assert any(r.actor == "gus" for r in denied)

    ed = login(inbox, "ed")
    assert ed.get("/review").status_code == 403
    for token in (inbox["agent_token"], inbox["user_token"]):
        answer = browser(inbox).get("/review", headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 403 and "Not for tokens" in answer.text


def test_a_draft_page_shows_lists_tables_and_sources_and_nothing_hostile_runs(
    inbox: dict[str, Any],
) -> None:
    client = login(inbox, "amy")
    page = client.get(f"/review/drafts/{inbox['drafts'][0]}")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp  # no script allowed
    body = page.text.split('<div class="draft">', 1)[1].split("</div>", 1)[0]
    assert body.count("<li>") == 3
    assert "<td>Kestrel</td>" in body and "<td>2,400 EUR</td>" in body
    assert "<th>Warranty</th>" in body
    assert f'href="/review/documents/{inbox["seed"]}"' in body  # a citation, as a link
    assert re.search(r">Larkspur brief[^<]*</a>", body)  # titled, not a 32-hex id
    assert 'href="https://larkspur.example/about"' in body
    hostile = client.get(f"/review/drafts/{inbox['drafts'][-1]}").text
    shown = hostile.split('<div class="draft">', 1)[1].split("</div>", 1)[0]
    assert "<script" not in shown and "<img" not in shown
    assert not re.search(r"href=\"\s*javascript:", shown, re.IGNORECASE)  # inert text only
    assert not re.search(r"<[^>]*\son\w+=", shown)  # no tag with an event handler
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown  # shown as text


def test_decisions_from_the_inbox_apply_as_the_logged_in_user(inbox: dict[str, Any]) -> None:
    client = login(inbox, "amy")
    approve, edit, reject = inbox["drafts"][3], inbox["drafts"][4], inbox["drafts"][5]
    page = client.get(f"/review/drafts/{approve}")
    csrf = _csrf(page.text)
    done = client.post(f"/review/drafts/{approve}/approve", data={"csrf": csrf, "note": "ok"})
    assert done.status_code == 303 and status(inbox, approve) == "approved"
    again = client.post(f"/review/drafts/{approve}/reject", data={"csrf": csrf, "note": "late"})
    assert again.status_code == 409 and status(inbox, approve) == "approved"  # decided already
    no_note = client.post(f"/review/drafts/{reject}/reject", data={"csrf": csrf})
    assert no_note.status_code == 400 and status(inbox, reject) == "pending_review"
    assert (
        client.post(
            f"/review/drafts/{reject}/reject", data={"csrf": csrf, "note": "off brand"}
        ).status_code
        == 303
    )
    text = client.get(f"/review/drafts/{edit}").text
    assert 'rows="' in text and "<textarea" in text
    new = DRAFT.format(seed=inbox["seed"]).replace("Prefer short sentences.", "Keep it brief.")
    preview = client.post(f"/review/drafts/{edit}/preview", data={"csrf": csrf, "content": new})
    assert '<span class="d-add">+ - Keep it brief.' in preview.text
    assert '<span class="d-del">- - Prefer short sentences.' in preview.text
    edited = client.post(f"/review/drafts/{edit}/edit", data={"csrf": csrf, "content": new})
    assert edited.status_code == 303 and status(inbox, edit) == "approved"
    actors = {
        (r.action, r.doc_id): r.actor
        for r in audit(inbox, "larkspur")
        if r.doc_id in (approve, edit, reject) and r.action != AuditAction.CREATED.value
    }
    assert actors == {
        (AuditAction.APPROVED.value, approve): "amy",
        (AuditAction.EDITED_APPROVED.value, edit): "amy",
        (AuditAction.REJECTED.value, reject): "amy",
    }


def test_a_temporary_password_must_be_changed_at_first_login(inbox: dict[str, Any]) -> None:
    from kbflow.services.review.inbox import set_password

    temporary = set_password(inbox["settings"], "gus", None, temporary=True, actor="root")
    assert temporary
    client = login(inbox, "gus", temporary)
    assert client.get("/review").headers["location"] == "/review/password"
    page = client.get("/review/password")
    assert "Choose a new password" in page.text
    changed = client.post(
        "/review/password",
        data={"csrf": _csrf(page.text), "current": temporary, "new": PASSWORDS["gus"],
              "again": PASSWORDS["gus"]},
    )  # fmt: skip
    assert changed.status_code == 303
    assert client.get("/review").status_code == 200


def test_set_password_needs_a_superadmin_or_the_user(tmp_path: Path) -> None:
    from core.errors import Forbidden
    from kbflow.services.review.inbox import set_password

    settings = Settings(home=tmp_path / "home")
    registry = SqlRegistry.open(settings.registry_url)
    registry.people.ensure_org("acme")
    registry.people.ensure_user("root", Role.SUPERADMIN)
    registry.people.ensure_user("amy", Role.ACCOUNT_MANAGER)
    registry.people.ensure_user("gus", Role.ACCOUNT_MANAGER)
    registry.close()
    with pytest.raises(Forbidden):
        set_password(settings, "amy", "a password by gus", temporary=False, actor="gus")
    with pytest.raises(Forbidden):
        set_password(settings, "amy", "a password by nobody", temporary=False, actor=None)
    set_password(settings, "amy", "she sets her own now", temporary=False, actor="amy")
    registry = SqlRegistry.open(settings.registry_url)
    try:
        assert registry.logins.login_state("amy").has_password
        denied = [
            r for r in registry.audit.audit_trail(None) if r.action == AuditAction.DENIED.value
        ]
        assert len(denied) == 2
    finally:
        registry.close()


def test_the_inbox_gives_a_review_code_for_the_users_own_orgs_only(inbox: dict[str, Any]) -> None:
    client = login(inbox, "amy")
    csrf = _csrf(client.get("/review").text)
    page = client.post("/review/codes", data={"csrf": csrf, "org": "larkspur"})
    assert page.status_code == 200
    code = re.search(r"\b([A-Z2-9]{4}-[A-Z2-9]{4}-[A-Z2-9]{4})\b", page.text)
    assert code, page.text
    registry = SqlRegistry.open(inbox["settings"].registry_url)
    try:
        assert (
            registry.logins.redeem_review_code(code.group(1), org_id="larkspur", flow_run_id="r")
            == "amy"
        )
    finally:
        registry.close()
    assert client.post("/review/codes", data={"csrf": csrf, "org": "globex"}).status_code == 403


def _seen(html: str) -> str:
    found = re.search(r'name="seen" value="([^"]+)"', html)
    assert found, html[:2000]
    return found.group(1)


def test_a_stale_edit_after_someone_approved_is_a_conflict(inbox: dict[str, Any]) -> None:
    """Issue 41 #12: amy opens a draft; root approves it meanwhile; amy's edit, made on the page
    she saw, is refused with 409 and makes no version 2 (on ad21d18 it became v2, superseding
    the approval she never saw)."""
    draft = inbox["drafts"][1]
    amy, root = login(inbox, "amy"), login(inbox, "root")
    page = amy.get(f"/review/drafts/{draft}")
    seen, csrf = _seen(page.text), _csrf(page.text)
    assert seen == "1:pending_review"
    theirs = root.get(f"/review/drafts/{draft}")
    approved = root.post(f"/review/drafts/{draft}/approve",
                         data={"csrf": _csrf(theirs.text), "seen": _seen(theirs.text)})  # fmt: skip
    assert approved.status_code == 303 and status(inbox, draft) == "approved"
    new = DRAFT.format(seed=inbox["seed"]).replace("Prefer short sentences.", "Stale words.")
    stale = amy.post(f"/review/drafts/{draft}/edit",
                     data={"csrf": csrf, "content": new, "seen": seen})  # fmt: skip
    assert stale.status_code == 409 and "changed since you opened it" in stale.text
    registry = SqlRegistry.open(inbox["settings"].registry_url)
    try:
        key = registry.documents.get_document(draft).source_key
        versions = [d for d in registry.documents.list_documents("larkspur") if d.source_key == key]
    finally:
        registry.close()
    assert [(d.version, d.status) for d in versions] == [(1, "approved")]


def _titles(html: str) -> list[str]:
    return re.findall(r'<a href="/review/documents/[0-9a-f-]+">([^<]+)</a>', html)


def test_the_library_lists_what_an_org_serves_with_filters_and_pages(
    inbox: dict[str, Any],
) -> None:
    """Issue 44: approved documents no longer vanish once decided. The library lists what an
    org serves or has withdrawn (never a seed input, never a draft), filtered by collection,
    status, source and title, 50 to a page; another org's AM and an engineer are refused."""
    amy = login(inbox, "amy")
    page = amy.get("/review/library", params={"org": "larkspur", "collection": "lib/handbook"})
    assert page.status_code == 200, page.text[:2000]
    assert _titles(page.text) == ["Leave policy", "Travel policy"]  # by title; no seed, no draft
    assert "2 documents" in page.text
    synced = amy.get("/review/library", params={"org": "larkspur", "source": "source:crm"})
    assert _titles(synced.text) == ["Price list 2027"] and "sync: crm" in synced.text
    found = amy.get("/review/library", params={"org": "larkspur", "q": "  PRICE  list "})
    assert _titles(found.text) == ["Price list 2027"]
    none = amy.get("/review/library", params={"org": "larkspur", "q": "100%_"})
    assert "No document matches." in none.text  # % and _ are letters, not wildcards
    first = amy.get("/review/library", params={"org": "larkspur", "collection": "lib/notes"})
    assert f"{BULK} documents" in first.text and "page 1 of 2" in first.text
    assert _titles(first.text) == [f"Shop note {i:02d}" for i in range(50)]
    second = amy.get("/review/library", params={"org": "larkspur", "collection": "lib/notes",
                                                 "page": 2})  # fmt: skip
    assert _titles(second.text) == [f"Shop note {i:02d}" for i in range(50, BULK)]
    assert (
        'href="/review/library?org=larkspur&amp;collection=lib%2Fnotes&amp;page=1">Previous'
        in second.text
    )
    bad = amy.get("/review/library", params={"org": "larkspur", "status": "gone"})
    assert bad.status_code == 400 and "served, withdrawn" in bad.text
    gus = login(inbox, "gus").get("/review/library", params={"org": "larkspur"})
    assert gus.status_code == 403 and "Leave policy" not in gus.text
    assert login(inbox, "ed").get("/review/library").status_code == 403
    assert browser(inbox).get("/review/library").status_code == 303  # to the login page


def test_a_restored_document_leaves_the_withdrawn_list_and_a_second_restore_says_so(
    inbox: dict[str, Any],
) -> None:
    """Issue 44: after a restore the old version sat under "Withdrawn documents" and pressing
    Restore again said "Someone decided first" (it was her) with no way to the new version."""
    leave = inbox["library"]["leave"]
    amy = login(inbox, "amy")
    page = amy.get(f"/review/documents/{leave}")
    csrf = _csrf(page.text)
    out = amy.post(f"/review/drafts/{leave}/withdraw",
                   data={"csrf": csrf, "note": "outdated", "seen": _seen(page.text)})  # fmt: skip
    assert out.status_code == 303 and status(inbox, leave) == "withdrawn"
    assert f"/review/drafts/{leave}" in amy.get("/review").text.split("Withdrawn documents")[1]
    shown = amy.get("/review/library", params={"org": "larkspur", "status": "withdrawn",
                                               "collection": "lib"})  # fmt: skip
    assert _titles(shown.text) == ["Leave policy"]
    old = amy.get(f"/review/documents/{leave}")
    restore = {"csrf": csrf, "note": "still right", "seen": _seen(old.text)}
    back = amy.post(f"/review/drafts/{leave}/restore", data=restore)
    assert back.status_code == 303
    new = back.headers["location"].split("/review/drafts/")[1].split("?")[0]
    assert new != leave and status(inbox, new) == "approved"
    assert leave not in amy.get("/review").text  # not offered for a second restore
    listed = amy.get("/review/library", params={"org": "larkspur", "collection": "lib/handbook"})
    assert _titles(listed.text) == ["Leave policy", "Travel policy"]
    assert f"/review/documents/{new}" in listed.text and f"/review/documents/{leave}" not in (
        listed.text
    )
    again = amy.post(f"/review/drafts/{leave}/restore",
                     data={"csrf": csrf, "note": "twice", "seen": _seen(old.text)})  # fmt: skip
    assert again.status_code == 409
    assert "You decided this document already" in again.text
    assert "Someone decided first" not in again.text
    assert f'<a href="/review/documents/{new}">Open the current version 2</a>' in again.text


def test_the_note_typed_before_show_my_changes_is_kept(inbox: dict[str, Any]) -> None:
    draft = inbox["library"]["draft"]
    amy = login(inbox, "amy")
    page = amy.get(f"/review/drafts/{draft}")
    form = {"csrf": _csrf(page.text), "content": "Decided now.\n", "note": "checked with <Dana>"}
    preview = amy.post(f"/review/drafts/{draft}/preview", data=form)
    assert preview.status_code == 200
    assert 'id="edit-note" name="note" maxlength="2000" value="checked with &lt;Dana&gt;"' in (
        preview.text
    )
    assert status(inbox, draft) == "pending_review"  # a preview decides nothing


def test_every_page_has_a_skip_link_and_an_icon(inbox: dict[str, Any]) -> None:
    amy = login(inbox, "amy")
    home = amy.get("/review").text
    assert '<a class="skip" href="#main">Skip to content</a>' in home and 'id="main"' in home
    draft = amy.get(f"/review/drafts/{inbox['library']['draft']}").text
    assert 'href="#decide">Skip to your decision</a>' in draft and 'id="decide"' in draft
    icon = browser(inbox).get("/review/static/favicon.svg")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert 'rel="icon" href="/review/static/favicon.svg"' in home


def _form_body(
    fields: dict[str, str], files: list[tuple[str, bytes, str]]
) -> tuple[bytes, dict[str, str]]:
    """A multipart body as a browser sends it: a file input with nothing chosen is a part
    whose file name is empty (httpx leaves the name out, so it cannot send one)."""
    boundary = "----kbflowtestboundary7MA4YWxk"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    for name, data, kind in files:
        head = (f'--{boundary}\r\nContent-Disposition: form-data; name="files"; '
                f'filename="{name}"\r\nContent-Type: {kind}\r\n\r\n')  # fmt: skip
        parts.append(head.encode() + data + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, {"content-type": f"multipart/form-data; boundary={boundary}"}


def test_the_am_seeds_from_the_inbox_and_removes_an_input(inbox: dict[str, Any]) -> None:
    """Issue 44: seeding had no page. The seed page takes files, URLs (one per line) and a
    steering prompt in one form (a file input left empty included), lists every input with its
    full address, and removes one; the form's token and the org are checked like a decision."""
    long_url = "https://larkspur.example/" + "/".join(["a-rather-long-path-segment"] * 5)
    amy = login(inbox, "amy")
    page = amy.get("/review/seeds", params={"org": "larkspur"})
    assert page.status_code == 200 and 'enctype="multipart/form-data"' in page.text
    csrf = _csrf(page.text)
    note = b"# Larkspur service notes\n\n- Repairs within 48 hours.\n- Free first service.\n"
    data = {"csrf": csrf, "urls": f"{long_url}\n\nhttps://larkspur.example/press\n",
            "prompts": "Focus on commuters."}  # fmt: skip
    body, head = _form_body(data, [("service-notes.md", note, "text/markdown"),
                                   ("", b"", "application/octet-stream")])  # fmt: skip
    sent = amy.post("/review/seeds/larkspur", content=body,
                    headers={**head, "origin": inbox["base"]})  # fmt: skip
    assert sent.status_code == 200, sent.text[-3000:]
    assert "Seeded 4 new inputs." in sent.text
    assert f'<code class="uri">{long_url}</code>' in sent.text  # the whole address
    assert "upload:larkspur/service-notes.md" in sent.text
    assert "Focus on commuters." in sent.text
    registry = SqlRegistry.open(inbox["settings"].registry_url)
    try:
        seeds = {d.uri: d for d in registry.documents.list_documents("larkspur")
                 if d.source_tag in ("am_file", "am_url", "am_prompt")}  # fmt: skip
    finally:
        registry.close()
    assert {long_url, "https://larkspur.example/press", "upload:larkspur/service-notes.md"} <= set(
        seeds
    )
    press = seeds["https://larkspur.example/press"]

    unchosen = [("", b"", "application/octet-stream")]
    body, head = _form_body({"csrf": "wrong", "prompts": "Forged."}, unchosen)
    forged = amy.post("/review/seeds/larkspur", content=body,
                      headers={**head, "origin": inbox["base"]})  # fmt: skip
    assert forged.status_code == 403 and "nothing was stored" in forged.text
    body, head = _form_body({"csrf": csrf, "urls": "\n"}, unchosen)
    empty = amy.post("/review/seeds/larkspur", content=body,
                     headers={**head, "origin": inbox["base"]})  # fmt: skip
    assert empty.status_code == 400 and "choose a file, or give a URL or a prompt" in empty.text
    gus = login(inbox, "gus")
    theirs = gus.post("/review/seeds/larkspur", data={"csrf": _csrf(gus.get("/review").text),
                      "prompts": "Not my org."}, headers={"origin": inbox["base"]})  # fmt: skip
    assert theirs.status_code == 403
    assert gus.get("/review/seeds", params={"org": "larkspur"}).status_code == 403

    gone = amy.post(f"/review/seeds/larkspur/{press.id}/remove", data={"csrf": csrf})
    assert gone.status_code == 200 and "the next research run does not read it" in gone.text
    assert "https://larkspur.example/press" not in gone.text.split("In the bundle")[1]
    assert status(inbox, press.id) == "withdrawn"
    again = amy.post(f"/review/seeds/larkspur/{press.id}/remove", data={"csrf": csrf})
    assert again.status_code == 404 and "Nothing was removed" in again.text
    removed = [r for r in audit(inbox, "larkspur") if r.doc_id == press.id]
    assert [r.actor for r in removed][-1] == "amy"


def test_the_reviewer_sees_the_banner_and_an_added_uncited_line_is_hers(
    inbox: dict[str, Any],
) -> None:
    """Issue 44: the offline banner is on the draft's page, never in what agents get; a line
    the account manager adds without a citation is listed among the sources as hers."""
    client = login(inbox, "amy")
    doc_id = inbox["noted"]
    page = client.get(f"/review/drafts/{doc_id}").text
    assert "assembled without a model: Edit before approving." in page.split('class="draft"')[0]
    textarea = page.split("<textarea", 1)[1].split("</textarea>", 1)[0]
    assert "assembled without a model" not in textarea  # an edit starts from the served text
    assert "- [doc:" in textarea and "## Citations" in textarea
    new = textarea.split(">", 1)[1].replace("&#34;", '"').replace("&#39;", "'")
    new = new.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    new = new.replace("- Prefer short sentences.\n", "- Prefer short sentences.\n- Say hello.\n")
    edited = client.post(
        f"/review/drafts/{doc_id}/edit", data={"csrf": _csrf(page), "content": new}
    )
    assert edited.status_code == 303 and status(inbox, doc_id) == "approved"
    day = dt.datetime.now(dt.UTC).date().isoformat()
    shown = client.get(f"/review/documents/{doc_id}").text
    assert "assembled without a model" not in shown  # approved: the note has done its job
    sources = shown.split('<section class="sources">', 1)[1].split("</section>", 1)[0]
    assert sources.count(f"added by amy on {day}") == 1
    assert "Larkspur brief" in sources and "About Larkspur" in sources
    body = shown.split('<div class="draft">', 1)[1].split("</div>", 1)[0]
    assert re.search(rf"<li>Say hello\. \[added by amy on {day}\]</li>", body), body
    for cited in ("Write plainly and warmly.", "Prefer short sentences.", "Kestrel"):
        line = next(part for part in body.split("\n") if cited in part)
        assert "added by" not in line, line
    hits = httpx.post(
        f"{inbox['base']}/v1/agent/search", json={"query": "say hello write plainly", "top_k": 20},
        headers={"Authorization": f"Bearer {inbox['agent_token']}"}, timeout=60,
    ).json()["results"]  # fmt: skip
    mine = [h for h in hits if h["doc_id"] == doc_id]
    assert mine and not [h for h in hits if "assembled without a model" in h["text"]]
    said = next(h for h in mine if "Say hello." in h["text"])
    assert f"- Say hello. [am:amy/{day}]" in said["text"]
    assert {"tag": f"[am:amy/{day}]", "title": f"added by amy on {day}", "uri": None} in said[
        "sources"
    ]


def test_the_research_page_follows_each_run_and_only_the_am_starts_one(
    inbox: dict[str, Any],
) -> None:
    """Issue 44: research had no page. It lists the org's runs (jobs) with their stage, what
    they spent of their budget and why one failed, reloads itself while one runs, and offers
    Start research to the org's AM only (another org's AM is refused and nothing starts)."""
    from kbflow.services.jobs import RESEARCH_KIND

    registry = SqlRegistry.open(inbox["settings"].registry_url)
    try:
        params = {"client_name": "Larkspur", "model": None, "budget_tokens": 200000,
                  "reviewer": "amy"}  # fmt: skip
        failed = registry.jobs.create_job("larkspur", kind=RESEARCH_KIND, inputs=[],
                                          params=params)  # fmt: skip
        registry.jobs.finish_job(failed.id, JobStatus.FAILED,
                                 reason="research budget exceeded: the fetch cap (30)")  # fmt: skip
        done = registry.jobs.create_job("larkspur", kind=RESEARCH_KIND, inputs=[], params=params)
        report = {"documents": [{"filename": f"d{i}.md"} for i in range(4)],
                  "budget": {"tokens": 12345, "max_tokens": 200000},
                  "notes": ["brand_voice.md: not proposed again"]}  # fmt: skip
        registry.jobs.finish_job(done.id, JobStatus.COMPLETE, report=report)
        running = registry.jobs.create_job("larkspur", kind=RESEARCH_KIND, inputs=[],
                                           params=params)  # fmt: skip
    finally:
        registry.close()
    amy = login(inbox, "amy")
    page = amy.get("/review/research", params={"org": "larkspur"})
    assert page.status_code == 200, page.text[-2000:]
    text = " ".join(page.text.split())
    assert '<meta http-equiv="refresh" content="5">' in page.text  # a run goes on
    assert "Start research" in text
    assert "research budget exceeded: the fetch cap (30)" in text
    assert "4 drafts made" in text  # and its notes, folded away under the run
    assert "<summary>1 note</summary><ul><li>brand_voice.md: not proposed again</li>" in text
    assert "12,345 of 200,000 tokens" in text
    assert "reading the seed inputs and public pages, then drafting" in text
    assert text.index(running.id) < text.index(done.id) < text.index(failed.id)  # newest first
    gus = login(inbox, "gus")
    assert gus.get("/review/research", params={"org": "larkspur"}).status_code == 403
    csrf = _csrf(gus.get("/review").text)
    refused = gus.post("/review/research/larkspur", data={"csrf": csrf})
    assert refused.status_code == 403
    registry = SqlRegistry.open(inbox["settings"].registry_url)
    try:
        assert len(registry.jobs.list_jobs("larkspur")) == 3  # nothing started
        registry.jobs.finish_job(running.id, JobStatus.FAILED, reason="test over")
    finally:
        registry.close()
    still = amy.get("/review/research", params={"org": "larkspur"})
    assert 'http-equiv="refresh"' not in still.text  # nothing runs: no reloading


def test_the_research_page_shows_how_far_a_run_has_got(inbox: dict[str, Any]) -> None:
    """Issue 44: the research page said only "researching". A running run records its stage on
    its job (`tasks.research.progress`) and the page says it: which public page of how many it
    fetches, that it writes the drafts. The stage is no report: the job has none until it ends,
    and a finished job takes no more progress."""
    from kbflow.services.jobs import RESEARCH_KIND
    from tasks.research.progress import job_progress

    registry = SqlRegistry.open(inbox["settings"].registry_url)
    try:
        params = {"client_name": "Larkspur", "model": None, "budget_tokens": 200000,
                  "reviewer": "amy"}  # fmt: skip
        job = registry.jobs.create_job("larkspur", kind=RESEARCH_KIND, inputs=[], params=params)
        progress = job_progress(registry, job.id)
        progress("fetching", 2, 4)
        running = registry.jobs.get_job(job.id)
        assert (running.report, running.progress) == (None, {"stage": "fetching", "done": 2,
                                                              "total": 4})  # fmt: skip
        amy = login(inbox, "amy")
        text = " ".join(amy.get("/review/research", params={"org": "larkspur"}).text.split())
        assert "fetching public pages: 2 of 4" in text
        assert 'class="status s-fetching">fetching<' in text
        progress("reading", 0, 1)
        text = " ".join(amy.get("/review/research", params={"org": "larkspur"}).text.split())
        assert "reading the 1 seed input (" in text
        progress("reading", 0, 0)
        text = " ".join(amy.get("/review/research", params={"org": "larkspur"}).text.split())
        assert "no seed inputs to read: public pages only" in text
        progress("synthesising")
        text = " ".join(amy.get("/review/research", params={"org": "larkspur"}).text.split())
        assert "writing the four drafts from what was gathered" in text
        with pytest.raises(ValueError, match="unknown research stage"):
            progress("dawdling")
        registry.jobs.finish_job(job.id, JobStatus.FAILED, reason="test over")
        assert not registry.jobs.note_progress(job.id, {"stage": "saving"})  # it has ended
        ended = registry.jobs.get_job(job.id)
        assert (ended.report, ended.progress, ended.reason) == (None, None, "test over")
    finally:
        registry.close()
