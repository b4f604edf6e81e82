"""The review inbox (`kbflow serve`, /review) in a real browser: an account manager decides on a
research run's drafts by clicking, in Debian's Chromium driven by Playwright.

`kbflow server` (Prefect) and `kbflow serve` run on free loopback ports over one data dir (the
Prefect server and the seeded org come from `test_review_browser`'s fixture, plus a price list
with a table). `kbflow research` runs until its review pauses; the AM logs in with the password
`kbflow users set-password` gave her, opens each of the four drafts (lists as list items, the
price table as a table, citations as titled links), edits one in the editor (sees her change in
the diff, approves it: that decision goes to the paused run, which applies it and completes),
approves one, rejects one with a note and leaves one. kbflow then has to agree: the research
command exits 0, the audit names her for the three decisions, and search serves exactly the
approved and the edited drafts. Last, the approved one is withdrawn (`kbflow review withdraw`)
and a superadmin logs in and restores it: the new version is searchable and the audit names him.

Screenshots of the inbox and of a draft page are saved under the test's tmp dir, and into
``$KBFLOW_UI_SCREENSHOTS`` when it is set (`make screenshots` writes docs/img).
"""

from __future__ import annotations

import json
import re
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
from tests.flows.browser import AM, ORG, Ui, playwright, shoot

pytestmark = [pytest.mark.browser, pytest.mark.integration]

playwright_api = playwright()  # or the module is skipped

ROOT = "root"
PASSWORDS = {AM: "reviews-drafts-with-care-42", ROOT: "restores-withdrawn-things-42"}
PRICES = """# Larch Cycles price list

## Bikes

| Product | Price | Frame warranty |
|---|---|---|
| Wren city bike | 899 EUR | 5 years |
| Kestrel cargo bike | 2,400 EUR | 5 years |
| Finch kids bike | 349 EUR | 2 years |
"""
TITLES = ("Brand voice playbook", "Compliance notes", "Key contacts", "Product context")
EDITED, APPROVED = "Product context", "Brand voice playbook"
REJECTED, LEFT = "Compliance notes", "Key contacts"
ADDED = "Every Wren city bike ships with a brass bell and dynamo lights."
HEX_ID = re.compile(r"^[0-9a-f]{32}$")
expect = playwright_api.expect


@dataclass
class Inbox:
    ui: Ui
    base: str  # kbflow serve, e.g. http://127.0.0.1:PORT


@pytest.fixture(scope="module")
def inbox(ui: Ui) -> Iterator[Inbox]:
    """The org of `ui` with a price list seeded too, inbox passwords for its AM and a
    superadmin, and `kbflow serve` over the same data, sending decisions to `ui`'s Prefect."""
    prices = ui.home.parent / "prices.md"
    prices.write_text(PRICES)
    ui.kbflow("seed", "--org", ORG, "--as", AM, "--file", str(prices))
    for user, password in PASSWORDS.items():
        done = subprocess.run(
            [sys.executable, "-m", "kbflow.cli", "users", "set-password", user, "--as", ROOT,
             "--password-stdin"],
            input=password + "\n", capture_output=True, text=True, env=ui.env, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    log = ui.home.parent / "serve.log"
    with launched(ui.home, log, env=ui.env, require_ready=False) as served:
        yield Inbox(ui, served.base)


def log_in(tab: Any, base: str, user: str) -> None:
    tab.goto(f"{base}/review")
    expect(tab).to_have_url(re.compile(r"/review/login\?"))
    tab.get_by_label("User id").fill(user)
    tab.get_by_label("Password", exact=True).fill(PASSWORDS[user])
    tab.get_by_role("button", name="Log in").click()
    expect(tab.get_by_role("heading", name="Drafts waiting for review")).to_be_visible()


def open_from_inbox(tab: Any, base: str, title: str) -> str:
    """Click the draft titled ``title`` in the inbox; its doc id."""
    tab.goto(f"{base}/review")
    tab.locator(f"section#org-{ORG} table.list a", has_text=title).click()
    expect(tab.locator("header.doc-head h1")).to_contain_text(title)
    return tab.url.rsplit("/", 1)[-1].split("?")[0]


def flash(tab: Any) -> Any:
    return tab.locator("p.flash")


def test_the_am_decides_in_the_inbox(
    inbox: Inbox,
    page: Any,
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    kb, base = inbox.ui, inbox.base
    research = kb.start(
        "research", "--org", ORG, "--client-name", "Larch Cycles", "--as", AM,
        "--review-timeout", "600", "--json", name="research",
    )  # fmt: skip
    run_url = kb.paused_run_url("research", research, timeout_s=300)
    run_id = run_url.rsplit("/", 1)[-1]
    paused_at = time.monotonic()

    log_in(page, base, AM)
    cookie = next(c for c in page.context.cookies() if c["name"] == "kbflow_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/review"
    listed = page.locator(f"section#org-{ORG} table.list a")
    expect(listed).to_have_count(4)
    assert sorted(t.split(" — ")[0] for t in listed.all_inner_texts()) == sorted(TITLES)
    expect(page.locator(f"section#org-{ORG} h3", has_text="Research run")).to_have_count(1)
    shoot(page, tmp_path, "inbox")

    # She reads each draft: lists, the price table, citations as titled links.
    ids: dict[str, str] = {}
    items: dict[str, int] = {}
    for title in TITLES:
        ids[title] = open_from_inbox(page, base, title)
        draft = page.locator("div.draft")
        items[title] = draft.locator("li").count()
        sources = page.locator("section.sources a")
        expect(sources.first).to_be_visible()
        names = sources.all_inner_texts()
        assert "Larch Cycles brief" in names, names
        assert not any(HEX_ID.match(n.strip()) for n in names), names
        inline = draft.locator("a", has_text="Larch Cycles brief").first
        expect(inline).to_have_attribute("href", re.compile(r"^/review/documents/[0-9a-f]{32}$"))
        if title == EDITED:
            kestrel = draft.locator("table tr", has=page.locator("td", has_text="Kestrel"))
            expect(kestrel.locator("td").nth(1)).to_have_text("2,400 EUR")
            expect(draft.locator("table th").first).to_have_text("Product")
            expect(page.locator("section.sources a", has_text="Larch Cycles price list"))\
                .to_have_count(1)  # fmt: skip
    assert max(items.values()) >= 2, items

    # The edit, in the editor: her change in the diff, then approved (through the paused run).
    open_from_inbox(page, base, EDITED)
    editor = page.locator("textarea#content")
    assert int(editor.get_attribute("rows") or 0) > 10
    text = editor.input_value()
    first_item = next(line for line in text.splitlines() if line.startswith("- "))
    editor.fill(text.replace(first_item, f"{first_item}\n- {ADDED}", 1))
    page.get_by_role("button", name="Show my changes").click()
    expect(page.get_by_role("heading", name="Your changes")).to_be_visible()
    expect(page.locator("pre.diff .d-add")).to_have_text([f"+ - {ADDED}"])
    expect(page.locator("pre.diff .d-del")).to_have_count(0)
    shoot(page, tmp_path, "draft-page")
    page.get_by_role("button", name="Approve with my edits").click()
    expect(flash(page)).to_contain_text("Your edit is approved.")
    expect(flash(page)).to_contain_text(f"paused review run {run_id}")

    # The run applied it and completed; the research command exits 0.
    assert research.wait(timeout=180) == 0, (kb.home.parent / "research.err").read_text()
    review = json.loads((kb.home.parent / "research.out").read_text())["review"]
    assert (review["reviewer"], review["applied"], review["skipped"]) == (AM, 1, 3), review
    assert [(o["doc_id"], o["action"], o["result"]) for o in review["outcomes"]] == [
        (ids[EDITED], "edit", "applied")
    ]
    with urllib.request.urlopen(f"{kb.url}/api/flow_runs/{run_id}", timeout=10) as resp:
        assert json.load(resp)["state"]["type"] == "COMPLETED"
    page.reload()
    expect(page.locator(".status")).to_have_text("approved")
    decided = time.monotonic()

    # Approve one as it is, reject one with a note (the run is done: these apply directly).
    open_from_inbox(page, base, APPROVED)
    page.get_by_role("button", name="Approve as it is").click()
    expect(flash(page)).to_have_text("Approved.")
    expect(page.locator(".status")).to_have_text("approved")
    open_from_inbox(page, base, REJECTED)
    page.get_by_label("Why reject it (required)").fill("Not legal advice we can stand behind.")
    page.get_by_role("button", name="Reject").click()
    expect(flash(page)).to_have_text("Rejected.")
    expect(page.locator(".status")).to_have_text("rejected")
    page.goto(f"{base}/review")
    expect(page.locator(f"section#org-{ORG} table.list a")).to_have_text([re.compile(LEFT)])

    served = _served(kb)
    assert set(served) == {ids[EDITED], ids[APPROVED]}, served
    assert any(ADDED in text for text in served[ids[EDITED]])  # the edit, not the draft

    # Withdrawn from the CLI; a superadmin logs in and restores it in the browser.
    kb.kbflow("review", "withdraw", ids[APPROVED], "--note", "tone under review", "--as", AM)
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    log_in(page, base, ROOT)
    page.locator("summary", has_text="Withdrawn documents (1)").click()
    page.locator(f"section#org-{ORG} details a", has_text=APPROVED).click()
    page.get_by_label("Why restore it (required)").fill("the tone is fine after all")
    page.get_by_role("button", name="Restore as a new approved version").click()
    expect(flash(page)).to_have_text("Restored: this is the new approved version.")
    restored = page.url.rsplit("/", 1)[-1].split("?")[0]
    assert restored != ids[APPROVED]
    expect(page.locator(".status")).to_have_text("approved")
    served = _served(kb)
    assert set(served) == {ids[EDITED], restored}, served

    # The restored version leaves the withdrawn list; the library lists what the org serves,
    # and neither page scrolls sideways on a phone (issue 44).
    page.goto(f"{base}/review")
    expect(page.locator("summary", has_text="Withdrawn documents")).to_have_count(0)
    page.set_viewport_size({"width": 390, "height": 844})
    for where in ("/review", f"/review/library?org={ORG}", f"/review/documents/{restored}"):
        page.goto(f"{base}{where}")
        wide = page.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390, f"{where} is {wide} px wide at 390 px"
    page.goto(f"{base}/review")
    page.get_by_role("link", name="Library").click()
    rows = page.locator("table.library tbody tr", has_text=APPROVED)
    expect(rows).to_have_count(1)
    expect(rows.locator("a")).to_have_attribute("href", f"/review/documents/{restored}")
    shoot(page, tmp_path, "library-phone")

    # The audit names who decided what (the restore's row names the new version).
    assert sorted(_decisions(kb)) == sorted(
        [
            ("edited_approved", ids[EDITED], AM),
            ("approved", ids[APPROVED], AM),
            ("rejected", ids[REJECTED], AM),
            ("withdrawn", ids[APPROVED], AM),
            ("restored", restored, ROOT),
        ]
    )
    print(
        f"research paused after {paused_at - started:.0f}s, the AM's edit went through the run "
        f"after {decided - paused_at:.0f}s more, the rest took {time.monotonic() - decided:.0f}s"
    )


def _decisions(kb: Ui) -> list[tuple[str, str, str]]:
    kinds = ("approved", "rejected", "edited_approved", "withdrawn", "restored")
    return [
        (r["action"].removeprefix("kb.document."), r["doc_id"], r["actor"])
        for r in kb.data("audit", "--org", ORG)
        if r["action"].removeprefix("kb.document.") in kinds
    ]


def _served(kb: Ui) -> dict[str, list[str]]:
    """The research drafts search serves (doc id -> hit texts): the org has a dozen chunks,
    so the top 50 hits are all it serves."""
    found: dict[str, list[str]] = {}
    hits = kb.data("search", "Larch Cycles", "--org", ORG, "--as", ROOT, "-k", "50")["hits"]
    for hit in hits:
        if hit["collection"] != "am-inputs":
            found.setdefault(hit["doc_id"], []).append(hit["text"])
    return found
