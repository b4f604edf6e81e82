"""Who may administer users and roles (`tasks.review.access.authorize_admin`): the bootstrap of
the first superadmin opens only on a registry that never had one (review finding M2)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from core.errors import Forbidden
from core.models import AuditAction, Role
from sinks.registry import SqlRegistry
from tasks.review.access import authorize_admin


def test_the_bootstrap_admits_an_anonymous_actor_on_a_registry_that_never_had_a_superadmin(
    registry: SqlRegistry,
) -> None:
    registry.people.ensure_user("eng", Role.ENGINEER)
    assert authorize_admin(registry, None, "manage users and roles", bootstrap=True) == (
        "bootstrap"
    )


def test_the_bootstrap_stays_closed_once_the_only_superadmin_is_gone(
    registry: SqlRegistry,
) -> None:
    registry.people.ensure_user("root", Role.SUPERADMIN)
    with registry.engine.begin() as conn:  # removed behind the registry's back
        conn.execute(text("DELETE FROM users WHERE id = 'root'"))
    assert registry.people.count_superadmins() == 0
    with pytest.raises(Forbidden, match="bootstrap") as refused:
        authorize_admin(registry, None, "manage users and roles", bootstrap=True)
    assert "--as" in str(refused.value)
    registry.people.ensure_user("mallory", Role.ENGINEER, actor="root")
    with pytest.raises(Forbidden, match="only a superadmin"):
        authorize_admin(registry, "mallory", "manage users and roles", bootstrap=True)
    denied = [r for r in registry.audit.audit_trail(None) if r.action == AuditAction.DENIED.value]
    assert [r.actor for r in denied] == ["(anonymous)", "mallory"]
