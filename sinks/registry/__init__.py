"""The registry: orgs and users, collections and agents, documents and their review state,
chunk texts, background jobs, API tokens and the audit log — one :class:`SqlRegistry` over
one engine, and a repository per concern, a module each.

SQLite (WAL, ``BEGIN IMMEDIATE``, busy timeout) by default, PostgreSQL by URL; Alembic
migrations in ``sinks/migrations``. Status changes are compare-and-set
(``UPDATE ... WHERE id=? AND status=?``): a lost race raises
:class:`~core.errors.ReviewConflict` and writes nothing. Open it with
:func:`sinks.connect.open_registry`.

`SqlRegistry` keeps what is about the whole store (``engine``, ``session()``, ``open``,
``migrate``, ``close``) and holds the repositories as attributes, all built over that one
engine and session factory: ``registry.documents.get_document(...)``,
``registry.catalog.create_agent(...)``, ``registry.audit.audit_trail(...)``. No repository
calls another: a change that is audited adds its audit row in its own session (the same
transaction), through the row helpers of ``audit``.

| concern | module | attribute: repository |
|---|---|---|
| engine, sessions, migrations | ``base`` | the registry itself (`RegistryBase`) |
| orgs, users, roles, AM assignments | ``people`` | ``people``: `PeopleRepository` |
| collections and agents | ``catalog`` | ``catalog``: `CatalogRepository` |
| documents, versions, transitions | ``documents`` | ``documents``: `DocumentsRepository` |
| chunk texts | ``chunks`` | ``chunks``: `ChunksRepository` |
| background jobs | ``jobs`` | ``jobs``: `JobsRepository` |
| API tokens (hashed secrets) | ``tokens`` | ``tokens``: `TokensRepository` |
| passwords, browser sessions, review codes | ``logins`` | ``logins``: `LoginsRepository` |
| decision proofs, review runs | ``review_runs`` | ``review_runs``: `ReviewRunsRepository` |
| synced sources and their items' state | ``sources`` | ``sources``: `SourcesRepository` |
| the audit log | ``audit`` | ``audit``: `AuditRepository` |
| row snapshots (``DocRecord`` …) | ``records`` | — |
| tables | ``schema`` | — |
"""

from __future__ import annotations

from sqlalchemy import Engine

from sinks.registry.audit import AuditRepository
from sinks.registry.base import RegistryBase
from sinks.registry.catalog import (
    AgentRecord,
    CatalogRepository,
    CollectionRecord,
    named_collection,
)
from sinks.registry.chunks import ChunksRepository
from sinks.registry.documents import DocumentsRepository, citations_column
from sinks.registry.jobs import JobRecord, JobsRepository
from sinks.registry.logins import IssuedCode, LoginsRepository, LoginState, WebSession
from sinks.registry.people import PeopleRepository
from sinks.registry.records import (
    NO_DESCRIPTION,
    SYSTEM_ACTOR,
    DocRecord,
    NewDocument,
    OrgRecord,
    UserRecord,
    collection_ancestry,
    normalize_collection_path,
)
from sinks.registry.review_runs import ReviewRunsRepository
from sinks.registry.sources import ItemState, SourceRecord, SourcesRepository
from sinks.registry.tokens import TokenRecord, TokensRepository

__all__ = [
    "NO_DESCRIPTION",
    "SYSTEM_ACTOR",
    "AgentRecord",
    "AuditRepository",
    "CatalogRepository",
    "ChunksRepository",
    "CollectionRecord",
    "DocRecord",
    "DocumentsRepository",
    "IssuedCode",
    "ItemState",
    "JobRecord",
    "JobsRepository",
    "LoginState",
    "LoginsRepository",
    "NewDocument",
    "OrgRecord",
    "PeopleRepository",
    "ReviewRunsRepository",
    "SourceRecord",
    "SourcesRepository",
    "SqlRegistry",
    "TokenRecord",
    "TokensRepository",
    "UserRecord",
    "WebSession",
    "citations_column",
    "collection_ancestry",
    "named_collection",
    "normalize_collection_path",
]


class SqlRegistry(RegistryBase):
    """The registry over one SQLAlchemy engine, migrated to the latest schema on open: the
    engine, its sessions and migrations, and one repository per concern over them."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.people = PeopleRepository(self)
        self.catalog = CatalogRepository(self)
        self.documents = DocumentsRepository(self)
        self.chunks = ChunksRepository(self)
        self.jobs = JobsRepository(self)
        self.tokens = TokensRepository(self)
        self.logins = LoginsRepository(self)
        self.review_runs = ReviewRunsRepository(self)
        self.sources = SourcesRepository(self)
        self.audit = AuditRepository(self)
