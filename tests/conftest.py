"""Shared fixtures: a clean environment per test, no network beyond loopback, real components.

Real storage everywhere: Qdrant Edge in a temp dir, SQLite in ``tmp_path``, MiniLM from the
package that ships it. Prefect's test harness starts once per session, only for tests that ask.
"""

from __future__ import annotations

import os

# rich's consoles (kbflow/render.py) fix their width when first imported. Which test imports them
# first depends on the order tests run in (pytest-xdist shares them out), so every test process
# gets the same wide terminal before anything imports them: ids and table cells stay whole.
os.environ["COLUMNS"] = "250"

import datetime as dt
import functools
import ipaddress
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from core.models import DocStatus
from core.settings import Settings, configure_environment
from kbflow.api.launch import free_port
from sinks.registry import SqlRegistry
from tasks.ingest.discover import Source
from tasks.ingest.index import IngestTarget, WorkItem, index_batch

REPO = Path(__file__).resolve().parents[1]
DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))

# One data dir for the whole session's Prefect state, set before anything imports prefect. Under
# pytest-xdist (`make test` runs two workers) each worker inherits the controller's and takes its
# own beside it, so no worker's Prefect or dlt state, or its removal at the end, touches another's.
_SESSION_BASE = os.environ.setdefault("KBFLOW_TEST_HOME", f"/tmp/kbflow-tests-{os.getpid()}")
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_SESSION_HOME = Path(f"{_SESSION_BASE}-{_WORKER}" if _WORKER else _SESSION_BASE)
configure_environment(Settings(home=_SESSION_HOME))


def require_binaries(*names: str) -> None:
    """Skip the test when a system program it needs (tesseract, ffmpeg) is not installed."""
    import shutil

    missing = [name for name in names if shutil.which(name) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (`make system-deps` installs them)")


def make_org(org: str) -> None:
    """Create ``org`` in the test's KBFLOW_HOME (ingest refuses an org that does not exist)."""
    registry = SqlRegistry.open(Settings().registry_url)
    try:
        registry.people.ensure_org(org)
    finally:
        registry.close()


def datasets_dir(*parts: str) -> Path:
    """A path under ../shared/datasets, or skip the test when it is absent."""
    path = DATASETS.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"dataset not available at {path} (set KBFLOW_DATASETS to its folder)")
    return path


# What the tests themselves read: where the datasets are, the session's home, where the browser
# test saves its screenshots (`make screenshots`), which Chromium it drives, and the Qdrant
# server the live store tests run against (tests/sinks/test_qdrant_live.py).
# KBFLOW_TEST_DATABASE_URL is the PostgreSQL server of the second pass (`make test-postgres`),
# KBFLOW_TEST_GATE_EXAMPLES how many examples the gate property test runs there.
KEPT_ENV = (
    "KBFLOW_DATASETS",
    "KBFLOW_TEST_HOME",
    "KBFLOW_UI_SCREENSHOTS",
    "KBFLOW_CHROMIUM",
    "KBFLOW_TEST_QDRANT_URL",
    "KBFLOW_TEST_QDRANT_API_KEY",
    "KBFLOW_TEST_DATABASE_URL",
    "KBFLOW_TEST_GATE_EXAMPLES",
)

# --- the registry on PostgreSQL (the second pass) --------------------------------------------
# With KBFLOW_TEST_DATABASE_URL set, each pytest-xdist worker takes its own database on that
# server (`kbflow_test_gw0`, …; the plain name when serial), created and migrated once per
# session; every test starts from empty tables (one TRUNCATE), not from a new database.

TEST_DATABASE_URL = os.environ.get("KBFLOW_TEST_DATABASE_URL")
ON_POSTGRES = bool(TEST_DATABASE_URL)
_pg_ready: dict[str, Any] = {}  # database URL -> a session-long engine on it, once migrated


def _worker_database_url(suffix: str = "") -> str:
    from sqlalchemy.engine import make_url

    assert TEST_DATABASE_URL
    url = make_url(TEST_DATABASE_URL)
    name = "_".join(part for part in (url.database or "kbflow_test", _WORKER, suffix) if part)
    return url.set(database=name).render_as_string(hide_password=False)


def _ensure_database(url: str) -> None:
    """CREATE DATABASE ``url``'s database on its server when missing (from the postgres db)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = make_url(url).database
    admin = create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
            ).first()
            if not exists:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()


def _empty_registry(url: str) -> None:
    """Migrate ``url`` once per session, then empty every registry table in one statement."""
    from sqlalchemy import create_engine, text

    if url not in _pg_ready:
        _ensure_database(url)
        SqlRegistry.open(url).close()
        _pg_ready[url] = create_engine(url, connect_args={"options": "-c lock_timeout=30000"})
    with _pg_ready[url].begin() as conn:
        tables = [
            name
            for (name,) in conn.execute(
                text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                    "AND tablename <> 'alembic_version'"
                )
            )
        ]
        if tables:
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))


def registry_url(path: Path, name: str = "") -> str:
    """An empty, migrated registry for a test that opens one by hand.

    SQLite at ``path`` normally; in the PostgreSQL pass the worker's database (``name`` picks a
    second one, for a test that needs two registries), its tables emptied now.
    """
    if not ON_POSTGRES:
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    url = _worker_database_url(name)
    _empty_registry(url)
    return url


def blank_database_url(path: Path) -> str:
    """A database with no tables at all, for migration tests that start below head.

    SQLite at ``path`` normally; in the PostgreSQL pass the worker's `_migrations` database,
    its ``public`` schema dropped and created again.
    """
    if not ON_POSTGRES:
        return f"sqlite:///{path}"
    url = _worker_database_url("migrations")
    return _reset(url, "DROP SCHEMA public CASCADE", "CREATE SCHEMA public")


def warehouse_database_url() -> str:
    """A PostgreSQL database for the eval warehouse and ledger, apart from the registry's (whose
    tables every test empties), its ``evals`` and ``ledger`` schemas dropped; skips the test
    when no KBFLOW_TEST_DATABASE_URL is set (`make test-postgres` sets one)."""
    if not ON_POSTGRES:
        pytest.skip("needs PostgreSQL: set KBFLOW_TEST_DATABASE_URL, or run `make test-postgres`")
    url = _worker_database_url("warehouse")
    return _reset(
        url, "DROP SCHEMA IF EXISTS evals CASCADE", "DROP SCHEMA IF EXISTS ledger CASCADE"
    )


def _reset(url: str, *statements: str) -> str:
    """``url``'s database, created if missing, after running ``statements`` in it."""
    from sqlalchemy import create_engine, text

    _ensure_database(url)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()
    return url


def sqlite_only(reason: str) -> None:
    """Skip the test in the PostgreSQL pass: what it checks exists only in SQLite."""
    if ON_POSTGRES:
        pytest.skip(f"SQLite only: {reason}")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test gets its own KBFLOW_HOME and none of the caller's KBFLOW_* or API keys; in the
    PostgreSQL pass, KBFLOW_DATABASE_URL is the worker's database, its tables emptied."""
    for key in list(os.environ):
        if key.startswith("KBFLOW_") and key not in KEPT_ENV:
            monkeypatch.delenv(key)
    for key in ("ANTHROPIC_API_KEY", "COHERE_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("KBFLOW_HOME", str(tmp_path / "home"))
    if ON_POSTGRES:
        monkeypatch.setenv("KBFLOW_DATABASE_URL", registry_url(tmp_path / "unused"))


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse connections to anything but loopback (Prefect's test server lives there)."""
    real_connect = socket.socket.connect
    allowed = _live_qdrant_addresses()

    def guarded(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            try:
                loopback = ipaddress.ip_address(host).is_loopback
            except ValueError:
                loopback = host == "localhost"
            if not loopback and host not in allowed:
                raise OSError(f"network access blocked in tests: {address!r}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


@functools.cache
def _live_qdrant_addresses() -> frozenset[str]:
    """The addresses of the Qdrant server in KBFLOW_TEST_QDRANT_URL: the one remote host the
    live store tests may reach (none when it is unset)."""
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("KBFLOW_TEST_QDRANT_URL", "")).hostname
    if not host:
        return frozenset()
    try:
        return frozenset({host} | {str(info[4][0]) for info in socket.getaddrinfo(host, None)})
    except OSError:
        return frozenset({host})


@pytest.fixture(scope="session", autouse=True)
def _prefect_database_template() -> None:
    """The migrated Prefect database that every new test home is seeded from
    (`core.prefect_database`): built once per machine and Prefect version, before any test
    starts a server, so no test home runs Prefect's migrations itself."""
    from core import prefect_database

    prefect_database.build_template()


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


@pytest.fixture(scope="session")
def local_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma 3 270M's weights joined and checked once per worker (`evals.local_llm`); skipped
    without the ``local-llm`` extra (`make local-llm`)."""
    from evals import local_llm

    reason = local_llm.unavailable()
    if reason:
        pytest.skip(reason)
    return local_llm.assemble_weights(tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="session")
def local_model(local_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real OpenAI-compatible server on this machine (`evals.local_llm`: llama.cpp's, Gemma 3
    270M), started once per worker for the tests that read through one. A test that abandons a
    request must not use it: the server generates on for a request its client gave up on, and
    the next test on the worker would wait for it (use a `local_llm.local_server` of its own)."""
    from evals import local_llm

    log = tmp_path_factory.mktemp("llama") / "server.log"
    with local_llm.local_server(local_weights, n_ctx=4096, log_path=log) as running:
        yield running


@pytest.fixture(scope="session")
def embedder() -> Any:
    from tasks.text.embed import get_embedder

    return get_embedder()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home")


@pytest.fixture
def registry(settings: Settings) -> Iterator[SqlRegistry]:
    reg = SqlRegistry.open(settings.registry_url)
    yield reg
    reg.close()


@pytest.fixture
def edge_store(settings: Settings) -> Iterator[Any]:
    from sinks.qdrant_edge import QdrantEdgeStore

    store = QdrantEdgeStore.open(settings.vectors_dir, lock_timeout_s=1)
    yield store
    store.close()


def index_records(
    records: list[dict[str, Any]],
    *,
    store: Any,
    registry: SqlRegistry,
    embedder: Any,
    org: str = "acme",
    collection: str = "docs",
    status: DocStatus | None = DocStatus.APPROVED,
    audience: str | None = None,
    effective_date: dt.date | None = None,
    source_tag: str | None = None,
    cite_uris: dict[str, str] | None = None,
) -> list[str]:
    """Index ``{"key", "title", "text"}`` records as documents; returns their doc ids. A record
    may name its ``"uri"`` (default ``test://<org>/<key>``); one with ``"markdown": True`` is
    read as Markdown (sections at headings, a Citations footer
    kept as metadata with ``cite_uris``), as drafts are; ``"review_note"`` is kept beside it
    for its reviewer, as an offline draft's banner is."""
    registry.people.ensure_org(org)
    coll = registry.catalog.ensure_collection(org, collection)
    target = IngestTarget(
        org_id=org,
        collection_id=coll.id,
        collection_path=coll.path,
        status=status,
        audience=audience,
        effective_date=effective_date,
        source_tag=source_tag,
    )
    current = registry.documents.current_documents(org)
    items = [
        WorkItem(
            Source(
                source_key=(uri := r.get("uri") or f"test://{org}/{r['key']}"),
                uri=uri,
                content_hash=str(hash((r["title"], r["text"]))),
                path=Path(r["key"]),
                record=(r["title"], r["text"]),
                markdown=bool(r.get("markdown")),
                review_note=r.get("review_note"),
            ),
            previous=current.get(uri),
        )
        for r in records
    ]
    report = index_batch(
        items, target, store=store, registry=registry, embedder=embedder, extract_file=_no_files,
        cite_uris=cite_uris,
    )  # fmt: skip
    assert not report.skipped, report.skipped
    return report.doc_ids


def _no_files(source: Source) -> Any:
    raise AssertionError(f"unexpected file source {source}")


INTEGRATION_FIXTURES = frozenset(
    {"prefect_harness", "prefect_server", "app_server", "served", "served_once", "local_model",
     "edge_store"}
)  # fmt: skip
"""Fixtures that start a server or a process, or open Qdrant Edge on disk: a test that uses
one is an integration test, whether or not its module says so (`make test-unit` leaves it
out)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the session's Prefect/dlt state (it lives outside tmp_path)."""
    import shutil

    if "KBFLOW_TEST_HOME" in os.environ and str(_SESSION_HOME).startswith("/tmp/kbflow-tests-"):
        shutil.rmtree(_SESSION_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_whisper_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny, randomly initialised Whisper checkpoint (~14 MB), built in code: the real
    openai-whisper code path without downloadable weights. Its text is arbitrary tokens.

    ``n_text_ctx=64`` caps decoding at 32 tokens per 30 s window, so a random model cannot
    spend long generating (a 10 s clip: ~0.2 s here, ~0.5 s with Whisper's usual 448).
    """
    whisper = pytest.importorskip("whisper")
    import torch
    from whisper.model import ModelDimensions, Whisper

    dims = ModelDimensions(
        n_mels=80,
        n_audio_ctx=1500,
        n_audio_state=64,
        n_audio_head=2,
        n_audio_layer=1,
        n_vocab=51865,
        n_text_ctx=64,
        n_text_state=64,
        n_text_head=2,
        n_text_layer=1,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
        model = Whisper(dims)
        # Whisper leaves the decoder's positional embedding as torch.empty (real checkpoints
        # overwrite it): fill it, or the model would depend on whatever memory it got.
        torch.nn.init.normal_(model.decoder.positional_embedding, std=0.02)
    finally:
        torch.random.set_rng_state(generator_state)
    path = tmp_path_factory.mktemp("whisper") / "tiny-random.pt"
    torch.save({"dims": dims.__dict__, "model_state_dict": model.state_dict()}, path)
    whisper.load_model(str(path), device="cpu")  # fail here, not in a test, if it does not load
    return path


@contextmanager
def held_by_another_process(path: Path) -> Iterator[None]:
    """Another process with a read-write connection open on ``path`` until the block ends."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys; con = duckdb.connect(sys.argv[1]); print('held', flush=True);"
            " sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)


def running(proc: Any) -> bool:
    """The process (a ``psutil.Process``) still runs: not gone, and not a zombie. A killed
    process whose parent died stays a zombie until PID 1 reaps it, which some sandboxes' init
    never does; it has exited all the same."""
    import psutil

    try:
        return bool(proc.is_running()) and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def copy_home(src: Path, dst: Path) -> None:
    """A copy of the folder ``src`` (a built home, a backup) at ``dst``, links kept as links and
    holes kept as holes. An Edge shard's files are sparse (~220 MB apparent, under 1 MB on disk):
    `shutil.copytree` writes every zero, which made the crash tests alone write ~20 GB a run."""
    subprocess.run(
        ["cp", "-a", "--sparse=always", "--no-target-directory", str(src), str(dst)],
        check=True,
        capture_output=True,
    )


_BUILT_HOMES: dict[str, Path] = {}


def home_built_once(
    name: str, build: Callable[[], object], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Fill the test's KBFLOW_HOME with a copy of the home ``build`` made once per worker under
    ``name`` (the commands it runs cost seconds; a copy costs milliseconds). In the PostgreSQL
    pass the registry lives in the database, not in the home, so ``build`` runs every time."""
    home = Path(os.environ["KBFLOW_HOME"])
    if ON_POSTGRES:
        build()
        return
    template = _BUILT_HOMES.get(name)
    if template is None:
        template = tmp_path_factory.mktemp(f"built-{name}") / "home"
        with pytest.MonkeyPatch.context() as env:
            env.setenv("KBFLOW_HOME", str(template))
            build()
        _BUILT_HOMES[name] = template
    assert not home.exists(), f"{home} exists before its copy of the {name} home"
    copy_home(template, home)


@pytest.fixture
def app_server(settings: Settings) -> Iterator[str]:
    """``kbflow serve``'s app (`kbflow.api.app.create_app`) on ``settings`` under uvicorn in a
    thread of this process (so a monkeypatched spy sees its calls); its base URL. Start it after
    any in-process CLI call: the embedded store has one owner, and then it is the service."""
    import threading
    import time

    import uvicorn

    from kbflow.api.app import create_app

    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=free_port(), log_level="error"
    )
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not running.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        running.should_exit = True
        thread.join(timeout=60)
