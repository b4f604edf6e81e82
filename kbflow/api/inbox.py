# Over 500 lines: every inbox page shares one login, session, CSRF and refusal path kept here.
"""The review inbox: server-rendered pages under ``/review`` for the people at the gate.

People log in with a password (`kbflow.services.review.inbox`); the session is a cookie that is
HttpOnly, SameSite=Strict, scoped to ``/review`` and Secure behind https, and ends on the
server at logout, when idle and at its absolute expiry. Every state-changing request carries
the session's CSRF token in its form (the login form a double-submit cookie's), and one whose
``Origin`` is not this server is refused too. Bearer tokens are not accepted here: an agent's
token (or a person's API token) gets a 403 page, so nobody reaches the inbox without logging in.

Every page is sent with a Content Security Policy that allows no script at all and loads only
from kbflow itself (its stylesheet is served here, nothing from a CDN), on top of the drafts'
sanitised rendering (`tasks.review.markup`).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from core.errors import (
    ConfigError,
    Forbidden,
    KbflowError,
    NotFound,
    ReviewConflict,
    TooLarge,
    Unauthorized,
    UnsupportedMediaType,
)
from kbflow.api.auth import Service, service_of
from kbflow.api.deps import ID_PATTERN
from kbflow.api.login_guard import LOGIN_REASONS, LoginRefused, client_of, guard_of, reason_code
from kbflow.services.review import inbox as service

if TYPE_CHECKING:
    from sinks.registry import DocRecord, WebSession

router = APIRouter(prefix="/review", include_in_schema=False)

HERE = Path(__file__).parent
SESSION_COOKIE = "kbflow_session"
LOGIN_CSRF_COOKIE = "kbflow_login_csrf"
COOKIE_PATH = "/review"
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
MAX_NOTE = 2000
MAX_CONTENT = 1_000_000
ACTIONS = ("approve", "edit", "reject", "withdraw", "restore")

_templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=False,
)


def _page(name: str, status: int = 200, **values: Any) -> Response:
    html = _templates.get_template(name).render(age=service.age, **values)
    return _guarded(HTMLResponse(html, status_code=status))


def _guarded(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    # Not "no-referrer": under it a browser sends `Origin: null` with every form POST, which
    # `_same_origin` refuses. "same-origin" sends no referrer to any other site either.
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Cache-Control"] = "no-store"
    return response


def _message(
    heading: str, message: str, status: int, *, user: Any = None, csrf: str = "",
    back: str | None = "/review",
) -> Response:  # fmt: skip
    return _page("message.html", status, title=heading, heading=heading, message=message,
                 user=user, csrf=csrf, back=back)  # fmt: skip


def _secure(request: Request, service_: Service) -> bool:
    """Whether the session cookie is marked Secure: as configured, else when the request came
    over https (directly, or as X-Forwarded-Proto from a proxy on this machine)."""
    configured = service_.settings.inbox.cookie_secure
    if configured is not None:
        return configured
    if request.url.scheme == "https":
        return True
    client = request.client.host if request.client else ""
    try:
        local = ipaddress.ip_address(client).is_loopback
    except ValueError:
        local = False
    return local and request.headers.get("x-forwarded-proto", "").lower() == "https"


def _set_cookie(
    response: Response, request: Request, service_: Service, name: str, value: str, max_age: int
) -> None:
    response.set_cookie(
        name, value, max_age=max_age, path=COOKIE_PATH, httponly=True, samesite="strict",
        secure=_secure(request, service_),
    )  # fmt: skip


def _refuse_tokens(request: Request) -> Response | None:
    """A request that carries a bearer token is not a person in a browser: refused."""
    if request.headers.get("authorization"):
        return _message(
            "Not for tokens",
            "The review inbox is for people who log in with a password. API tokens (an "
            "agent's or a person's) are not accepted here; the HTTP API under /v1 takes them.",
            403,
            back=None,
        )
    return None


def _same_origin(request: Request) -> bool:
    """A state-changing request from a page of another site is refused (with SameSite=Strict
    cookies and the CSRF token, a third check that costs nothing)."""
    origin = request.headers.get("origin")
    if not origin or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host


def _current(request: Request) -> tuple[Service, WebSession | None, str | None]:
    """The service, the live session (None: not logged in) and why not."""
    service_ = service_of(request)
    try:
        session = service.session_of(
            service_.ctx.registry, service_.settings, request.cookies.get(SESSION_COOKIE)
        )
    except Unauthorized as exc:
        return service_, None, str(exc)
    return service_, session, None


def _to_login(request: Request, why: str | None = None) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    where = f"/review/login?next={quote(target, safe='')}"
    if code := reason_code(why):
        where += f"&why={code}"
    return _guarded(RedirectResponse(where, status_code=303))


def _busy(refused: LoginRefused, *, user: Any = None, csrf: str = "") -> Response:
    back = "/review/login" if user is None else "/review/password"
    response = _message("Try again in a moment", refused.message, refused.status, user=user,
                        csrf=csrf, back=back)  # fmt: skip
    response.headers["Retry-After"] = str(refused.retry_after_s)
    return response


def _checked_post(request: Request, csrf: str) -> tuple[Service, WebSession] | Response:
    """The session of a state-changing request whose CSRF token and origin hold; otherwise
    the refusal page (nothing is done)."""
    if (refused := _refuse_tokens(request)) is not None:
        return refused
    service_, session, why = _current(request)
    if session is None:
        return _message(
            "Logged out",
            f"Your session is not valid ({why}). Log in again; nothing was changed.",
            401,
            back="/review/login",
        )
    if not _same_origin(request) or not hmac.compare_digest(csrf or "", session.csrf):
        return _message(
            "Request refused",
            "This form was not sent from your review page (its security token is missing or "
            "wrong). Reload the page and try again; nothing was changed.",
            403,
            user=session.user,
            csrf=session.csrf,
        )
    return service_, session


@router.get("/static/inbox.css")
def stylesheet() -> Response:
    return _guarded(FileResponse(HERE / "static" / "inbox.css", media_type="text/css"))


@router.get("/login")
def login_page(request: Request, next: str = "/review", why: str | None = None) -> Response:
    if (refused := _refuse_tokens(request)) is not None:
        return refused
    token = secrets.token_urlsafe(32)
    response = _page(
        "login.html", title="Log in", user=None, csrf=token, next=_local(next), typed_user="",
        flash=LOGIN_REASONS.get(why or ""), flash_kind="error",
    )  # fmt: skip
    _set_cookie(response, request, service_of(request), LOGIN_CSRF_COOKIE, token, 3600)
    return response


def _local(target: str) -> str:
    """Only a path of the inbox itself is a place to go after login (no open redirect)."""
    if target.startswith("/review") and not target.startswith("//") and "\\" not in target:
        return target
    return "/review"


@router.post("/login")
async def login(
    request: Request,
    user: Annotated[str, Form(max_length=120)] = "",
    password: Annotated[str, Form(max_length=1024)] = "",
    csrf: Annotated[str, Form(max_length=200)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/review",
) -> Response:
    if (refused := _refuse_tokens(request)) is not None:
        return refused
    service_ = service_of(request)
    cookie = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if not _same_origin(request) or not cookie or not hmac.compare_digest(cookie, csrf):
        return _message(
            "Request refused",
            "The login form was not sent from this site's login page. Open the login page "
            "again and log in there.",
            403,
            back="/review/login",
        )
    # Async up to here, so that a refused attempt never takes a worker thread; the password
    # check runs in one only with a hashing slot held. Every id counts alike, known or not.
    guard = guard_of(request)
    if (refused_now := guard.admit(client_of(request))) is not None:
        return _busy(refused_now)
    try:
        with guard.hashing_slot() as busy:
            if busy is not None:
                return _busy(busy)
            logged = await run_in_threadpool(
                service.log_in, service_.ctx.registry, service_.settings, user, password
            )
    except Unauthorized as exc:
        token = secrets.token_urlsafe(32)
        response = _page(
            "login.html", 401, title="Log in", user=None, csrf=token, next=_local(next),
            typed_user=user[:120], flash=str(exc), flash_kind="error",
        )  # fmt: skip
        _set_cookie(response, request, service_, LOGIN_CSRF_COOKIE, token, 3600)
        return response
    target = "/review/password" if logged.must_change else _local(next)
    response = _guarded(RedirectResponse(target, status_code=303))
    _set_cookie(response, request, service_, SESSION_COOKIE, logged.secret,
                service_.settings.inbox.session_absolute_s)  # fmt: skip
    response.delete_cookie(LOGIN_CSRF_COOKIE, path=COOKIE_PATH)
    return response


@router.post("/logout")
def logout(request: Request, csrf: Annotated[str, Form(max_length=200)] = "") -> Response:
    checked = _checked_post(request, csrf)
    if isinstance(checked, Response):
        return checked
    service_, _ = checked
    service_.ctx.registry.logins.end_session(request.cookies.get(SESSION_COOKIE, ""))
    response = _guarded(RedirectResponse("/review/login", status_code=303))
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH)
    return response


@router.get("/password")
def password_page(request: Request) -> Response:
    if (refused := _refuse_tokens(request)) is not None:
        return refused
    _, session, why = _current(request)
    if session is None:
        return _to_login(request, why)
    return _page("password.html", title="Password", user=session.user, csrf=session.csrf,
                 must_change=session.must_change)  # fmt: skip


@router.post("/password")
def change_password(
    request: Request,
    csrf: Annotated[str, Form(max_length=200)] = "",
    current: Annotated[str, Form(max_length=1024)] = "",
    new: Annotated[str, Form(max_length=1024)] = "",
    again: Annotated[str, Form(max_length=1024)] = "",
) -> Response:
    checked = _checked_post(request, csrf)
    if isinstance(checked, Response):
        return checked
    service_, session = checked

    def again_page(problem: str, status: int) -> Response:
        return _page("password.html", status, title="Password", user=session.user,
                     csrf=session.csrf, must_change=session.must_change, flash=problem,
                     flash_kind="error")  # fmt: skip

    if new != again:
        return again_page("The two new passwords differ. Nothing was changed.", 400)
    guard = guard_of(request)
    if (refused := guard.admit(client_of(request))) is not None:
        return _busy(refused, user=session.user, csrf=session.csrf)
    try:
        with guard.hashing_slot() as busy:
            if busy is not None:
                return _busy(busy, user=session.user, csrf=session.csrf)
            logged = service.change_password(
                service_.ctx.registry, service_.settings, session.user, current, new
            )
    except Unauthorized as exc:
        return again_page(f"The current password is not right: {exc}", 401)
    except ConfigError as exc:
        return again_page(str(exc), 400)
    response = _guarded(RedirectResponse("/review?changed=1", status_code=303))
    _set_cookie(response, request, service_, SESSION_COOKIE, logged.secret,
                service_.settings.inbox.session_absolute_s)  # fmt: skip
    return response


def _logged_in_page(
    request: Request, render: Callable[[Service, WebSession], Response]
) -> Response:
    if (refused := _refuse_tokens(request)) is not None:
        return refused
    service_, session, why = _current(request)
    if session is None:
        return _to_login(request, why)
    if session.must_change:
        return _guarded(RedirectResponse("/review/password", status_code=303))
    try:
        service.require_person(session.user)
        return render(service_, session)
    except Forbidden as exc:
        return _message("Not yours to see", str(exc), 403, user=session.user, csrf=session.csrf)


@router.get("")
@router.get("/")
def inbox_page(request: Request, changed: str | None = None) -> Response:
    def render(service_: Service, session: WebSession) -> Response:
        orgs = service.inbox(service_.ctx.registry, session.user)
        flash = "Your new password is saved." if changed else None
        return _page("inbox.html", title="Inbox", user=session.user, csrf=session.csrf,
                     orgs=orgs, flash=flash)  # fmt: skip

    return _logged_in_page(request, render)


@router.get("/library")
def library_page(
    request: Request,
    org: str | None = None,
    status: str | None = None,
    collection: str | None = None,
    source: str | None = None,
    q: str = "",
    page: int = 1,
) -> Response:
    """Every document an org serves or has withdrawn, filterable (a GET form: no script)."""

    def render(service_: Service, session: WebSession) -> Response:
        try:
            view = service.library(
                service_.ctx.registry, session.user, org or None, status=status or None,
                collection=collection or None, source=source or None, title=q[:200],
                page=page,
            )  # fmt: skip
        except ConfigError as exc:
            return _message("Not a filter", str(exc), 400, user=session.user, csrf=session.csrf,
                            back="/review/library")  # fmt: skip
        return _page("library.html", title=f"Library · {view.org.name}", user=session.user,
                     csrf=session.csrf, view=view, label=service.source_label)  # fmt: skip

    return _logged_in_page(request, render)


def _seeds_page(
    service_: Service, session: WebSession, org: str | None, *, status: int = 200,
    flash: str | None = None, flash_kind: str = "ok",
) -> Response:  # fmt: skip
    view = service.seeds_view(service_.ctx.registry, session.user, org)
    return _page("seeds.html", status, title=f"Seed inputs · {view.org.name}",
                 user=session.user, csrf=session.csrf, org=view.org, seeds=view.seeds,
                 may_decide=view.may_decide, flash=flash, flash_kind=flash_kind,
                 kind=service.seed_kind)  # fmt: skip


@router.get("/seeds")
def seeds_page(request: Request, org: str = "") -> Response:
    """An org's seed inputs for its research, with their full addresses, and the forms that
    add files, URLs and a steering prompt or remove one."""
    return _logged_in_page(request, lambda service_, session: _seeds_page(
        service_, session, org or None))  # fmt: skip


def _org_id(org: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,62}", org):
        raise Forbidden("no such organisation, or not one you may read.")
    return org


@router.post("/seeds/{org}")
async def add_seeds(request: Request, org: str) -> Response:
    """Files, URLs (one per line) and a steering prompt added to an org's seed bundle, with
    the same caps and checks as ``POST /v1/admin/orgs/{org}/seed``. Who and where are checked
    before the body is read; the form's CSRF token once it is."""

    from kbflow.api.uploads import (
        SeedForm,
        checked_form,
        private_folder,
        receive_upload,
        seed_limits,
    )
    from kbflow.services.research import seeds

    if (refused := _refuse_tokens(request)) is not None:
        return refused
    service_, session, why = _current(request)
    if session is None or not _same_origin(request):
        return _message("Request refused", f"Log in again and send the form from your seed "
                        f"page ({why or 'another site'}); nothing was stored.", 403,
                        back="/review/login")  # fmt: skip
    user, settings = session.user, service_.settings
    try:
        await run_in_threadpool(seeds.authorize_research, settings, _org_id(org), user.id)
    except (Forbidden, NotFound) as exc:
        return _message("Not yours to seed", str(exc), 403, user=user, csrf=session.csrf)

    def again(problem: str, status: int) -> Response:
        return _seeds_page(service_, session, org, status=status, flash_kind="error",
                           flash=f"Nothing was stored: {problem}")  # fmt: skip

    with private_folder(settings) as folder:
        try:
            received = await receive_upload(request, folder, file_fields=frozenset({"files"}),
                                            limits=seed_limits(settings))  # fmt: skip
        except RequestValidationError as exc:
            return again(_problems(exc), 400)
        except TooLarge as exc:
            return again(str(exc), 413)
        except UnsupportedMediaType as exc:
            return again(str(exc), 415)
        csrf = (received.fields.pop("csrf", None) or [""])[0]
        if not hmac.compare_digest(csrf, session.csrf):
            return _message("Request refused", "This form was not sent from your seed page "
                            "(its security token is missing or wrong). Reload the page and try "
                            "again; nothing was stored.", 403, user=user,
                            csrf=session.csrf)  # fmt: skip
        urls = [u.strip() for text in received.fields.pop("urls", []) for u in text.splitlines()]
        prompts = [p for p in received.fields.pop("prompts", []) if p.strip()]
        try:
            form = checked_form(SeedForm, {"urls": [u for u in urls if u], "prompts": prompts,
                                           **received.fields})  # fmt: skip
        except RequestValidationError as exc:
            return again(_problems(exc), 400)
        if not (received.files or form.urls or form.prompts):
            return again("choose a file, or give a URL or a prompt", 400)
        try:
            result = await run_in_threadpool(
                _seed_from_form, service_, org, user.id, received.files, form
            )
        except KbflowError as exc:
            return again(str(exc), 400)
    skipped = "; ".join(f"{s['source'].rsplit('/', 1)[-1]}: {s['reason']}"
                        for s in result["skipped"])  # fmt: skip
    said = f"Seeded {result['stored']} new input{'s' if result['stored'] != 1 else ''}."
    if skipped:
        said += f" Not seeded: {skipped}"
    return _seeds_page(service_, session, org, flash=said,
                       flash_kind="error" if skipped else "ok")  # fmt: skip


def _problems(exc: RequestValidationError) -> str:
    """A form's refused fields, as one line (a RequestValidationError's messages)."""
    return "; ".join(str(error.get("msg")) for error in exc.errors())


def _seed_from_form(
    service_: Service, org: str, user: str, files: list[Any], form: Any
) -> dict[str, Any]:
    from kbflow.services.research import seeds
    from tasks.review.machine import held

    with service_.use() as ctx:
        result = seeds.seed(
            service_.settings, org, actor=user, files=[f.path for f in files],
            urls=form.urls, prompts=form.prompts,
            file_uris=[f"upload:{org}/{f.name}" for f in files],
            open_store=held(ctx.vector_store),
        )  # fmt: skip
    return dict(result)


@router.post("/seeds/{org}/{doc_id}/remove")
def remove_seed(
    request: Request, org: str, doc_id: str, csrf: Annotated[str, Form(max_length=200)] = ""
) -> Response:
    """One seed input out of the org's bundle (withdrawn, audited)."""
    from kbflow.services.research import seeds
    from tasks.review.machine import held

    checked = _checked_post(request, csrf)
    if isinstance(checked, Response):
        return checked
    service_, session = checked
    try:
        with service_.use() as ctx:
            gone = seeds.remove_seed(service_.settings, _org_id(org), _doc_id(doc_id),
                                     actor=session.user.id,
                                     open_store=held(ctx.vector_store))  # fmt: skip
    except Forbidden as exc:
        return _message("Not yours to decide", str(exc), 403, user=session.user,
                        csrf=session.csrf)  # fmt: skip
    except NotFound as exc:
        return _seeds_page(service_, session, org, status=404, flash_kind="error",
                           flash=f"Nothing was removed: {exc}")  # fmt: skip
    return _seeds_page(
        service_,
        session,
        org,
        flash=f"Removed {gone.title!r}: the next research run does not read it.",
    )


def _research_page(
    service_: Service, session: WebSession, org: str | None, *, status: int = 200,
    flash: str | None = None, flash_kind: str = "ok",
) -> Response:  # fmt: skip
    from kbflow.services.research.page import research_page

    registry = service_.ctx.registry
    chosen = service.readable_org(registry, session.user, org)
    view = research_page(service_.settings, registry, session.user, chosen)
    return _page("research.html", status, title=f"Research · {view.org.name}", user=session.user,
                 csrf=session.csrf, view=view, flash=flash, flash_kind=flash_kind,
                 refresh_s=5 if view.refresh else None)  # fmt: skip


@router.get("/research")
def research_runs(request: Request, org: str = "", started: str = "") -> Response:
    """An org's research runs as they progress (the page reloads itself while one runs), and
    the button that starts one."""
    said = (
        f"Research started (job {started}): it runs in the background and this page follows it."
        if re.fullmatch(r"[0-9a-f]{12}", started)
        else None
    )

    return _logged_in_page(request, lambda service_, session: _research_page(
        service_, session, org or None, flash=said))  # fmt: skip


@router.post("/research/{org}")
def start_research(
    request: Request, org: str, csrf: Annotated[str, Form(max_length=200)] = ""
) -> Response:
    """Start a research run for the org as the logged-in AM (a job: this returns at once)."""
    from kbflow.services.research.page import start_research as start

    checked = _checked_post(request, csrf)
    if isinstance(checked, Response):
        return checked
    service_, session = checked
    registry = service_.ctx.registry
    try:
        job = start(service_.settings, registry, session.user,
                    registry.people.get_org(_org_id(org)))  # fmt: skip
    except (Forbidden, NotFound) as exc:
        return _message("Not yours to research", str(exc), 403, user=session.user,
                        csrf=session.csrf)  # fmt: skip
    except KbflowError as exc:
        return _research_page(service_, session, org, status=503, flash_kind="error",
                              flash=f"The run did not start: {exc}")  # fmt: skip
    return _guarded(RedirectResponse(f"/review/research?org={org}&started={job.id}",
                                     status_code=303))  # fmt: skip


@router.get("/static/favicon.svg")
def favicon() -> Response:
    return _guarded(FileResponse(HERE / "static" / "favicon.svg", media_type="image/svg+xml"))


def _draft_response(
    service_: Service,
    session: WebSession,
    doc_id: str,
    *,
    edited: str | None = None,
    flash: str | None = None,
    flash_kind: str = "ok",
    status: int = 200,
    note: str = "",
    current: DocRecord | None = None,
) -> Response:
    page = service.draft_page(service_.ctx, service_.settings, session.user, doc_id, edited)
    org = service_.ctx.registry.people.get_org(page.doc.org_id)
    text = edited if edited is not None else page.markdown
    rows = min(60, max(16, text.count("\n") + 4))
    return _page("draft.html", status, title=page.doc.title, user=session.user,
                 csrf=session.csrf, page=page, org=org, edited=edited, rows=rows, flash=flash,
                 flash_kind=flash_kind, note=note, current=current)  # fmt: skip


def _doc_id(doc_id: str) -> str:
    if not re.fullmatch(ID_PATTERN, doc_id):
        raise Forbidden("no such document, or not one you may read.")
    return doc_id


@router.get("/drafts/{doc_id}")
@router.get("/documents/{doc_id}")
def draft(
    request: Request, doc_id: str, done: str | None = None, run: str | None = None
) -> Response:
    def render(service_: Service, session: WebSession) -> Response:
        return _draft_response(service_, session, _doc_id(doc_id), flash=_done(done, run))

    return _logged_in_page(request, render)


@router.post("/drafts/{doc_id}/preview")
def preview(
    request: Request,
    doc_id: str,
    csrf: Annotated[str, Form(max_length=200)] = "",
    content: Annotated[str, Form(max_length=MAX_CONTENT)] = "",
    note: Annotated[str, Form(max_length=MAX_NOTE)] = "",
) -> Response:
    checked = _checked_post(request, csrf)
    if isinstance(checked, Response):
        return checked
    service_, session = checked
    try:  # the note typed before "Show my changes" is kept in the form
        return _draft_response(service_, session, _doc_id(doc_id), edited=content, note=note)
    except Forbidden as exc:
        return _message("Not yours to see", str(exc), 403, user=session.user, csrf=session.csrf)


@router.post("/drafts/{doc_id}/{action}")
def decide(
    request: Request,
    doc_id: str,
    action: str,
    csrf: Annotated[str, Form(max_length=200)] = "",
    note: Annotated[str, Form(max_length=MAX_NOTE)] = "",
    content: Annotated[str, Form(max_length=MAX_CONTENT)] = "",
    seen: Annotated[str, Form(max_length=80)] = "",
) -> Response:
    checked = _checked_post(request, csrf)
    if isinstance(checked, Response):
        return checked
    service_, session = checked
    user = session.user
    if action not in ACTIONS:
        return _message("No such decision", f"{action!r} is not a decision here.", 404,
                        user=user, csrf=session.csrf)  # fmt: skip
    try:
        with service_.use() as ctx:
            decided = service.decide(
                ctx, service_.settings, user, _doc_id(doc_id), action,  # type: ignore[arg-type]
                content=content if action == "edit" else None, note=note, seen=seen or None,
            )  # fmt: skip
    except ReviewConflict as exc:
        mine = service.own_conflict(service_.ctx.registry, user, doc_id)
        if mine is not None:  # the decision that came first was this user's own
            flash = (f"You decided this document already: version {mine.version} is "
                     f"{(mine.status or 'served').replace('_', ' ')} now. Nothing more was "
                     "changed.")  # fmt: skip
            return _draft_response(service_, session, doc_id, status=409, flash_kind="error",
                                   flash=flash, current=mine)  # fmt: skip
        return _draft_response(service_, session, doc_id, status=409, flash_kind="error",
                               flash=f"Someone decided first: {exc}")  # fmt: skip
    except Forbidden as exc:
        return _message("Not yours to decide", str(exc), 403, user=user, csrf=session.csrf)
    except NotFound as exc:
        return _message("Not found", str(exc), 404, user=user, csrf=session.csrf)
    except KbflowError as exc:
        return _draft_response(service_, session, doc_id, status=400, flash_kind="error",
                               edited=content if action == "edit" else None,
                               note=note if action == "edit" else "",
                               flash=f"Nothing was changed: {exc}")  # fmt: skip
    applied = decided.via_run is None or decided.doc.status != "pending_review"
    where = f"/review/drafts/{decided.doc.id}?done={action if applied else 'sent'}"
    if decided.via_run:
        where += f"&run={decided.via_run}"
    return _guarded(RedirectResponse(where, status_code=303))


_DONE = {
    "approve": "Approved.",
    "edit": "Your edit is approved.",
    "reject": "Rejected.",
    "withdraw": "Withdrawn: it is out of search until someone restores it.",
    "restore": "Restored: this is the new approved version.",
    "sent": "Sent to the paused review run, which applies it in a moment: reload this page.",
}
_RUN_ID = re.compile(r"[0-9a-f-]{36}")


def _done(action: str | None, run: str | None) -> str | None:
    """The confirmation a decision's redirect asks for (only known words: a link cannot put
    text of its own on the page)."""
    said = _DONE.get(action or "")
    if said and run and _RUN_ID.fullmatch(run):
        said += f" It went through the paused review run {run}, whose page in Prefect says so."
    return said


@router.post("/codes")
def review_code(
    request: Request,
    csrf: Annotated[str, Form(max_length=200)] = "",
    org: Annotated[str, Form(max_length=64)] = "",
) -> Response:
    """A one-time review code for the logged-in user, for the Prefect form of a paused run."""
    checked = _checked_post(request, csrf)
    if isinstance(checked, Response):
        return checked
    service_, session = checked
    from tasks.review.codes import issue_code

    registry = service_.ctx.registry
    try:
        issued = issue_code(registry, session.user.id, org)
    except (Forbidden, NotFound) as exc:
        registry.people.record_denied(session.user.id, "get a review code (inbox)", org_id=None,
                               reason=str(exc))  # fmt: skip
        return _message("Not yours to decide", str(exc), 403, user=session.user,
                        csrf=session.csrf)  # fmt: skip
    return _message(
        "Your review code",
        f"{issued.code} — for a program that resumes a paused run of org {org}: it signs "
        "the exact decisions with it (tasks.review.codes.sign_decisions) and sends the proof, "
        "never the code (a code in the Prefect form is refused: anyone who reaches the Prefect "
        "API could read it there). To decide yourself, use this inbox: it resumes the run for "
        f"you. It works once, until {issued.expires_at:%H:%M} UTC.",
        200,
        user=session.user,
        csrf=session.csrf,
    )
