"""Extraction isolation: a hung, crashed or ballooning extractor costs one file, not the run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from core.errors import ExtractionError
from tasks.ingest import isolate
from tasks.ingest.discover import Source, file_sha256
from tasks.ingest.index import IngestTarget, WorkItem, extract_batch, index_batch, prefetched
from tasks.ingest.isolate import ExtractionPool, Limits
from tests.conftest import running

TARGETS = "tests.tasks.ingest.isolate_targets"


@pytest.fixture(autouse=True)
def _no_parked_workers() -> Iterator[None]:
    """Each test starts and ends with no worker parked by another."""
    isolate.stop_parked_workers()
    yield
    isolate.stop_parked_workers()


def _files(tmp_path: Path, *names: str) -> list[Path]:
    paths = []
    for name in names:
        path = tmp_path / name
        path.write_text(f"text of {name}")
        paths.append(path)
    return paths


def test_a_hanging_extractor_is_killed_at_the_timeout_and_the_next_file_still_works(
    tmp_path: Path,
) -> None:
    hung, fine = _files(tmp_path, "hang.txt", "fine.txt")
    with ExtractionPool(f"{TARGETS}:hang", limits=Limits(timeout_s=3)) as pool:
        first_pid = pool.extract(fine).meta["pid"]
        started = time.monotonic()
        with pytest.raises(ExtractionError, match=r"hang\.txt took longer than 3 s") as err:
            pool.extract(hung)
        elapsed = time.monotonic() - started
        assert "KBFLOW_EXTRACT_TIMEOUT_S" in str(err.value)
        after = pool.extract(fine)
    assert 3 <= elapsed < 8
    assert after.text == "text of fine.txt"
    assert after.meta["pid"] != first_pid  # the hung worker was replaced


def test_a_crashing_parser_kills_only_its_worker(tmp_path: Path) -> None:
    crash, fine = _files(tmp_path, "crash.txt", "fine.txt")
    with ExtractionPool(f"{TARGETS}:segfault", limits=Limits(timeout_s=30)) as pool:
        with pytest.raises(ExtractionError, match=r"killed by signal SIGSEGV while reading crash"):
            pool.extract(crash)
        assert pool.extract(fine).text == "text of fine.txt"


def test_memory_over_the_cap_is_stopped(tmp_path: Path) -> None:
    bomb, fine = _files(tmp_path, "bomb.txt", "fine.txt")
    with ExtractionPool(f"{TARGETS}:balloon", limits=Limits(timeout_s=60, memory_mb=600)) as pool:
        with pytest.raises(ExtractionError, match=r"more than 600 MiB of memory") as err:
            pool.extract(bomb)
        assert "KBFLOW_EXTRACT_MEMORY_MB" in str(err.value)
        assert pool.extract(fine).text == "text of fine.txt"


def test_errors_cross_the_process_boundary_with_their_message(tmp_path: Path) -> None:
    (path,) = _files(tmp_path, "some.txt")
    with (
        ExtractionPool(f"{TARGETS}:refuse") as pool,
        pytest.raises(ExtractionError, match=r"some\.txt is refused on purpose"),
    ):
        pool.extract(path)
    with (
        ExtractionPool(f"{TARGETS}:bug") as pool,
        pytest.raises(ExtractionError, match=r"unexpected KeyError: 'a parser bug'"),
    ):
        pool.extract(path)


def test_the_worker_is_reused_between_files(tmp_path: Path) -> None:
    a, b = _files(tmp_path, "a.txt", "b.txt")
    with ExtractionPool(f"{TARGETS}:echo") as pool:
        assert pool.extract(a).meta["pid"] == pool.extract(b).meta["pid"]


def test_a_hung_file_is_reported_in_the_batch_and_its_neighbours_are_stored(
    tmp_path: Path, registry: Any, edge_store: Any, embedder: Any
) -> None:
    """The ingest path end to end below Prefect: extract_batch through the pool, then index."""
    hung, fine = _files(tmp_path, "hang.txt", "fine.txt")
    registry.people.ensure_org("acme")
    coll = registry.catalog.ensure_collection("acme", "docs")
    target = IngestTarget(org_id="acme", collection_id=coll.id, collection_path=coll.path)
    items = [WorkItem(Source(p.as_uri(), p.as_uri(), file_sha256(p), p)) for p in (hung, fine)]
    with ExtractionPool(f"{TARGETS}:hang", limits=Limits(timeout_s=2)) as pool:
        extracted = extract_batch(items, lambda source: pool.extract(source.path))

    report = index_batch(
        items,
        target,
        store=edge_store,
        registry=registry,
        embedder=embedder,
        extract_file=prefetched(extracted),
    )

    assert report.documents == 1
    ((name, reason),) = report.skipped
    assert name == "hang.txt" and "took longer than 2 s and was stopped" in reason
    stored = registry.documents.list_documents("acme")
    assert [Path(d.uri).name for d in stored] == ["fine.txt"]


# --- a worker parked between pools -------------------------------------------------------------


def test_an_idle_worker_serves_the_next_pool_in_the_same_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (a,) = _files(tmp_path, "a.txt")
    with ExtractionPool(f"{TARGETS}:echo") as pool:
        first = pool.extract(a).meta["pid"]
    with ExtractionPool(f"{TARGETS}:echo") as pool:
        assert pool.extract(a).meta["pid"] == first  # no second start
    monkeypatch.setenv("OMP_THREAD_LIMIT", "7")  # the OCR it runs reads it; it never saw this
    with ExtractionPool(f"{TARGETS}:echo") as pool:
        changed = pool.extract(a).meta["pid"]
    assert changed != first
    assert not psutil.pid_exists(first) or not running(psutil.Process(first))
    assert isolate.stop_parked_workers() == 1
    _gone(changed)


def test_a_parked_worker_outlives_a_new_home_and_a_new_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kbflow's settings reach the extractor as arguments and it imports no Prefect: a pool in
    another home, with another Prefect API, or in pytest's next test gets the parked worker
    instead of spending seconds starting its own."""
    (a,) = _files(tmp_path, "a.txt")
    with ExtractionPool(f"{TARGETS}:echo") as pool:
        first = pool.extract(a).meta["pid"]
    monkeypatch.setenv("KBFLOW_HOME", str(tmp_path / "another-home"))
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/x.py::test_next (setup)")
    with ExtractionPool(f"{TARGETS}:echo") as pool:
        assert pool.extract(a).meta["pid"] == first
    assert isolate.stop_parked_workers() == 1
    _gone(first)


def test_a_worker_busy_when_its_pool_ends_is_killed_not_parked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file sent whose outcome was never read (the caller was interrupted): the next pool
    must not receive that stale outcome for its own file."""
    hung, fine = _files(tmp_path, "hang.txt", "fine.txt")

    def interrupted(*_: Any) -> Any:
        raise KeyboardInterrupt

    with ExtractionPool(f"{TARGETS}:hang") as pool:
        busy = pool.extract(fine).meta["pid"]
        monkeypatch.setattr(ExtractionPool, "_await", interrupted)
        with pytest.raises(KeyboardInterrupt):
            pool.extract(hung)
    monkeypatch.undo()
    _gone(busy)
    assert isolate.stop_parked_workers() == 0


def test_a_parked_worker_stops_after_its_idle_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(isolate, "PARK_IDLE_S", 0.5)
    (a,) = _files(tmp_path, "a.txt")
    with ExtractionPool(f"{TARGETS}:echo") as pool:
        pid = pool.extract(a).meta["pid"]
    _gone(pid)
    assert isolate.stop_parked_workers() == 0


def _gone(pid: int, within_s: float = 15) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or not running(psutil.Process(pid)):
            return
        time.sleep(0.1)
    raise AssertionError(f"worker {pid} still runs {within_s:g} s later")
