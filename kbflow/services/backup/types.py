"""A backup's manifest and the backup list, as typed dicts.

Types only: a manifest is the JSON `backups.backup` writes into ``manifest.json`` and
`backups.manifest_of` reads back (checking only its format: `restore.verify_backup` checks the
rest before anything trusts it).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from sinks.snapshot import FileRecord


class ManifestPart(TypedDict):
    """One part of a backup (`_parts`): how it was copied, its folder in the backup, its files
    and what it holds."""

    kind: str
    root: str
    files: list[FileRecord]
    counts: dict[str, Any]
    copied_by: NotRequired[str]  # the Edge shard's: "backup" or "owner" (the serving process)


class BackupManifest(TypedDict):
    """A backup's ``manifest.json``, signed with the home's backup key."""

    format: int
    kbflow_version: str
    schema_version: str | None
    schema_head: str
    created_at: str
    source: dict[str, str]
    previous: str | None
    parts: dict[str, ManifestPart]
    signature: dict[str, str]  # ``alg``, ``key_id``, ``mac``


class BackupListed(TypedDict):
    """A finished backup in `backups.list_backups`."""

    path: str
    created_at: str
    bytes: int
    documents: int
    points: int
