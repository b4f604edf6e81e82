"""The account manager's whole day in the browser (issue 44), with a real login and no CLI.

`kbflow serve` starts first and `kbflow server` (Prefect) after it, on one data dir, as an
operator might bring them up: nothing tells the service where the Prefect server is. A small
website on 127.0.0.1 stands for the client's (the SSRF guard's test-only loopback switch lets
research fetch it). In Debian's Chromium, driven by Playwright, the org's account manager:

1. adds a PDF, a Word file, a spreadsheet, the site's URL and a steering prompt on the seed page;
2. starts research on the research page and watches it to four drafts (its stages are recorded);
3. edits one draft and approves it: that decision goes through the run's paused review, which
   ends Completed (the service found the server started after it); approves two as they are
   and rejects one;
4. in the library, withdraws an approved document and restores it (the withdrawn list is then
   empty of it);
5. re-runs research: the rejected draft does not come back, nor do the approved ones (the
   same text again), and her edited document is offered as a change against her text (the
   diff removes her line).

An agent's search over HTTP then serves exactly the approved, the edited and the restored
documents. Screenshots of the seed page, the research page and the library are saved under the
test's tmp dir, and into ``$KBFLOW_UI_SCREENSHOTS`` when it is set (`make screenshots`).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kbflow.api.launch import launched
from tests.conftest import free_port
from tests.flows.browser import AM, ORG, Ui, chromium_tab, kbflow_server, playwright, shoot
from tests.flows.source_servers import serve_http

pytestmark = [pytest.mark.browser, pytest.mark.integration]

playwright_api = playwright()  # or the module is skipped
expect = playwright_api.expect

ROOT, AGENT = "root", "helper"
PASSWORD = "seeds-and-reviews-all-day-42"
TITLES = ("Brand voice playbook", "Compliance notes", "Key contacts", "Product context")
EDITED, APPROVED, WITHDRAWN, REJECTED = TITLES[3], TITLES[0], TITLES[2], TITLES[1]
ADDED = "Every Wren city bike ships with a brass bell and dynamo lights."
SITE = """<!doctype html><html><head><title>Larch Cycles | City and cargo bikes</title></head>
<body><h1>Larch Cycles</h1>
<p>Larch Cycles builds city and cargo bikes in Leeds and sells them across the UK.</p>
<p>Customer service: Dana Lee, dana@larch.example, +44 20 7946 0018, weekdays 9:00 to 17:00.</p>
<p>Every frame carries a five-year warranty under UK consumer law.</p></body></html>"""
PROMPT = "Our readers are commuters; keep the tone warm, plain and practical."


@dataclass
class Day:
    home: Path
    env: dict[str, str]
    serve: str  # kbflow serve, e.g. http://127.0.0.1:PORT
    prefect: str  # kbflow server's UI, e.g. http://127.0.0.1:PORT
    site: str  # the client's website
    files: list[Path]
    token: str  # the org's agent's bearer token

    def kbflow(self, *args: str) -> subprocess.CompletedProcess[str]:
        return Ui(self.home, self.prefect, self.env).kbflow(*args)

    def data(self, *args: str) -> Any:
        return json.loads(self.kbflow(*args, "--json").stdout)


def _seed_files(folder: Path) -> list[Path]:
    """A PDF, a Word file and a spreadsheet shaped like a client's: a brief with a list, a
    product sheet with headings and bullets, a price list in a table."""
    import docx
    import openpyxl
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_title("Larch Cycles brand brief")
    pdf.add_page()
    pdf.set_font("helvetica", size=12)
    for line in (
        "Larch Cycles brand brief",
        "Our tone is warm, plain and practical.",
        "- Say what a bike does before what it is made of.",
        "- Name prices in euros and the warranty in years.",
        "- Never promise delivery dates we cannot keep.",
        "Customer service is run by Dana Lee, dana@larch.example, +44 20 7946 0018.",
    ):
        pdf.multi_cell(0, 8, line, new_x="LMARGIN", new_y="NEXT")
    pdf.output(str(brief := folder / "brand-brief.pdf"))

    document = docx.Document()
    document.core_properties.title = "Larch Cycles products"
    document.add_heading("Larch Cycles products", 1)
    document.add_paragraph("The Wren city bike costs 899 EUR and suits daily commutes.")
    for item in ("Wren city bike: steel frame, 8 gears", "Kestrel cargo bike: carries 100 kg",
                 "Finch kids bike: for ages 6 to 9"):  # fmt: skip
        document.add_paragraph(item, style="List Bullet")
    document.add_heading("Warranty", 2)
    document.add_paragraph("All bikes carry a five-year frame warranty under UK consumer law.")
    document.save(products := folder / "products.docx")

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Prices"
    sheet.append(["Product", "Price (EUR)", "Frame warranty (years)"])
    for row in (["Wren city bike", 899, 5], ["Kestrel cargo bike", 2400, 5],
                ["Finch kids bike", 349, 2]):  # fmt: skip
        sheet.append(row)
    book.save(prices := folder / "prices.xlsx")
    return [brief, products, prices]


@contextlib.contextmanager
def _website(root: Path) -> Iterator[str]:
    """The client's website on 127.0.0.1 until the block ends."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "index.html").write_text(SITE)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    with contextlib.contextmanager(serve_http)(handler) as base:
        yield f"{base}/"


def _stop_jobs(home: Path, env: dict[str, str]) -> None:
    """End the research jobs still waiting for a review (each is its own session)."""
    done = subprocess.run(
        [sys.executable, "-m", "kbflow.cli", "jobs", "list", "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    running = [j["pid"] for j in json.loads(done.stdout) if j["status"] == "PROCESSING"]
    for pid in filter(None, running):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)  # the job's own session: it and what it started
    for pid in filter(None, running):
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # serve may not reap it
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def _without_prefect_url() -> Iterator[None]:
    """This process's PREFECT_API_URL unset for the block (a test before may have set one)."""
    saved = os.environ.pop("PREFECT_API_URL", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["PREFECT_API_URL"] = saved


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Day]:
    """A brand-new org with its AM (a password, nothing seeded), `kbflow serve` started, then
    `kbflow server`, and the client's website; torn down in the reverse order."""
    base = tmp_path_factory.mktemp("am-day")
    home = base / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "KBFLOW_"))}
    env |= {
        "KBFLOW_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "KBFLOW_SOURCES_TEST_ALLOW_LOOPBACK": "true",  # honoured only while a test runs
        "KBFLOW_RESEARCH_FETCH_TIMEOUT_S": "5",
    }
    admin = Ui(home, "", env)
    admin.kbflow("users", "add", ROOT, "--role", "superadmin")
    admin.kbflow("orgs", "create", ORG, "--name", "Larch Cycles", "--as", ROOT)
    admin.kbflow("users", "add", AM, "--role", "account_manager", "--as", ROOT)
    admin.kbflow("orgs", "assign-am", ORG, AM, "--as", ROOT)
    admin.kbflow("agents", "create", "--org", ORG, AGENT, "--as", ROOT)
    token = json.loads(admin.kbflow("tokens", "create", "--agent", AGENT, "--as", ROOT,
                                    "--json").stdout)["secret"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "kbflow.cli", "users", "set-password", AM, "--as", ROOT,
         "--password-stdin"],
        input=PASSWORD + "\n", capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    files = _seed_files(base)
    # serve starts knowing of no Prefect server (`launched` passes this process's environment)
    with (
        _website(base / "site") as site,
        _without_prefect_url(),
        launched(home, base / "serve.log", env=env, require_ready=False) as served,
    ):
        port = free_port()
        with kbflow_server(port, env, base / "server.log"):  # after serve, not before
            try:
                yield Day(home, env, served.base, f"http://127.0.0.1:{port}", site, files, token)
            finally:  # a research job waiting for its review would outlive the server
                _stop_jobs(home, env)


@pytest.fixture
def tab(day: Day) -> Iterator[Any]:
    with chromium_tab(1366, 900) as tab:
        yield tab


def _flash(tab: Any) -> Any:
    return tab.locator("p.flash")


def _nav(tab: Any, name: str) -> None:
    tab.get_by_role("navigation").get_by_role("link", name=name, exact=True).click()


def _research(tab: Any, tmp_path: Path, *, shot: str | None) -> list[str]:
    """Start a run on the research page and follow it (the page reloads itself) until it has
    drafts waiting or is done; the stages the page showed on the way."""
    _nav(tab, "Research")
    runs = tab.locator("table.runs tbody tr")
    before = runs.count()
    tab.get_by_role("button", name="Start research").click()
    expect(runs).to_have_count(before + 1)
    newest = runs.first.locator("span.status")
    seen: list[str] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with contextlib.suppress(playwright_api.Error):  # the page was reloading
            stage = newest.inner_text(timeout=2_000).strip()
            if not seen or seen[-1] != stage:
                seen.append(stage)
            if stage in ("drafts ready", "done", "failed"):
                break
        time.sleep(0.25)
    assert seen and seen[-1] in ("drafts ready", "done"), (seen, runs.first.inner_text())
    if shot:
        shoot(tab, tmp_path, shot)
    return seen


def _open(tab: Any, base: str, title: str) -> str:
    """Open the inbox's draft titled ``title``; its doc id."""
    tab.goto(f"{base}/review")
    tab.locator(f"section#org-{ORG} table.list a", has_text=title).click()
    expect(tab.locator("header.doc-head h1")).to_contain_text(title)
    return tab.url.rsplit("/", 1)[-1].split("?")[0]


def _served(day: Day) -> dict[str, list[str]]:
    """What the org's agent is served over HTTP (doc id -> hit texts): the org has a few dozen
    chunks, so the top 50 hits are all it serves."""
    request = urllib.request.Request(
        f"{day.serve}/v1/agent/search",
        data=json.dumps({"query": "Larch Cycles bikes", "top_k": 50}).encode(),
        headers={"Authorization": f"Bearer {day.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        hits = json.load(resp)["results"]
    found: dict[str, list[str]] = {}
    for hit in hits:
        found.setdefault(hit["doc_id"], []).append(hit["text"])
    return found


def test_the_account_managers_whole_day(day: Day, tab: Any, tmp_path: Path) -> None:
    base = day.serve
    tab.goto(f"{base}/review")
    tab.get_by_label("User id").fill(AM)
    tab.get_by_label("Password", exact=True).fill(PASSWORD)
    tab.get_by_role("button", name="Log in").click()
    expect(tab.get_by_role("heading", name="Drafts waiting for review")).to_be_visible()

    # 1. Seeds: three files, the website and a prompt, in one form.
    _nav(tab, "Seeds")
    tab.get_by_label(re.compile("^Files")).set_input_files([str(f) for f in day.files])
    tab.get_by_label("URLs to research (one per line)").fill(day.site)
    tab.get_by_label("Steering prompt (optional)").fill(PROMPT)
    tab.get_by_role("button", name="Add to the seed bundle").click()
    expect(_flash(tab)).to_contain_text("5")
    rows = tab.locator("table.seeds tbody tr")
    expect(rows).to_have_count(5)
    uris = tab.locator("table.seeds code.uri").all_inner_texts()
    assert day.site in uris, uris  # the whole URI, not cut
    assert sorted(u.rsplit("/", 1)[-1] for u in uris if u.startswith("upload:")) == sorted(
        f.name for f in day.files
    ), uris
    shoot(tab, tmp_path, "seed-page")

    # 2. Research from the page, followed to four drafts; the run links its Prefect page.
    stages = _research(tab, tmp_path, shot=None)
    assert stages[-1] == "drafts ready", stages
    # its spend so far beside its cap while the drafts wait (the final report comes later)
    expect(tab.locator("table.runs tbody tr").first).to_contain_text(
        re.compile(r"\b[1-9][\d,]* of 200,000 tokens")
    )
    link = tab.locator("table.runs tbody tr").first.get_by_role("link", name="Prefect run")
    href = link.get_attribute("href") or ""
    assert re.fullmatch(rf"{day.prefect}/runs/flow-run/[0-9a-f-]{{36}}", href), href
    with urllib.request.urlopen(
        f"{day.prefect}/api/flow_runs/{href.rsplit('/', 1)[-1]}", timeout=10
    ) as resp:
        assert json.load(resp)["name"], "the linked run exists on the server started after serve"
    tab.get_by_role("link", name="review them").click()
    listed = tab.locator(f"section#org-{ORG} table.list a")
    expect(listed).to_have_count(4)
    assert sorted(t.split(" — ")[0] for t in listed.all_inner_texts()) == sorted(TITLES)

    # 3. Edit one (through the paused run), approve two, reject one.
    ids = {title: _open(tab, base, title) for title in TITLES}
    _open(tab, base, EDITED)
    editor = tab.locator("textarea#content")
    text = editor.input_value()
    first_item = next(line for line in text.splitlines() if line.startswith("- "))
    editor.fill(text.replace(first_item, f"{first_item}\n- {ADDED}", 1))
    tab.get_by_role("button", name="Approve with my edits").click()
    expect(_flash(tab)).to_contain_text("Your edit is approved.")
    paused = re.search(r"paused review run ([0-9a-f-]{36})", _flash(tab).inner_text())
    assert paused, _flash(tab).inner_text()  # not applied directly: serve found the server
    state = ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and state != "COMPLETED":
        with urllib.request.urlopen(f"{day.prefect}/api/flow_runs/{paused.group(1)}",
                                    timeout=10) as resp:  # fmt: skip
            state = json.load(resp)["state"]["type"]
        time.sleep(0.5)
    assert state == "COMPLETED"
    for title in (APPROVED, WITHDRAWN):
        _open(tab, base, title)
        tab.get_by_role("button", name="Approve as it is").click()
        expect(_flash(tab)).to_have_text("Approved.")
    _open(tab, base, REJECTED)
    tab.get_by_label("Why reject it (required)").fill("Not legal advice we can stand behind.")
    tab.get_by_role("button", name="Reject").click()
    expect(_flash(tab)).to_have_text("Rejected.")

    # 4. The library: withdraw an approved document, then restore it.
    _nav(tab, "Library")
    tab.locator("table.library a", has_text=WITHDRAWN).click()
    tab.get_by_label(re.compile("^Why withdraw it")).fill("the contacts are being checked")
    tab.get_by_role("button", name="Withdraw").click()
    expect(tab.locator(".status")).to_have_text("withdrawn")
    tab.goto(f"{base}/review/library?org={ORG}&status=withdrawn")
    expect(tab.locator("table.library a", has_text=WITHDRAWN)).to_have_count(1)
    tab.locator("table.library a", has_text=WITHDRAWN).click()
    tab.get_by_label("Why restore it (required)").fill("the contacts are right")
    tab.get_by_role("button", name="Restore as a new approved version").click()
    expect(_flash(tab)).to_have_text("Restored: this is the new approved version.")
    restored = tab.url.rsplit("/", 1)[-1].split("?")[0]
    assert restored != ids[WITHDRAWN]
    tab.goto(f"{base}/review/library?org={ORG}&status=withdrawn")
    expect(tab.locator("p.empty")).to_have_text("No document matches.")
    tab.goto(f"{base}/review")
    expect(tab.locator("summary", has_text="Withdrawn documents")).to_have_count(0)
    _nav(tab, "Library")
    expect(tab.locator("table.library tbody tr")).to_have_count(3)
    shoot(tab, tmp_path, "library")

    # 5. Research again: what she rejected stays out; her edit is what a new draft changes.
    again = _research(tab, tmp_path, shot="research-page")
    # Each run recorded its stages on its job as it went (the page shows the one it is in).
    logs = sorted((day.home / "jobs").glob("*.log"))
    assert len(logs) == 2, logs
    for log in logs:
        told = [json.loads(t) for t in
                re.findall(r"research job \w+: progress (\{.*\})", log.read_text())]  # fmt: skip
        spent = told[-1].pop("tokens", None) if told else None
        assert told == [
            {"stage": "reading", "done": 0, "total": 5},
            *({"stage": "fetching", "done": n, "total": 4} for n in range(1, 5)),
            {"stage": "synthesising"},
            {"stage": "saving"},
        ], (log.name, told)
        assert isinstance(spent, int) and 0 < spent <= 200_000, spent  # what it had spent
    print(f"the research page showed {' > '.join(stages)}, then again {' > '.join(again)}")
    tab.goto(f"{base}/review")
    waiting = tab.locator(f"section#org-{ORG} table.list a").all_inner_texts()
    # Only her edited document waits: the rejected one and the two approved (one restored)
    # ones, word for word the same, are not proposed again.
    assert [t.split(" — ")[0] for t in waiting] == [EDITED], waiting
    _open(tab, base, EDITED)
    expect(tab.locator("p.edited-by")).to_contain_text(f"the text {AM} edited and approved")
    expect(tab.locator("pre.diff .d-del", has_text=ADDED)).to_have_count(1)

    # An agent is served exactly the approved, the edited and the restored documents.
    served = _served(day)
    assert set(served) == {ids[APPROVED], ids[EDITED], restored}, served
    assert any(ADDED in t for t in served[ids[EDITED]])  # her text, not the draft's
