"""API tokens in the registry, on real SQLite in ``tmp_path`` (PostgreSQL in its pass): only
hashes stored, every way a token fails to verify, the one-subject rule in the database itself,
audit rows, and ``last_used_at`` written at most once a minute."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, inspect, text
from sqlalchemy.exc import IntegrityError

from core.errors import ConfigError, NotFound, Unauthorized
from core.models import AuditAction, Role
from core.settings import Settings
from sinks.registry import SqlRegistry, TokenRecord
from sinks.registry.schema import Base

T0 = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


@pytest.fixture
def people(registry: SqlRegistry) -> SqlRegistry:
    """Org acme with agent bot; users amy (acme) and root (agency-wide)."""
    registry.people.ensure_org("acme")
    registry.people.ensure_user("amy", Role.ACCOUNT_MANAGER, org_id="acme")
    registry.people.ensure_user("root", Role.SUPERADMIN)
    registry.catalog.create_agent("acme", "bot")
    return registry


def make(
    registry: SqlRegistry, *, user: str | None = "amy", agent: str | None = None, **kw: Any
) -> tuple[TokenRecord, str]:
    kw.setdefault("expires_at", T0 + 90 * DAY)
    kw.setdefault("now", T0)
    return registry.tokens.create_token(
        user_id=None if agent else user, agent_id=agent, created_by="root", **kw
    )


def refused(registry: SqlRegistry, secret: Any, now: dt.datetime = T0) -> str:
    with pytest.raises(Unauthorized) as err:
        registry.tokens.verify_token(secret, now=now)
    return str(err.value)


# --- create and verify -------------------------------------------------------------------------


def test_a_new_token_verifies_and_says_whom_it_stands_for(people: SqlRegistry) -> None:
    token, secret = make(people, name="laptop")
    assert re.fullmatch(r"kbf_[A-Za-z0-9_-]{43}", secret)
    assert re.fullmatch(r"tok_[0-9a-f]{12}", token.id)
    assert (token.user_id, token.agent_id, token.name) == ("amy", None, "laptop")
    assert (token.created_by, token.created_at, token.expires_at) == ("root", T0, T0 + 90 * DAY)
    assert token.revoked_at is None and token.last_used_at is None
    assert token.status(T0) == "active" and token.subject == "user amy"

    seen = people.tokens.verify_token(secret, now=T0 + DAY)
    assert seen.id == token.id and seen.user_id == "amy"
    assert seen.last_used_at == T0 + DAY

    bot, bot_secret = make(people, agent="bot", expires_at=None)
    assert (
        people.tokens.verify_token(bot_secret, now=T0 + 3650 * DAY).agent_id == "bot"
    )  # never expires
    assert bot.subject == "agent bot" and bot.id != token.id and bot_secret != secret


def test_the_record_holds_no_secret_and_cannot_change(people: SqlRegistry) -> None:
    token, secret = make(people)
    digest = hashlib.sha256(secret.encode()).hexdigest()
    for shown in (repr(token), str(token.to_dict()), str(dataclasses.asdict(token))):
        assert secret not in shown and digest not in shown and secret[4:] not in shown
    with pytest.raises(dataclasses.FrozenInstanceError):
        token.name = "other"  # type: ignore[misc]


def test_no_table_holds_the_secret_only_its_hash(people: SqlRegistry, settings: Settings) -> None:
    token, secret = make(people, name="scan me")
    people.tokens.verify_token(secret, now=T0 + DAY)
    people.tokens.revoke_token(token.id, actor="root", now=T0 + 2 * DAY)
    digest = hashlib.sha256(secret.encode()).hexdigest()
    body = secret.removeprefix("kbf_")
    with people.engine.connect() as conn:
        (row,) = conn.execute(text("SELECT * FROM api_tokens")).mappings().all()
        assert row["secret_hash"] == digest
        for table in Base.metadata.sorted_tables:  # every column of every table
            for values in conn.execute(text(f"SELECT * FROM {table.name}")):
                for value in values:
                    assert body not in str(value), table.name
    dialect = people.engine.dialect.name
    people.close()
    if dialect != "sqlite":
        return  # a server's files are its own; the rows above are what it stores
    # and not in the database files either (WAL included)
    home = Path(settings.registry_url.removeprefix("sqlite:///")).parent
    for path in home.rglob("*"):
        if path.is_file():
            assert body.encode() not in path.read_bytes(), path


# --- every way to fail -------------------------------------------------------------------------


@pytest.mark.parametrize("secret", ["", None, 42])
def test_no_secret_is_refused(people: SqlRegistry, secret: Any) -> None:
    assert "no token given" in refused(people, secret)


def test_a_malformed_secret_is_refused(people: SqlRegistry) -> None:
    _, secret = make(people)
    for bad in (
        secret[:-1],
        secret + "A",
        " " + secret,
        secret + "\n",
        f"Bearer {secret}",
        "kbf_" + "=" * 43,
        secret.removeprefix("kbf_"),
        secret.replace("kbf_", "KBF_"),
        "x" * 5000,
    ):
        assert "malformed token" in refused(people, bad), bad


def test_a_wrong_or_look_alike_secret_is_unknown(people: SqlRegistry) -> None:
    _, secret = make(people)
    other = "kbf_" + "A" * 43
    last = secret[-1]
    look_alike = secret[:-1] + ("B" if last != "B" else "C")
    case_flipped = secret[:10] + secret[10].swapcase() + secret[11:]
    for bad in (other, look_alike, case_flipped):
        if bad != secret:
            assert "unknown token" in refused(people, bad), bad
    assert people.tokens.verify_token(secret, now=T0).user_id == "amy"


def test_an_expired_token_says_when_it_expired(people: SqlRegistry) -> None:
    token, secret = make(people, expires_at=T0 + DAY)
    assert people.tokens.verify_token(secret, now=T0 + DAY - dt.timedelta(seconds=1)).id == token.id
    message = refused(people, secret, now=T0 + DAY)
    assert "expired" in message and "2030-01-02T12:00:00+00:00" in message
    assert token.status(T0 + 2 * DAY) == "expired"


def test_a_revoked_token_says_when_it_was_revoked(people: SqlRegistry) -> None:
    token, secret = make(people)
    revoked, done = people.tokens.revoke_token(token.id, actor="amy", now=T0 + DAY)
    assert done and revoked.revoked_at == T0 + DAY and revoked.status() == "revoked"
    message = refused(people, secret, now=T0 + 2 * DAY)
    assert "revoked" in message and "2030-01-02T12:00:00+00:00" in message
    assert token.id not in message  # a 401 never says which token it was


def test_revoking_twice_changes_nothing(people: SqlRegistry) -> None:
    token, _ = make(people)
    first, done = people.tokens.revoke_token(token.id, actor="amy", now=T0 + DAY)
    again, done_again = people.tokens.revoke_token(token.id, actor="root", now=T0 + 2 * DAY)
    assert done and not done_again
    assert again.revoked_at == first.revoked_at == T0 + DAY
    revokes = [r for r in people.audit.audit_trail("acme") if r.action == AuditAction.TOKEN_REVOKED]
    assert [r.actor for r in revokes] == ["amy"]
    with pytest.raises(NotFound, match="tok_000000000000"):
        people.tokens.revoke_token("tok_000000000000", actor="root")


def test_a_token_whose_user_is_gone_no_longer_verifies(
    people: SqlRegistry, settings: Settings
) -> None:
    _, secret = make(people)
    # The registry has no "delete user" (foreign keys forbid it); a hand-edited database can.
    if people.engine.dialect.name == "sqlite":
        path = settings.registry_url.removeprefix("sqlite:///")
        conn = sqlite3.connect(path)  # foreign keys off: sqlite3's default
        conn.execute("DELETE FROM users WHERE id = 'amy'")
        conn.commit()
        conn.close()
    else:  # PostgreSQL: a superuser's session skips the foreign-key triggers this way
        with people.engine.begin() as pg:
            pg.execute(text("SET LOCAL session_replication_role = replica"))
            pg.execute(text("DELETE FROM users WHERE id = 'amy'"))
    message = refused(people, secret)
    assert "holder no longer exists" in message and "amy" not in message


def test_a_disabled_agent_still_verifies_with_an_empty_scope(people: SqlRegistry) -> None:
    _, secret = make(people, agent="bot")
    agent = people.catalog.set_enabled("bot", False)
    assert people.tokens.verify_token(secret, now=T0).agent_id == "bot"
    assert people.catalog.readable_collections(agent) == []


# --- the database keeps the rules itself -------------------------------------------------------


@pytest.mark.parametrize("user, agent", [("'amy'", "'bot'"), ("NULL", "NULL")])
def test_a_token_stands_for_exactly_one_subject_in_sql(
    people: SqlRegistry, user: str, agent: str
) -> None:
    with pytest.raises(IntegrityError), people.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO api_tokens (id, secret_hash, user_id, agent_id, name, created_by, "
                f"created_at) VALUES ('tok_x', 'h', {user}, {agent}, '', 'root', :now)"
            ),
            {"now": T0},
        )


def test_hashes_are_unique_and_subjects_must_exist_in_sql(people: SqlRegistry) -> None:
    insert = text(
        "INSERT INTO api_tokens (id, secret_hash, user_id, name, created_by, created_at) "
        "VALUES (:id, :h, :user, '', 'root', :now)"
    )
    with people.engine.begin() as conn:
        conn.execute(insert, {"id": "tok_a", "h": "same", "user": "amy", "now": T0})
    with pytest.raises(IntegrityError), people.engine.begin() as conn:
        conn.execute(insert, {"id": "tok_b", "h": "same", "user": "amy", "now": T0})
    with pytest.raises(IntegrityError), people.engine.begin() as conn:
        conn.execute(insert, {"id": "tok_c", "h": "other", "user": "nobody", "now": T0})


def test_create_refuses_bad_subjects_names_and_expiries(people: SqlRegistry) -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        people.tokens.create_token(
            user_id="amy", agent_id="bot", expires_at=None, created_by="root"
        )
    with pytest.raises(ConfigError, match="exactly one"):
        people.tokens.create_token(expires_at=None, created_by="root")
    with pytest.raises(NotFound, match="nobody"):
        make(people, user="nobody")
    with pytest.raises(NotFound, match="ghost"):
        make(people, agent="ghost")
    with pytest.raises(ConfigError, match="future"):
        make(people, expires_at=T0)
    with pytest.raises(ConfigError, match="200"):
        make(people, name="x" * 201)
    assert people.tokens.list_tokens(include_revoked=True) == []


# --- audit and listing -------------------------------------------------------------------------


def test_creating_and_revoking_are_audited_in_the_subjects_org(people: SqlRegistry) -> None:
    bot, _ = make(people, agent="bot", name="crm")
    root, _ = make(people, user="root")
    people.tokens.revoke_token(bot.id, actor="amy")
    acme = [(r.actor, r.action, r.after) for r in people.audit.audit_trail("acme")]
    assert ("root", AuditAction.TOKEN_CREATED.value, {
        "token_id": bot.id, "user": None, "agent": "bot", "name": "crm",
        "expires_at": (T0 + 90 * DAY).isoformat(),
    }) in acme  # fmt: skip
    assert ("amy", AuditAction.TOKEN_REVOKED.value, {
        "token_id": bot.id, "user": None, "agent": "bot", "name": "crm",
    }) in acme  # fmt: skip
    agency = people.audit.audit_trail(None)  # root has no org: an agency-wide row
    assert any(r.after and r.after.get("token_id") == root.id for r in agency)


def test_list_filters_by_subject_and_hides_revoked_unless_asked(people: SqlRegistry) -> None:
    amy, _ = make(people)
    old, _ = make(people, now=T0 - DAY, expires_at=T0)  # expired: still listed
    bot, _ = make(people, agent="bot", now=T0 + DAY)
    people.tokens.revoke_token(bot.id, actor="root")
    assert [t.id for t in people.tokens.list_tokens()] == [old.id, amy.id]
    assert [t.id for t in people.tokens.list_tokens(include_revoked=True)] == [
        old.id,
        amy.id,
        bot.id,
    ]
    assert [t.id for t in people.tokens.list_tokens(user_id="amy")] == [old.id, amy.id]
    assert people.tokens.list_tokens(agent_id="bot") == []
    assert [t.id for t in people.tokens.list_tokens(agent_id="bot", include_revoked=True)] == [
        bot.id
    ]
    assert people.tokens.get_token(old.id).status(T0) == "expired"


# --- last_used_at ------------------------------------------------------------------------------


@pytest.fixture
def token_writes(people: SqlRegistry) -> Iterator[list[str]]:
    """Every UPDATE of api_tokens the registry sends."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE API_TOKENS"):
            seen.append(statement)

    event.listen(people.engine, "before_cursor_execute", record)
    yield seen
    event.remove(people.engine, "before_cursor_execute", record)


def test_last_used_is_written_at_most_once_a_minute(
    people: SqlRegistry, token_writes: list[str]
) -> None:
    token, secret = make(people)
    for seconds in (0, 1, 30, 59):
        people.tokens.verify_token(secret, now=T0 + dt.timedelta(seconds=seconds))
    assert len(token_writes) == 1
    assert people.tokens.get_token(token.id).last_used_at == T0
    people.tokens.verify_token(secret, now=T0 + dt.timedelta(seconds=60))
    assert len(token_writes) == 2
    assert people.tokens.get_token(token.id).last_used_at == T0 + dt.timedelta(seconds=60)
    for _ in range(20):
        people.tokens.verify_token(secret, now=T0 + dt.timedelta(seconds=90))
    assert len(token_writes) == 2


def test_verify_reads_a_naive_or_foreign_now_as_utc(people: SqlRegistry) -> None:
    _, secret = make(people, expires_at=T0 + DAY)
    cet = dt.timezone(dt.timedelta(hours=1))
    assert people.tokens.verify_token(secret, now=(T0 + DAY).replace(tzinfo=None) - dt.timedelta(1))
    refused(people, secret, now=(T0 + DAY).astimezone(cet))


# --- the migration -----------------------------------------------------------------------------


def test_migration_0008_goes_down_and_up_again(people: SqlRegistry) -> None:
    from alembic import command
    from alembic.config import Config

    from sinks.registry.base import _MIGRATIONS

    make(people)
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    with people.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0007")
    with people.engine.connect() as conn:
        assert "api_tokens" not in inspect(conn).get_table_names()
    people.migrate("head")
    assert people.tokens.list_tokens(include_revoked=True) == []
    _, secret = make(people)
    assert people.tokens.verify_token(secret, now=T0).user_id == "amy"
