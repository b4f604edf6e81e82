"""The ``backup`` flow: a scheduled `kbflow backup` of the worker's home, verified, with the
oldest backups beyond the operator's ``KBFLOW_BACKUP_KEEP`` removed (prefect.yaml's ``backup``
deployment, daily).

It takes no parameters: anyone who can reach the Prefect API can start a deployment run, so a
run may choose neither where the home is copied (``KBFLOW_BACKUP_DIR``, default
``<home>/backups``, private: 0700/0600) nor how many backups are deleted (``KBFLOW_BACKUP_KEEP``).
A run given a folder or a ``keep`` is refused by Prefect before it starts.

It lives in the app, beside `kbflow.job_flow`, not in ``flows/``: it runs the app's backup
service (`kbflow.services.backup.backups`), and floors only import down (tests/test_layers.py). The
worker needs the home's settings (``KBFLOW_HOME`` and any store URLs) in its environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from core.settings import Settings
from kbflow.services.backup.backups import backup as back_up
from kbflow.services.backup.backups import backup_key, backups_dir, prune_backups
from kbflow.services.backup.restore import verify_backup


@flow(name="backup", validate_parameters=True)
def backup() -> dict[str, Any]:
    """Back up the home into a new folder under the configured backup folder
    (``KBFLOW_BACKUP_DIR``, default ``<home>/backups``), verify it, then remove the oldest
    finished backups there beyond the newest ``KBFLOW_BACKUP_KEEP`` (14).

    Unchanged files are hard-linked from the previous backup, so a daily run costs little when
    little changed. A run that fails leaves the earlier backups as they were.
    """
    log = get_run_logger()
    settings = Settings()
    root = backups_dir(settings)
    report = back_up(settings, root / _stamp())
    verify_backup(Path(report.path), backup_key(settings))
    removed = prune_backups(settings, root, keep=settings.stores.backup_keep)
    log.info(
        "backed up to %s in %.1f s: %d bytes (%d linked), verified; removed %d old backups",
        report.path,
        report.seconds,
        report.bytes,
        report.linked_bytes,
        len(removed),
    )
    return report.to_dict() | {"removed": [str(p) for p in removed]}


def _stamp() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
