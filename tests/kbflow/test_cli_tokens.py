"""``kbflow tokens`` as an admin runs it: the secret printed once, never listed, who may create
and revoke whose tokens, and the exit codes of refusals and unknown ids.

In-process (typer's CliRunner) on a real registry in the test's KBFLOW_HOME; people are made
through the CLI itself.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import Result

from core.errors import Unauthorized
from core.settings import Settings
from sinks.registry import SqlRegistry
from tests.kbflow.support import data, flat, kb, ok

SECRET = re.compile(r"kbf_[A-Za-z0-9_-]{43}")
RECORD_KEYS = {
    "id", "user", "agent", "name", "created_by", "created_at", "expires_at", "revoked_at",
    "last_used_at", "status",
}  # fmt: skip


def refused(*args: str, says: str) -> Result:
    result = kb(*args)
    assert result.exit_code == 1, (args, result.output)
    assert says in flat(result), (args, result.output)
    assert "error:" in result.stderr
    return result


@pytest.fixture
def people() -> None:
    """root (superadmin); org acme with AM amy, engineer ed and agent bot; org globex with AM
    gus."""
    ok("users", "add", "root", "--role", "superadmin")
    for org in ("acme", "globex"):
        ok("orgs", "create", org, "--as", "root")
    ok("users", "add", "amy", "--role", "account_manager", "--as", "root")
    ok("users", "add", "gus", "--role", "account_manager", "--as", "root")
    ok("users", "add", "ed", "--role", "engineer", "--org", "acme", "--as", "root")
    ok("orgs", "assign-am", "acme", "amy", "--as", "root")
    ok("orgs", "assign-am", "globex", "gus", "--as", "root")
    ok("agents", "create", "--org", "acme", "bot", "--as", "amy")


@pytest.fixture
def registry() -> Iterator[SqlRegistry]:
    reg = SqlRegistry.open(Settings().registry_url)
    yield reg
    reg.close()


def create(*args: str) -> dict[str, Any]:
    made: dict[str, Any] = data("tokens", "create", *args)
    return made


# --- the secret, once --------------------------------------------------------------------------


def test_create_prints_the_secret_once_and_list_never_does(
    people: None, registry: SqlRegistry
) -> None:
    made = ok("tokens", "create", "--user", "ed", "--as", "ed", "--name", "laptop")
    lines = made.stdout.splitlines()
    assert "user ed" in lines[0] and "laptop" in lines[0] and "expires" in lines[0]
    secret = lines[-1]
    assert SECRET.fullmatch(secret) and made.stdout.count(secret) == 1
    assert "cannot be shown again" in " ".join(made.stderr.split())
    assert secret not in made.stderr

    token = registry.tokens.verify_token(secret)
    assert (token.user_id, token.name, token.created_by) == ("ed", "laptop", "ed")

    digest = hashlib.sha256(secret.encode()).hexdigest()
    body = secret.removeprefix("kbf_")
    for args in (
        ("tokens", "list"), ("tokens", "list", "--all"), ("tokens", "list", "--json"),
        ("tokens", "list", "--user", "ed", "--json"), ("audit", "--org", "acme", "--json"),
        ("tokens", "revoke", token.id, "--as", "ed", "--json"), ("tokens", "list", "--all"),
    ):  # fmt: skip
        shown = ok(*args).output
        assert body not in shown and digest not in shown, args
    assert token.id in ok("tokens", "list", "--all").stdout


def test_create_json_holds_the_secret_and_the_record(people: None, registry: SqlRegistry) -> None:
    before = dt.datetime.now(dt.UTC)
    made = create("--agent", "bot", "--as", "amy", "--name", "crm")
    assert set(made) == RECORD_KEYS | {"secret"}
    assert list(made)[:2] == ["id", "secret"]
    assert (made["user"], made["agent"], made["name"]) == (None, "bot", "crm")
    assert (made["created_by"], made["status"], made["revoked_at"]) == ("amy", "active", None)
    expires = dt.datetime.fromisoformat(made["expires_at"])
    assert before + dt.timedelta(days=90) <= expires <= dt.datetime.now(dt.UTC) + dt.timedelta(90)
    assert registry.tokens.verify_token(made["secret"]).id == made["id"]

    forever = create("--user", "root", "--as", "root", "--expires-days", "0")
    assert forever["expires_at"] is None and forever["agent"] is None
    week = create("--user", "root", "--as", "root", "--expires-days", "7")
    assert dt.datetime.fromisoformat(week["expires_at"]) < expires
    for days in ("-1", "3651", "soon"):
        bad = kb("tokens", "create", "--user", "root", "--as", "root", "--expires-days", days)
        assert bad.exit_code == 2, days


def test_list_shapes_and_filters(people: None) -> None:
    ed = create("--user", "ed", "--as", "ed")
    bot = create("--agent", "bot", "--as", "root")
    listed = data("tokens", "list")
    assert [t["id"] for t in listed] == [ed["id"], bot["id"]]
    assert all(set(t) == RECORD_KEYS for t in listed)
    assert [t["id"] for t in data("tokens", "list", "--user", "ed")] == [ed["id"]]
    assert [t["id"] for t in data("tokens", "list", "--agent", "bot")] == [bot["id"]]
    ok("tokens", "revoke", bot["id"], "--as", "amy")
    assert [t["id"] for t in data("tokens", "list")] == [ed["id"]]
    every = data("tokens", "list", "--all")
    assert [(t["id"], t["status"]) for t in every] == [(ed["id"], "active"), (bot["id"], "revoked")]
    table = flat(ok("tokens", "list", "--all"))
    assert "user ed" in table and "agent bot" in table and "revoked" in table

    refused("tokens", "list", "--user", "nobody", says="'nobody' does not exist")
    refused("tokens", "list", "--agent", "ghost", says="'ghost' does not exist")
    refused("tokens", "list", "--user", "ed", "--agent", "bot", says="not both")
    assert kb("tokens", "list", "--user", "Ed").exit_code == 2  # not a user id


# --- who may create ----------------------------------------------------------------------------


def test_who_may_create_whose_tokens(people: None, registry: SqlRegistry) -> None:
    assert kb("tokens", "create", "--user", "ed").exit_code == 2  # --as is required
    refused("tokens", "create", "--user", "ed", "--as", "mallory", says="unknown user 'mallory'")
    refused("tokens", "create", "--user", "amy", "--as", "ed", says="may not create tokens")
    refused("tokens", "create", "--agent", "bot", "--as", "gus", says="may not create tokens")
    refused("tokens", "create", "--agent", "bot", "--as", "ed", says="may not create tokens")
    refused("tokens", "create", "--as", "root", says="--user USER or --agent AGENT")
    refused("tokens", "create", "--user", "ed", "--agent", "bot", "--as", "root", says="not both")
    refused("tokens", "create", "--agent", "ghost", "--as", "amy", says="'ghost' does not exist")
    refused("tokens", "create", "--user", "nobody", "--as", "root", says="'nobody' does not exist")
    assert data("tokens", "list", "--all") == []

    create("--user", "ed", "--as", "ed")  # their own
    create("--agent", "bot", "--as", "amy")  # the AM of the agent's org
    create("--user", "amy", "--as", "root")  # a superadmin: anyone's
    create("--agent", "bot", "--as", "root")
    assert len(data("tokens", "list")) == 4

    denied = [r for r in data("audit", "--org", "acme") if r["action"] == "kb.access.denied"]
    assert {r["actor"] for r in denied} == {"gus", "ed"}
    agency = [r for r in data("audit") if r["action"] == "kb.access.denied"]
    assert {r["actor"] for r in agency} >= {"mallory", "ed"}
    created = [r for r in data("audit", "--org", "acme") if r["action"] == "kb.token.created"]
    assert sorted(r["actor"] for r in created) == ["amy", "ed", "root"]


# --- who may revoke ----------------------------------------------------------------------------


def test_who_may_revoke_and_revoking_twice(people: None, registry: SqlRegistry) -> None:
    ed = create("--user", "ed", "--as", "ed")
    bot = create("--agent", "bot", "--as", "amy")

    assert kb("tokens", "revoke", ed["id"]).exit_code == 2  # --as is required
    refused("tokens", "revoke", ed["id"], "--as", "amy", says="may not revoke token")
    refused("tokens", "revoke", bot["id"], "--as", "gus", says="may not revoke token")
    refused("tokens", "revoke", bot["id"], "--as", "ed", says="may not revoke token")
    refused("tokens", "revoke", "tok_000000000000", "--as", "root", says="does not exist")
    assert registry.tokens.verify_token(ed["secret"]).id == ed["id"]  # nothing was revoked

    done = ok("tokens", "revoke", ed["id"], "--as", "ed")
    assert f"token {ed['id']} (user ed) revoked" in flat(done)
    again = ok("tokens", "revoke", ed["id"], "--as", "root")
    assert "already revoked" in flat(again) and "nothing changed" in flat(again)
    shape = data("tokens", "revoke", ed["id"], "--as", "ed")
    assert set(shape) == RECORD_KEYS | {"already_revoked"}
    assert shape["already_revoked"] is True and shape["status"] == "revoked"
    with pytest.raises(Unauthorized, match="revoked"):
        registry.tokens.verify_token(ed["secret"])

    first = data("tokens", "revoke", bot["id"], "--as", "root")  # a superadmin: anyone's
    assert first["already_revoked"] is False and first["revoked_at"]
    with pytest.raises(Unauthorized, match="revoked"):
        registry.tokens.verify_token(bot["secret"])
    amys = create("--agent", "bot", "--as", "root")
    ok("tokens", "revoke", amys["id"], "--as", "amy")  # the AM of the agent's org

    revoked = [r for r in data("audit", "--org", "acme") if r["action"] == "kb.token.revoked"]
    assert [(r["actor"], r["after"]["token_id"]) for r in revoked] == [
        ("ed", ed["id"]), ("root", bot["id"]), ("amy", amys["id"]),
    ]  # fmt: skip
