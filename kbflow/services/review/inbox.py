"""The review inbox (`kbflow serve`, pages under /review): who is logged in, what waits for
them, a draft as they read it, and their decisions.

Identity is a password login (`sinks.registry.logins`: argon2, lockout, server-side sessions);
what a person may see and decide is `tasks.review.access`, the same rules as the CLI and the
HTTP API. A decision goes through `kbflow.services.review.decisions.decide`, the one path the
CLI and HTTP take too: to the paused review run kbflow started that waits for the draft, if
one does, else directly through the state machine (compare-and-set, audit, a conflict when
someone decided first).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from core.errors import (
    ConfigError,
    Forbidden,
    NotFound,
)
from core.models import DocStatus, Role
from core.settings import Settings
from kbflow.services.review import decisions
from kbflow.services.review.decisions import Decided
from tasks.review.access import authorize_document, may_decide, may_inspect
from tasks.review.decisions import Verb
from tasks.review.inspection import draft_markdown
from tasks.review.machine import held, live_older_versions
from tasks.review.markup import (
    Citation,
    DiffLine,
    citations_of,
    cited_doc_ids,
    line_diff,
    render_draft,
)
from tasks.text.citations import render_footer

if TYPE_CHECKING:
    from kbflow.services.query import OpenHome
    from sinks.registry import DocRecord, OrgRecord, SqlRegistry, UserRecord, WebSession

Action = Literal["approve", "edit", "reject", "withdraw", "restore"]


# -- who is logged in ------------------------------------------------------------------------


def log_in(registry: SqlRegistry, settings: Settings, user_id: str, password: str) -> LoggedIn:
    """Check a password and start a session.

    Raises:
        Unauthorized: wrong user or password, or the login is locked (audited).
    """
    user, must_change = _check(registry, settings, user_id.strip(), password)
    return _start(registry, settings, user, must_change)


@dataclass(frozen=True)
class LoggedIn:
    user: UserRecord
    secret: str
    csrf: str
    must_change: bool


def _check(
    registry: SqlRegistry, settings: Settings, user_id: str, password: str
) -> tuple[UserRecord, bool]:
    """The password check with the configured lockout (see `LoginsRepository.check_password`)."""
    return registry.logins.check_password(
        user_id,
        password,
        max_failures=settings.inbox.login_max_failures,
        lock_s=settings.inbox.login_lock_s,
    )


def _start(
    registry: SqlRegistry, settings: Settings, user: UserRecord, must_change: bool
) -> LoggedIn:
    secret, csrf = registry.logins.start_session(
        user.id, absolute_s=settings.inbox.session_absolute_s
    )
    return LoggedIn(user, secret, csrf, must_change)


def session_of(registry: SqlRegistry, settings: Settings, secret: str | None) -> WebSession:
    """The live session behind a cookie (Unauthorized: none, ended, expired or idle)."""
    return registry.logins.session_for(secret or "", idle_s=settings.inbox.session_idle_s)


def change_password(
    registry: SqlRegistry, settings: Settings, user: UserRecord, current: str, new: str
) -> LoggedIn:
    """The user's own new password (the current one checked first); every session of theirs
    ends and a new one starts."""
    _check(registry, settings, user.id, current)
    registry.logins.set_password(user.id, new, actor=user.id, must_change=False)
    return _start(registry, settings, user, False)


# -- the inbox ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrgInbox:
    """One org as the inbox lists it for a user."""

    org: OrgRecord
    may_decide: bool
    pending: list[DocRecord]
    withdrawn: list[DocRecord]
    seeds: list[DocRecord]

    def runs(self) -> list[tuple[str | None, list[DocRecord]]]:
        """The pending drafts grouped by research run, the newest run first."""
        groups: dict[str | None, list[DocRecord]] = {}
        for doc in sorted(self.pending, key=lambda d: d.created_at, reverse=True):
            groups.setdefault(doc.synthesis_run_id, []).append(doc)
        return list(groups.items())


def inbox(registry: SqlRegistry, user: UserRecord) -> list[OrgInbox]:
    """Every org the user may review or read drafts of, with its pending drafts, its withdrawn
    documents (which a decider may restore) and its seed inputs; others are not listed."""
    from tasks.research.seed import list_seeds

    shown: list[OrgInbox] = []
    for org in registry.people.list_orgs():
        if not may_inspect(user, org):
            continue
        pending = registry.documents.list_documents(
            org.id, statuses=[DocStatus.PENDING_REVIEW.value]
        )
        # A withdrawn version a restore (or a newer decision) left behind is not offered.
        withdrawn, _ = registry.documents.library(
            org.id, status=DocStatus.WITHDRAWN.value, limit=None
        )
        shown.append(
            OrgInbox(org, may_decide(user, org), pending, withdrawn, list_seeds(registry, org.id))
        )
    return shown


# -- the library -------------------------------------------------------------------------------

LIBRARY_PAGE = 50
LIBRARY_STATUSES = ("served", "withdrawn")


@dataclass(frozen=True)
class LibraryView:
    """One page of an org's library: the documents it serves or has withdrawn (newest version
    per source), with what the filters may choose from."""

    org: OrgRecord
    orgs: list[OrgRecord]
    docs: list[DocRecord]
    total: int
    page: int
    pages: int
    collections: list[str]
    sources: list[tuple[str, str]]
    status: str | None
    collection: str | None
    source: str | None
    title: str
    may_decide: bool

    def link(self, page: int) -> str:
        """The library's address for ``page`` with these filters."""
        from urllib.parse import urlencode

        wanted = {"org": self.org.id, "q": self.title, "collection": self.collection,
                  "status": self.status, "source": self.source, "page": page}  # fmt: skip
        return "/review/library?" + urlencode({k: v for k, v in wanted.items() if v})


def source_label(tag: str | None) -> str:
    """A source tag as the library shows it."""
    if tag is None:
        return "files"
    if tag == "agent_synthesis":
        return "research"
    if tag.startswith("source:"):
        return f"sync: {tag.removeprefix('source:')}"
    return tag.replace("_", " ")


def library(
    registry: SqlRegistry,
    user: UserRecord,
    org_id: str | None = None,
    *,
    status: str | None = None,
    collection: str | None = None,
    source: str | None = None,
    title: str = "",
    page: int = 1,
) -> LibraryView:
    """The library of ``org_id`` (else the first org the user may read) as ``user`` sees it:
    every document the org serves or has withdrawn, filtered and one page of `LIBRARY_PAGE`.
    ``source`` is a source tag, ``"files"`` for none.

    Raises:
        Forbidden: the user may read no org, or not ``org_id`` (refused as if it did not
            exist).
        ConfigError: an unknown status.
    """
    orgs = readable_orgs(registry, user)
    org = readable_org(registry, user, org_id, orgs)
    if status is not None and status not in LIBRARY_STATUSES:
        raise ConfigError(f"status must be one of {', '.join(LIBRARY_STATUSES)}, not {status!r}.")
    tags = registry.documents.source_tags(org.id)
    known = {source_label(tag): tag for tag in tags}
    tag: str | None = None
    if source:
        tag = "" if source == "files" else source
    page = max(1, page)
    docs, total = registry.documents.library(
        org.id, status=status, collection=collection or None, source_tag=tag,
        title=title, limit=LIBRARY_PAGE, offset=(page - 1) * LIBRARY_PAGE,
    )  # fmt: skip
    return LibraryView(
        org=org,
        orgs=orgs,
        docs=docs,
        total=total,
        page=page,
        pages=max(1, -(-total // LIBRARY_PAGE)),
        collections=[c.path for c in registry.catalog.list_collections(org.id)],
        sources=[(tag or "files", label) for label, tag in sorted(known.items())],
        status=status,
        collection=collection or None,
        source=source or None,
        title=title,
        may_decide=may_decide(user, org),
    )


def readable_orgs(registry: SqlRegistry, user: UserRecord) -> list[OrgRecord]:
    """The orgs whose drafts, library, seed inputs and research runs ``user`` may read."""
    return [org for org in registry.people.list_orgs() if may_inspect(user, org)]


def readable_org(
    registry: SqlRegistry,
    user: UserRecord,
    org_id: str | None,
    orgs: list[OrgRecord] | None = None,
) -> OrgRecord:
    """``org_id`` when ``user`` may read it; with none, the first org they may read (a page
    opened without ``?org=``). ``orgs``: `readable_orgs`, when the caller has them already.

    Raises:
        Forbidden: the user may read no org, or not ``org_id`` (refused as if it did not
            exist).
    """
    orgs = readable_orgs(registry, user) if orgs is None else orgs
    if not orgs:
        raise Forbidden(
            f"user {user.id!r} may read no organisation's documents yet: a superadmin assigns "
            "account managers to organisations."
        )
    org = next((o for o in orgs if o.id == org_id), None) if org_id else orgs[0]
    if org is None:
        raise Forbidden("no such organisation, or not one you may read.")
    return org


@dataclass(frozen=True)
class SeedsView:
    """An org's seed inputs as its seed page shows them."""

    org: OrgRecord
    seeds: list[DocRecord]
    may_decide: bool


def seeds_view(registry: SqlRegistry, user: UserRecord, org_id: str | None) -> SeedsView:
    """The seed inputs of ``org_id`` (else the first org ``user`` may read), read through the
    service's own registry.

    Raises:
        Forbidden: the user may not read the org's drafts.
    """
    from tasks.research.seed import list_seeds

    org = readable_org(registry, user, org_id)
    return SeedsView(org, list_seeds(registry, org.id), may_decide(user, org))


def own_conflict(registry: SqlRegistry, user: UserRecord, doc_id: str) -> DocRecord | None:
    """After a decision on ``doc_id`` lost to another: the current version of its source when
    the decision that came first was ``user``'s own (a second press of Restore, a page left
    open in two tabs), else None (someone else decided)."""
    doc = registry.documents.get_document(doc_id)
    versions = registry.documents.versions_of(doc.org_id, doc.source_key)
    rows = [row for v in versions for row in registry.audit.audit_trail(doc.org_id, v.id, last=1)]
    last = max(rows, key=lambda row: row.id, default=None)
    if last is None or last.actor != user.id:
        return None
    live = [v for v in versions if v.status != DocStatus.SUPERSEDED.value]
    return live[-1] if live else versions[-1]


def seed_kind(tag: str | None) -> str:
    """A seed input's kind as its page shows it: file, URL or prompt."""
    return {"am_file": "file", "am_url": "URL", "am_prompt": "prompt"}.get(tag or "", tag or "")


def age(at: dt.datetime, now: dt.datetime | None = None) -> str:
    """How long ago ``at`` was, as a person says it (``5 min``, ``3 h``, ``2 days``)."""
    now = now or dt.datetime.now(dt.UTC)
    seconds = max(0, int((now - (at if at.tzinfo else at.replace(tzinfo=dt.UTC))).total_seconds()))
    if seconds < 3600:
        return f"{max(1, seconds // 60)} min"
    if seconds < 86400 * 2:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} days"


# -- a draft -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftPage:
    """A document as its page shows it."""

    doc: DocRecord
    markdown: str
    html: str
    citations: list[Citation]
    may_decide: bool
    current: DocRecord | None = None
    diff: list[DiffLine] = field(default_factory=list)


def _body(doc: DocRecord, text: str) -> str:
    """The draft's text as the page shows it under its title: without a first heading that
    repeats the title, and without its Citations footer (the page lists its sources)."""
    footer = render_footer(doc.citations)
    if footer and text.endswith(footer):
        text = text[: -len(footer)].rstrip() + "\n"
    first, _, rest = text.lstrip().partition("\n")
    if first.startswith("# ") and " ".join(first[2:].split()) == " ".join(doc.title.split()):
        return rest.lstrip("\n")
    return text


def draft_page(
    ctx: OpenHome, settings: Settings, user: UserRecord, doc_id: str, edited: str | None
) -> DraftPage:
    """The document ``doc_id`` for someone allowed to read it: its Markdown, rendered and
    sanitised, its sources, and a diff against the approved version it would replace (or,
    with ``edited``, against the reviewer's edit).

    Raises:
        Forbidden: the user may not read it (or it does not exist: refused the same way).
    """
    registry = ctx.registry
    _, doc = authorize_document(registry, user.id, doc_id, inspect=True)
    org = registry.people.get_org(doc.org_id)
    overlap = max(64, settings.ingest.chunk_overlap_words)
    with held(ctx.vector_store)() as store:
        text = draft_markdown(doc, store, overlap)
        current = next(
            (v for v in live_older_versions(registry, doc) if v.status == DocStatus.APPROVED.value),
            None,
        )
        current_text = draft_markdown(current, store, overlap) if current else None
    titles = _cited_titles(registry, doc, text)
    citations = citations_of(text, doc.citations, _document_href, titles)
    if edited is not None:
        diff = line_diff(text, edited)
    elif current_text is not None:
        diff = line_diff(current_text, text)
    else:
        diff = []
    return DraftPage(
        doc=doc,
        markdown=text,
        html=render_draft(_body(doc, text), citations),
        citations=citations,
        may_decide=may_decide(user, org),
        current=current,
        diff=diff,
    )


def _document_href(doc_id: str) -> str:
    return f"/review/documents/{doc_id}"


def _cited_titles(registry: SqlRegistry, doc: DocRecord, text: str) -> dict[str, str]:
    """Titles of the kbflow documents ``text`` cites by id, from the registry (for tags its
    Citations footer does not title), limited to the document's own org."""
    ids = cited_doc_ids(text)[:200]
    if not ids:
        return {}
    return {
        d.id: d.title
        for d in registry.documents.get_documents(ids).values()
        if d.org_id == doc.org_id
    }


# -- decisions ---------------------------------------------------------------------------------


def decide(
    ctx: OpenHome,
    settings: Settings,
    user: UserRecord,
    doc_id: str,
    action: Action,
    *,
    content: str | None = None,
    note: str | None = None,
    seen: str | None = None,
) -> Decided:
    """Apply one decision as ``user`` from the inbox: `kbflow.services.review.decisions.decide`
    (through the paused review run that waits for this draft, else directly), with the
    inbox's ``seen`` (the ``version:status`` the page showed: a document changed since is a
    conflict) and its form's note rules.

    Raises:
        Forbidden: the user may not decide for the document's org (audited).
        ReviewConflict: someone decided first (nothing changed).
        ConfigError: a withdraw, restore or reject without a note, an edit without text.
    """
    return decisions.decide(
        settings, ctx.registry, held(ctx.vector_store), lambda: ctx.embedder, user.id, doc_id,
        Verb(action), surface="inbox", note=note, content=content, seen=seen,
    )  # fmt: skip


def require_person(user: UserRecord) -> None:
    """Engineers have no review rights: the inbox says so instead of showing an empty page."""
    if user.role is Role.ENGINEER:
        raise Forbidden(
            f"user {user.id!r} is an engineer: the review inbox is for account managers, "
            "experts and superadmins."
        )


def set_password(
    settings: Settings, user_id: str, password: str | None, *, temporary: bool, actor: str | None
) -> str | None:
    """Set ``user_id``'s inbox password, as a superadmin or as the user themself (audited; a
    refusal too). ``temporary``: the user must choose their own at their next login; without
    a ``password`` one is generated and returned (shown once), for a first login or a reset.
    Every session the user has ends.

    Raises:
        Forbidden: ``actor`` is neither a superadmin nor the user.
        ConfigError: a password too short or too long, or none given for a permanent one.
    """

    from sinks.connect import open_registry
    from tasks.review.access import load_actor

    with open_registry(settings) as registry:
        try:
            who = load_actor(registry, actor, what="set a password")
            if who.role is not Role.SUPERADMIN and who.id != user_id:
                raise Forbidden(
                    f"user {who.id!r} may not set {user_id!r}'s password: only a superadmin, "
                    "or the user for themself. Nothing was changed."
                )
            registry.people.get_user(user_id)
        except (Forbidden, NotFound) as exc:
            registry.people.record_denied(actor or "(anonymous)", f"set the password of {user_id}",
                                   org_id=None, reason=str(exc))  # fmt: skip
            raise
        generated = None
        if password is None:
            if not temporary:
                raise ConfigError("give a password (prompted, or --password-stdin), or use "
                                  "--temporary to generate one. Nothing was changed.")  # fmt: skip
            generated = password = _temporary_password(user_id)
        registry.logins.set_password(user_id, password, actor=who.id, must_change=temporary)
        return generated


def _temporary_password(user_id: str) -> str:
    """A random password (96 bits) that the password rules accept (one that happened to
    contain the user id, say, is drawn again)."""
    import secrets

    from sinks.registry.passwords import password_problem

    while password_problem(user_id, drawn := secrets.token_urlsafe(12)):
        pass
    return drawn
