"""A hostile draft in the review inbox is inert in a real browser (Debian's Chromium, driven by
Playwright): draft text comes from fetched public pages, so it is attacker-controlled.

One pending draft (and its title) holds a script tag, an image with an onerror handler, a
Markdown and a raw ``javascript:`` link, a remote Markdown image and an iframe. The org's AM
logs in to `kbflow serve`, opens the draft from the inbox, then previews an edit that adds one
more script tag ("Show my changes"). On every page: no dialog fires, no request leaves for a host
other than the service's, no element carries an ``on*`` handler, the draft holds no
``javascript:`` link (and the page no script, image or frame), the hostile text shows as text,
and the response carries the Content-Security-Policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from core.settings import Settings
from kbflow.api.launch import launched
from tests.conftest import index_records
from tests.flows.browser import CHROMIUM, LAUNCH_ARGS, playwright

pytestmark = [pytest.mark.browser, pytest.mark.integration]

playwright_api = playwright()  # or the module is skipped

ORG, AM, PASSWORD = "acme", "amy", "reviews-drafts-with-care-42"
HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(2)>",
    "[click](javascript:alert(3))",
    '<a href="javascript:alert(4)">x</a>',
    "<iframe src=http://evil.example>",
]
TITLE = "Price memo <script>alert(6)</script>"
TEXT = "\n\n".join(
    [
        "# Price memo",
        "The Wren city bike costs 899 EUR.",
        *HOSTILE[:4],
        "![pic](http://evil.example/x.png)",
        HOSTILE[4],
        "The Kestrel cargo bike costs 2,400 EUR.",
    ]
)
ADDED = "<script>alert(5)</script>"
expect = playwright_api.expect


@pytest.fixture
def served(settings: Settings, tmp_path: Path, embedder: Any) -> Iterator[dict[str, str]]:
    """One pending hostile draft in org acme, its AM with an inbox password, and the service."""
    from core.models import DocStatus, Role
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.registry import SqlRegistry

    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)
    try:
        registry.people.ensure_user("root", Role.SUPERADMIN)
        registry.people.ensure_user(AM, Role.ACCOUNT_MANAGER)
        registry.people.ensure_org(ORG)
        registry.people.assign_am(ORG, AM)
        registry.logins.set_password(AM, PASSWORD, actor="root")
        [doc_id] = index_records(
            [{"key": "memo", "title": TITLE, "text": TEXT, "markdown": True}],
            store=store, registry=registry, embedder=embedder, org=ORG, collection="kb",
            status=DocStatus.PENDING_REVIEW,
        )  # fmt: skip
    finally:
        store.close()
        registry.close()
    with launched(settings.home, tmp_path / "serve.log", require_ready=False) as service:
        yield {"base": service.base, "doc_id": doc_id}


@pytest.fixture
def watched() -> Iterator[tuple[Any, list[str], list[str]]]:
    """A Chromium page, with every dialog it opens and every URL it requests."""
    dialogs: list[str] = []
    requests: list[str] = []
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})

            def dismissed(dialog: Any) -> None:
                dialogs.append(dialog.message)
                dialog.dismiss()

            page.on("dialog", dismissed)
            page.on("request", lambda r: requests.append(r.url))
            yield page, dialogs, requests
        finally:
            browser.close()


ON_ATTRIBUTES = """() => [...document.querySelectorAll('*')].flatMap(element =>
    [...element.attributes].filter(a => a.name.toLowerCase().startsWith('on'))
        .map(a => `${element.tagName} ${a.name}`))"""


def assert_inert(page: Any, response: Any, dialogs: list[str]) -> None:
    csp = response.headers.get("content-security-policy", "")
    assert "default-src 'none'" in csp and "unsafe" not in csp, csp
    page.wait_for_timeout(500)  # time for an onerror or a frame to fire, if any could
    assert dialogs == []
    assert page.evaluate(ON_ATTRIBUTES) == []
    expect(page.locator("script, img, iframe, object, embed, frame")).to_have_count(0)
    draft = page.locator("div.draft")
    hrefs = [a.get_attribute("href") or "" for a in draft.locator("a").all()]
    assert not any(h.strip().lower().startswith("javascript:") for h in hrefs), hrefs
    for text in HOSTILE:
        expect(draft).to_contain_text(text)
    expect(draft).to_contain_text("[image: pic]")  # the remote image as its alt text
    expect(page.locator("header.doc-head h1")).to_have_text(TITLE)


def test_a_hostile_draft_is_inert_in_the_browser(
    served: dict[str, str], watched: tuple[Any, list[str], list[str]]
) -> None:
    page, dialogs, requests = watched
    base = served["base"]
    login = page.goto(f"{base}/review")
    assert "default-src 'none'" in login.headers.get("content-security-policy", "")
    page.get_by_label("User id").fill(AM)
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    link = page.locator("table.list a")
    expect(link).to_have_text(TITLE)  # the hostile title is text in the inbox too

    with page.expect_response(lambda r: r.url.startswith(f"{base}/review/drafts/")) as opened:
        link.click()
    assert_inert(page, opened.value, dialogs)

    editor = page.locator("textarea#content")
    text = editor.input_value()
    assert all(h in text for h in HOSTILE)
    editor.fill(f"{text.rstrip()}\n\n{ADDED}\n")
    with page.expect_response(lambda r: r.url.endswith("/preview")) as previewed:
        page.get_by_role("button", name="Show my changes").click()
    assert_inert(page, previewed.value, dialogs)
    expect(page.locator("pre.diff .d-add", has_text=ADDED)).to_have_text(f"+ {ADDED}")
    assert all(h in page.locator("textarea#content").input_value() for h in [*HOSTILE, ADDED])

    origin = urlsplit(base).netloc
    assert requests and all(urlsplit(url).netloc == origin for url in requests), requests
