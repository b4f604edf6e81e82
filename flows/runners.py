"""Task runners for the heavy steps of a flow, chosen by settings (``KBFLOW_TASK_RUNNER``).

``default`` runs them in the flow's own process, one after another. ``dask`` maps them over a
Dask cluster through `prefect_dask.DaskTaskRunner`: a local cluster of ``dask_workers`` worker
processes started for the run (and stopped after it), or the existing cluster at
``dask_address``. The flow keeps everything that writes (registry, vector store) to itself, so
only pure work (extraction, embedding) travels.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError
from core.settings import Settings


@dataclass(frozen=True)
class ComputeRunner:
    """A started task runner and how to use it."""

    runner: Any  # prefect_dask.DaskTaskRunner, entered
    workers: int  # how many batches may usefully run at once
    threads: int  # CPU threads each task may use (0: the runtime's default)


@contextmanager
def compute_runner(settings: Settings | None) -> Iterator[ComputeRunner | None]:
    """The settings' runner for the block, stopped after it: ``None`` for ``default`` (and for
    no settings: nothing to run)."""
    if settings is None or settings.ingest.task_runner != "dask":
        yield None
        return
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError as exc:  # pragma: no cover - locked in requirements.lock
        raise ConfigError(
            f"KBFLOW_TASK_RUNNER=dask needs prefect-dask: `make install` installs it ({exc})"
        ) from exc
    if settings.ingest.dask_address:
        runner = DaskTaskRunner(address=settings.ingest.dask_address)
        workers, threads = 0, 0
    else:
        workers = settings.ingest.dask_workers
        # One process per worker, one task at a time each, and the cores shared out between
        # them, so two workers on two cores do not both spin up two embedding threads.
        threads = max(1, (os.cpu_count() or 1) // workers)
        runner = DaskTaskRunner(
            cluster_kwargs={
                "n_workers": workers,
                "threads_per_worker": 1,
                "processes": True,
                "dashboard_address": None,
            }
        )
    import dask

    # Extraction runs each file in an isolated child process (tasks.ingest.isolate), and a
    # daemonic Dask worker may not have children.
    dask.config.set({"distributed.worker.daemon": False})
    try:
        runner.__enter__()
    except (OSError, TimeoutError) as exc:
        raise ConfigError(
            f"cannot reach the Dask scheduler at {settings.ingest.dask_address}: {exc}. Start one "
            "(`dask scheduler`, then `dask worker ADDRESS` on each machine) or unset "
            "KBFLOW_DASK_ADDRESS for a local cluster."
        ) from exc
    try:
        if not workers:  # an existing cluster: as many batches as it has worker threads
            info = runner.client.scheduler_info()
            workers = max(1, sum(w.get("nthreads", 1) for w in info["workers"].values()))
        yield ComputeRunner(runner, workers, threads)
    finally:
        runner.__exit__(None, None, None)
