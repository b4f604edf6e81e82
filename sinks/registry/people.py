"""Orgs, users and roles, and who is the account manager of which org (every change audited)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, or_, select, text
from sqlalchemy.orm import Session

from core import ids
from core.errors import ConfigError, Forbidden, NotFound
from core.models import (
    AuditAction,
    Role,
)
from sinks.registry.audit import admin_audit
from sinks.registry.base import Repository
from sinks.registry.records import (
    SYSTEM_ACTOR,
    OrgRecord,
    UserRecord,
)
from sinks.registry.schema import (
    AuditRow,
    CollectionRow,
    OrgRow,
    UserRow,
)

_SUPERADMIN = Role.SUPERADMIN.value


def _lock_users(s: Session) -> None:
    """Make ``s``'s transaction the only one changing users until it ends, so a check on the
    superadmins and the write that depends on it cannot interleave with another's.

    SQLite: nothing to do, every transaction already begins with ``BEGIN IMMEDIATE`` (one writer
    at a time). PostgreSQL: lock the users table against other writers (readers go on).
    """
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("LOCK TABLE users IN SHARE ROW EXCLUSIVE MODE"))


def _had_superadmin(s: Session) -> bool:
    """Whether the registry has, or ever had, a superadmin: one is a user now, or the audit log
    shows a user saved as (or from) a superadmin. The audit log is append-only, so once true this
    stays true even if every superadmin row is later changed or removed behind kbflow's back."""
    if s.scalar(select(UserRow.id).where(UserRow.role == _SUPERADMIN).limit(1)) is not None:
        return True
    saved = (
        select(AuditRow.id)
        .where(
            AuditRow.action == AuditAction.USER_SAVED.value,
            or_(
                AuditRow.after["role"].as_string() == _SUPERADMIN,
                AuditRow.before["role"].as_string() == _SUPERADMIN,
            ),
        )
        .limit(1)
    )
    return s.scalar(saved) is not None


def bootstrap_closed_message() -> str:
    """Why a superadmin may not be created without a superadmin's ``--as`` here."""
    return (
        "this registry has (or once had) a superadmin, so the first-superadmin bootstrap (a "
        "superadmin added without --as) is closed: ask a superadmin to run `kbflow users add "
        "USER --role superadmin --as THEM`. If no superadmin is left because one was removed "
        "outside kbflow, restore the users table from a backup. Nothing was changed."
    )


def last_superadmin_message(user_id: str, change: str) -> str:
    """Why the last superadmin may not be demoted or removed, and what to do instead."""
    return (
        f"user {user_id!r} is the last superadmin: {change} would leave no one who may manage "
        "users, roles and account-manager assignments, and the bootstrap does not reopen. Make "
        f"another superadmin first (`kbflow users add USER --role superadmin --as {user_id}`), "
        "then try again. Nothing was changed."
    )


def refuse_last_superadmin(s: Session, user_id: str, change: str) -> None:
    """Inside a transaction that took :func:`_lock_users`: Forbidden when ``user_id`` is a
    superadmin and no other is (call it before any write that demotes or removes a user)."""
    user = s.get(UserRow, user_id)
    if user is None or user.role != _SUPERADMIN:
        return
    others = s.scalar(
        select(func.count()).where(UserRow.role == _SUPERADMIN, UserRow.id != user_id)
    )
    if not others:
        raise Forbidden(last_superadmin_message(user_id, change))


class PeopleRepository(Repository):
    """Orgs, users and roles, and who is the account manager of which org (every change audited)."""

    def ensure_org(
        self,
        org_id: str,
        name: str | None = None,
        am_user_id: str | None = None,
        *,
        actor: str = SYSTEM_ACTOR,
    ) -> bool:
        """Create the org if missing (its id must follow :func:`core.ids.org_id`); update its
        name or AM when given. Returns True when it was created. A creation and a rename are
        audited as ``actor``'s."""
        ids.org_id(org_id)
        with self.session() as s, s.begin():
            org = s.get(OrgRow, org_id)
            if org is None:
                s.add(OrgRow(id=org_id, name=name or org_id, am_user_id=am_user_id))
                s.flush()
                # Every org has a Default collection (see migration 0006).
                s.add(
                    CollectionRow(
                        org_id=org_id,
                        path="default",
                        name="Default",
                        description="Documents not filed in a more specific collection.",
                    )
                )
                s.add(
                    admin_audit(
                        actor, AuditAction.ORG_CREATED, org_id, None,
                        {"name": name or org_id, "am_user_id": am_user_id},
                    )
                )  # fmt: skip
                return True
            if name and name != org.name:
                s.add(
                    admin_audit(
                        actor, AuditAction.ORG_RENAMED, org_id, {"name": org.name},
                        {"name": name},
                    )
                )  # fmt: skip
                org.name = name
            if am_user_id:
                org.am_user_id = am_user_id
            return False

    def get_org(self, org_id: str) -> OrgRecord:
        with self.session() as s:
            org = s.get(OrgRow, org_id)
            if org is None:
                raise NotFound(
                    f"org {org_id!r} does not exist. Create it with `kbflow orgs create {org_id}`."
                )
            return OrgRecord(org.id, org.name, org.am_user_id)

    def list_orgs(self) -> list[OrgRecord]:
        with self.session() as s:
            rows = s.scalars(select(OrgRow).order_by(OrgRow.id))
            return [OrgRecord(o.id, o.name, o.am_user_id) for o in rows]

    def assign_am(self, org_id: str, user_id: str, *, actor: str = SYSTEM_ACTOR) -> OrgRecord:
        """Make ``user_id`` (an account manager) the org's assigned AM (audited)."""
        user = self.get_user(user_id)
        if user.role is not Role.ACCOUNT_MANAGER:
            raise ConfigError(
                f"user {user_id!r} is a {user.role.value}, not an account_manager; only an "
                "account manager can be assigned to an org."
            )
        with self.session() as s, s.begin():
            org = s.get(OrgRow, org_id)
            if org is None:
                raise NotFound(f"org {org_id!r} does not exist. Create it first.")
            before = org.am_user_id
            org.am_user_id = user_id
            s.add(
                admin_audit(
                    actor, AuditAction.AM_ASSIGNED, org_id, {"am_user_id": before},
                    {"am_user_id": user_id},
                )
            )  # fmt: skip
        return self.get_org(org_id)

    def ensure_user(
        self,
        user_id: str,
        role: Role,
        *,
        name: str | None = None,
        org_id: str | None = None,
        actor: str = SYSTEM_ACTOR,
        bootstrap: bool = False,
    ) -> UserRecord:
        """Create the user, or update its role, name and org (audited; the id must follow
        :func:`core.ids.user_id`).

        The checks that keep the registry administrable run in the same transaction as the
        write, so two concurrent calls cannot both pass them:

        - the last superadmin is never demoted (Forbidden: make another superadmin first);
        - ``bootstrap`` (a superadmin created without a superadmin's say-so, the registry's very
          first) is refused unless the registry never had a superadmin (:meth:`had_superadmin`).

        Raises:
            Forbidden: either check failed; nothing was changed.
            NotFound: no such org.
        """
        ids.user_id(user_id)
        if bootstrap and role is not Role.SUPERADMIN:
            raise ConfigError(
                f"the bootstrap creates the first superadmin only, not a {role.value}: add "
                f"{user_id!r} with --as a superadmin."
            )
        with self.session() as s, s.begin():
            _lock_users(s)
            if bootstrap and _had_superadmin(s):
                raise Forbidden(bootstrap_closed_message())
            if role is not Role.SUPERADMIN:
                refuse_last_superadmin(s, user_id, f"changing its role to {role.value}")
            if org_id is not None and s.get(OrgRow, org_id) is None:
                raise NotFound(f"org {org_id!r} does not exist. Create it before its users.")
            user = s.get(UserRow, user_id)
            before = None if user is None else {"role": user.role, "org_id": user.org_id}
            if user is None:
                s.add(UserRow(id=user_id, name=name or user_id, role=role.value, org_id=org_id))
            else:
                user.role = role.value
                user.name = name or user.name
                user.org_id = org_id
            s.add(
                admin_audit(
                    actor, AuditAction.USER_SAVED, org_id, before,
                    {"user_id": user_id, "role": role.value, "org_id": org_id},
                )
            )  # fmt: skip
        return self.get_user(user_id)

    def count_superadmins(self) -> int:
        with self.session() as s:
            return int(
                s.scalar(select(func.count()).where(UserRow.role == Role.SUPERADMIN.value)) or 0
            )

    def had_superadmin(self) -> bool:
        """Whether the registry has, or ever had, a superadmin (then the first-superadmin
        bootstrap is closed for good: a superadmin's ``--as`` is needed to make another)."""
        with self.session() as s:
            return _had_superadmin(s)

    def record_admin(
        self,
        actor: str,
        action: AuditAction,
        *,
        org_id: str | None,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
    ) -> None:
        """An audit row for an administrative change made elsewhere (an agent's audiences)."""
        with self.session() as s, s.begin():
            s.add(admin_audit(actor, action, org_id, before, after))

    def record_denied(self, actor: str, attempted: str, *, org_id: str | None, reason: str) -> None:
        """An audit row for an admin action that was refused (who tried what, and why not)."""
        with self.session() as s, s.begin():
            s.add(
                admin_audit(
                    actor, AuditAction.DENIED, org_id, None,
                    {"attempted": attempted, "reason": reason[:500]},
                )
            )  # fmt: skip

    def get_user(self, user_id: str) -> UserRecord:
        with self.session() as s:
            user = s.get(UserRow, user_id)
            if user is None:
                raise NotFound(
                    f"user {user_id!r} does not exist. Add it with `kbflow users add {user_id} "
                    "--role ...`."
                )
            return UserRecord(user.id, user.name, Role(user.role), user.org_id)

    def list_users(self) -> list[UserRecord]:
        with self.session() as s:
            rows = s.scalars(select(UserRow).order_by(UserRow.id))
            return [UserRecord(u.id, u.name, Role(u.role), u.org_id) for u in rows]
