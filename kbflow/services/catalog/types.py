"""The JSON the catalog services return, as typed dicts: orgs, users, tokens and agents as
``--json`` prints them, and the fine-tuned models' report and list.

Types only: the values are the plain dicts the CLI prints as they are.
"""

from __future__ import annotations

from typing import Any, TypedDict


class OrgDict(TypedDict):
    """An org (`orgs.org_dict`)."""

    id: str
    name: str
    am_user_id: str | None


class UserDict(TypedDict):
    """A user and their role (`orgs.user_dict`)."""

    id: str
    name: str
    role: str
    org_id: str | None


class TokenDict(TypedDict):
    """An API token without its secret (`tokens.token_dict`); the dates are ISO 8601 (UTC)."""

    id: str
    user: str | None
    agent: str | None
    name: str
    created_by: str
    created_at: str
    expires_at: str | None
    revoked_at: str | None
    last_used_at: str | None
    status: str  # "active", "expired" or "revoked"


class CollectionDict(TypedDict):
    """A collection (`sinks.registry.CollectionRecord.to_dict`)."""

    id: int
    name: str
    path: str
    description: str
    parent_id: int | None


class AgentShown(TypedDict):
    """An agent and the collections it may read (`documents.show_agent`)."""

    id: str
    org_id: str
    name: str
    knowledge_base_enabled: bool
    allowed_collection_ids: list[int]
    audiences: list[str]
    readable: list[CollectionDict]


class BaseAndFinetuned(TypedDict):
    """One half's scores of the base model and of the fine-tuned candidate."""

    base: dict[str, Any]
    finetuned: dict[str, Any]


class FinetuneReport(TypedDict):
    """What the ``finetune-embedder`` flow reports (`models.finetune`)."""

    model_id: str
    path: str
    promoted: bool
    reason: str
    promoted_file: str | None
    held_out: BaseAndFinetuned
    train: BaseAndFinetuned
    pairs: int
    train_seconds: float


class ModelsListed(TypedDict):
    """The fine-tuned models (their manifests, oldest first), the promotion record (None: none
    promoted) and the configured embedding model (`models.list_models`)."""

    models: list[dict[str, Any]]  # `tasks.text.finetune.read_manifest`
    promoted: dict[str, Any] | None  # `tasks.text.finetune.promoted_model`
    configured: str
