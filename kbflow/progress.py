"""A tiny progress channel: flows report, the CLI (if listening) draws a progress bar.

Flows and tasks call :func:`advance`; nothing happens unless an entry point installed a
listener with :func:`listening`. Keeps rich out of flows and callables out of flow parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

Listener = Callable[[str, int, int | None], None]  # (stage, advanced_by, total or None)
_listeners: list[Listener] = []


def advance(stage: str, by: int = 1, total: int | None = None) -> None:
    for listener in list(_listeners):
        listener(stage, by, total)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)
