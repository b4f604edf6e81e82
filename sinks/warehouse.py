"""DuckDB or a SQL database for the eval warehouse and the answer ledger.

The eval warehouse (``evals/warehouse.py``) loads rows through dlt; the answer ledger
(``sinks/ledger.py``) writes each turn with plain SQL in one transaction. Both read back with
plain SQL. Where they live is a :class:`Destination`: a DuckDB file under kbflow's home by
default, or any SQL database SQLAlchemy reaches (``KBFLOW_WAREHOUSE_URL``, e.g. PostgreSQL),
which dlt loads through its ``sqlalchemy`` destination. Every read and every direct write goes
through :func:`reading` / :func:`writing`, which open the same place the loads went to, so a
store never reads one place after writing another.

What they share lives here: a dlt pipeline that stays offline and keeps its state under
kbflow's home, the test for DuckDB's "another process holds this file" error, a bounded retry
on that error, and read-only connections. The lock handling applies to DuckDB files only.

DuckDB allows ONE writer process per file, and a writer also shuts readers out (a read-only
connection holds a shared lock that shuts writers out in turn).

dlt and duckdb are imported inside the functions: together they take about a second to import,
which commands that never touch a DuckDB file should not pay.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from core.errors import ConfigError

if TYPE_CHECKING:
    import duckdb
    from dlt import Pipeline
    from sqlalchemy import Connection, Engine

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


# --- one place to load into and read from: a DuckDB file or a SQL database ---------------------

# SQLAlchemy's default PostgreSQL driver (psycopg2) is not installed; psycopg 3 is.
_DEFAULT_DRIVERS = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg"}


@dataclass(frozen=True)
class Destination:
    """Where a store's tables live: the DuckDB file ``path``, or the database at ``url``.

    Build it with :func:`destination`.
    """

    path: Path
    url: str | None = None

    @property
    def is_duckdb(self) -> bool:
        return self.url is None

    @property
    def where(self) -> str:
        """The file, or the URL without its password, for messages and logs."""
        if self.url is None:
            return str(self.path)
        from sqlalchemy.engine import make_url

        return make_url(self.url).render_as_string(hide_password=True)

    def may_hold_data(self) -> bool:
        """False only when nothing can have been loaded yet: a DuckDB file that is not there."""
        return self.url is not None or self.path.exists()


def destination(path: Path, url: str | None) -> Destination:
    """The DuckDB file ``path`` when ``url`` is unset, else the SQL database at ``url``.

    Args:
        path: The DuckDB file used when no URL is set.
        url: A SQLAlchemy URL (``KBFLOW_WAREHOUSE_URL``); ``postgresql://`` uses psycopg.

    Raises:
        ConfigError: ``url`` is not a SQLAlchemy URL, or names a database SQLAlchemy has no
            dialect for.
    """
    if not url:
        return Destination(path)
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
        if parsed.drivername in _DEFAULT_DRIVERS:
            parsed = parsed.set(drivername=_DEFAULT_DRIVERS[parsed.drivername])
        parsed.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise ConfigError(
            f"KBFLOW_WAREHOUSE_URL must be a SQLAlchemy database URL. Currently {url!r} ({exc}) "
            "— use e.g. postgresql://user:password@host:5432/kbflow, or unset it for the DuckDB "
            "files under KBFLOW_HOME"
        ) from exc
    return Destination(path, parsed.render_as_string(hide_password=False))


def dlt_pipeline(name: str, *, target: Destination, dataset: str, pipelines_dir: Path) -> Pipeline:
    """A dlt pipeline that loads into ``target`` (see :func:`duckdb_pipeline` for the rest)."""
    if target.url is None:
        return duckdb_pipeline(
            name, database=target.path, dataset=dataset, pipelines_dir=pipelines_dir
        )
    pipelines_dir.mkdir(parents=True, exist_ok=True)
    os.environ["RUNTIME__DLTHUB_TELEMETRY"] = "false"
    import dlt

    return dlt.pipeline(
        pipeline_name=name,
        destination=dlt.destinations.sqlalchemy(credentials=target.url),
        dataset_name=dataset,
        pipelines_dir=str(pipelines_dir),
    )


class SqlReader(Protocol):
    """An open connection to a destination, the same for DuckDB and a SQL database.

    SQL uses ``?`` placeholders whatever the database's own style is.
    """

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def tables(self, schema: str) -> set[str]: ...

    def columns(self, schema: str, table: str) -> set[str]: ...


class _DuckDbReader:
    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.con.execute(sql, list(params)).fetchall()

    def tables(self, schema: str) -> set[str]:
        return _tables(self, schema)

    def columns(self, schema: str, table: str) -> set[str]:
        return _columns(self, schema, table)


class _SqlAlchemyReader:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.qmark = conn.dialect.paramstyle == "qmark"

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if not self.qmark:  # psycopg and most others: %s (our SQL holds no literal % or ?)
            sql = sql.replace("?", "%s")
        result = self.conn.exec_driver_sql(sql, tuple(params))
        return [tuple(row) for row in result] if result.returns_rows else []

    def tables(self, schema: str) -> set[str]:
        return _tables(self, schema)

    def columns(self, schema: str, table: str) -> set[str]:
        return _columns(self, schema, table)


def _tables(reader: SqlReader, schema: str) -> set[str]:
    found = reader.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = ?", [schema]
    )
    return {name for (name,) in found}


def _columns(reader: SqlReader, schema: str, table: str) -> set[str]:
    found = reader.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = ? AND table_name = ?",
        [schema, table],
    )
    return {name for (name,) in found}


_ENGINES: dict[str, Engine] = {}


def _engine(url: str) -> Engine:
    """One engine (and connection pool) per URL per process."""
    if url not in _ENGINES:
        from sqlalchemy import create_engine

        _ENGINES[url] = create_engine(url, pool_pre_ping=True)
    return _ENGINES[url]


@contextmanager
def reading(
    target: Destination,
    *,
    on_lock: Callable[[], Exception],
    on_error: Callable[[Exception], Exception],
    wait_s: float = 0.0,
) -> Iterator[SqlReader]:
    """A connection for reading ``target``: read-only on a DuckDB file (waiting up to
    ``wait_s`` for another process's lock), a pooled SQLAlchemy connection on a database
    (on PostgreSQL in one REPEATABLE READ snapshot, so several statements read one state).

    Args:
        target: Where the store lives; a DuckDB file must exist.
        on_lock: Builds the error to raise when another process holds the DuckDB file.
        on_error: Builds the error to raise when the file or database cannot be opened.
        wait_s: How long to retry while the DuckDB file is locked.
    """
    if target.url is None:
        with read_only_connection(
            target.path, on_lock=on_lock, on_error=on_error, wait_s=wait_s
        ) as con:
            yield _DuckDbReader(con)
        return
    with _server_connection(target, on_error, begin=False) as conn:
        if conn.dialect.name == "postgresql":
            # One snapshot for the whole read: under PostgreSQL's default READ COMMITTED each
            # statement sees what was committed when it started, so a turn read in two
            # statements could pair one version's turn row with the next version's (absent)
            # citations while another process records that turn id again.
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        yield _SqlAlchemyReader(conn)


@contextmanager
def writing(
    target: Destination,
    *,
    on_lock: Callable[[], Exception],
    on_error: Callable[[Exception], Exception],
    wait_s: float = 0.0,
) -> Iterator[SqlReader]:
    """A read-write connection to ``target`` in one transaction: it commits when the block
    ends, and rolls back if the block raises anything at all (an injected crash included).

    On a DuckDB file (created, with its folder, if missing) the connection is closed at the
    end, so other processes can open the file again.

    Args:
        target: Where the store lives.
        on_lock: Builds the error to raise when another process holds the DuckDB file.
        on_error: Builds the error to raise when the file or database cannot be opened.
        wait_s: How long to retry while the DuckDB file is locked.
    """
    if target.url is None:
        import duckdb

        target.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            con = retry_while_locked(lambda: duckdb.connect(str(target.path)), wait_s=wait_s)
        except duckdb.IOException as exc:
            if is_lock_error(exc):
                raise on_lock() from exc
            raise on_error(exc) from exc
        try:
            con.execute("BEGIN TRANSACTION")
            yield _DuckDbReader(con)
            con.execute("COMMIT")
        finally:
            con.close()  # without a COMMIT, DuckDB rolls the transaction back
        return
    with _server_connection(target, on_error, begin=True) as conn:
        yield _SqlAlchemyReader(conn)


@contextmanager
def _server_connection(
    target: Destination, on_error: Callable[[Exception], Exception], *, begin: bool
) -> Iterator[Connection]:
    from sqlalchemy.exc import OperationalError

    assert target.url is not None
    engine = _engine(target.url)
    try:
        conn = engine.connect()
    except OperationalError as exc:
        raise on_error(exc) from exc
    try:
        if begin:
            with conn.begin():
                yield conn
        else:
            yield conn
    finally:
        conn.close()
