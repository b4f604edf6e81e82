"""One embedded store, many processes: while ``kbflow serve`` owns it, CLI commands and Prefect
flow runs work beside the service's own requests — no "store is busy", no degraded search.

All real processes: the service (uvicorn on a loopback port), ``kbflow ingest`` running its
Prefect flow, ``kbflow search``; clients over HTTP.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import re
import string
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.settings import Settings
from kbflow.api.launch import REPO
from sinks.registry import SqlRegistry
from tests import web
from tests.kbflow.service import running_service

pytestmark = pytest.mark.integration

CLIENTS = 8


def _word(i: int) -> str:
    """A made-up word unique to document ``i`` (letters only: one token to every analyser)."""
    letters = string.ascii_lowercase
    out = ""
    n = i
    for _ in range(4):
        out += letters[n % 26]
        n //= 26
    return "qz" + out


def _corpus(path: Path, first: int, count: int) -> Path:
    with path.open("w") as out:
        for i in range(first, first + count):
            w = _word(i)
            out.write(
                json.dumps({
                    "_id": f"note-{i}",
                    "title": f"Field note {w}",
                    "text": f"The {w} procedure: how expense claim {i} is filed and approved.",
                }) + "\n"
            )  # fmt: skip
    return path


def _kbflow(home: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kbflow.cli", *args],
        cwd=REPO,
        env={**os.environ, "KBFLOW_HOME": str(home), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def world(settings: Settings) -> Iterator[dict[str, Any]]:
    """An org with an agent that reads its default collection, and the agent's token."""
    registry = SqlRegistry.open(settings.registry_url)
    try:
        registry.people.ensure_org("acme")
        registry.catalog.create_agent("acme", "bot", "answers staff")
        registry.catalog.set_allowed("bot", ["default"], allow=True)
        _, secret = registry.tokens.create_token(agent_id="bot", expires_at=None, created_by="test")
    finally:
        registry.close()
    yield {"home": settings.home, "token": secret, "settings": settings}


def _search(client: httpx.Client, base: str, token: str, query: str) -> httpx.Response:
    return client.post(
        f"{base}/v1/agent/search",
        json={"query": query, "top_k": 5},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def _found(response: httpx.Response, word: str) -> bool:
    return any(word in (r["title"] or "") for r in response.json()["results"])


def test_commands_and_flows_share_the_store_with_the_running_service(
    world: dict[str, Any], tmp_path: Path
) -> None:
    home, token = world["home"], world["token"]
    with running_service(home, tmp_path / "serve.log", {}) as base:
        ready = web.get(f"{base}/readyz", timeout=10).json()
        assert ready == {"status": "ready", "vector_store": "open", "shared": True}
        started = time.monotonic()
        ingest = _kbflow(home, "ingest", str(_corpus(tmp_path / "a.jsonl", 0, 5)), "--org",
                         "acme", "--json")  # fmt: skip
        assert ingest.returncode == 0, ingest.stderr[-3000:]
        assert "busy" not in ingest.stderr
        with web.client() as client:
            found = _search(client, base, token, f"{_word(3)} procedure")
        assert found.status_code == 200 and not found.json()["degraded"]
        assert _found(found, _word(3))
        cli = _kbflow(home, "search", f"{_word(4)} procedure", "--agent", "bot", "--json")
        assert cli.returncode == 0, cli.stderr[-3000:]
        said = json.loads(cli.stdout)
        assert not said.get("degraded") and _word(4) in cli.stdout
        assert time.monotonic() - started < 300
    # The service is gone: the next command owns the store itself and sees the same data.
    after = _kbflow(home, "search", f"{_word(2)} procedure", "--agent", "bot", "--json")
    assert after.returncode == 0 and _word(2) in after.stdout, after.stderr[-3000:]


def test_workers_reach_the_store_through_the_parent_that_owns_it(
    world: dict[str, Any], tmp_path: Path
) -> None:
    """``kbflow serve --workers 2``: the parent owns the store, both workers answer through it
    (two worker processes started), and a command beside them still reaches it."""
    home, token = world["home"], world["token"]
    with running_service(home, tmp_path / "serve.log", {}, ("--workers", "2")) as base:
        ingest = _kbflow(home, "ingest", str(_corpus(tmp_path / "w.jsonl", 0, 4)), "--org",
                         "acme", "--json")  # fmt: skip
        assert ingest.returncode == 0, ingest.stderr[-3000:]
        for i in range(24):  # new connections spread over both workers
            with web.client() as client:
                ready = client.get(f"{base}/readyz", timeout=10).json()
                assert ready == {"status": "ready", "vector_store": "open", "shared": True}
                found = _search(client, base, token, f"{_word(i % 4)} procedure")
                assert found.status_code == 200 and not found.json()["degraded"]
                assert _found(found, _word(i % 4))
        log = (tmp_path / "serve.log").read_text()
        workers = set(re.findall(r"Started server process \[(\d+)\]", log))
        assert len(workers) == 2, log[-3000:]
        tail = log.split("Application startup complete")[-1]
        assert "Traceback" not in tail


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from sinks.qdrant_edge import QdrantEdgeStore
    store = QdrantEdgeStore.open(sys.argv[1], lock_timeout_s=5)
    print("HOLDING", flush=True)
    sys.stdin.readline()
    store.close()
    """
)


def test_the_service_takes_the_store_over_once_its_holder_lets_go(
    world: dict[str, Any], tmp_path: Path
) -> None:
    """Started while a command holds the store, the service answers (degraded: keyword search
    from the registry), and owns and shares the store as soon as the command lets go."""
    settings: Settings = world["settings"]
    log = tmp_path / "holder.log"
    with log.open("w") as out:
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(settings.vectors_dir)],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "HOLDING" not in log.read_text():
            assert holder.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        env = {"KBFLOW_STORE_LOCK_TIMEOUT_S": "1"}
        with running_service(world["home"], tmp_path / "serve.log", env) as base:
            ready = web.get(f"{base}/readyz", timeout=10).json()
            assert ready == {"status": "degraded", "vector_store": "unavailable", "shared": False}
            with web.client() as client:
                degraded = _search(client, base, world["token"], "expense claim")
            assert degraded.status_code == 200 and degraded.json()["degraded"] is True
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
            holder.wait(timeout=30)
            deadline = time.monotonic() + 30
            while web.get(f"{base}/readyz", timeout=10).json()["status"] != "ready":
                assert time.monotonic() < deadline, "the service did not take the store over"
                time.sleep(0.2)
            assert web.get(f"{base}/readyz", timeout=10).json()["shared"] is True
            ingest = _kbflow(world["home"], "ingest", str(_corpus(tmp_path / "b.jsonl", 0, 3)),
                             "--org", "acme", "--json")  # fmt: skip
            assert ingest.returncode == 0, ingest.stderr[-3000:]
            with web.client() as client:
                now = _search(client, base, world["token"], f"{_word(1)} procedure")
            assert now.json()["degraded"] is False and _found(now, _word(1))
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


@dataclass
class _Probe:
    started: dt.datetime
    doc: int
    status: int
    degraded: bool
    found: bool


@pytest.mark.parametrize(
    "documents",
    [pytest.param(160, id="160"), pytest.param(1000, id="1000", marks=pytest.mark.slow)],
)
def test_searches_during_an_ingest_flow_see_every_committed_batch(
    world: dict[str, Any], tmp_path: Path, documents: int
) -> None:
    """While ``kbflow ingest`` runs its Prefect flow over ``documents`` records, 8 clients search
    through the API: every response is a 200 and not degraded, and every search that starts
    after a document's batch committed finds that document."""
    home, token = world["home"], world["token"]
    corpus = _corpus(tmp_path / "corpus.jsonl", 0, documents)
    probes: list[_Probe] = []
    errors: list[str] = []
    unlimited = {"KBFLOW_API_RATE_PER_MINUTE": "100000", "KBFLOW_API_RATE_BURST": "10000"}
    with running_service(home, tmp_path / "serve.log", unlimited) as base:
        done = threading.Event()

        def client_loop(seed: int) -> None:
            rng = random.Random(seed)
            with web.client() as client:
                while not done.is_set():
                    i = rng.randrange(documents)
                    started = dt.datetime.now(dt.UTC)
                    try:
                        response = _search(client, base, token, f"{_word(i)} procedure")
                    except httpx.HTTPError as exc:
                        errors.append(f"{type(exc).__name__}: {exc}")
                        continue
                    ok = response.status_code == 200
                    degraded = ok and bool(response.json()["degraded"])
                    found = ok and _found(response, _word(i))
                    probes.append(_Probe(started, i, response.status_code, degraded, found))

        threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(CLIENTS)]
        for t in threads:
            t.start()
        try:
            ingest = _kbflow(home, "ingest", str(corpus), "--org", "acme", "--json", timeout=3000)
        finally:
            done.set()
            for t in threads:
                t.join()
        assert ingest.returncode == 0, ingest.stderr[-3000:]
        with web.client() as client:  # afterwards, every document is found
            missing = [
                i
                for i in range(documents)
                if not _found(_search(client, base, token, f"{_word(i)} procedure"), _word(i))
            ]
    assert errors == []
    assert [p for p in probes if p.status != 200] == []
    assert [p for p in probes if p.degraded] == []
    assert missing == []
    registry = SqlRegistry.open(world["settings"].registry_url)
    try:
        committed = {
            _index_of(rec.title.split()[-1]): rec.updated_at
            for rec in registry.documents.current_documents("acme").values()
        }
    finally:
        registry.close()
    assert len(committed) == documents
    after_commit = [p for p in probes if p.started > _aware(committed[p.doc])]
    assert len(after_commit) >= CLIENTS, "too few searches ran after a commit to judge"
    unseen = [p for p in after_commit if not p.found]
    assert unseen == [], f"{len(unseen)} searches missed a committed document, e.g. {unseen[:3]}"
    summary = {"documents": documents, "searches": len(probes), "after_commit": len(after_commit)}
    print(json.dumps(summary))


def _index_of(word: str) -> int:
    n = 0
    for ch in reversed(word[2:]):
        n = n * 26 + string.ascii_lowercase.index(ch)
    return n


def _aware(when: dt.datetime) -> dt.datetime:
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)
