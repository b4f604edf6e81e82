"""dlt into DuckDB, shared by the stores that keep their tables in a DuckDB file.

The eval warehouse (``evals/warehouse.py``) and the answer ledger (``sinks/ledger.py``) both load
rows through dlt and read them back with plain SQL. What they share lives here: a dlt pipeline
that stays offline and keeps its state under kbflow's home, the test for DuckDB's "another
process holds this file" error, a bounded retry on that error, and read-only connections.

DuckDB allows ONE writer process per file, and a writer also shuts readers out (a read-only
connection holds a shared lock that shuts writers out in turn).

dlt and duckdb are imported inside the functions: together they take about a second to import,
which commands that never touch a DuckDB file should not pay.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import duckdb
    from dlt import Pipeline

log = logging.getLogger(__name__)
T = TypeVar("T")

_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 1.0


def duckdb_pipeline(name: str, *, database: Path, dataset: str, pipelines_dir: Path) -> Pipeline:
    """A dlt pipeline that loads into the DuckDB file ``database``, with telemetry off.

    Creates the folders of ``database`` and ``pipelines_dir``. dlt keeps the pipeline's state
    and load packages under ``pipelines_dir / name``; callers pass a folder under kbflow's home
    (``<home>/dlt``) so nothing lands in ``~/.dlt``. Run the pipeline inside
    :func:`without_dlt_usage_tracking`.

    Args:
        name: The pipeline's name (and its folder under ``pipelines_dir``).
        database: The DuckDB file to load into.
        dataset: The DuckDB schema the tables go to.
        pipelines_dir: Where dlt keeps the pipeline's own state.
    """
    database.parent.mkdir(parents=True, exist_ok=True)
    pipelines_dir.mkdir(parents=True, exist_ok=True)
    # kbflow runs offline and must not phone home. dlt reads this once per process, when it
    # first resolves its runtime config, so it has to be set before the pipeline is created
    # (and `without_dlt_usage_tracking` covers a process where that already happened).
    os.environ["RUNTIME__DLTHUB_TELEMETRY"] = "false"
    import dlt

    return dlt.pipeline(
        pipeline_name=name,
        destination=dlt.destinations.duckdb(str(database)),
        dataset_name=dataset,
        pipelines_dir=str(pipelines_dir),
    )


@contextmanager
def without_dlt_usage_tracking(pipeline: Any) -> Iterator[None]:
    """Unhook dlt's usage tracker from pipeline steps while ``pipeline`` runs.

    With telemetry off dlt sends nothing, but its tracker still builds each event and so
    creates ``.anonymous_id`` in dlt's global dir (``~/.dlt``, ``/var/dlt`` for root), outside
    the pipelines dir. Dropping the tracker for the run keeps dlt out of that dir and also
    guarantees no event even if this process started dlt earlier with telemetry on. The
    tracker also carries Sentry spans, so it stays when a Sentry DSN is configured.
    """
    from dlt.pipeline import trace, track

    if pipeline.run_context.runtime_config.sentry_dsn:
        yield
        return
    hooked = trace.TRACKING_MODULES
    trace.TRACKING_MODULES = [module for module in hooked if module is not track]
    try:
        yield
    finally:
        trace.TRACKING_MODULES = hooked


def is_lock_error(exc: BaseException) -> bool:
    """Whether DuckDB refused the file because another process holds its lock.

    dlt wraps the duckdb error (``PipelineStepFailed.exception`` -> ``__cause__``), so walk
    the chain; duckdb says "Could not set lock on file ...: Conflicting lock is held in ...".
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if "Could not set lock on file" in str(current) or "Conflicting lock" in str(current):
            return True
        inner = getattr(current, "exception", None)
        if isinstance(inner, BaseException):
            todo.append(inner)
        todo.extend((current.__cause__, current.__context__))
    return False


def retry_while_locked(
    action: Callable[[], T],
    *,
    wait_s: float,
    is_locked: Callable[[BaseException], bool] = is_lock_error,
) -> T:
    """Run ``action``, retrying with backoff while it fails because a lock is held elsewhere.

    Args:
        action: What to run; it must be safe to run again after a lock failure.
        wait_s: How long to keep retrying; 0 tries once.
        is_locked: Which failures mean "held by someone else" (default: DuckDB's file lock).

    Returns:
        What ``action`` returned.

    Raises:
        Exception: The last lock failure once ``wait_s`` has passed, or any other failure at
            once.
    """
    deadline = time.monotonic() + wait_s
    delay = _FIRST_BACKOFF_S
    while True:
        try:
            return action()
        except Exception as exc:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not is_locked(exc):
                raise
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _MAX_BACKOFF_S)


@contextmanager
def read_only_connection(
    path: Path,
    *,
    on_lock: Callable[[], Exception],
    on_error: Callable[[Exception], Exception],
    wait_s: float = 0.0,
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only DuckDB connection to ``path``, closed on exit.

    Args:
        path: The DuckDB file; it must exist.
        on_lock: Builds the error to raise when another process holds the file's lock.
        on_error: Builds the error to raise when the file cannot be opened for another reason.
        wait_s: How long to keep retrying while the file is locked before raising.
    """
    import duckdb

    try:
        con = retry_while_locked(lambda: duckdb.connect(str(path), read_only=True), wait_s=wait_s)
    except duckdb.IOException as exc:
        if is_lock_error(exc):
            raise on_lock() from exc
        raise on_error(exc) from exc
    try:
        yield con
    finally:
        con.close()


def table_exists(con: duckdb.DuckDBPyConnection, schema: str, table: str) -> bool:
    """Whether ``schema.table`` exists (dlt creates a table only once rows arrive for it)."""
    found = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?",
        [schema, table],
    ).fetchone()
    return bool(found and found[0])


def drop_unfinished_loads(pipeline: Any, what: str) -> None:
    """Abort the load packages a failed run left in ``pipeline``'s folder.

    dlt's ``run`` finishes pending packages INSTEAD of loading the new data (it only logs a
    warning), so a run after a failure would silently store the old data and skip the new.
    The failed run's caller was told; the rows it meant to write are written again by a retry.
    """
    if not pipeline.has_pending_data:
        return
    log.warning(
        "dropping %d unfinished %s load package(s) in %s",
        len(pipeline.list_normalized_load_packages())
        + len(pipeline.list_extracted_load_packages()),
        what,
        pipeline.pipelines_dir,
    )
    pipeline.abort_packages()
