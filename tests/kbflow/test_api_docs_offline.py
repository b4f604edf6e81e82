"""``kbflow serve``'s API docs work offline (issue 33): /docs (Swagger UI) and /redoc load their
scripts, stylesheet and icon from kbflow itself, never from a CDN, and /openapi.json declares
the bearer token, so Swagger's "Authorize" button sends it.

The schema and the pages are checked on the app as built (nothing opened); then a real
``kbflow serve`` is opened in Chromium with every request to another host aborted: Swagger UI
has to render the operations, and an agent's token entered with "Authorize" has to get a 200
from "Try it out". The screenshot docs/OPERATIONS.md shows is saved under the test's tmp dir,
and into ``$KBFLOW_UI_SCREENSHOTS`` when it is set (`make screenshots` writes docs/img).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from kbflow.api.app import create_app
from kbflow.api.launch import launched
from sinks.registry import SqlRegistry
from tests.flows.browser import CHROMIUM, LAUNCH_ARGS  # the same Chromium, started alike

SCHEME = "bearerAuth"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "testserver"}  # testserver: TestClient's own host
MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
URL = re.compile(r"""\b[a-z][a-z0-9+.-]*://[^\s"'<>`)]+""", re.IGNORECASE)
REFERENCE = re.compile(r"""\b(?:src|href)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
SCREENSHOT = "api-docs-offline"
REDOCLY_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


@pytest.fixture(scope="module")
def app() -> Any:
    return create_app(Settings(home=Path("unused")))  # only built: it opens nothing


@pytest.fixture(scope="module")
def client(app: Any) -> Iterator[TestClient]:
    yield TestClient(app)  # no `with`: the lifespan (store, model) never starts


# --- the schema ---------------------------------------------------------------------------------


def test_openapi_declares_the_bearer_scheme(app: Any) -> None:
    openapi = app.openapi()
    assert openapi["components"]["securitySchemes"][SCHEME] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "kbflow token",
        "description": (
            "A kbflow token (`kbflow tokens create`): an agent's for /v1/agent, "
            "a person's for /v1/admin."
        ),
    }
    paths = openapi["paths"]
    needs_token = [
        paths["/v1/agent/search"]["post"],
        paths["/v1/agent/collections"]["get"],
        paths["/v1/admin/orgs/{org}/drafts"]["get"],
        paths["/v1/admin/jobs/{job_id}"]["get"],
    ]
    for operation in needs_token:
        assert operation["security"] == [{SCHEME: []}], operation["operationId"]
    for path in ("/healthz", "/readyz", "/metrics"):
        assert "security" not in paths[path]["get"], path
    # every /v1 route takes a token, and nothing else declares one; the inbox's pages (its
    # login page too) and /mcp are not in the schema at all
    for path, item in paths.items():
        for method, operation in item.items():
            assert ("security" in operation) == path.startswith("/v1/"), (method, path)
    assert not any(path.startswith(("/review", "/mcp", "/docs", "/redoc")) for path in paths)


def test_the_token_stays_out_of_the_parameters(app: Any) -> None:
    """The token is the security scheme's, not a header parameter each route lists."""
    for item in app.openapi()["paths"].values():
        for operation in item.values():
            names = {p["name"].lower() for p in operation.get("parameters", [])}
            assert "authorization" not in names, operation["operationId"]


# --- the pages and their files -------------------------------------------------------------------


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_load_nothing_from_elsewhere(client: TestClient, page: str) -> None:
    response = client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    foreign = [url for url in URL.findall(html) if urlsplit(url).hostname not in LOCAL_HOSTS]
    assert foreign == [], f"{page} names other hosts: {foreign}"
    references = REFERENCE.findall(html)
    assert references, html
    for reference in references:
        assert reference.startswith("/") and not reference.startswith("//"), reference
        asset = client.get(reference)
        assert asset.status_code == 200, reference
        want = MEDIA_TYPES[Path(urlsplit(reference).path).suffix]
        assert asset.headers["content-type"].split(";")[0] == want, reference
        assert asset.headers["x-content-type-options"] == "nosniff"
        assert len(asset.content) > 1000, reference
    if page == "/docs":  # the scripts and the stylesheet, and the OpenAPI document they read
        assert "/openapi.json" in html
        assert {Path(r).name for r in references} == {
            "swagger-ui-bundle.js",
            "swagger-ui.css",
            "favicon.png",
        }


@pytest.mark.parametrize(
    "path",
    [
        "/docs/assets/",
        "/docs/assets/nope.js",
        "/docs/assets/__init__.py",
        "/docs/assets/..%2F__init__.py",
        "/docs/assets/%2E%2E%2Fcore.py",
        "/docs/assets/../../api_docs.py",
        "/docs/assets/swagger-ui-bundle.js/x",
    ],
)
def test_only_the_named_files_are_served(client: TestClient, path: str) -> None:
    """No listing, nothing outside the bundle: only the files the pages reference."""
    response = client.get(path)
    assert response.status_code == 404, path
    assert "import" not in response.text


def test_redoc_may_load_from_kbflow_only(client: TestClient) -> None:
    """ReDoc's bundle asks cdn.redoc.ly for a logo: the page's CSP keeps the browser from it."""
    policy = client.get("/redoc").headers["content-security-policy"]
    directives = {d.split()[0]: d.split()[1:] for d in policy.split("; ")}
    assert directives["default-src"] == ["'self'"] and directives["img-src"] == ["'self'", "data:"]
    assert not any("http" in source for sources in directives.values() for source in sources)


def test_the_oauth2_redirect_page_still_answers(client: TestClient) -> None:
    response = client.get("/docs/oauth2-redirect")
    assert response.status_code == 200 and "swaggerUIRedirectOauth2" in response.text


# --- in a browser that reaches nothing but kbflow ----------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """``kbflow serve`` over a home with one org and an agent's token."""
    home = tmp_path_factory.mktemp("docs") / "home"
    registry = SqlRegistry.open(Settings(home=home).registry_url)
    try:
        registry.people.ensure_org("larkspur")
        agent = registry.catalog.create_agent("larkspur", "bot")
        token = registry.tokens.create_token(agent_id=agent.id, expires_at=None, created_by="root")[
            1
        ]
    finally:
        registry.close()
    with launched(home, home.parent / "serve.log", require_ready=False) as server:
        yield {"base": server.base, "token": token}


@pytest.fixture
def offline_page() -> Iterator[tuple[Any, list[str]]]:
    """A Chromium page whose requests to any host but loopback are aborted, and the list of
    the URLs it aborted."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (`make browser-deps` installs it as root)")
    playwright_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed"
    )
    blocked: list[str] = []

    def only_loopback(route: Any) -> None:
        url = route.request.url
        if urlsplit(url).hostname in {"127.0.0.1", "localhost"}:
            route.continue_()
        else:
            blocked.append(url)
            route.abort("internetdisconnected")

    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.route("**/*", only_loopback)
            yield context.new_page(), blocked
        finally:
            browser.close()


def shoot(page: Any, tmp_path: Path, name: str) -> Path:
    """A screenshot of the window, also into $KBFLOW_UI_SCREENSHOTS when it is set."""
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path))
    if wanted := os.environ.get("KBFLOW_UI_SCREENSHOTS"):
        Path(wanted).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(wanted) / path.name)
    return path


@pytest.mark.browser
@pytest.mark.integration
def test_swagger_ui_renders_and_authorizes_offline(
    served: dict[str, str], offline_page: tuple[Any, list[str]], tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    page, blocked = offline_page
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(f"{r.url} {r.failure}"))
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(served["base"] + "/docs")
    operations = page.locator(".opblock")
    expect(operations.first).to_be_visible(timeout=30_000)
    assert operations.count() > 5
    expect(page.locator(".info .title")).to_contain_text("kbflow")
    authorize = page.locator(".scheme-container button.authorize")
    expect(authorize).to_be_visible()
    page.wait_for_load_state("networkidle")
    shoot(page, tmp_path, SCREENSHOT)

    # "Authorize" with an agent's token; "Try it out" on the agent's collections sends it
    authorize.click()
    dialog = page.locator(".modal-ux")
    expect(dialog).to_contain_text(SCHEME)
    dialog.locator("input").fill(served["token"])
    dialog.locator("button.authorize").click()
    dialog.locator("button.btn-done").click()
    collections = page.locator(".opblock", has_text="/v1/agent/collections")
    collections.locator(".opblock-summary").first.click()
    collections.locator("button.try-out__btn").click()
    collections.locator("button.execute").click()
    status = collections.locator(".live-responses-table tr.response .response-col_status")
    expect(status).to_have_text("200", timeout=30_000)
    expect(collections.locator(".curl-command")).to_contain_text("Authorization: Bearer")

    assert blocked == [], f"Swagger UI asked other hosts for {blocked}"
    assert failed == [] and errors == [], (failed, errors)

    # ReDoc too, from the same files; its page's CSP stops the one request its bundle makes
    # elsewhere (the Redocly logo, which it hides when it does not load) in the browser
    page.goto(served["base"] + "/redoc")
    expect(page.locator(".api-content h1").first).to_contain_text("kbflow", timeout=30_000)
    assert page.locator(".api-content [data-section-id^='operation/']").count() > 5
    page.wait_for_load_state("networkidle")
    assert blocked == [], f"ReDoc asked other hosts for {blocked}"
    assert failed == [f"{REDOCLY_LOGO} csp"], failed
    assert len(errors) == 1 and REDOCLY_LOGO in errors[0], errors
