"""`kbflow serve` as a real process on a loopback port, driven over HTTP: who may call what
(tokens, never the body), the agent routes' answers, and bad input answered without a trace."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests import web
from tests.kbflow.service import LIMITED, TOPIC, _call, _clean

pytestmark = pytest.mark.integration  # each test starts or reaches a real service


def test_who_calls_is_the_tokens_business(served_once: dict[str, Any]) -> None:
    served = served_once
    search = {"query": TOPIC}
    cases = {
        "no token": (_call(served, "POST", "/v1/agent/search", json=search), 401, "no token"),
        "not bearer": (
            web.post(
                served["base"] + "/v1/agent/search",
                json=search,
                headers={"Authorization": "Basic cm9vdDpyb290"},
            ),
            401,
            "Bearer",
        ),
        "unknown": (
            web.post(
                served["base"] + "/v1/agent/search",
                json=search,
                headers={"Authorization": "Bearer kbf_not-a-real-token-at-all"},
            ),
            401,
            "",
        ),
        "revoked": (
            _call(served, "POST", "/v1/agent/search", "revoked", json=search),
            401,
            "revoked",
        ),
        "a user on an agent route": (
            _call(served, "POST", "/v1/agent/search", "user", json=search),
            403,
            "agent",
        ),
    }
    time.sleep(2.1)  # the short-lived token is past its expiry now
    cases["expired"] = (
        _call(served, "POST", "/v1/agent/search", "expired", json=search),
        401,
        "expired",
    )
    for name, (response, status, says) in cases.items():
        assert response.status_code == status, (name, response.text)
        assert says.lower() in response.json()["detail"].lower(), (name, response.text)
        if status == 401:
            assert response.headers["www-authenticate"] == "Bearer", name
        _clean(response)


def test_an_agent_searches_its_own_scope_only(served_once: dict[str, Any]) -> None:
    served = served_once
    response = _call(served, "POST", "/v1/agent/search", "agent", json={"query": TOPIC})
    assert response.status_code == 200, response.text
    found = {hit["doc_id"] for hit in response.json()["results"]}
    assert found == {served["docs"]["hr"]}  # not sales (not allowed), not globex (other org)
    # The body cannot name another agent: the token fixed who asks.
    claim = {"query": TOPIC, "agent_id": "sales-bot"}
    refused = _call(served, "POST", "/v1/agent/search", "agent", json=claim)
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"].endswith("agent_id")
    off = _call(served, "POST", "/v1/agent/search", "off", json={"query": TOPIC})
    assert off.status_code == 200 and off.json()["results"] == []
    assert "switched off" in off.json()["note"]


def test_the_agent_routes_answer_like_the_tools(served_once: dict[str, Any]) -> None:
    served = served_once
    listed = _call(served, "GET", "/v1/agent/collections", "agent")
    assert listed.status_code == 200, listed.text
    assert [c["name"] for c in listed.json()["collections"]] == ["hr"]
    asked = _call(served, "POST", "/v1/agent/ask", "agent", json={"queries": [TOPIC]})
    assert asked.status_code == 200, asked.text
    assert asked.json()["answer_status"] in {"yes", "maybe", "no"}
    answered = _call(served, "POST", "/v1/agent/answer", "agent", json={"question": TOPIC})
    assert answered.status_code == 200, answered.text
    cited = {c["doc_id"] for c in answered.json().get("citations", [])}
    assert cited <= {served["docs"]["hr"]}
    metrics = web.get(served["base"] + "/metrics").text  # each outcome counted
    verdict, status = asked.json()["answer_status"], answered.json()["status"]
    assert f'kbflow_agent_outcomes_total{{outcome="{verdict}",route="ask"}} 1.0' in metrics
    assert f'kbflow_agent_outcomes_total{{outcome="{status}",route="answer"}} 1.0' in metrics


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/agent/search", {"query": ""}, "query"),
        ("/v1/agent/search", {"query": TOPIC, "top_k": 0}, "top_k"),
        ("/v1/agent/search", {"query": TOPIC, "top_k": True}, "top_k"),
        ("/v1/agent/search", {}, "query"),
        ("/v1/agent/ask", {"queries": []}, "queries"),
        ("/v1/agent/answer", {"question": "x" * 5000}, "question"),
    ],
)
def test_bad_bodies_name_the_field(
    served_once: dict[str, Any], path: str, body: dict[str, Any], field: str
) -> None:
    served = served_once
    response = _call(served, "POST", path, "agent", json=body)
    assert response.status_code == 422, response.text
    assert any(e["field"].endswith(field) for e in response.json()["errors"]), response.text
    _clean(response)


def test_health_docs_and_garbage(served_once: dict[str, Any]) -> None:
    served = served_once
    assert web.get(served["base"] + "/healthz").json() == {"status": "ok"}
    assert web.get(served["base"] + "/readyz").json()["vector_store"] == "open"
    assert web.get(served["base"] + "/docs").status_code == 200
    schema = web.get(served["base"] + "/openapi.json").json()
    assert "/v1/agent/search" in schema["paths"]
    not_json = web.post(
        served["base"] + "/v1/agent/search",
        content=b"{not json",
        headers={"Authorization": f"Bearer {served['tokens']['agent']}",
                 "Content-Type": "application/json"},
    )  # fmt: skip
    assert not_json.status_code == 422
    _clean(not_json)


def test_the_review_queue_and_decisions(served: dict[str, Any]) -> None:
    drafts = served["drafts"]
    queue = _call(served, "GET", "/v1/admin/orgs/acme/drafts", "amy")
    assert queue.status_code == 200, queue.text
    listed = {d["id"] for run in queue.json()["runs"] for d in run["documents"]}
    assert listed == set(drafts)
    shown = _call(served, "GET", f"/v1/admin/documents/{drafts[0]}", "eve")  # experts may look
    assert shown.status_code == 200 and "draft 0" in shown.json()["text"]

    approved = _call(served, "POST", f"/v1/admin/documents/{drafts[0]}/approve", "amy",
                     json={"note": "checked"})  # fmt: skip
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "approved"
    again = _call(served, "POST", f"/v1/admin/documents/{drafts[0]}/approve", "amy")
    assert again.status_code == 409, again.text  # decided already: nothing changed
    _clean(again)
    rejected = _call(served, "POST", f"/v1/admin/documents/{drafts[1]}/reject", "user")
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
    content = f"# Edited\n\n{TOPIC}: the edited copy."
    edited = _call(served, "POST", f"/v1/admin/documents/{drafts[2]}/edit", "amy",
                   json={"content": content, "note": "x"})  # fmt: skip
    assert edited.status_code == 200, edited.text
    assert edited.json()["status"] == "approved"
    no_note = _call(served, "POST", f"/v1/admin/documents/{drafts[0]}/withdraw", "amy")
    assert no_note.status_code == 422 and "note" in no_note.json()["detail"]
    withdrawn = _call(served, "POST", f"/v1/admin/documents/{drafts[0]}/withdraw", "amy",
                      json={"note": "out of date"})  # fmt: skip
    assert withdrawn.status_code == 200 and withdrawn.json()["status"] == "withdrawn"

    # The agent sees the edited draft now, never a pending or rejected one.
    hits = _call(served, "POST", "/v1/agent/search", "agent", json={"query": TOPIC, "top_k": 50})
    found = {h["doc_id"] for h in hits.json()["results"]}
    assert found & set(drafts) == {drafts[2]}

    trail = _call(served, "GET", "/v1/admin/orgs/acme/audit", "amy", params={"limit": 100})
    assert trail.status_code == 200
    actions = [(r["doc_id"], r["actor"]) for r in trail.json() if r["doc_id"] in drafts]
    assert (drafts[0], "amy") in actions and (drafts[1], "root") in actions


def test_who_may_review_what(served_once: dict[str, Any]) -> None:
    served = served_once
    draft = served["drafts"][3]
    cases = [
        ("agent", "GET", "/v1/admin/orgs/acme/drafts", 403, "people"),
        ("gus", "GET", "/v1/admin/orgs/acme/drafts", 403, ""),  # the AM of another org
        ("gus", "POST", f"/v1/admin/documents/{draft}/approve", 403, ""),
        ("eve", "POST", f"/v1/admin/documents/{draft}/approve", 403, ""),  # experts only look
        (None, "POST", f"/v1/admin/documents/{draft}/approve", 401, "token"),
        # Not found or not allowed, the same answer: to anyone but a superadmin a refusal says
        # neither whether a document or org exists, nor whose it is, nor who its AM is.
        ("amy", "POST", "/v1/admin/documents/no-such-doc/approve", 403, "does not exist"),
        ("user", "POST", "/v1/admin/documents/no-such-doc/approve", 404, ""),  # root: superadmin
        ("amy", "POST", "/v1/admin/documents/..%2Fetc/approve", 404, ""),
        ("amy", "POST", f"/v1/admin/documents/{draft}/publish", 422, ""),
        ("amy", "GET", "/v1/admin/orgs/no-such-org/drafts", 403, "does not exist"),
        ("gus", "GET", "/v1/admin/documents/no-such-doc", 403, "does not exist"),
        ("gus", "GET", "/v1/admin/jobs/0123456789ab", 403, "does not exist"),
        ("user", "GET", "/v1/admin/orgs/no-such-org/drafts", 404, ""),
    ]
    for token, method, path, status, says in cases:
        response = _call(served, method, path, token)
        assert response.status_code == status, (token, path, response.text)
        assert says in response.json()["detail"], (token, path, response.text)
        _clean(response)
    # gus, the AM of globex, learns nothing of acme's people, nor which org a draft is in.
    for method, path in (("POST", f"/v1/admin/documents/{draft}/approve"),
                         ("GET", f"/v1/admin/documents/{draft}"),
                         ("POST", "/v1/admin/documents/no-such-doc/reject")):  # fmt: skip
        response = _call(served, method, path, "gus")
        assert response.status_code == 403, (path, response.text)
        assert "amy" not in response.text and "acme" not in response.text, response.text
    other_org = _call(served, "GET", "/v1/admin/orgs/acme/drafts", "gus").json()["detail"]
    missing_org = _call(served, "GET", "/v1/admin/orgs/nosuch/drafts", "gus").json()["detail"]
    assert other_org.replace("acme", "nosuch") == missing_org and "amy" not in other_org
    still = _call(served, "GET", f"/v1/admin/documents/{draft}", "amy")
    assert still.json()["document"]["status"] == "pending_review"  # nothing was decided
    trail = _call(served, "GET", "/v1/admin/orgs/acme/audit", "amy", params={"limit": 100})
    denied = [(r["actor"], r["after"]["attempted"]) for r in trail.json()
              if r["action"] == "kb.access.denied"]  # fmt: skip
    assert ("gus", f"approve {draft}") in denied and ("eve", f"approve {draft}") in denied


@pytest.mark.parametrize("served", [LIMITED], indirect=True)
def test_limits_per_token_and_per_body(served: dict[str, Any]) -> None:
    codes = [_call(served, "GET", "/v1/agent/collections", "agent").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    limited = _call(served, "GET", "/v1/agent/collections", "agent")
    assert limited.status_code == 429 and 1 <= int(limited.headers["retry-after"]) <= 10
    assert "too many requests" in limited.json()["detail"]
    # Another token has its own bucket.
    assert _call(served, "GET", "/v1/agent/collections", "off").status_code == 200

    big = {"query": "x" * 20_000}
    declared = _call(served, "POST", "/v1/agent/search", "off", json=big)
    assert declared.status_code == 413, declared.text
    assert "KBFLOW_API_MAX_BODY_MB" in declared.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"query": "'
        for _ in range(30):
            yield b"x" * 1000
        yield b'"}'

    streamed = web.post(
        served["base"] + "/v1/agent/search",
        content=chunks(),
        headers={"Authorization": f"Bearer {served['tokens']['user']}",
                 "Content-Type": "application/json"},
    )  # fmt: skip
    assert streamed.status_code == 413, streamed.text

    # A client that declares a body and stalls is answered 408 and let go, while others are
    # served meanwhile.
    import socket

    host, port = served["base"].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as slow:
        started = time.monotonic()
        slow.sendall(
            b"POST /v1/agent/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + served["tokens"]["off"].encode() + b"\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"query": "sl'
        )
        assert _call(served, "GET", "/healthz").status_code == 200  # not held up meanwhile
        received = b""
        while chunk := slow.recv(4096):  # the answer, then the service closes the connection
            received += chunk
        answer = received.decode()
        waited = time.monotonic() - started
    assert answer.startswith("HTTP/1.1 408"), answer
    assert "KBFLOW_API_READ_TIMEOUT_S" in answer and 1.5 <= waited < 20, (answer, waited)

    metrics = web.get(served["base"] + "/metrics").text
    assert 'kbflow_http_refused_total{status="429"}' in metrics
    assert 'kbflow_http_request_seconds_count{method="GET",route="/v1/agent/collections"' in (
        metrics
    )


def test_a_token_bucket_refills_at_its_rate() -> None:
    from kbflow.api.limits import RateLimited, TokenBuckets

    buckets = TokenBuckets(per_minute=60, burst=2)
    buckets.take("a", now=0.0)
    buckets.take("a", now=0.0)
    with pytest.raises(RateLimited) as caught:
        buckets.take("a", now=0.5)
    assert caught.value.retry_after_s == 1
    buckets.take("b", now=0.5)  # its own bucket
    buckets.take("a", now=1.6)  # one second refilled one request
    with pytest.raises(RateLimited):
        buckets.take("a", now=1.7)


@pytest.mark.parametrize("served", [{"_drafts": 200, "KBFLOW_API_RATE_BURST": "1000"}],
                         indirect=True)  # fmt: skip
def test_two_reviewers_race_for_the_same_drafts(served: dict[str, Any]) -> None:
    """The AM approves and a superadmin rejects the same 200 drafts at once, in opposite
    orders: each draft gets exactly one 200 and one 409, and one audit row."""
    from concurrent.futures import ThreadPoolExecutor

    drafts: list[str] = served["drafts"]

    def decide(who: str, verb: str, order: list[str]) -> dict[str, int]:
        auth = {"Authorization": f"Bearer {served['tokens'][who]}"}
        with web.client(base_url=served["base"], timeout=60, headers=auth) as c:
            return {d: c.post(f"/v1/admin/documents/{d}/{verb}").status_code for d in order}

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(decide, "amy", "approve", drafts)
        second = pool.submit(decide, "user", "reject", drafts[::-1])
        approvals, rejections = first.result(), second.result()
    for doc in drafts:
        assert sorted((approvals[doc], rejections[doc])) == [200, 409], doc
    assert 0 < sum(c == 200 for c in approvals.values()) < len(drafts)  # they really raced
    trail = _call(served, "GET", "/v1/admin/orgs/acme/audit", "amy", params={"limit": 1000})
    decided = [
        r["doc_id"]
        for r in trail.json()
        if r["action"] in {"kb.document.approved", "kb.document.rejected"}
    ]
    assert sorted(decided) == sorted(drafts)
    queue = _call(served, "GET", "/v1/admin/orgs/acme/drafts", "amy", params={"status": "approved"})
    approved = {d["id"] for run in queue.json()["runs"] for d in run["documents"]}
    assert approved & set(drafts) == {d for d, c in approvals.items() if c == 200}


def test_an_embedding_model_mismatch_is_the_servers_fault_not_the_requests() -> None:
    """Another model's index behind the server: 503 (fix the setting or re-embed), not 422."""
    from core.errors import ConfigError, EmbeddingModelMismatch
    from kbflow.api.errors import status_of

    assert status_of(EmbeddingModelMismatch("org acme: chunks of 'a', embedder 'b'")) == 503
    assert status_of(ConfigError("top_k must be > 0")) == 422
