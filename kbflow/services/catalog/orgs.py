"""Client orgs, their account managers and the users who review (`kbflow orgs`, `kbflow users`).

Who may change what is checked here, by `tasks.review.access`; every change is audited by the
registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core import ids
from core.errors import Forbidden, KbflowError, NotFound
from core.models import Role
from core.settings import Settings
from kbflow.services.catalog.types import OrgDict, UserDict

if TYPE_CHECKING:
    from sinks.registry import OrgRecord, UserRecord


def org_dict(org: OrgRecord) -> OrgDict:
    """An org as JSON."""
    return {"id": org.id, "name": org.name, "am_user_id": org.am_user_id}


def user_dict(user: UserRecord) -> UserDict:
    """A user as JSON."""
    return {"id": user.id, "name": user.name, "role": user.role.value, "org_id": user.org_id}


def create_org(
    settings: Settings, org: str, *, name: str | None, am: str | None, actor: str | None
) -> OrgRecord:
    """Create an org, or rename an existing one, and assign its account manager when ``am``
    is given: all a superadmin's (``actor``) decisions, audited (a refusal too, and it changes
    nothing).

    An org saved before its account manager could be assigned stays saved; the error says so
    and how to assign one later.
    """
    from sinks.connect import open_registry
    from tasks.review.access import authorize_org_admin

    ids.org_id(org)
    with open_registry(settings) as registry:
        try:
            registry.people.get_org(org)
            what = f"{'rename' if name else 'change'} org {org!r}"
        except NotFound:
            what = f"create org {org!r}"
        if am:
            what += " and assign its account manager"
        admin = authorize_org_admin(registry, actor, what, org, superadmin_only=True)
        registry.people.ensure_org(org, name=name, actor=admin)
        record = registry.people.get_org(org)
        if am:
            try:
                record = registry.people.assign_am(org, am, actor=admin)
            except KbflowError as exc:
                raise type(exc)(
                    f"{exc} Org {org!r} is saved with account manager "
                    f"{record.am_user_id or 'none'}; run `kbflow orgs assign-am {org} USER` "
                    "once the user is an account manager."
                ) from exc
    return record


def assign_am(settings: Settings, org: str, user: str, *, actor: str | None) -> OrgRecord:
    """Make ``user`` (an account manager) the one who approves ``org``'s documents: a
    superadmin's decision (``actor``), audited."""
    from sinks.connect import open_registry
    from tasks.review.access import authorize_admin

    with open_registry(settings) as registry:
        admin = authorize_admin(registry, actor, "assign account managers", org_id=org)
        return registry.people.assign_am(org, user, actor=admin)


def list_orgs(settings: Settings) -> list[OrgRecord]:
    """Every org with its account manager."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        return registry.people.list_orgs()


def add_user(
    settings: Settings,
    user: str,
    role: Role,
    *,
    name: str | None,
    org: str | None,
    actor: str | None,
) -> UserRecord:
    """Add a user or replace an existing one's role and org; needs ``actor`` a superadmin,
    except for the very first superadmin of a registry that never had one.

    The registry refuses (Forbidden, recorded in the audit log) to demote the last superadmin,
    and a bootstrap once a superadmin has existed, in the same transaction as the write.
    """
    from sinks.connect import open_registry
    from tasks.review.access import authorize_admin, bootstrap_open

    ids.user_id(user)
    attempted = "manage users and roles"
    with open_registry(settings) as registry:
        # Only a superadmin may be bootstrapped, and only on a registry that never had one;
        # the registry checks that again in the write.
        bootstrap = role is Role.SUPERADMIN and bootstrap_open(registry)
        admin = authorize_admin(
            registry, actor, attempted, org_id=org, bootstrap=role is Role.SUPERADMIN
        )  # fmt: skip
        if org:
            registry.people.get_org(org)  # a clear "does not exist" instead of a foreign-key error
        try:
            return registry.people.ensure_user(
                user, role, name=name, org_id=org, actor=admin, bootstrap=bootstrap
            )
        except Forbidden as exc:
            registry.people.record_denied(actor or "(anonymous)", attempted, org_id=org,
                                   reason=str(exc))  # fmt: skip
            raise


def list_users(settings: Settings) -> list[UserRecord]:
    """Every user with their role and org."""
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        return registry.people.list_users()
