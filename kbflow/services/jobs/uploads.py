"""Upload folders (``<home>/uploads/<32 hex>/``, written by ``POST
/v1/admin/orgs/{org}/documents``) end with their job.

A COMPLETE job's upload folder is removed when it finishes; a FAILED job's is kept
``KBFLOW_JOBS_FAILED_UPLOAD_RETENTION_H`` hours (to look at, or send again), then pruned
(`prune_uploads`, when a job starts or finishes). Only folders directly under ``uploads/`` are
ever removed, and never through a symbolic link (`upload_folder`).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import shutil
from pathlib import Path

from core.errors import NotFound
from core.models import JobStatus
from core.settings import Settings
from sinks.registry import JobRecord, SqlRegistry

log = logging.getLogger(__name__)

UPLOADS_DIR = "uploads"
UPLOAD_JOB_FILE = ".kbflow-job"
"""Written into an upload folder when its job is recorded: the job's id, for `prune_uploads`."""
ORPHAN_UPLOAD_MIN_AGE = dt.timedelta(hours=24)
"""An upload folder no job names is removed only once older than this (and than the failed
uploads' retention): an upload still arriving, or just recorded, is never one of them."""
_UPLOAD_FOLDER = re.compile(r"[0-9a-f]{32}")
_JOB_ID = re.compile(r"[0-9a-f]{12}")


def _uploads_root(settings: Settings) -> Path | None:
    """``<home>/uploads`` (the home resolved), unless it is missing or a symbolic link."""
    root = settings.home.resolve() / UPLOADS_DIR
    if root.is_symlink() or not root.is_dir():
        return None
    return root


def upload_folder(settings: Settings, path: str) -> Path | None:
    """The upload folder a job input lies directly in: ``<home>/uploads/<32 hex>/NAME``, read
    as written (no symbolic link followed), the folder a real directory; else None."""
    root = _uploads_root(settings)
    if root is None:
        return None
    file = Path(os.path.normpath(path))
    folder = file.parent
    if not file.is_absolute() or folder.parent != root:
        return None
    if not _UPLOAD_FOLDER.fullmatch(folder.name) or folder.is_symlink() or not folder.is_dir():
        return None
    return folder


def mark_uploads(settings: Settings, job: JobRecord) -> None:
    """Write the job's id into each upload folder it reads (`prune_uploads` reads it back)."""
    for path in job.inputs:
        folder = upload_folder(settings, path)
        if folder is None:
            continue
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(folder / UPLOAD_JOB_FILE, flags, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(job.id)
        except OSError as exc:
            log.warning("could not mark upload folder %s for job %s: %s", folder, job.id, exc)


def _job_of(folder: Path) -> str | None:
    try:
        fd = os.open(folder / UPLOAD_JOB_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            text = f.read(64).strip()
    except OSError:
        return None
    return text if _JOB_ID.fullmatch(text) else None


def _remove(settings: Settings, folder: Path) -> bool:
    root = _uploads_root(settings)
    if root is None or folder.parent != root or folder.is_symlink() or not folder.is_dir():
        return False
    shutil.rmtree(folder, ignore_errors=True)  # never follows a link inside it
    return not folder.exists()


def remove_uploads(settings: Settings, job: JobRecord) -> list[Path]:
    """Remove the upload folders of a COMPLETE job; returns those removed."""
    if job.status is not JobStatus.COMPLETE:
        return []
    folders = {f for f in (upload_folder(settings, p) for p in job.inputs) if f is not None}
    return [f for f in sorted(folders) if _job_of(f) in (None, job.id) and _remove(settings, f)]


def prune_uploads(
    settings: Settings, registry: SqlRegistry, *, now: dt.datetime | None = None
) -> list[Path]:
    """Remove the upload folders that are done with; returns those removed.

    Those of COMPLETE jobs; of FAILED jobs once ``jobs_failed_upload_retention_h`` has passed
    since they failed; and folders no job names (an upload whose request died) once older than
    that and than `ORPHAN_UPLOAD_MIN_AGE`. A folder of a job still PROCESSING (queued or
    running) is kept."""
    root = _uploads_root(settings)
    if root is None:
        return []
    now = now or dt.datetime.now(dt.UTC)
    retention = dt.timedelta(hours=settings.jobs.jobs_failed_upload_retention_h)
    orphan_age = max(retention, ORPHAN_UPLOAD_MIN_AGE)
    removed: list[Path] = []
    with os.scandir(root) as entries:
        folders = [
            Path(e.path)
            for e in entries
            if _UPLOAD_FOLDER.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
        ]
    for folder in folders:
        job_id = _job_of(folder)
        job: JobRecord | None = None
        if job_id is not None:
            try:
                job = registry.jobs.get_job(job_id)
            except NotFound:
                job = None
        if job is None:
            try:
                born = dt.datetime.fromtimestamp(folder.stat().st_mtime, dt.UTC)
            except OSError:
                continue
            expired = now - born > orphan_age
        elif job.status is JobStatus.COMPLETE:
            expired = True
        elif job.status is JobStatus.FAILED:
            expired = now - job.updated_at >= retention
        else:
            expired = False
        if expired and _remove(settings, folder):
            removed.append(folder)
    return removed
