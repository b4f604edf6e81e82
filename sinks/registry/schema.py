"""Registry tables (SQLAlchemy 2). Alembic migrations in ``sinks/migrations`` create them."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

TOKEN_ONE_SUBJECT = (
    "(user_id IS NOT NULL AND agent_id IS NULL) OR (user_id IS NULL AND agent_id IS NOT NULL)"
)
"""A token stands for a user or an agent, never both, never neither (migration 0008 too)."""


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def aware(at: dt.datetime) -> dt.datetime:
    """A stored time with its zone (SQLite drops it; every stored time is UTC)."""
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


class Base(DeclarativeBase):
    pass


class OrgRow(Base):
    __tablename__ = "orgs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    am_user_id: Mapped[str | None] = mapped_column(String(120), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class UserRow(Base):
    __tablename__ = "users"
    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(32))
    org_id: Mapped[str | None] = mapped_column(ForeignKey("orgs.id"), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class CollectionRow(Base):
    __tablename__ = "collections"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"))
    path: Mapped[str] = mapped_column(String(500))
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("collections.id"), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    __table_args__ = (Index("ux_collections_org_path", "org_id", "path", unique=True),)


class DocumentRow(Base):
    __tablename__ = "documents"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"))
    collection_id: Mapped[int] = mapped_column(ForeignKey("collections.id"))
    source_key: Mapped[str] = mapped_column(String(1000))
    title: Mapped[str] = mapped_column(String(500))
    uri: Mapped[str] = mapped_column(String(2000))
    content_hash: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[str | None] = mapped_column(String(32), nullable=True)
    source_tag: Mapped[str | None] = mapped_column(String(64), nullable=True)
    synthesis_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    audience: Mapped[str | None] = mapped_column(String(64), nullable=True)
    effective_date: Mapped[dt.date | None] = mapped_column(Date, nullable=True)
    parse_status: Mapped[str] = mapped_column(String(32))
    chunk_count: Mapped[int] = mapped_column(Integer, default=0)
    approved_by: Mapped[str | None] = mapped_column(String(120), nullable=True)
    approved_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    rejected_by: Mapped[str | None] = mapped_column(String(120), nullable=True)
    rejected_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    edited_by: Mapped[str | None] = mapped_column(String(120), nullable=True)
    edited_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # The sources the text cites ([doc:…], [url:…], [search:…] tags), from its Citations footer:
    # ``[{"tag", "title", "uri"}]``, or NULL when it has none (migration 0009).
    citations: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    # A note for the reviewer only (an offline draft's banner), kept beside the text and never
    # chunked, so search never serves it; NULL without one (migration 0015).
    review_note: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )
    __table_args__ = (
        Index("ix_documents_org_source", "org_id", "source_key"),
        Index("ix_documents_org_status", "org_id", "status"),
    )


class AuditRow(Base):
    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    actor: Mapped[str] = mapped_column(String(120))
    action: Mapped[str] = mapped_column(String(64))
    org_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # None: agency-wide
    doc_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    synthesis_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    source_tag: Mapped[str | None] = mapped_column(String(64), nullable=True)
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class JobRow(Base):
    """A long ingest (audio, video, large files) running as its own Prefect flow run."""

    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    inputs: Mapped[list[str]] = mapped_column(JSON)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    flow_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    log_path: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )
    __table_args__ = (Index("ix_jobs_org_created", "org_id", "created_at"),)


class SourceRow(Base):
    """A synced source (docs/SOURCES.md): where an org's knowledge lives and how it enters."""

    __tablename__ = "sources"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(64), ForeignKey("orgs.id"))
    name: Mapped[str] = mapped_column(String(120))
    kind: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    collection: Mapped[str] = mapped_column(String(300))
    status: Mapped[str] = mapped_column(String(16))  # the status its documents enter with
    audience: Mapped[str | None] = mapped_column(String(200), nullable=True)
    include: Mapped[list[str]] = mapped_column(JSON)
    exclude: Mapped[list[str]] = mapped_column(JSON)
    max_items: Mapped[int] = mapped_column(Integer)
    max_item_bytes: Mapped[int] = mapped_column(Integer)
    schedule: Mapped[str | None] = mapped_column(String(120), nullable=True)  # cron
    timezone: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_by: Mapped[str] = mapped_column(String(120))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )
    last_sync: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    __table_args__ = (Index("ux_sources_org_name", "org_id", "name", unique=True),)


class SourceItemRow(Base):
    """What the last sync saw of one item of a source: the sync's own state, per item, so a
    sync killed midway resumes where it stopped (each item is recorded after its ingest)."""

    __tablename__ = "source_items"
    source_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("sources.id", ondelete="CASCADE"), primary_key=True
    )
    item_id: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the key
    key: Mapped[str] = mapped_column(Text)
    uri: Mapped[str] = mapped_column(Text)
    version: Mapped[str | None] = mapped_column(String(300), nullable=True)
    content_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))  # present | gone | failed
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    seen_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ChunkRow(Base):
    """A chunk's text, kept beside its document so retrieval can fall back to keyword search
    over the registry when the vector engine is down. Keyed by the document's content hash: a
    document serves the chunks of its current content only."""

    __tablename__ = "chunks"
    chunk_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    doc_id: Mapped[str] = mapped_column(ForeignKey("documents.id"))
    org_id: Mapped[str] = mapped_column(String(64))
    content_hash: Mapped[str] = mapped_column(String(64))
    chunk_index: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    heading_path: Mapped[list[str]] = mapped_column(JSON)
    location: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # The id of the embedding model that made the chunk's vectors (`Embedder.model_id`), or
    # NULL for a chunk written before model ids were recorded (migration 0010).
    embedding_model: Mapped[str | None] = mapped_column(String(500), nullable=True)
    __table_args__ = (
        Index("ix_chunks_doc", "doc_id", "content_hash"),
        Index("ix_chunks_org", "org_id"),
        Index("ix_chunks_org_model", "org_id", "embedding_model"),
    )


class AgentRow(Base):
    """An agent (specialist) of an org: its knowledge-base switch and collection allow-list
    (empty = every collection of the org; an allowed collection includes its descendants)."""

    __tablename__ = "agents"
    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"))
    name: Mapped[str] = mapped_column(String(200))
    knowledge_base_enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    allowed_collection_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    # The audiences the agent belongs to: documents for one of them (or for everyone) are in
    # its scope. Set by an admin on the agent, never taken from a request.
    audiences: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiTokenRow(Base):
    """A bearer token of the HTTP API: it stands for exactly one user or one agent. Only the
    sha256 of its secret is kept (the secret is shown once, when it is made)."""

    __tablename__ = "api_tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # "tok_" + 12 hex, public
    secret_hash: Mapped[str] = mapped_column(String(64))  # sha256 hex of the secret
    user_id: Mapped[str | None] = mapped_column(ForeignKey("users.id"), nullable=True)
    agent_id: Mapped[str | None] = mapped_column(ForeignKey("agents.id"), nullable=True)
    name: Mapped[str] = mapped_column(String(200))
    created_by: Mapped[str] = mapped_column(String(120))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    __table_args__ = (
        CheckConstraint(TOKEN_ONE_SUBJECT, name="ck_api_tokens_one_subject"),
        Index("ux_api_tokens_secret_hash", "secret_hash", unique=True),
        Index("ix_api_tokens_user", "user_id"),
        Index("ix_api_tokens_agent", "agent_id"),
    )


class UserLoginRow(Base):
    """How a person logs in to the review inbox: an argon2 hash of their password (never the
    password), whether they must choose a new one, and the failed attempts that lock it."""

    __tablename__ = "user_logins"
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), primary_key=True)
    password_hash: Mapped[str | None] = mapped_column(String(200), nullable=True)
    must_change: Mapped[bool] = mapped_column(Boolean, default=False)
    failed_attempts: Mapped[int] = mapped_column(Integer, default=0)
    locked_until: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    changed_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class LoginAttemptRow(Base):
    """The password checks a login name has had since its last success, by the name as typed
    (no foreign key: an unknown user id is counted and locked like a known one, so neither
    answer nor timing tells which ids exist). A check is reserved here before the password is
    verified (`LoginsRepository.check_password`)."""

    __tablename__ = "login_attempts"
    login: Mapped[str] = mapped_column(String(120), primary_key=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    locked_until: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    last_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    __table_args__ = (Index("ix_login_attempts_last_at", "last_at"),)


class WebSessionRow(Base):
    """A browser session of the review inbox: only the sha256 of its cookie is kept; it ends at
    ``expires_at`` (absolute), after an idle spell (``last_seen_at``) or when revoked."""

    __tablename__ = "web_sessions"
    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    __table_args__ = (Index("ix_web_sessions_user", "user_id"),)


class ReviewCodeRow(Base):
    """A one-time review code: proof, typed into a paused review run's form (or sent by the
    inbox), that a registered user decides for an org. Only its sha256 is kept; it is used once
    and expires."""

    __tablename__ = "review_codes"
    code_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"))
    flow_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    used_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    used_by_run: Mapped[str | None] = mapped_column(String(64), nullable=True)
    __table_args__ = (Index("ix_review_codes_user", "user_id"),)


class ReviewRunRow(Base):
    """A paused ``review`` flow run that kbflow's own code started and recorded (the review
    flow writes it just before it pauses): the only runs the inbox hands decisions to. A run
    planted through the Prefect API has no row here."""

    __tablename__ = "review_runs"
    flow_run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"))
    doc_ids: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # A research run holds every draft of its synthesis run, recorded before they are stored
    # (migration 0016); NULL for a review run recorded with its drafts' ids.
    synthesis_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    __table_args__ = (Index("ix_review_runs_org", "org_id", "created_at"),)
