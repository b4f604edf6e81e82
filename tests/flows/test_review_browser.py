"""The account manager's approval, in a real browser: the Prefect UI's review form, driven by
Playwright in Debian's Chromium, against `kbflow server` on a free loopback port.

A brand-new org is seeded, `kbflow research` runs until its review pauses, and the AM opens the
paused run's page: the form names every draft but shows none of its text (anyone who reaches
the Prefect API can read the form). The AM approves one draft, edits one (pasting its text with
a sentence changed), rejects one, skips one, pastes the proof that her one-time review code
(`kbflow review code`) signed for exactly those decisions and this run (as a program signs
them: `tasks.review.codes.sign_decisions`; the code itself never goes into the form) and
submits. kbflow then has to agree: the approved and edited drafts are
searchable (the edit's new sentence, not the old one), the rejected one never is, the skipped
one is still pending, and the audit log holds exactly those three decisions by that AM. A
second run, submitted with a made-up bare code, ends Failed with the reason on the run's page.

Screenshots of the form (before and after submit) are saved under the test's tmp dir, and into
``$KBFLOW_UI_SCREENSHOTS`` when it is set (`make screenshots` writes docs/img).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tasks.review.codes import sign_decisions
from tests.flows.browser import AM, ORG, Ui, playwright

pytestmark = [pytest.mark.browser, pytest.mark.integration]

playwright_api = playwright()  # or the module is skipped

# A sentence each draft quotes from the brief, and what the AM does with it.
DRAFTS = {
    "Brand voice playbook": ("Our tone is warm, plain and practical.", "approve"),
    "Product context": ("Wren city bike for 899 EUR", "edit"),
    "Compliance notes": ("five-year frame warranty", "reject"),
    "Key contacts": ("Dana Lee", "skip"),
}
OLD, NEW = "Wren city bike for 899 EUR", "Wren city bike for 949 EUR"
# The pictures docs/REVIEW.md and the README show (`make screenshots`).
DOC_SHOTS = ("review-form-top", "review-form-filled", "review-refused")


def shoot(
    page: Any, tmp_path: Path, name: str, *, whole_form: bool = False, dialog: bool = False
) -> Path:
    """Save a screenshot (also into $KBFLOW_UI_SCREENSHOTS): the page, the resume dialog as
    the window shows it (``dialog``), or the whole form in a window tall enough for it
    (``whole_form``)."""
    if whole_form:
        height = page.evaluate("() => document.querySelector('.p-modal__body').scrollHeight")
        page.set_viewport_size({"width": 1400, "height": min(height + 260, 6000)})
        page.wait_for_timeout(500)
    path = tmp_path / f"{name}.png"
    if dialog:
        page.locator(".p-modal__card").screenshot(path=str(path))
    else:
        page.screenshot(path=str(path))
    wanted = os.environ.get("KBFLOW_UI_SCREENSHOTS")
    if wanted and name in DOC_SHOTS:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(wanted) / path.name)
    if whole_form:
        page.set_viewport_size({"width": 1400, "height": 1000})
    return path


def open_form(page: Any, url: str) -> Any:
    page.goto(url)
    page.get_by_role("button", name="Resume").click()
    dialog = page.get_by_role("dialog")
    dialog.wait_for()
    return dialog


def field(scope: Any, page: Any, label: str) -> Any:
    """The form field (with everything under it) whose label starts with ``label``."""
    return scope.locator("div.schema-form-property").filter(
        has=page.locator(".schema-form-property__label", has_text=label)
    )


def choose(page: Any, draft: Any, action: str) -> None:
    # The UI's select opens on the keyboard (a synthetic click does not open its pop-over).
    control = field(draft, page, "Action").last.locator("button.p-select-button__control")
    control.scroll_into_view_if_needed()
    control.focus()
    page.keyboard.press("ArrowDown")
    options = page.locator(".p-pop-over-content").last
    options.get_by_role("option").filter(has_text=re.compile(f"^{action}$")).click()
    playwright_api.expect(control).to_have_text(action)
    playwright_api.expect(page.locator(".p-pop-over-content")).to_have_count(0)


def test_the_am_reviews_each_draft_in_the_prefect_ui(ui: Ui, page: Any, tmp_path: Path) -> None:
    started = time.monotonic()
    research = ui.start(
        "research", "--org", ORG, "--client-name", "Larch Cycles", "--as", AM,
        "--review-timeout", "600", "--json", name="research",
    )  # fmt: skip
    url = ui.paused_run_url("research", research, timeout_s=240)
    by_title = {d["title"].split(" — ")[0]: d for d in ui.data("docs", "list", "--org", ORG)
                if d["source_tag"] == "agent_synthesis"}  # fmt: skip
    assert set(by_title) == set(DRAFTS)

    dialog = open_form(page, url)
    expect = playwright_api.expect
    for number, (title, (sentence, _)) in enumerate(sorted(DRAFTS.items()), start=1):
        draft = field(dialog, page, f"Draft {number} of 4: {title}").first
        draft.scroll_into_view_if_needed()
        expect(draft.get_by_text(by_title[title]["id"]).first).to_be_visible()
        expect(draft.get_by_text(sentence)).to_have_count(0)  # no draft text in the form
        content = field(draft, page, "Content").last.locator("textarea")
        expect(content).to_have_value("")
    shoot(page, tmp_path, "review-form", whole_form=True)
    page.locator(".p-modal__body").evaluate("body => { body.scrollTop = 0 }")
    shoot(page, tmp_path, "review-form-top", dialog=True)

    chosen: dict[str, Any] = {}  # what the form will send, for the proof
    for number, (title, (_, action)) in enumerate(sorted(DRAFTS.items()), start=1):
        draft = field(dialog, page, f"Draft {number} of 4: {title}").first
        if action == "skip":
            continue
        choose(page, draft, action)
        text = ""
        if action == "edit":  # the AM copies the draft's text (inbox, `review show`), edits it
            text = ui.data("review", "show", by_title[title]["id"], "--as", AM, "--json")["text"]
            text = text.replace(OLD, NEW)
            content = field(draft, page, "Content").last.locator("textarea")
            content.fill(text)
        field(draft, page, "Note").last.locator("textarea").fill(f"{action} in the UI")
        chosen[f"doc_{by_title[title]['id']}"] = {
            "action": action,
            "content": text,
            "note": f"{action} in the UI",
        }
    # The proof: the AM's one-time code signs exactly these decisions for this run (issue 41:
    # the code itself never goes into the form, where the Prefect API would keep it readable).
    code = ui.data("review", "code", "--org", ORG, "--as", AM, "--json")["code"]
    proof = sign_decisions(code, url.rsplit("/", 1)[1], chosen)
    field(dialog, page, "Your decision proof").first.locator("textarea").fill(proof)
    shoot(page, tmp_path, "review-form-filled", whole_form=True)
    dialog.get_by_role("button", name="Submit").click()
    dialog.wait_for(state="hidden")

    assert research.wait(timeout=120) == 0, (ui.home.parent / "research.err").read_text()
    page.reload()
    expect(page.get_by_text("Completed", exact=True).first).to_be_visible(timeout=30_000)
    shoot(page, tmp_path, "review-submitted")

    # What kbflow says now.
    status = {d["id"]: d["status"] for d in ui.data("docs", "list", "--org", ORG)}
    ids = {title: by_title[title]["id"] for title in DRAFTS}
    assert status[ids["Brand voice playbook"]] == "approved"
    assert status[ids["Product context"]] == "approved"
    assert status[ids["Compliance notes"]] == "rejected"
    assert status[ids["Key contacts"]] == "pending_review"

    def hits(query: str) -> list[dict[str, Any]]:
        found = ui.data("search", query, "--org", ORG, "--as", "root", "-k", "20")["hits"]
        return [h for h in found if h["collection"] != "am-inputs"]

    product = [h for h in hits("Wren city bike price EUR") if h["doc_id"] == ids["Product context"]]
    assert product and any(NEW in h["text"] for h in product)
    assert not any(OLD in h["text"] for h in product)  # the edit, not the draft
    voice = hits("tone warm plain practical")
    assert ids["Brand voice playbook"] in {h["doc_id"] for h in voice}
    for query in ("five-year frame warranty UK consumer law", "Dana Lee customer service"):
        found = {h["doc_id"] for h in hits(query)}
        assert ids["Compliance notes"] not in found and ids["Key contacts"] not in found

    decisions = [
        (r["action"].removeprefix("kb.document."), r["doc_id"], r["actor"])
        for r in ui.data("audit", "--org", ORG)
        if r["action"] in ("kb.document.approved", "kb.document.rejected",
                           "kb.document.edited_approved", "kb.document.withdrawn")
    ]  # fmt: skip
    assert sorted(decisions) == sorted(
        [
            ("approved", ids["Brand voice playbook"], AM),
            ("edited_approved", ids["Product context"], AM),
            ("rejected", ids["Compliance notes"], AM),
        ]
    )
    print(f"browser review took {time.monotonic() - started:.0f}s")


# Slow: the same refusal is checked at the flow (tests/flows/test_review.py, a typed name and
# no code, a used code) and in the inbox (tests/kbflow/test_inbox.py); this one adds the form.
@pytest.mark.slow
def test_a_submission_without_a_valid_code_fails_the_run(ui: Ui, page: Any, tmp_path: Path) -> None:
    # The draft skipped above is still pending: a new review run pauses for it.
    review = ui.start("review", "flow", "--org", ORG, "--as", AM, "--timeout", "600",
                      name="review")  # fmt: skip
    url = ui.paused_run_url("review", review, timeout_s=120)
    before = ui.data("docs", "list", "--org", ORG)

    dialog = open_form(page, url)
    field(dialog, page, "Your decision proof").first.locator("textarea").fill("MADE-UPCO-DE42")
    draft = field(dialog, page, "Draft 1 of 1: Key contacts").first
    choose(page, draft, "approve")
    dialog.get_by_role("button", name="Submit").click()
    dialog.wait_for(state="hidden")

    assert review.wait(timeout=120) == 1, (ui.home.parent / "review.err").read_text()
    page.reload()
    expect = playwright_api.expect
    expect(page.get_by_text("Failed", exact=True).first).to_be_visible(timeout=30_000)
    page.get_by_text("Details", exact=True).click()
    # The UI shortens a long state message ("… See More"): its start says it was refused.
    reason = page.get_by_text(re.compile("refused: nothing was applied"))
    expect(reason.first).to_be_visible()
    shoot(page, tmp_path, "review-refused")
    assert ui.data("docs", "list", "--org", ORG) == before  # nothing was applied
    assert "bare review code" in (ui.home.parent / "review.err").read_text()
