"""What the app's entry points show a person: the two rich consoles and the progress bars.

Shared by the CLI and the demo. Services report progress through plain callbacks
(:data:`core.progress.Listener`: stage, advanced by, total); the functions here turn those calls
into rich progress bars on stderr, so no service imports rich.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console

from core.progress import Listener

console = Console()
"""Results: tables, reports, JSON (stdout)."""

err_console = Console(stderr=True)
"""Messages and progress bars (stderr), so stdout stays machine-readable."""


def progress_bar() -> Any:
    """The progress bar every long command shows on stderr."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
    )


@contextmanager
def ingest_progress(enabled: bool = True) -> Iterator[Listener | None]:
    """A listener for `kbflow.services.ingest.run_ingest`: one bar, "ingest N documents".

    The bar appears on the first call (the service announces the documents to index just before
    its flow starts), so an ingest with nothing to do draws nothing. Yields None when disabled.
    """
    if not enabled:
        yield None
        return
    bar: Any = None
    task_id: Any = None

    def on_progress(stage: str, by: int, total: int | None) -> None:
        nonlocal bar, task_id
        if bar is None:
            bar = progress_bar()
            bar.start()
            what = counted(total, "document") if total is not None else "documents"
            task_id = bar.add_task(f"{stage} {what}", total=total)
        elif total is not None:
            bar.update(task_id, total=total)
        bar.advance(task_id, by)

    try:
        yield on_progress
    finally:
        if bar is not None:
            bar.stop()


@contextmanager
def stage_progress(enabled: bool) -> Iterator[Any]:
    """A bar per stage ("index", then each mode), fed by (stage, done, total) in absolute counts
    (the eval runner's progress); yields None when disabled."""
    if not enabled:
        yield None
        return
    with progress_bar() as bar:
        tasks: dict[str, Any] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        yield update


def counted(n: int, noun: str, plural: str | None = None, *, grouped: bool = False) -> str:
    """``n`` and ``noun``, the noun agreeing with the number: ``1 draft``, ``0 drafts``,
    ``2 drafts``. ``plural``: when it is not ``noun`` + "s" (``counted(n, "query",
    "queries")``); ``grouped``: thousands separated (``10,000 items``)."""
    word = noun if n == 1 else (plural or noun + "s")
    return f"{n:,} {word}" if grouped else f"{n} {word}"
