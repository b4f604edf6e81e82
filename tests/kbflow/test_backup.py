"""`kbflow backup` / `kbflow restore`: a backup taken while `kbflow serve` answers searches and an
ingest writes restores to the same hits, documents, audit rows and replays; a killed backup
leaves the previous one valid and no new one; a non-empty home is refused; a flipped byte is
caught; one org restores into a home in use. Real SQLite, Qdrant Edge, DuckDB and MiniLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from core.errors import ConfigError
from core.models import DocStatus, Role
from core.settings import Settings
from kbflow.api.launch import REPO, launched
from kbflow.cli import app
from tests import web
from tests.conftest import (
    ON_POSTGRES,
    _reset,
    _worker_database_url,
    copy_home,
    index_records,
    registry_url,
    warehouse_database_url,
)

runner = CliRunner()
WORDS = (
    "leave", "holiday", "expense", "travel", "laptop", "security", "password", "refund",
    "warranty", "invoice", "bicycle", "helmet", "brake", "chain", "tyre", "saddle", "pedal",
    "gear", "frame", "lock", "light", "pump", "bell", "basket", "mudguard", "rack",
    "kickstand", "bottle", "mirror",
)  # fmt: skip
FACTS = {
    "annual-leave": (
        "Annual leave",
        "Every employee gets 25 days of annual leave each year, booked with their manager.",
    ),
    "refunds": (
        "Refunds",
        "Customers can return a bicycle for a full refund within 30 days of purchase.",
    ),
    "helmets": ("Helmets", "All staff riding for work must wear a certified helmet."),
}
QUESTIONS = (
    "How many days of annual leave does an employee get each year?",
    "Within how many days can customers return a bicycle for a full refund?",
    "What must staff riding for work wear?",
)


def _records(prefix: str, n: int) -> list[dict[str, Any]]:
    return [
        {
            "key": f"{prefix}-{i}",
            "title": f"{WORDS[i % len(WORDS)].title()} policy {prefix} {i}",
            "text": f"The {WORDS[i % len(WORDS)]} rule {i}: {WORDS[(i * 7) % len(WORDS)]} "
            f"within {i + 3} days, {WORDS[(i * 3) % len(WORDS)]} for staff of {prefix}.",
        }
        for i in range(n)
    ]


def build_home(settings: Settings, embedder: Any, *, docs: int = 30) -> str:
    """Two orgs' documents (approved, pending, rejected, two versions), an agent, users, audit
    rows, ledger turns, an upload and a key under ``settings.home``; returns the agent's
    token."""
    from kbflow.services.query import answers
    from kbflow.services.query.context import open_home
    from sinks.qdrant_edge import QdrantEdgeStore
    from sinks.registry import SqlRegistry

    registry = SqlRegistry.open(settings.registry_url)
    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=5)
    try:
        kw = {"store": store, "registry": registry, "embedder": embedder}
        registry.people.ensure_user("root", Role.SUPERADMIN)
        registry.people.ensure_org("acme")
        registry.people.ensure_org("globex")
        registry.people.ensure_user("amy", Role.ACCOUNT_MANAGER)
        registry.people.assign_am("acme", "amy")
        registry.people.ensure_user("eve", Role.EXPERT, org_id="acme")
        registry.catalog.create_collection("acme", "hr", "People policies.", None)
        facts = [{"key": k, "title": t, "text": x} for k, (t, x) in FACTS.items()]
        index_records(_records("acme", docs) + facts, org="acme", collection="hr", **kw)
        changed = _records("acme", 2)
        changed[0]["text"] += " Changed: now a second version."
        index_records(changed, org="acme", collection="hr", **kw)
        drafts = index_records(
            _records("draft", 3), org="acme", status=DocStatus.PENDING_REVIEW, **kw
        )
        index_records(_records("globex", 8), org="globex", **kw)
        registry.catalog.create_agent("acme", "hr-bot", "answers staff")
        registry.catalog.set_allowed("hr-bot", ["hr"], allow=True)
        _, token = registry.tokens.create_token(
            agent_id="hr-bot", expires_at=None, created_by="root"
        )
    finally:
        store.close()
        registry.close()
    _reject(settings, drafts[0])  # an audited transition
    with open_home(settings) as ctx:
        for question in QUESTIONS:
            answers.answer(ctx, "hr-bot", question)
    upload = settings.home / "uploads" / ("ab" * 16)
    upload.mkdir(parents=True)
    (upload / "memo.txt").write_text("an upload waiting for its job\n")
    (settings.home / "prefect-auth").write_text("kbflow:secret\n")
    return token


def _superadmin(settings: Settings) -> None:
    from sinks.connect import open_registry

    with open_registry(settings) as registry:
        registry.people.ensure_user("root", Role.SUPERADMIN)


def _reject(settings: Settings, doc_id: str) -> None:
    result = runner.invoke(app, ["review", "reject", doc_id, "--as", "amy", "--note", "no"])
    assert result.exit_code == 0, result.output


def snapshot_of(settings: Settings, queries: list[str]) -> dict[str, Any]:
    """What a home serves and holds: hits per query, documents, audit rows, replays."""
    from kbflow.services.query import answers
    from kbflow.services.query.context import open_home
    from kbflow.services.query.search import search
    from sinks.ledger import Ledger

    with open_home(settings) as ctx:
        hits = {
            q: [(h.chunk_id, round(h.score, 5)) for h in search(ctx, q, agent="hr-bot").result.hits]
            for q in queries
        }
        docs = sorted(
            (d.id, d.org_id, d.status, d.version, d.content_hash)
            for org in ("acme", "globex")
            for d in ctx.registry.documents.list_documents(org, limit=10_000)
        )
        audit = {
            org: [
                (a.actor, a.action, a.doc_id, a.before, a.after)
                for a in ctx.registry.audit.audit_trail(org)
            ]
            for org in ("acme", "globex", None)
        }
    replays: dict[str, str | None] = {}
    for turn in Ledger(settings.home, url=settings.stores.warehouse_url).turns(limit=1000):
        try:
            replays[turn["turn_id"]] = answers.replay(settings, turn["turn_id"])[0].replayed
        except ConfigError:  # refused before synthesis: nothing to replay
            replays[turn["turn_id"]] = None
    return {"hits": hits, "docs": docs, "audit": audit, "replays": replays}


def _cli(*args: str, home: Path | Settings, json_out: bool = True) -> Any:
    """``kbflow ARGS --json`` on ``home`` (a folder, or settings naming its registry too)."""
    env: dict[str, str | None] = {**os.environ}
    if isinstance(home, Settings):
        env["KBFLOW_DATABASE_URL"] = home.stores.database_url
        env["KBFLOW_WAREHOUSE_URL"] = home.stores.warehouse_url
        home = home.home
    env["KBFLOW_HOME"] = str(home)
    return runner.invoke(app, [*args, *(["--json"] if json_out else [])], env=env)


def key_of(home: Settings) -> list[str]:
    """``--key-file`` with the backup key of ``home`` (made by its first backup)."""
    return ["--key-file", str(home.home / "backup-key")]


def empty_home(tmp_path: Path, name: str) -> Settings:
    """A new home; in the PostgreSQL pass with a registry database of its own, empty."""
    if ON_POSTGRES:
        url = registry_url(tmp_path / name / "registry.db", name=name)
        return Settings(home=tmp_path / name).replace(database_url=url)
    return Settings(home=tmp_path / name)


@pytest.fixture
def home(settings: Settings, embedder: Any) -> Settings:
    TOKENS[str(settings.home)] = build_home(settings, embedder)
    return settings


TOKENS: dict[str, str] = {}
"""The agent's token per home the fixture built."""


def test_a_backup_under_load_restores_the_same_home(
    home: Settings, tmp_path: Path, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    queries = [f"{w} {WORDS[(i * 5) % len(WORDS)]} days" for i, w in enumerate(WORDS)]
    queries = (queries + [f"{w} policy" for w in WORDS])[:50]
    before = snapshot_of(home, queries)
    stop = threading.Event()
    errors: list[str] = []
    served = 0
    with launched(home.home, tmp_path / "serve.log") as service:
        token = TOKENS[str(home.home)]

        def searches() -> None:
            nonlocal served
            while not stop.is_set():
                r = web.post(
                    f"{service.base}/v1/agent/search",
                    json={"query": "leave days", "top_k": 5},
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=30,
                )
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text[:200]}")
                served += 1

        def ingest() -> None:  # through the service, which owns the shard
            from sinks.connect import open_registry, open_vector_store

            try:
                with open_registry(home) as registry, open_vector_store(home) as store:
                    for batch in range(4):
                        index_records(
                            _records(f"busy{batch}", 5), org="globex", store=store,
                            registry=registry, embedder=embedder,
                        )  # fmt: skip
            except Exception as exc:  # reported by the assertions below
                errors.append(f"ingest: {exc!r}")

        workers = [threading.Thread(target=searches), threading.Thread(target=ingest)]
        for worker in workers:
            worker.start()
        result = _cli("backup", "--to", str(tmp_path / "b1"), home=home.home)
        workers[1].join()
        stop.set()
        workers[0].join()
    assert result.exit_code == 0, result.output
    assert not errors and served > 0, errors
    report = json.loads(result.stdout)
    assert report["parts"]["vectors"]["kind"] == "qdrant-edge"
    manifest = json.loads((tmp_path / "b1" / "manifest.json").read_text())
    assert manifest["parts"]["vectors"]["copied_by"] == "owner"  # kbflow serve, under its lock
    assert manifest["parts"]["registry"]["kind"] == ("sql-jsonl" if ON_POSTGRES else "sqlite")
    assert report["parts"]["ledger"]["counts"]["turns"] == len(QUESTIONS)

    fresh = empty_home(tmp_path, "fresh")
    restored = _cli("restore", str(tmp_path / "b1"), *key_of(home), home=fresh)
    assert restored.exit_code == 0, restored.output
    after = snapshot_of(fresh, queries)
    # acme: nothing wrote it meanwhile, so the same chunks in the same order. Their scores may
    # move in the fifth decimal: BM25's IDF is over the whole shard, and the backup holds
    # however much of globex's concurrent ingest it caught (seen: 0.24445 against 0.24442).
    assert {q: [c for c, _ in h] for q, h in after["hits"].items()} == {
        q: [c for c, _ in h] for q, h in before["hits"].items()
    }
    for q, hits in after["hits"].items():
        assert [s for _, s in hits] == pytest.approx([s for _, s in before["hits"][q]], abs=1e-3)
    assert sum(len(h) for h in after["hits"].values()) > 0
    assert [d for d in after["docs"] if d[1] == "acme"] == [
        d for d in before["docs"] if d[1] == "acme"
    ]
    assert after["audit"]["acme"] == before["audit"]["acme"] and before["audit"]["acme"]
    assert after["audit"][None] == before["audit"][None]
    assert after["audit"]["globex"][: len(before["audit"]["globex"])] == before["audit"]["globex"]
    assert after["replays"] == before["replays"] and len(after["replays"]) == len(QUESTIONS)
    assert any(after["replays"].values())  # at least one turn reached synthesis
    _registry_and_vectors_agree(fresh)


def _registry_and_vectors_agree(settings: Settings) -> None:
    """Every chunk the restored registry serves has its point (the registry is copied first,
    so an ingest in flight leaves at most points without rows, which search never serves)."""
    from sinks.connect import open_registry, open_vector_store
    from sinks.vectors import point_id_for

    with open_registry(settings) as registry, open_vector_store(settings) as store:
        for org in ("acme", "globex"):
            chunks = [c.chunk_id for _, c in registry.chunks.current_chunks(org)]
            found = store.payloads([point_id_for(c) for c in chunks])
            assert len(found) == len(chunks), org


def test_a_killed_backup_leaves_the_previous_one_and_no_new_one(
    home: Settings, tmp_path: Path
) -> None:
    first = _cli("backup", "--to", str(tmp_path / "backups" / "one"), home=home.home)
    assert first.exit_code == 0, first.output
    env = {
        **os.environ,
        "KBFLOW_HOME": str(home.home),
        "KBFLOW_FAULT_AT": "backup.after_part:2=kill",  # after the registry and the vectors
        "PYTHONPATH": str(REPO),
    }
    killed = subprocess.run(
        [sys.executable, "-m", "kbflow.cli", "backup", "--to", str(tmp_path / "backups" / "two")],
        env=env, capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    partial = tmp_path / "backups" / "two.partial"
    assert (partial / "vectors").is_dir() and not (tmp_path / "backups" / "two").exists()
    refused = _cli("backup", "verify", str(partial), home=home.home)
    assert refused.exit_code == 1 and "manifest.json" in refused.output
    assert (
        _cli("backup", "verify", str(tmp_path / "backups" / "one"), home=home.home).exit_code == 0
    )
    listed = json.loads(
        _cli("backup", "list", "--in", str(tmp_path / "backups"), home=home.home).stdout
    )
    assert [Path(b["path"]).name for b in listed] == ["one"]
    # The next backup replaces the leftovers and links what did not change from "one".
    again = _cli("backup", "--to", str(tmp_path / "backups" / "two"), home=home.home)
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert report["previous"] == "one" and report["parts"]["files"]["linked_bytes"] > 0
    assert report["parts"]["vectors"]["linked_bytes"] > 0
    assert not partial.exists()


def test_a_restore_into_a_home_in_use_is_refused(home: Settings, tmp_path: Path) -> None:
    assert _cli("backup", "--to", str(tmp_path / "b"), home=home.home).exit_code == 0
    files = {p: p.stat().st_mtime_ns for p in home.home.rglob("*") if p.is_file()}
    refused = _cli("restore", str(tmp_path / "b"), home=home.home)
    assert refused.exit_code == 1
    assert "not empty" in refused.output and "registry" in refused.output
    assert {p: p.stat().st_mtime_ns for p in home.home.rglob("*") if p.is_file()} == files


def test_verify_catches_a_flipped_byte(home: Settings, tmp_path: Path) -> None:
    backup = tmp_path / "b"
    assert _cli("backup", "--to", str(backup), home=home.home).exit_code == 0
    assert _cli("backup", "verify", str(backup), home=home.home).exit_code == 0
    manifest = json.loads((backup / "manifest.json").read_text())
    record = max(manifest["parts"]["vectors"]["files"], key=lambda f: f["bytes"])
    target = backup / "vectors" / record["path"]
    data = bytearray(target.read_bytes())
    data[len(data) // 3] ^= 0x01
    target.write_bytes(bytes(data))
    result = _cli("backup", "verify", str(backup), home=home.home)
    assert result.exit_code == 1
    assert "part vectors" in result.output and record["path"] in result.output
    fresh = empty_home(tmp_path, "fresh")
    refused = _cli("restore", str(backup), *key_of(home), home=fresh)
    assert refused.exit_code == 1 and "does not match" in refused.output
    assert not (fresh.home / "registry.db").exists() and not fresh.vectors_dir.exists()


def test_one_org_restores_into_a_home_in_use(home: Settings, tmp_path: Path, embedder: Any) -> None:
    from sinks.connect import open_registry

    with open_registry(home) as registry:  # a synced source, and what its last sync saw
        made = registry.sources.create_source("acme", "share", {
            "kind": "filesystem", "config": {"url": "s3://acme/docs", "glob": "**/*"},
            "collection": "docs", "status": "approved", "audience": None, "include": [],
            "exclude": [], "max_items": 10, "max_item_bytes": 1000, "schedule": None,
            "timezone": None,
        }, actor="root")  # fmt: skip
        registry.sources.record_items(
            made.id, [{"key": "a.md", "version": "e1", "content_hash": "h"}]
        )
    before = snapshot_of(home, ["leave days", "refund window"])
    assert _cli("backup", "--to", str(tmp_path / "b"), home=home.home).exit_code == 0
    other = empty_home(tmp_path, "other")
    from sinks.connect import open_vector_store

    with open_registry(other) as registry, open_vector_store(other) as store:
        registry.people.ensure_user("root", Role.SUPERADMIN)
        index_records(_records("initech", 4), org="initech", store=store, registry=registry,
                      embedder=embedder)  # fmt: skip
    as_root = ["--as", "root", *key_of(home)]
    refused = _cli("restore", str(tmp_path / "b"), "--org", "initech", *as_root, home=other)
    assert refused.exit_code == 1 and "no org 'initech'" in refused.output
    done = _cli("restore", str(tmp_path / "b"), "--org", "acme", *as_root, home=other)
    assert done.exit_code == 0, done.output
    counts = json.loads(done.stdout)["counts"]
    assert counts["turns"] == len(QUESTIONS) and counts["points"] > 0
    after = snapshot_of(other, ["leave days", "refund window"])
    # The same chunks in the same order; the keyword leg's scores move a little, since BM25's
    # IDF is over the whole shard, and this home holds another org's documents too.
    assert {q: [c for c, _ in h] for q, h in after["hits"].items()} == {
        q: [c for c, _ in h] for q, h in before["hits"].items()
    }
    assert [d for d in after["docs"] if d[1] == "acme"] == [
        d for d in before["docs"] if d[1] == "acme"
    ]
    restored_by = [a for a in after["audit"]["acme"] if a[1] == "kb.org.restored"]
    assert [a[0] for a in restored_by] == ["root"]
    assert [a for a in after["audit"]["acme"] if a[1] != "kb.org.restored"] == before["audit"][
        "acme"
    ]
    assert after["replays"] == before["replays"] and any(after["replays"].values())
    with open_registry(other) as registry:
        (restored,) = registry.sources.list_sources("acme")
        assert (restored.id, restored.config) == (made.id, made.config)
        assert registry.sources.source_items(made.id)["a.md"].version == "e1"
    again = _cli("restore", str(tmp_path / "b"), "--org", "acme", *as_root, home=other)
    assert again.exit_code == 1 and "already" in again.output


@pytest.fixture(autouse=True)
def _quiet_prefect(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("KBFLOW_STORE_LOCK_TIMEOUT_S", "30")
    yield


def test_the_scheduled_flow_backs_up_verifies_and_keeps_the_newest(
    home: Settings, tmp_path: Path, prefect_harness: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kbflow.backup_flow import backup

    folder = tmp_path / "daily"
    monkeypatch.setenv("KBFLOW_BACKUP_DIR", str(folder))  # the operator's settings
    monkeypatch.setenv("KBFLOW_BACKUP_KEEP", "1")
    first = backup()
    second = backup()
    assert second["removed"] == [first["path"]] and first["removed"] == []
    assert [p.name for p in folder.iterdir()] == [Path(second["path"]).name]
    assert second["linked_bytes"] > 0  # unchanged files came from the first, by hard link
    assert _cli("backup", "verify", second["path"], home=home.home).exit_code == 0


@pytest.mark.skipif(ON_POSTGRES, reason="the PostgreSQL pass runs this path on PostgreSQL")
def test_a_registry_in_another_database_backs_up_as_rows_and_restores(
    tmp_path: Path, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registry named by KBFLOW_DATABASE_URL (here SQLite through a driver URL, so it takes
    the PostgreSQL path) is dumped as JSON lines, counted, verified and loaded back."""
    monkeypatch.setenv("KBFLOW_DATABASE_URL", f"sqlite+pysqlite:///{tmp_path / 'src.db'}")
    source = Settings()
    build_home(source, embedder)
    queries = ["leave days", "refund window", "helmet"]
    before = snapshot_of(source, queries)
    made = _cli("backup", "--to", str(tmp_path / "b"), home=source)
    assert made.exit_code == 0, made.output
    registry = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"]["registry"]
    assert registry["kind"] == "sql-jsonl" and registry["counts"]["audit_rows"] > 0
    assert registry["counts"]["documents"]["rejected"] == 1
    fresh = Settings(home=tmp_path / "fresh").replace(
        database_url=f"sqlite+pysqlite:///{tmp_path}/d.db"
    )
    done = _cli("restore", str(tmp_path / "b"), *key_of(source), home=fresh)
    assert done.exit_code == 0, done.output
    assert snapshot_of(fresh, queries) == before
    assert _cli("restore", str(tmp_path / "b"), home=fresh).exit_code == 1  # not empty now
    other = Settings(home=tmp_path / "other").replace(
        database_url=f"sqlite+pysqlite:///{tmp_path}/o.db"
    )
    _superadmin(other)
    one = _cli("restore", str(tmp_path / "b"), "--org", "globex", "--as", "root",
               *key_of(source), home=other)  # fmt: skip
    assert one.exit_code == 0, one.output
    assert json.loads(one.stdout)["counts"]["documents"] == 8


@pytest.mark.skipif(not ON_POSTGRES, reason="needs PostgreSQL (`make test-postgres`)")
def test_a_ledger_in_postgresql_backs_up_and_restores(
    tmp_path: Path, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Registry and ledger both in PostgreSQL: dumped from a snapshot, restored whole into a
    home with a DuckDB ledger, and one org into a home whose ledger is another database."""
    monkeypatch.setenv("KBFLOW_WAREHOUSE_URL", warehouse_database_url())
    source = Settings()
    build_home(source, embedder)
    queries = ["leave days", "refund window", "helmet"]
    before = snapshot_of(source, queries)
    assert _cli("backup", "--to", str(tmp_path / "b"), home=source).exit_code == 0
    parts = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"]
    assert parts["ledger"]["kind"] == "sql-jsonl" and parts["ledger"]["counts"]["turns"] == 3
    assert parts["registry"]["kind"] == "sql-jsonl"
    fresh = empty_home(tmp_path, "fresh").replace(warehouse_url=None)
    done = _cli("restore", str(tmp_path / "b"), *key_of(source), home=fresh)
    assert done.exit_code == 0, done.output
    assert snapshot_of(fresh, queries) == before
    other_ledger = _reset(
        _worker_database_url("ledger_other"), "DROP SCHEMA IF EXISTS ledger CASCADE"
    )
    other = empty_home(tmp_path, "other").replace(warehouse_url=other_ledger)
    _superadmin(other)
    one = _cli("restore", str(tmp_path / "b"), "--org", "acme", "--as", "root", *key_of(source),
               home=other)  # fmt: skip
    assert one.exit_code == 0, one.output
    assert snapshot_of(other, queries)["replays"] == before["replays"]


def test_points_of_a_qdrant_server_back_up_and_restore(
    tmp_path: Path, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With KBFLOW_QDRANT_URL (here qdrant-client's local mode, the server API in-process),
    every point is scrolled into the backup and upserted into an empty collection on restore."""
    from sinks.connect import open_registry, open_vector_store

    monkeypatch.setenv("KBFLOW_QDRANT_URL", f"file://{tmp_path / 'qdrant-a'}")
    source = Settings()
    with open_registry(source) as registry, open_vector_store(source) as store:
        index_records(_records("acme", 6), store=store, registry=registry, embedder=embedder)
        registry.catalog.create_agent("acme", "hr-bot", "answers staff")
    before = snapshot_of(source, ["leave days", "refund window"])
    assert _cli("backup", "--to", str(tmp_path / "b"), home=source).exit_code == 0
    vectors = json.loads((tmp_path / "b" / "manifest.json").read_text())["parts"]["vectors"]
    assert vectors["kind"] == "qdrant-points" and vectors["counts"]["points"] >= 6
    monkeypatch.setenv("KBFLOW_QDRANT_URL", f"file://{tmp_path / 'qdrant-b'}")
    fresh = empty_home(tmp_path, "fresh")
    done = _cli("restore", str(tmp_path / "b"), *key_of(source), home=fresh)
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["counts"]["vectors"]["points"] == vectors["counts"]["points"]
    assert snapshot_of(fresh, ["leave days", "refund window"])["hits"] == before["hits"]
    assert all(before["hits"].values())
    again = _cli("restore", str(tmp_path / "b"), *key_of(source),
                 home=empty_home(tmp_path, "third"))  # fmt: skip
    assert again.exit_code == 1 and "points in the Qdrant" in again.output  # b's not empty


# --- hostile backups and deployment runs (issue: backups, restore, deployment parameters) ------


def _copy(backup: Path, to: Path) -> dict[str, Any]:
    """A copy of ``backup`` (links kept as links) and its manifest, to tamper with."""
    copy_home(backup, to)
    return json.loads((to / "manifest.json").read_text())


def _save(backup: Path, manifest: dict[str, Any], key: Path | None = None) -> None:
    """Write a tampered manifest; signed with ``key`` when given (an attacker holding it)."""
    if key is not None:
        from kbflow.services.backup.backups import read_key_file, sign

        manifest["signature"] = sign(manifest, read_key_file(key))
    (backup / "manifest.json").write_text(json.dumps(manifest))


def _rehash(manifest: dict[str, Any], part: str, record: dict[str, Any], file: Path) -> None:
    from sinks.snapshot import sha256_file

    for entry in manifest["parts"][part]["files"]:
        if entry["path"] == record["path"]:
            entry.update(bytes=file.stat().st_size, sha256=sha256_file(file))


def test_a_tampered_backup_is_refused_and_writes_nothing(home: Settings, tmp_path: Path) -> None:
    """A re-hashed manifest, a path that leaves the home, a link to a host file: refused by
    verify and restore, even signed with the right key, and nothing lands outside the home."""
    good = tmp_path / "b"
    assert _cli("backup", "--to", str(good), home=home.home).exit_code == 0
    key = home.home / "backup-key"
    assert _cli("backup", "verify", str(good), home=home.home).exit_code == 0

    # A re-hashed manifest: the credential replaced, its sha256 and size updated.
    rehashed = tmp_path / "rehashed"
    manifest = _copy(good, rehashed)
    (auth,) = [f for f in manifest["parts"]["files"]["files"] if f["path"] == "prefect-auth"]
    (rehashed / "files" / "prefect-auth").write_text("kbflow:attacker\n")
    _rehash(manifest, "files", auth, rehashed / "files" / "prefect-auth")
    _save(rehashed, manifest)
    result = _cli("backup", "verify", str(rehashed), home=home.home)
    assert result.exit_code == 1 and "bad signature" in result.output, result.output
    del manifest["signature"]
    _save(rehashed, manifest)
    result = _cli("backup", "verify", str(rehashed), home=home.home, json_out=False)
    assert result.exit_code == 1 and "no signature" in result.output, result.output

    # A path out of the home, and a link to a host file, even under a valid signature.
    outside = tmp_path / "x"
    escaping = tmp_path / "escaping"
    manifest = _copy(good, escaping)
    planted = escaping / "files" / "uploads" / "x"
    planted.write_text("planted\n")
    manifest["parts"]["files"]["files"].append(
        {"path": "uploads/../../../x", "bytes": 8, "sha256": _sha(planted), "linked": False}
    )
    _save(escaping, manifest, key)
    fresh = empty_home(tmp_path, "fresh")
    refused = _cli("restore", str(escaping), "--key-file", str(key), home=fresh)
    assert refused.exit_code == 1 and "leaves its folder" in refused.output, refused.output
    assert not outside.exists() and not (fresh.home / "registry.db").exists()

    host = tmp_path / "host-secret"
    host.write_text("a host file\n")
    linked = tmp_path / "linked"
    manifest = _copy(good, linked)
    (memo,) = [f for f in manifest["parts"]["files"]["files"] if f["path"].endswith("memo.txt")]
    (linked / "files" / memo["path"]).unlink()
    (linked / "files" / memo["path"]).symlink_to(host)
    _rehash(manifest, "files", memo, host)
    _save(linked, manifest, key)
    result = _cli("backup", "verify", str(linked), "--key-file", str(key), home=fresh)
    assert result.exit_code == 1 and "symbolic link" in result.output, result.output
    refused = _cli("restore", str(linked), "--key-file", str(key), home=fresh)
    assert refused.exit_code == 1 and not (fresh.home / "registry.db").exists()

    # Another home's backup needs its key: this home has none, or another one.
    refused = _cli("restore", str(good), home=fresh)
    assert refused.exit_code == 1 and "--key-file" in refused.output
    other_key = tmp_path / "other-key"
    other_key.write_text("ab" * 32 + "\n")
    refused = _cli("backup", "verify", str(good), "--key-file", str(other_key), home=fresh)
    assert refused.exit_code == 1 and "another key" in refused.output


def _sha(path: Path) -> str:
    from sinks.snapshot import sha256_file

    return sha256_file(path)


def test_restore_org_needs_a_superadmin_and_brings_only_the_orgs_own_rows(
    home: Settings, tmp_path: Path
) -> None:
    from sqlalchemy import text

    from sinks.connect import open_registry

    with open_registry(home) as registry:  # planted in the backed-up home
        registry.tokens.create_token(user_id="amy", expires_at=None, created_by="root")
        with registry.engine.begin() as con:
            con.execute(text(
                "INSERT INTO users (id, name, role, org_id, created_at) VALUES "
                "('mallory', 'Mallory', 'superadmin', 'acme', CURRENT_TIMESTAMP)"
            ))  # fmt: skip
    assert _cli("backup", "--to", str(tmp_path / "b"), home=home.home).exit_code == 0
    other = empty_home(tmp_path, "other")
    with open_registry(other) as registry:
        registry.people.ensure_user("root", Role.SUPERADMIN)
        registry.people.ensure_user("ed", Role.EXPERT)
    args = ("restore", str(tmp_path / "b"), "--org", "acme", *key_of(home))
    for claim in ([], ["--as", "ed"], ["--as", "nobody"]):
        refused = _cli(*args, *claim, home=other)
        assert refused.exit_code == 1 and "superadmin" in refused.output, refused.output
    with open_registry(other) as registry:
        assert [o.id for o in registry.people.list_orgs()] == []
        denied = [a for a in registry.audit.audit_trail(None) if a.action == "kb.access.denied"]
        assert len(denied) == 3
    done = _cli(*args, "--as", "root", home=other)
    assert done.exit_code == 0, done.output
    with open_registry(other) as registry:
        users = {u.id: u.role for u in registry.people.list_users()}
        assert users == {"root": Role.SUPERADMIN, "ed": Role.EXPERT, "amy": Role.ACCOUNT_MANAGER,
                         "eve": Role.EXPERT}  # fmt: skip
        with registry.engine.connect() as con:
            tokens = con.execute(text("SELECT user_id, agent_id FROM api_tokens")).all()
        assert tokens == [(None, "hr-bot")]  # the org's agent's; no user's


def test_the_home_and_its_backups_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """Under umask 022: the home kbflow creates and its registry, every backup, and every
    restored file are 0700 (folders) / 0600 (files)."""
    from kbflow.services.backup.backups import backup
    from kbflow.services.backup.restore import restore

    home = tmp_path / "new" / "home"
    env = {**os.environ, "KBFLOW_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("KBFLOW_DATABASE_URL", None)
    made = subprocess.run(
        [sys.executable, "-m", "kbflow.cli", "users", "add", "root", "--role", "superadmin"],
        env=env, capture_output=True, text=True, timeout=300, cwd=REPO,
        preexec_fn=lambda: os.umask(0o022),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert _mode(home) == 0o700 and _mode(home / "registry.db") == 0o600
    assert _mode(home.parent) == 0o700  # kbflow made it too
    (home / "prefect-auth").write_text("kbflow:secret\n")
    os.chmod(home / "prefect-auth", 0o600)
    old = os.umask(0o022)
    try:
        settings = Settings(home=home)
        report = backup(settings, tmp_path / "backups" / "b")
        again = backup(settings, tmp_path / "backups" / "c")  # hard links from b
        assert again.linked_bytes > 0
        restored = Settings(home=tmp_path / "restored")
        restore(restored, Path(report.path), key_file=home / "backup-key")
    finally:
        os.umask(old)
    assert _mode(home / "backup-key") == 0o600
    for root in (tmp_path / "backups", tmp_path / "restored"):
        found = [root, *root.rglob("*")]
        assert len(found) > 3
        wrong = {
            str(p): oct(_mode(p)) for p in found if _mode(p) != (0o700 if p.is_dir() else 0o600)
        }
        assert wrong == {}
    assert (tmp_path / "restored" / "prefect-auth").read_text() == "kbflow:secret\n"


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_backup_deployment_takes_no_folder_and_no_keep(tmp_path: Path) -> None:
    """An anonymous deployment run may choose neither where the home is copied nor how many
    backups are deleted: such parameters are refused before the flow starts."""
    import yaml

    from kbflow.backup_flow import backup

    for parameters in ({"folder": str(tmp_path / "loot")}, {"keep": 1}, {"to": "/tmp/x"}):
        with pytest.raises(Exception, match="parameters"):
            backup.validate_parameters(parameters)
    assert not (tmp_path / "loot").exists()
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    (deployment,) = [d for d in spec["deployments"] if d["name"] == "backup"]
    assert not deployment.get("parameters")
