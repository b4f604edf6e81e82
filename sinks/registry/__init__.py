"""The registry: orgs and users, collections and agents, documents and their review state,
chunk texts, background jobs, API tokens and the audit log — one :class:`SqlRegistry`, a
concern a module.

SQLite (WAL, ``BEGIN IMMEDIATE``, busy timeout) by default, PostgreSQL by URL; Alembic
migrations in ``sinks/migrations``. Status changes are compare-and-set
(``UPDATE ... WHERE id=? AND status=?``): a lost race raises
:class:`~core.errors.ReviewConflict` and writes nothing. Open it with
:func:`sinks.connect.open_registry`.

| concern | module |
|---|---|
| engine, sessions, migrations | ``base`` |
| orgs, users, roles, AM assignments | ``people`` |
| collections and agents | ``catalog`` |
| documents, versions, transitions | ``documents`` |
| chunk texts | ``chunks`` |
| background jobs | ``jobs`` |
| API tokens (hashed secrets) | ``tokens`` |
| passwords, browser sessions, review codes | ``logins`` |
| synced sources and their items' state | ``sources`` |
| the audit log | ``audit`` |
| row snapshots (``DocRecord`` …) | ``records`` |
| tables | ``schema`` |
"""

from __future__ import annotations

from sinks.registry.audit import AuditMixin
from sinks.registry.base import RegistryBase
from sinks.registry.catalog import AgentRecord, CatalogMixin, CollectionRecord
from sinks.registry.chunks import ChunksMixin
from sinks.registry.documents import DocumentsMixin, citations_column
from sinks.registry.jobs import JobRecord, JobsMixin
from sinks.registry.logins import IssuedCode, LoginsMixin, LoginState, WebSession
from sinks.registry.people import PeopleMixin
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
from sinks.registry.review_runs import ReviewRunsMixin
from sinks.registry.sources import ItemState, SourceRecord, SourcesMixin
from sinks.registry.tokens import TokenRecord, TokensMixin

__all__ = [
    "NO_DESCRIPTION",
    "SYSTEM_ACTOR",
    "AgentRecord",
    "CollectionRecord",
    "DocRecord",
    "IssuedCode",
    "ItemState",
    "JobRecord",
    "LoginState",
    "NewDocument",
    "OrgRecord",
    "SourceRecord",
    "SqlRegistry",
    "TokenRecord",
    "UserRecord",
    "WebSession",
    "citations_column",
    "collection_ancestry",
    "normalize_collection_path",
]


class SqlRegistry(
    PeopleMixin,
    CatalogMixin,
    DocumentsMixin,
    ChunksMixin,
    JobsMixin,
    TokensMixin,
    LoginsMixin,
    ReviewRunsMixin,
    SourcesMixin,
    AuditMixin,
    RegistryBase,
):
    """The registry over one SQLAlchemy engine, migrated to the latest schema on open."""
