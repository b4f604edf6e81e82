"""The HTTP contract of ``kbflow serve``: every route answers the same JSON for the same calls.

A safety net for refactoring the app floor (services, routers, response models). One real
server (`kbflow.api.launch.launched`) runs over a fixed home: two orgs, realistic documents
(paragraphs, a Markdown table, lists), drafts to review, agents, people and their tokens, and
three background jobs written straight into the registry. `CALLS` is a table of requests, run
in order (decisions change what later calls see): successes and the main refusals (401 no or a
bad token, 403 the wrong caller, 404, 409 a second decision, 413/415 uploads, 422 a bad body).
Each answer's status, a few headers (content type, Location, WWW-Authenticate, Retry-After,
Allow) and its normalised JSON body are compared with ``http_contract.json``. ``GET
/openapi.json`` is recorded as its list of methods and paths only (the schemas are expected to
grow with response models), so a route that disappears is caught; ``/metrics`` as its metric
families and the agent outcome and refusal counters.

What legitimately varies between runs is normalised (`Normaliser`):

- ids made at random (documents, chunks, turns, jobs, tokens, synthesis runs, uuids) become
  placeholders numbered by order of first appearance across the whole run (``<id-3>``,
  ``<turn-1>``, ``<job-2>``), inside any string too (citation tags, messages, Location), so the
  structure and the cross-references between answers stay checked; the ids the fixture made are
  named instead (``<doc:leave>``, ``<token:revoked>``, ``<job:blocker>``);
- timestamps become ``<time>`` (and today's date ``<today>``); durations ``<duration>``;
- floats (scores) are rounded to 3 decimals; the server's address and its home's path become
  ``<base>`` and ``<home>``;
- a string holding a JSON object (an MCP tool result's text) is parsed and normalised as JSON.

Background jobs never run here: a "blocker" job of acme is PROCESSING with a live process of
this module, so acme's upload and research are queued deterministically (``queued: true``,
their places) and no job process starts; only the synchronous answers are recorded.

To record after a deliberate change of the contract (then review the diff of the JSON file)::

    KBFLOW_RECORD_HTTP_CONTRACT=1 .venv/bin/python -m pytest -p no:cacheprovider \\
        tests/kbflow/test_http_contract.py
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.models import DocStatus, JobStatus, Role
from core.settings import Settings
from kbflow.api.launch import launched
from tests import web
from tests.conftest import KEPT_ENV, index_records

pytestmark = pytest.mark.integration

CONTRACT = Path(__file__).with_name("http_contract.json")
RECORD = os.environ.get("KBFLOW_RECORD_HTTP_CONTRACT") == "1"
START_TIMEOUT_S = 180
SERVER_ENV = {"KBFLOW_API_RATE_BURST": "1000", "KBFLOW_JOBS_MAX_RUNNING_PER_ORG": "1"}
KEPT_HEADERS = ("content-type", "location", "www-authenticate", "retry-after", "allow")
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
NOT_A_TOKEN = "kbf_not-a-real-token-at-all"

# --- the fixed home ----------------------------------------------------------------------------

LEAVE = """# Parental leave policy

Acme grants paid parental leave to every employee who becomes a parent by birth, adoption or
foster placement. Leave is paid at full base salary and does not reduce annual holiday.

## Entitlements

| Parent | Paid weeks | Unpaid weeks | When it must be taken |
| --- | --- | --- | --- |
| Birth parent | 16 | 10 | within 12 months of the birth |
| Second parent | 8 | 4 | within 12 months of the birth |
| Adoptive or foster parent | 12 | 6 | within 12 months of the placement |

## Eligibility

- You have worked at Acme for at least three months on the first day of leave.
- You tell your manager and People Operations at least eight weeks before leave starts.
- Part-time employees receive the same weeks, paid pro rata to their contracted hours.

## Returning to work

After parental leave you may return part time for up to eight weeks at full pay (a phased
return). Your role, salary and benefits are protected while you are away.
"""

EXPENSES = """# Expense reimbursement rules

Employees are reimbursed for reasonable business expenses paid with their own money. Claims are
filed in the expenses tool with an itemised receipt for every line over 25 EUR.

## Limits

| Category | Limit | Approval |
| --- | --- | --- |
| Hotel, per night | 180 EUR | line manager |
| Meals, per day | 60 EUR | none |
| Client entertainment, per guest | 90 EUR | department head |
| Economy flights | actual fare | line manager |

## How to claim

1. Photograph each receipt and attach it to the claim line.
2. Submit the claim within 30 days of the expense.
3. Your line manager approves it; Finance pays it with the next monthly payroll.

Claims filed after 90 days are refused unless Finance grants an exception in writing.
"""

DISCOUNTS = """# Enterprise discount playbook

Sales representatives may offer volume discounts on annual enterprise contracts. Discounts above
the representative's own limit need the approval named in the table.

| Annual contract value | Maximum discount | Approved by |
| --- | --- | --- |
| up to 50,000 EUR | 10% | the representative |
| 50,000 to 250,000 EUR | 18% | the regional sales director |
| above 250,000 EUR | 25% | the Chief Revenue Officer |

- Multi-year contracts may add 3% per additional committed year.
- Never discount professional services or support plans.
"""

GLOBEX_TRAVEL = """# Globex travel policy

Globex staff book all business travel through the travel desk. Rail is required for journeys
under four hours; flights longer than six hours may be booked in premium economy.

- Hotels are booked at the negotiated corporate rate.
- Per diems are paid at 45 EUR per day abroad.
"""

STIPEND = """# Remote work stipend

Employees who work from home at least three days a week receive a one-off equipment stipend of
600 EUR and a monthly internet allowance of 30 EUR.

- The stipend covers a desk, a chair and a monitor.
- Receipts are filed as an expense claim within 30 days.
"""

ONBOARDING = """# Onboarding checklist

New joiners complete the following in their first week:

1. Sign the employment contract and the confidentiality agreement.
2. Complete the security awareness course.
3. Meet their buddy and their line manager.
"""

HOLIDAYS = """# Public holidays

Acme offices close on the national public holidays of their country. Staff who must work on a
public holiday receive a day off in lieu within the next three months.
"""

SECURITY = """# Security training

Every employee completes the security awareness course each year. The course takes 45 minutes
and covers phishing, password managers and reporting an incident.
"""

EDITED_HOLIDAYS = """# Public holidays

Acme offices close on the national public holidays of their country, and on 24 and 31 December.

| Office | Extra closing days |
| --- | --- |
| Berlin | 24 December, 31 December |
| Lisbon | 24 December |

Staff who must work on a public holiday receive a day off in lieu within the next three months.
"""

UPLOAD = b"""# Bereavement leave

Employees may take up to five days of paid bereavement leave after the death of a close family
member, and one day for other relatives.
"""


def _doc(key: str, text: str) -> dict[str, Any]:
    return {"key": key, "title": text.splitlines()[0].lstrip("# "), "text": text, "markdown": True}


@dataclass
class Home:
    """The fixed home, the service on it, and what the calls need to name."""

    path: Path  # its KBFLOW_HOME
    base: str
    secrets: dict[str, str]  # who -> bearer secret
    refs: dict[str, str]  # name -> value, for the calls' paths and bodies
    named: dict[str, str]  # id made by the fixture -> its placeholder


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Iterator[Home]:
    """Two orgs with documents, drafts, agents, people, tokens and jobs; then the service."""
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.registry import SqlRegistry

    root = tmp_path_factory.mktemp("http-contract")
    with pytest.MonkeyPatch.context() as env:
        # This fixture outlives each test's own environment (tests/conftest.py `_clean_env`):
        # clean it the same way here, for the settings and for the server's environment.
        for key in list(os.environ):
            if key.startswith("KBFLOW_") and key not in KEPT_ENV:
                env.delenv(key)
        for key in ("ANTHROPIC_API_KEY", "COHERE_API_KEY"):
            env.delenv(key, raising=False)
        env.setenv("KBFLOW_HOME", str(root / "home"))
        settings = Settings(home=root / "home")
        registry = SqlRegistry.open(settings.registry_url)
        store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=5)
        try:
            built = _build(settings, registry, store, embedder)
        finally:
            store.close()
            registry.close()
        blocker = subprocess.Popen(  # holds acme's one job slot: its job id is on its cmdline
            [sys.executable, "-c", "import time; time.sleep(900)", built.refs["blocker_job"]],
            stdin=subprocess.DEVNULL,
        )
        try:
            registry = SqlRegistry.open(settings.registry_url)
            try:
                registry.jobs.update_job_runner(built.refs["blocker_job"], pid=blocker.pid)
            finally:
                registry.close()
            with launched(
                settings.home,
                root / "serve.log",
                env=SERVER_ENV,
                require_ready=False,
                wait_s=START_TIMEOUT_S,
            ) as server:
                built.base = server.base
                yield built
        finally:
            blocker.kill()
            blocker.wait()


def _build(settings: Settings, registry: Any, store: Any, embedder: Any) -> Home:
    kw = {"store": store, "registry": registry, "embedder": embedder}
    named: dict[str, str] = {}
    refs: dict[str, str] = {}
    registry.people.ensure_org("acme")
    registry.people.ensure_org("globex")
    hr = registry.catalog.create_collection("acme", "hr", "People policies: leave, expenses.", None)
    sales = registry.catalog.create_collection(
        "acme", "sales", "Sales playbooks and pricing.", None
    )
    refs |= {"hr_id": str(hr.id), "sales_id": str(sales.id)}
    for key, text, org, collection, status in (
        ("leave", LEAVE, "acme", "hr", DocStatus.APPROVED),
        ("expenses", EXPENSES, "acme", "hr", DocStatus.APPROVED),
        ("discounts", DISCOUNTS, "acme", "sales", DocStatus.APPROVED),
        ("globex-travel", GLOBEX_TRAVEL, "globex", "default", DocStatus.APPROVED),
        ("draft-stipend", STIPEND, "acme", "hr", DocStatus.PENDING_REVIEW),
        ("draft-onboarding", ONBOARDING, "acme", "hr", DocStatus.PENDING_REVIEW),
        ("draft-holidays", HOLIDAYS, "acme", "hr", DocStatus.PENDING_REVIEW),
        ("draft-security", SECURITY, "acme", "hr", DocStatus.PENDING_REVIEW),
    ):
        (doc_id,) = index_records(
            [_doc(key, text)], org=org, collection=collection, status=status, **kw
        )
        refs[key] = doc_id
        named[doc_id] = f"<doc:{key}>"
        # index_records' content hash is Python's hash() of the record: salted per process.
        indexed = _doc(key, text)
        named[str(hash((indexed["title"], indexed["text"])))] = f"<hash:{key}>"

    registry.catalog.create_agent("acme", "hr-bot", "answers staff questions")
    registry.catalog.set_allowed("hr-bot", ["hr"], allow=True)
    registry.catalog.create_agent("acme", "off-bot", "switched off", enabled=False)
    registry.catalog.set_allowed("off-bot", ["hr"], allow=True)
    registry.people.ensure_user("root", Role.SUPERADMIN)
    registry.people.ensure_user("amy", Role.ACCOUNT_MANAGER)
    registry.people.assign_am("acme", "amy")
    registry.people.ensure_user("gus", Role.ACCOUNT_MANAGER)
    registry.people.assign_am("globex", "gus")
    registry.people.ensure_user("eve", Role.EXPERT, org_id="acme")
    secrets: dict[str, str] = {"bogus": NOT_A_TOKEN}
    for who, subject in (
        ("agent", {"agent_id": "hr-bot"}),
        ("off", {"agent_id": "off-bot"}),
        ("revoked", {"agent_id": "hr-bot"}),
        ("root", {"user_id": "root"}),
        ("amy", {"user_id": "amy"}),
        ("gus", {"user_id": "gus"}),
        ("eve", {"user_id": "eve"}),
    ):
        record, secret = registry.tokens.create_token(**subject, expires_at=None, created_by="root")
        secrets[who] = secret
        named[record.id] = f"<token:{who}>"
    registry.tokens.revoke_token(
        next(k for k, v in named.items() if v == "<token:revoked>"), actor="root"
    )

    # Jobs as the registry holds them: one running (its process is the fixture's blocker), one
    # COMPLETE ingest with its report, one FAILED research run.
    uploads = settings.home.resolve() / "uploads" / ("0" * 32)
    blocker = registry.jobs.create_job(
        "acme", kind="ingest", inputs=[str(uploads / "handbook.pdf")],
        params={"collection": "hr", "status": "approved", "actor": "amy"},
    )  # fmt: skip
    done = registry.jobs.create_job(
        "acme", kind="ingest", inputs=[str(uploads / "faq.md")],
        params={"collection": "hr", "status": "pending_review", "actor": "amy"},
    )  # fmt: skip
    registry.jobs.update_job_runner(done.id, flow_run_id="00000000-0000-4000-8000-000000000001")
    registry.jobs.finish_job(
        done.id, JobStatus.COMPLETE,
        report={"documents": 1, "chunks": 3, "skipped": [], "doc_ids": [refs["draft-security"]]},
    )  # fmt: skip
    failed = registry.jobs.create_job(
        "globex", kind="research", inputs=[],
        params={"client_name": "Globex", "model": None, "budget_tokens": 50000, "reviewer": "gus"},
    )  # fmt: skip
    registry.jobs.finish_job(
        failed.id, JobStatus.FAILED, reason="the research budget of 50000 tokens was spent"
    )
    for key, job in (("blocker_job", blocker), ("done_job", done), ("failed_job", failed)):
        refs[key] = job.id
        named[job.id] = f"<job:{key.removesuffix('_job')}>"
    return Home(path=settings.home, base="", secrets=secrets, refs=refs, named=named)


# --- the calls ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One request. ``path`` and string bodies may name ``{refs}`` of the fixture or ids kept
    from earlier answers (``keep``: remember the answer's ``job_id`` under that name)."""

    name: str
    method: str
    path: str
    token: str | None = None  # a key of Home.secrets; None: no Authorization header
    json: Any = None
    params: dict[str, Any] | None = None
    files: list[tuple[str, tuple[str, bytes, str]]] | None = None
    data: dict[str, Any] | None = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    keep: str | None = None
    view: Callable[[Any], Any] | None = None  # what of the body is recorded (default: all)


def GET(name: str, path: str, token: str | None = None, **kw: Any) -> Call:
    return Call(name, "GET", path, token, **kw)


def POST(name: str, path: str, token: str | None = None, **kw: Any) -> Call:
    return Call(name, "POST", path, token, **kw)


def _routes(schema: dict[str, Any]) -> list[str]:
    """``METHOD path`` for every operation in an OpenAPI schema."""
    return sorted(f"{m.upper()} {p}" for p, ops in schema["paths"].items() for m in ops)


def _metrics(text: str) -> dict[str, Any]:
    """The metric families, and the counters a fixed run of calls sets exactly (requests'
    latencies and counts also include the launcher's polls of /readyz)."""
    kept = (
        "kbflow_agent_outcomes_total{",
        "kbflow_http_refused_total{",
        "kbflow_search_degraded_total",
    )
    return {
        "families": sorted(line for line in text.splitlines() if line.startswith("# TYPE ")),
        "counters": sorted(line for line in text.splitlines() if line.startswith(kept)),
    }


def _form(*parts: tuple[str, bytes]) -> dict[str, Any]:
    """A multipart body of text fields only (``data=`` alone would send a urlencoded form)."""
    boundary = "kbflow-contract-boundary"
    body = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
        + value
        + b"\r\n"
        for name, value in parts
    )
    body += f"--{boundary}--\r\n".encode()
    return {
        "content": body,
        "headers": {"Content-Type": f"multipart/form-data; boundary={boundary}"},
    }


def _source(body: Any) -> Any:
    """A source's answer (or a list of them) with its id, 12 hex digits made at random, named."""
    if isinstance(body, list):
        return [_source(item) for item in body]
    if isinstance(body, dict):
        return {k: "<source>" if k in ("id", "removed") else v for k, v in body.items()}
    return body


def _mcp(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method} | ({"params": params} if params else {})


LEAVE_Q = "How many weeks of paid parental leave does a birth parent get?"
SEED_FILES = [
    ("files", ("briefs/q3/brief.txt", b"Acme sells e-bikes with a 2-year warranty.", "text/plain")),
    ("files", ("faq.txt", b"Customers ask about battery range and servicing.", "text/plain")),
]  # fmt: skip
SEED_FIELDS = {"urls": ["https://acme.example/"], "prompts": ["Focus on the warranty terms."]}
DRAFTS = "/v1/admin/orgs/acme/drafts"
DOCS = "/v1/admin/documents"
ACME = "/v1/admin/orgs/acme"
MD = "text/markdown"
SOURCES = f"{ACME}/sources"
S3_SOURCE = {"name": "policies", "kind": "filesystem", "collection": "hr",
             "config": {"url": "s3://acme-docs/policies"}, "schedule": "0 6 * * *"}  # fmt: skip

CALLS: list[Call] = [
    # health, and the routes there are
    GET("healthz", "/healthz"),
    GET("readyz", "/readyz"),
    GET("openapi routes", "/openapi.json", view=_routes),
    # who calls: the token's business
    GET("collections: no token", "/v1/agent/collections"),
    POST("search: basic auth", "/v1/agent/search", json={"query": "leave"},
         headers={"Authorization": "Basic cm9vdDpyb290"}),
    POST("search: unknown token", "/v1/agent/search", "bogus", json={"query": "leave"}),
    POST("search: revoked token", "/v1/agent/search", "revoked", json={"query": "leave"}),
    POST("search: a person's token", "/v1/agent/search", "amy", json={"query": "leave"}),
    # the agent routes
    GET("collections", "/v1/agent/collections", "agent"),
    GET("collections: agent switched off", "/v1/agent/collections", "off"),
    POST("search", "/v1/agent/search", "agent", json={"query": "parental leave weeks"}),
    POST("search: in a collection", "/v1/agent/search", "agent",
         json={"query": "hotel limit per night", "collection_id": "{hr_id}", "top_k": 3}),
    POST("search: a collection not allowed", "/v1/agent/search", "agent",
         json={"query": "discount approval", "collection_id": "{sales_id}"}),
    POST("search: agent switched off", "/v1/agent/search", "off", json={"query": "leave"}),
    POST("search: top_k 0", "/v1/agent/search", "agent", json={"query": "leave", "top_k": 0}),
    POST("search: top_k true", "/v1/agent/search", "agent",
         json={"query": "leave", "top_k": True}),
    POST("search: names an agent", "/v1/agent/search", "agent",
         json={"query": "leave", "agent_id": "off-bot"}),
    POST("search: no query", "/v1/agent/search", "agent", json={}),
    POST("search: not json", "/v1/agent/search", "agent", content=b"{not json",
         headers={"Content-Type": "application/json"}),
    POST("ask", "/v1/agent/ask", "agent",
         json={"queries": [LEAVE_Q, "phased return after parental leave"]}),
    POST("ask: no queries", "/v1/agent/ask", "agent", json={"queries": []}),
    POST("answer", "/v1/agent/answer", "agent", json={"question": LEAVE_Q}),
    POST("answer: refused", "/v1/agent/answer", "agent",
         json={"question": "What is the boiling point of tungsten in kelvin?"}),
    POST("answer: agent switched off", "/v1/agent/answer", "off", json={"question": LEAVE_Q}),
    POST("answer: question too long", "/v1/agent/answer", "agent",
         json={"question": "x" * 2001}),
    POST("answer: no token", "/v1/agent/answer", json={"question": LEAVE_Q}),
    # the review queue
    GET("drafts", DRAFTS, "amy"),
    GET("drafts: an expert", DRAFTS, "eve"),
    GET("drafts: approved", DRAFTS, "amy", params={"status": "approved"}),
    GET("drafts: bad status", DRAFTS, "amy", params={"status": "published"}),
    GET("drafts: no token", DRAFTS),
    GET("drafts: an agent", DRAFTS, "agent"),
    GET("drafts: another org's AM", DRAFTS, "gus"),
    GET("drafts: no such org (AM)", "/v1/admin/orgs/no-such-org/drafts", "amy"),
    GET("drafts: no such org (superadmin)", "/v1/admin/orgs/no-such-org/drafts", "root"),
    GET("document", f"{DOCS}/{{draft-stipend}}", "eve"),
    GET("document: another org's AM", f"{DOCS}/{{draft-stipend}}", "gus"),
    GET("document: no such doc (superadmin)", f"{DOCS}/no-such-doc", "root"),
    GET("document: no such doc (AM)", f"{DOCS}/no-such-doc", "gus"),
    # decisions
    POST("approve", f"{DOCS}/{{draft-stipend}}/approve", "amy", json={"note": "checked"}),
    POST("approve: again", f"{DOCS}/{{draft-stipend}}/approve", "amy"),
    POST("reject", f"{DOCS}/{{draft-onboarding}}/reject", "root", json={"note": "outdated"}),
    POST("approve: rejected already", f"{DOCS}/{{draft-onboarding}}/approve", "amy"),
    POST("approve: an expert", f"{DOCS}/{{draft-security}}/approve", "eve"),
    POST("approve: another org's AM", f"{DOCS}/{{draft-security}}/approve", "gus"),
    POST("approve: no token", f"{DOCS}/{{draft-security}}/approve"),
    POST("approve: no such doc (superadmin)", f"{DOCS}/no-such-doc/approve", "root"),
    POST("approve: no such doc (AM)", f"{DOCS}/no-such-doc/approve", "amy"),
    POST("approve: bad note", f"{DOCS}/{{draft-security}}/approve", "amy", json={"note": 5}),
    POST("publish: no such verb", f"{DOCS}/{{draft-security}}/publish", "amy"),
    POST("edit", f"{DOCS}/{{draft-holidays}}/edit", "amy",
         json={"content": EDITED_HOLIDAYS, "note": "added the December closures"}),
    POST("edit: empty content", f"{DOCS}/{{draft-security}}/edit", "amy", json={"content": ""}),
    POST("edit: decided already", f"{DOCS}/{{draft-onboarding}}/edit", "amy",
         json={"content": ONBOARDING}),
    POST("withdraw: no note", f"{DOCS}/{{draft-stipend}}/withdraw", "amy"),
    POST("withdraw", f"{DOCS}/{{draft-stipend}}/withdraw", "amy",
         json={"note": "replaced by the 2026 policy"}),
    GET("document: withdrawn", f"{DOCS}/{{draft-stipend}}", "amy"),
    POST("search: after the decisions", "/v1/agent/search", "agent",
         json={"query": "public holidays December closing", "top_k": 3}),
    # provenance: who was told what
    GET("provenance: a cited document", f"{ACME}/provenance", "eve", params={"doc": "{leave}"}),
    GET("provenance: stale (none)", f"{ACME}/provenance", "amy",
        params={"stale": "true", "since": "7d"}),
    POST("withdraw: a cited document", f"{DOCS}/{{leave}}/withdraw", "root",
         json={"note": "the policy is being rewritten"}),
    GET("provenance: stale", f"{ACME}/provenance", "amy", params={"stale": "true"}),
    GET("provenance: nothing asked", f"{ACME}/provenance", "amy"),
    GET("provenance: bad since", f"{ACME}/provenance", "amy",
        params={"stale": "true", "since": "soon"}),
    GET("provenance: another org's doc", f"{ACME}/provenance", "amy",
        params={"doc": "{globex-travel}"}),
    GET("provenance: another org's AM", f"{ACME}/provenance", "gus", params={"stale": "true"}),
    GET("provenance: an agent", f"{ACME}/provenance", "agent", params={"stale": "true"}),
    # the audit log
    GET("audit", f"{ACME}/audit", "amy", params={"limit": 200}),
    GET("audit: one document", f"{ACME}/audit", "eve", params={"doc": "{draft-stipend}"}),
    GET("audit: bad limit", f"{ACME}/audit", "amy", params={"limit": 0}),
    GET("audit: another org's AM", f"{ACME}/audit", "gus"),
    GET("audit: no such org", "/v1/admin/orgs/no-such-org/audit", "root"),
    # seed inputs
    POST("seed", f"{ACME}/seed", "amy", files=SEED_FILES, data=SEED_FIELDS),
    POST("seed: the same file again", f"{ACME}/seed", "amy", files=SEED_FILES[:1]),
    POST("seed: nothing", f"{ACME}/seed", "amy", **_form()),
    POST("seed: an unknown field", f"{ACME}/seed", "amy", **_form(("colour", b"red"))),
    POST("seed: bad url", f"{ACME}/seed", "amy", **_form(("urls", b"ftp://acme.example/"))),
    POST("seed: not multipart", f"{ACME}/seed", "amy", data={"prompts": ["Warranty terms."]}),
    POST("seed: an expert", f"{ACME}/seed", "eve", files=SEED_FILES[:1]),
    POST("seed: no token", f"{ACME}/seed", files=SEED_FILES[:1]),
    GET("seed list", f"{ACME}/seed", "eve"),
    GET("seed list: another org's AM", f"{ACME}/seed", "gus"),
    GET("seed list: no such org", "/v1/admin/orgs/no-such-org/seed", "amy"),
    # jobs: the fixture's, then an upload and a research run (queued behind the blocker)
    GET("job: running", "/v1/admin/jobs/{blocker_job}", "amy"),
    GET("job: complete", "/v1/admin/jobs/{done_job}", "eve"),
    GET("job: failed", "/v1/admin/jobs/{failed_job}", "gus"),
    GET("job: another org's AM", "/v1/admin/jobs/{done_job}", "gus"),
    GET("job: an agent", "/v1/admin/jobs/{done_job}", "agent"),
    GET("job: no token", "/v1/admin/jobs/{done_job}"),
    GET("job: no such job (AM)", "/v1/admin/jobs/0123456789ab", "amy"),
    GET("job: no such job (other AM)", "/v1/admin/jobs/0123456789ab", "gus"),
    GET("job: bad id", "/v1/admin/jobs/not a job!", "amy"),
    POST("upload", f"{ACME}/documents", "amy",
         files=[("file", ("bereavement.md", UPLOAD, MD))],
         data={"collection": "hr", "status": "pending_review", "source_tag": "handbook"},
         keep="upload_job"),
    POST("research", f"{ACME}/research", "amy",
         json={"client_name": "Acme", "budget_tokens": 50_000}, keep="research_job"),
    GET("job: queued upload", "/v1/admin/jobs/{upload_job}", "eve"),
    GET("job: queued research", "/v1/admin/jobs/{research_job}", "amy"),
    POST("upload: an expert", f"{ACME}/documents", "eve",
         files=[("file", ("bereavement.md", UPLOAD, MD))]),
    POST("upload: not multipart", f"{ACME}/documents", "amy", json={}),
    POST("upload: a program", f"{ACME}/documents", "amy",
         files=[("file", ("tool.exe", b"MZ\x90\x00", "application/x-msdownload"))]),
    POST("upload: empty file", f"{ACME}/documents", "amy", files=[("file", ("empty.md", b"", MD))]),
    POST("upload: bad field", f"{ACME}/documents", "amy",
         files=[("file", ("bereavement.md", UPLOAD, MD))], data={"collection": "../hr"}),
    POST("research: another org's AM", f"{ACME}/research", "gus", json={"client_name": "Acme"}),
    POST("research: no client", f"{ACME}/research", "amy", json={"client_name": ""}),
    POST("research: an expert reviews", f"{ACME}/research", "amy",
         json={"client_name": "Acme", "reviewer": "eve"}),
    POST("research: no such org", "/v1/admin/orgs/no-such-org/research", "root",
         json={"client_name": "Nobody"}),
    # MCP: JSON-RPC over POST /mcp
    POST("mcp tools/list", "/mcp", "agent", json=_mcp("tools/list"), headers=MCP_HEADERS),
    POST("mcp tools/call search", "/mcp", "agent", headers=MCP_HEADERS,
         json=_mcp("tools/call", {"name": "search_knowledge_base",
                                  "arguments": {"query": "hotel limit per night", "top_k": 2}})),
    POST("mcp tools/call: refused", "/mcp", "agent", headers=MCP_HEADERS,
         json=_mcp("tools/call", {"name": "search_knowledge_base",
                                  "arguments": {"query": "discounts", "collection_id": 999}})),
    POST("mcp: no token", "/mcp", json=_mcp("tools/list"), headers=MCP_HEADERS),
    POST("mcp: a person's token", "/mcp", "amy", json=_mcp("tools/list"), headers=MCP_HEADERS),
    GET("mcp: GET", "/mcp", "agent", headers=MCP_HEADERS),
    # what the calls above counted
    GET("metrics", "/metrics", view=_metrics),
    # a withdrawal undone (after the metrics, so their counters stay as recorded): the cited
    # policy withdrawn above comes back as a new approved version; its answers' provenance
    # still names the withdrawn version
    POST("restore: no note", f"{DOCS}/{{leave}}/restore", "amy"),
    POST("restore: another org's AM", f"{DOCS}/{{leave}}/restore", "gus", json={"note": "x"}),
    POST("restore: an expert", f"{DOCS}/{{leave}}/restore", "eve", json={"note": "x"}),
    POST("restore: not withdrawn", f"{DOCS}/{{draft-holidays}}/restore", "amy",
         json={"note": "x"}),
    POST("restore", f"{DOCS}/{{leave}}/restore", "amy",
         json={"note": "the rewrite was dropped"}),
    POST("restore: again", f"{DOCS}/{{leave}}/restore", "root", json={"note": "twice"}),
    GET("document: the withdrawn version after the restore", f"{DOCS}/{{leave}}", "eve"),
    GET("provenance: after the restore", f"{ACME}/provenance", "eve", params={"doc": "{leave}"}),
    GET("audit: after the restore", f"{ACME}/audit", "amy", params={"limit": 2}),
    # one-time review codes (the proof a paused review run's form asks for)
    POST("review code", f"{ACME}/review-codes", "amy"),
    POST("review code: for one run", f"{ACME}/review-codes", "root",
         json={"flow_run_id": "0c1d2e3f-0000-4000-8000-000000000001"}),
    POST("review code: a bad run id", f"{ACME}/review-codes", "amy", json={"flow_run_id": "x"}),
    POST("review code: another org's AM", f"{ACME}/review-codes", "gus"),
    POST("review code: an expert", f"{ACME}/review-codes", "eve"),
    POST("review code: an agent", f"{ACME}/review-codes", "agent"),
    POST("review code: no token", f"{ACME}/review-codes"),
    # synced sources (none is synced here: a sync runs the source-sync flow)
    POST("source add", SOURCES, "amy", json=S3_SOURCE, view=_source),
    POST("source add: the same name again", SOURCES, "amy", json=S3_SOURCE),
    POST("source add: a local folder (AM)", SOURCES, "amy",
         json={**S3_SOURCE, "name": "share", "config": {"url": "/"}}),
    POST("source add: an expert", SOURCES, "eve", json={**S3_SOURCE, "name": "other"}),
    POST("source add: an unknown scheme", SOURCES, "amy",
         json={**S3_SOURCE, "name": "other", "config": {"url": "ftp://acme.example/x"}}),
    POST("source add: a bad body", SOURCES, "amy", json={"name": "other", "kind": "filesystem"}),
    GET("sources", SOURCES, "eve", view=_source),
    GET("sources: another org's AM", SOURCES, "gus"),
    GET("sources: an agent", SOURCES, "agent"),
    GET("sources: no such org (superadmin)", "/v1/admin/orgs/no-such-org/sources", "root"),
    GET("source", f"{SOURCES}/policies", "amy", view=_source),
    GET("source: no such source", f"{SOURCES}/nope", "amy"),
    Call("source update", "PATCH", f"{SOURCES}/policies", "amy",
         json={"status": "approved", "schedule": ""}, view=_source),
    Call("source update: nothing", "PATCH", f"{SOURCES}/policies", "amy", json={}),
    Call("source update: another org's AM", "PATCH", f"{SOURCES}/policies", "gus",
         json={"status": "approved"}),
    POST("source sync: another org's AM", f"{SOURCES}/policies/sync", "gus"),
    POST("source sync: no such source", f"{SOURCES}/nope/sync", "amy"),
    POST("source sync: no token", f"{SOURCES}/policies/sync"),
    Call("source remove: an expert", "DELETE", f"{SOURCES}/policies", "eve"),
    Call("source remove", "DELETE", f"{SOURCES}/policies", "amy", view=_source),
    Call("source remove: again", "DELETE", f"{SOURCES}/policies", "amy"),
]  # fmt: skip


# --- normalising -------------------------------------------------------------------------------

TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
# Ids made at random, by their form: (pattern, placeholder kind). A job id (12 hex digits, as
# is the content hash in an edited document's chunk ids) is known by its key instead (`ID_KEYS`).
GENERATED = (
    (re.compile(r"turn_[0-9a-f]{20}"), "turn"),
    (re.compile(r"tok_[0-9a-f]{12}"), "token"),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "uuid"),
    (re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])"), "id"),
    (re.compile(r"\b[A-Z2-9]{4}-[A-Z2-9]{4}-[A-Z2-9]{4}\b"), "review-code"),
)
ID_KEYS = {"job_id": "job"}
DURATION_KEYS = re.compile(r"(^|_)(ms|seconds|elapsed|duration|latency|took)($|_)|_s$")


class Normaliser:
    """Replaces what varies between runs with stable placeholders (see the module's doc)."""

    def __init__(self, named: dict[str, str], fixed: dict[str, str]) -> None:
        self.seen: dict[str, str] = {}  # value -> placeholder
        self.counts: dict[str, int] = {}
        self.fixed = fixed  # literal text -> placeholder (the server's address, its home)
        self.today = dt.date.today().isoformat()
        self._known: re.Pattern[str] | None = None
        for value, placeholder in named.items():
            self._learn(value, placeholder)

    def _learn(self, value: str, placeholder: str) -> str:
        self.seen[value] = placeholder
        self._known = None
        return placeholder

    def _placeholder(self, kind: str, value: str) -> str:
        if value in self.seen:
            return self.seen[value]
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return self._learn(value, f"<{kind}-{self.counts[kind]}>")

    def register(self, value: Any) -> None:
        """Learn the ids held under `ID_KEYS` in ``value`` (before any text is replaced)."""
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ID_KEYS and isinstance(item, str):
                    self._placeholder(ID_KEYS[key], item)
                else:
                    self.register(item)
        elif isinstance(value, list):
            for item in value:
                self.register(item)

    def text(self, value: str) -> Any:
        if value.startswith("{") and value.endswith("}"):
            try:
                inner = json.loads(value)
            except ValueError:
                pass
            else:
                self.register(inner)
                return {"<json>": self.value(inner)}
        for literal, placeholder in self.fixed.items():
            value = value.replace(literal, placeholder)
        if self.seen:
            if self._known is None:  # each known value, whole (not inside a longer hash)
                alternatives = "|".join(map(re.escape, sorted(self.seen, key=len, reverse=True)))
                self._known = re.compile(rf"(?<![0-9A-Za-z])(?:{alternatives})(?![0-9A-Za-z])")
            value = self._known.sub(lambda m: self.seen[m.group()], value)
        value = TIMESTAMP.sub("<time>", value)
        for pattern, kind in GENERATED:
            value = pattern.sub(lambda m, kind=kind: self._placeholder(kind, m.group()), value)
        return value.replace(self.today, "<today>")

    def value(self, value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {self.text(str(k)): self.value(v, str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v, key) for v in value]
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, int | float) and DURATION_KEYS.search(key):
            return "<duration>"
        if isinstance(value, float):
            return round(value, 3)
        if isinstance(value, str):
            return self.text(value)
        return value


def _fill(value: Any, refs: dict[str, str]) -> Any:
    """``value`` with ``{name}`` replaced by the fixture's (or a kept) value; a string that is
    exactly one numeric ref becomes that number (a collection id)."""
    if isinstance(value, str):
        names = re.fullmatch(r"\{([\w-]+)\}", value)
        if names and refs.get(names.group(1), "").isdigit():
            return int(refs[names.group(1)])
        return re.sub(r"\{([\w-]+)\}", lambda m: refs.get(m.group(1), m.group()), value)
    if isinstance(value, dict):
        return {k: _fill(v, refs) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, refs) for v in value]
    return value


def _run(home: Home, call: Call, refs: dict[str, str]) -> httpx.Response:
    headers = dict(call.headers)
    if call.token is not None:
        headers["Authorization"] = f"Bearer {home.secrets[call.token]}"
    return web.request(
        call.method,
        home.base + _fill(call.path, refs),
        headers=headers,
        json=_fill(call.json, refs),
        params=_fill(call.params, refs),
        files=call.files,
        data=call.data,
        content=call.content,
        timeout=120,
    )


def _recorded(home: Home) -> list[dict[str, Any]]:
    """Every call's answer, normalised, in the table's order."""
    refs = dict(home.refs)
    norm = Normaliser(
        home.named,
        {home.base: "<base>", str(home.path.resolve()): "<home>", str(home.path): "<home>"},
    )
    out = []
    for call in CALLS:
        response = _run(home, call, refs)
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        if call.keep and isinstance(body, dict) and "job_id" in body:
            refs[call.keep] = body["job_id"]
        if call.view is not None and response.status_code in (200, 201):
            body = call.view(body)
        headers = {k: response.headers[k] for k in KEPT_HEADERS if k in response.headers}
        norm.register(body)
        body = norm.value(body)
        out.append({
            "name": call.name,
            "request": f"{call.method} {norm.text(response.request.url.raw_path.decode())}",
            "status": response.status_code,
            "headers": norm.value(headers),
            "body": body,
        })  # fmt: skip
    return out


def test_every_route_answers_as_recorded(home: Home) -> None:
    names = [c.name for c in CALLS]
    assert len(names) == len(set(names)), "call names must be unique"
    got = _recorded(home)
    if RECORD:
        recorded = {"calls": got}
        CONTRACT.write_text(json.dumps(recorded, indent=2, ensure_ascii=False) + "\n")
        return
    assert CONTRACT.exists(), f"no {CONTRACT.name}: record it with KBFLOW_RECORD_HTTP_CONTRACT=1"
    want = {c["name"]: c for c in json.loads(CONTRACT.read_text())["calls"]}
    problems = []
    for answer in got:
        expected = want.pop(answer["name"], None)
        if expected is None:
            problems.append(f"{answer['name']}: not recorded")
        elif expected != answer:
            diff = difflib.unified_diff(
                json.dumps(expected, indent=2, ensure_ascii=False).splitlines(),
                json.dumps(answer, indent=2, ensure_ascii=False).splitlines(),
                "recorded",
                "now",
                lineterm="",
            )
            problems.append(f"{answer['name']}:\n" + "\n".join(diff))
    problems += [f"{name}: recorded, no longer called" for name in want]
    assert not problems, (
        f"{len(problems)} of {len(got)} calls differ from {CONTRACT.name} (a deliberate "
        "change: KBFLOW_RECORD_HTTP_CONTRACT=1)\n\n" + "\n\n".join(problems)
    )


def test_the_table_calls_every_route() -> None:
    """Each route of the service (and /mcp) has at least one call in the table."""
    from kbflow.api.app import create_app

    app = create_app(Settings(home=Path("unused")))  # only built: it opens nothing
    # the OpenAPI document lists every included router's routes (app.routes may hold them lazily)
    routes = {
        (method.upper(), path) for path, item in app.openapi()["paths"].items() for method in item
    }
    assert len(routes) >= 15, routes  # the whole service, not a lazily filled list
    called = set()
    for call in CALLS:
        for method, path in routes:
            pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path))
            if call.method == method and re.fullmatch(pattern, call.path.split("?")[0]):
                called.add((method, path))
    assert routes - called == set(), routes - called
