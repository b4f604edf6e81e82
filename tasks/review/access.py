"""Who may do what: the one module that answers it for every entry point.

Identity on the command line is the ``--as USER`` claim, checked against the registry (see
docs/SECURITY.md); the HTTP service will establish it from tokens. The rules:

- **decide** (approve, edit, reject, withdraw), **seed** and **research** an org's knowledge:
  a superadmin, or the account manager assigned to that org;
- **inspect** drafts and seed inputs: whoever may decide, and the org's experts (or agency-wide
  experts, with no org);
- **administer** users, roles and AM assignments: a superadmin only — except the very first
  superadmin of a registry that never had one, who bootstraps the rest (the bootstrap never
  reopens, and the last superadmin cannot be demoted: the registry refuses both);
- **create or rename an org**: a superadmin only;
- **administer an org's catalog** — create, describe, move and delete its collections; create
  its agents, allow and disallow their collections, switch their knowledge base on or off: a
  superadmin, or the account manager assigned to that org (:func:`authorize_org_admin`);
  giving an agent **audiences** stays a superadmin's decision (:func:`authorize_admin`);
- **search org-wide** (no agent scope): engineers of the org (or agency-wide) and superadmins;
- **manage API tokens**: a superadmin any token; a user their own user tokens; an agent's
  tokens whoever may decide for the agent's org (a superadmin or its assigned AM).

Every admin change (users, orgs, collections, agents, tokens) needs a permitted actor; a refusal
is a Forbidden that says what was refused and what to do, is written to the audit log (actor
``(anonymous)`` when none was given) and changes nothing.

What a caller may *read* is further bounded by audience: an agent's audiences are a property of
the agent (set by an admin), a person's follow from their role (:func:`person_audiences`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from core.errors import Forbidden, NotFound
from core.models import Role
from sinks.registry import AgentRecord, DocRecord, OrgRecord, SqlRegistry, UserRecord
from sinks.registry.people import bootstrap_closed_message

T = TypeVar("T")


def may_decide(user: UserRecord, org: OrgRecord) -> bool:
    """Superadmins, and the account manager assigned to the org."""
    if user.role is Role.SUPERADMIN:
        return True
    return user.role is Role.ACCOUNT_MANAGER and org.am_user_id == user.id


def may_inspect(user: UserRecord, org: OrgRecord) -> bool:
    """Whoever may decide, and experts of the org (or agency-wide experts, with no org)."""
    if may_decide(user, org):
        return True
    return user.role is Role.EXPERT and user.org_id in (None, org.id)


def load_actor(registry: SqlRegistry, actor_id: str | None, *, what: str = "act") -> UserRecord:
    """The registered user behind an ``--as`` claim.

    Raises:
        Forbidden: no user given, or no such user.
    """
    if not actor_id:
        raise Forbidden(f"say who you are to {what}: --as USER (see `kbflow users list`).")
    try:
        return registry.people.get_user(actor_id)
    except NotFound as exc:
        raise Forbidden(
            f"unknown user {actor_id!r}: only registered users may {what} (`kbflow users add`)."
        ) from exc


def authorize_decision(
    registry: SqlRegistry, actor_id: str | None, org_id: str, *, what: str = "review documents"
) -> UserRecord:
    """The actor, loaded from the registry, if they may decide for (or seed, or research) the
    org's documents.

    A refusal names neither the org's people nor whether the org exists: to anyone but a
    superadmin an unknown org is refused exactly as another org is.

    Raises:
        Forbidden: unknown user; neither a superadmin nor the org's assigned AM; no such org.
        NotFound: no such org, for a superadmin.
    """
    user = load_actor(registry, actor_id, what=what)
    org = _org_or_refused(registry, user, org_id, lambda: _decision_refused(user, what, org_id))
    if not may_decide(user, org):
        raise _decision_refused(user, what, org_id)
    return user


def authorize_inspection(registry: SqlRegistry, actor_id: str | None, org_id: str) -> UserRecord:
    """The actor if they may read the org's drafts (deciders and the org's experts); an unknown
    org is refused as another org is (`authorize_decision`)."""
    user = load_actor(registry, actor_id, what="inspect drafts")
    org = _org_or_refused(registry, user, org_id, lambda: _inspection_refused(user, org_id))
    if not may_inspect(user, org):
        raise _inspection_refused(user, org_id)
    return user


def authorize_document(
    registry: SqlRegistry,
    actor_id: str | None,
    doc_id: str,
    *,
    what: str = "review documents",
    inspect: bool = False,
) -> tuple[UserRecord, DocRecord]:
    """The actor and the document, if they may decide on it (``inspect``: read it); a refusal
    says neither its org nor whether it exists (`authorize_item`)."""
    return authorize_item(
        registry, actor_id, f"document {doc_id!r}", lambda: registry.documents.get_document(doc_id),
        lambda doc: doc.org_id, what=what, inspect=inspect,
    )  # fmt: skip


def authorize_item(
    registry: SqlRegistry,
    actor_id: str | None,
    item: str,
    load: Callable[[], T],
    org_of: Callable[[T], str],
    *,
    what: str = "review documents",
    inspect: bool = False,
) -> tuple[UserRecord, T]:
    """The actor and an org's item (a document, a job), if they may decide on it (``inspect``:
    read it).

    A refusal says neither which org the item belongs to nor whether it exists: to anyone but a
    superadmin an unknown item is refused as another org's is.

    Args:
        item: how the message names it ("document 'abc'").
        load: the item (raises NotFound when there is none).
        org_of: the org it belongs to.

    Raises:
        Forbidden: unknown user, an item they may not decide on (or read), or none.
        NotFound: no such item, for a superadmin.
    """
    user = load_actor(registry, actor_id, what="inspect drafts" if inspect else what)
    refused = Forbidden(
        f"user {user.id!r} ({user.role.value}) may not {'inspect drafts' if inspect else what}: "
        f"{item} is not one they may {'read' if inspect else 'decide on'}, or it does not "
        "exist. Nothing was changed."
    )
    try:
        found = load()
    except NotFound:
        if user.role is Role.SUPERADMIN:
            raise
        raise refused from None
    org = registry.people.get_org(org_of(found))
    if not (may_inspect(user, org) if inspect else may_decide(user, org)):
        raise refused
    return user, found


def _org_or_refused(
    registry: SqlRegistry, user: UserRecord, org_id: str, refused: Callable[[], Forbidden]
) -> OrgRecord:
    try:
        return registry.people.get_org(org_id)
    except NotFound:
        if user.role is Role.SUPERADMIN:
            raise
        raise refused() from None


def _decision_refused(user: UserRecord, what: str, org_id: str) -> Forbidden:
    return Forbidden(
        f"user {user.id!r} ({user.role.value}) may not {what} of org {org_id!r}: only a "
        "superadmin or the org's assigned account manager may (an org that does not exist is "
        "refused the same way). Nothing was changed."
    )


def _inspection_refused(user: UserRecord, org_id: str) -> Forbidden:
    return Forbidden(
        f"user {user.id!r} ({user.role.value}) may not inspect drafts of org {org_id!r}: only "
        "a superadmin, the org's assigned account manager or its experts may (an org that does "
        "not exist is refused the same way)."
    )


def bootstrap_open(registry: SqlRegistry) -> bool:
    """Whether a superadmin may be created without a superadmin's ``--as``: only on a registry
    that never had a superadmin (:meth:`~sinks.registry.PeopleRepository.had_superadmin`). The
    registry checks it again in the write (``ensure_user(..., bootstrap=True)``)."""
    return not registry.people.had_superadmin()


def authorize_admin(
    registry: SqlRegistry,
    actor_id: str | None,
    attempted: str,
    *,
    org_id: str | None = None,
    bootstrap: bool = False,
) -> str:
    """The actor's id if they may manage users, roles and AM assignments (a superadmin).

    ``bootstrap`` admits an anonymous actor when the registry never had a superadmin (the
    command creating the very first one; see :func:`bootstrap_open`). Once a superadmin has
    existed it is closed for good, even if none is left. A refusal is recorded in the audit log.

    Raises:
        Forbidden: not a superadmin (or no ``--as`` outside the bootstrap).
    """
    if bootstrap and bootstrap_open(registry):
        return actor_id or "bootstrap"
    try:
        if not actor_id and bootstrap:
            raise Forbidden(f"only a superadmin may {attempted}: {bootstrap_closed_message()}")
        if not actor_id:
            raise Forbidden(
                f"only a superadmin may {attempted}: say who you are with --as USER (a "
                "superadmin). Nothing was changed."
            )
        user = load_actor(registry, actor_id, what=attempted)
        if user.role is not Role.SUPERADMIN:
            raise Forbidden(
                f"user {user.id!r} ({user.role.value}) may not {attempted}: only a superadmin "
                "may manage users, roles and account-manager assignments. Nothing was changed."
            )
    except Forbidden as exc:
        registry.people.record_denied(actor_id or "(anonymous)", attempted, org_id=org_id,
                               reason=str(exc))  # fmt: skip
        raise
    return user.id


def authorize_org_admin(
    registry: SqlRegistry,
    actor_id: str | None,
    what: str,
    org_id: str,
    *,
    superadmin_only: bool = False,
) -> str:
    """The actor's id if they may ``what`` (a verb phrase: "create collection 'hr' in org
    'acme'") in ``org_id``'s catalog: a superadmin, or the org's assigned account manager
    (``superadmin_only``: a superadmin, as for creating or renaming an org).

    A refusal is recorded in the audit log (in the org's rows, or agency-wide when the org does
    not exist) and says what to do. To anyone but a superadmin an org that does not exist is
    refused as another org is; a superadmin is let through (the change itself then says the org
    does not exist).

    Raises:
        Forbidden: no ``--as``, an unknown user, or one who may not; nothing was changed.
    """
    try:
        org: OrgRecord | None = registry.people.get_org(org_id)
    except NotFound:
        org = None
    return _authorize_catalog(
        registry, actor_id, what, org, recorded_org=org_id if org else None,
        superadmin_only=superadmin_only,
    )  # fmt: skip


def authorize_agent_admin(
    registry: SqlRegistry, actor_id: str | None, what: str, agent_id: str
) -> tuple[str, AgentRecord]:
    """The actor's id and the agent, if they may ``what`` to the agent (its allowed collections,
    its knowledge-base switch): a superadmin, or the assigned account manager of the agent's org
    (:func:`authorize_org_admin`'s rule, audited the same way).

    To anyone but a superadmin an agent that does not exist is refused as another org's is.

    Raises:
        Forbidden: no ``--as``, an unknown user, or one who may not; nothing was changed.
        NotFound: no such agent, for a superadmin.
    """
    try:
        agent: AgentRecord | None = registry.catalog.get_agent(agent_id)
    except NotFound:
        agent = None
    org = registry.people.get_org(agent.org_id) if agent is not None else None
    admin = _authorize_catalog(
        registry, actor_id, what, org, recorded_org=org.id if org else None,
        superadmin_only=False,
    )  # fmt: skip
    if agent is None:
        agent = registry.catalog.get_agent(agent_id)  # NotFound, for a superadmin
    return admin, agent


def _authorize_catalog(
    registry: SqlRegistry,
    actor_id: str | None,
    what: str,
    org: OrgRecord | None,
    *,
    recorded_org: str | None,
    superadmin_only: bool,
) -> str:
    who = "a superadmin" if superadmin_only else (
        "a superadmin or the org's assigned account manager"
    )  # fmt: skip
    try:
        if not actor_id:
            raise Forbidden(
                f"only {who} may {what}: say who you are with --as USER (see `kbflow users "
                "list`). Nothing was changed."
            )
        try:
            user = registry.people.get_user(actor_id)
        except NotFound:
            raise Forbidden(
                f"unknown user {actor_id!r}: only {who} may {what} (see `kbflow users list`). "
                "Nothing was changed."
            ) from None
        if user.role is not Role.SUPERADMIN and (
            superadmin_only or org is None or not may_decide(user, org)
        ):
            see = (
                "`kbflow users list` shows the superadmins" if superadmin_only else
                "what does not exist is refused the same way; `kbflow orgs list` shows each "
                "org's account manager"
            )  # fmt: skip
            raise Forbidden(
                f"user {user.id!r} ({user.role.value}) may not {what}: only {who} may ({see}). "
                "Nothing was changed."
            )
    except Forbidden as exc:
        registry.people.record_denied(actor_id or "(anonymous)", what, org_id=recorded_org,
                               reason=str(exc))  # fmt: skip
        raise
    return user.id


def may_manage_tokens(
    user: UserRecord, *, user_id: str | None = None, agent_org: OrgRecord | None = None
) -> bool:
    """Whether ``user`` may create, list or revoke the tokens of the user ``user_id`` or of an
    agent of ``agent_org``: a superadmin any; a user their own; an agent's, whoever may decide
    for its org."""
    if user.role is Role.SUPERADMIN:
        return True
    if agent_org is not None:
        return may_decide(user, agent_org)
    return user_id is not None and user_id == user.id


def authorize_token_admin(
    registry: SqlRegistry,
    actor_id: str | None,
    attempted: str,
    *,
    user_id: str | None = None,
    agent_id: str | None = None,
) -> UserRecord:
    """The actor, if they may manage the tokens of the user ``user_id`` or the agent
    ``agent_id`` (:func:`may_manage_tokens`). A refusal is recorded in the audit log.

    Raises:
        Forbidden: no ``--as``, an unknown user, or not allowed.
        NotFound: no such agent (told only to a registered user).
    """
    org_id: str | None = None
    try:
        user = load_actor(registry, actor_id, what=attempted)
        if user.role is Role.SUPERADMIN:
            return user  # any token, even one whose agent is gone
        if agent_id is not None:
            agent_org = registry.people.get_org(registry.catalog.get_agent(agent_id).org_id)
            org_id = agent_org.id
            if not may_manage_tokens(user, agent_org=agent_org):
                raise Forbidden(
                    f"user {user.id!r} ({user.role.value}) may not {attempted}: an agent's "
                    f"tokens are managed by a superadmin or the assigned account manager of "
                    f"its org {agent_org.id!r} ({agent_org.am_user_id or 'none assigned'}). "
                    "Nothing was changed."
                )
        elif not may_manage_tokens(user, user_id=user_id):
            raise Forbidden(
                f"user {user.id!r} ({user.role.value}) may not {attempted}: a user manages "
                "their own tokens, a superadmin anyone's. Nothing was changed."
            )
    except Forbidden as exc:
        registry.people.record_denied(actor_id or "(anonymous)", attempted, org_id=org_id,
                               reason=str(exc))  # fmt: skip
        raise
    return user


def authorize_org_wide_search(
    registry: SqlRegistry, actor_id: str | None, org_id: str
) -> UserRecord:
    """An org-wide search (no agent scoping) is for engineers and superadmins only."""
    if not actor_id:
        raise Forbidden(
            "an org-wide search needs --as USER (an engineer or superadmin); agents search "
            "with --agent"
        )
    user = load_actor(registry, actor_id, what="search org-wide")
    if user.role not in (Role.ENGINEER, Role.SUPERADMIN):
        raise Forbidden(
            f"user {actor_id} is a {user.role.value}: org-wide search is for engineers and "
            "superadmins; search as an agent with --agent"
        )
    if user.role is Role.ENGINEER and user.org_id not in (None, org_id):
        raise Forbidden(f"engineer {actor_id} belongs to org {user.org_id}, not {org_id}")
    return user


def person_audiences(user: UserRecord) -> tuple[str, ...] | None:
    """The audiences a person reads as, from their role: a superadmin every audience (None),
    anyone else the audience named like their role (e.g. documents ingested with
    ``--audience engineer``) besides the documents meant for everyone."""
    if user.role is Role.SUPERADMIN:
        return None
    return (user.role.value,)
