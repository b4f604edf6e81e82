"""The registry's engine: opening (and migrating) the database, sessions, SQLite's settings;
and `Repository`, the base of each concern's repository over that one engine."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

_MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"
IN_LIST_MAX = 500
"""The most values one SQL ``IN (...)`` list is given."""

T = TypeVar("T")


def in_lists(values: Sequence[T]) -> Iterator[Sequence[T]]:
    """``values`` in consecutive slices of at most `IN_LIST_MAX`, one per ``IN (...)`` clause."""
    for start in range(0, len(values), IN_LIST_MAX):
        yield values[start : start + IN_LIST_MAX]


class RegistryBase:
    """An engine and its sessions; every repository of the registry builds on it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str) -> Self:
        """Open (and migrate) the registry at ``url``."""
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url)
        if engine.dialect.name == "sqlite":
            configure_sqlite(engine)
        registry = cls(engine)
        registry.migrate()
        return registry

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` with Alembic."""
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(_MIGRATIONS))
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)

    def close(self) -> None:
        self.engine.dispose()

    def session(self) -> Session:
        return self._sessions()


class Repository:
    """One concern of the registry over the store's engine and session factory.

    Every repository of a registry is built over the same `RegistryBase`, so they share one
    engine and one session factory: :meth:`session` is the store's, not a copy of it.
    """

    def __init__(self, store: RegistryBase) -> None:
        self._store = store

    @property
    def engine(self) -> Engine:
        return self._store.engine

    def session(self) -> Session:
        return self._store.session()


def configure_sqlite(engine: Engine) -> None:
    """WAL, a busy timeout and BEGIN IMMEDIATE: one writer at a time, waiting, never failing."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=15000")
        cur.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
