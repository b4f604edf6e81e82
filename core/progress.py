"""A tiny progress channel: flows report, the CLI (if listening) draws a progress bar.

Flows and tasks call :func:`advance`; nothing happens unless an entry point installed a
listener with :func:`listening`. Keeps rich out of flows and callables out of flow parameters.

The same goes for a flow run that pauses for a person's input: it calls :func:`waiting` just
before it pauses, and an entry point listening with :func:`on_waiting` tells its user where to
answer while the run waits (the flow itself blocks until then).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Waiting:
    """A flow run about to pause until someone submits its form.

    Attributes:
        flow_run_id: the paused run's id.
        flow_run_name: its name.
        url: where the run is resumed in the Prefect UI (None when no UI URL is known).
        what: what the run waits for ("decisions on 2 drafts of org acme").
        todo: one sentence on what to do.
    """

    flow_run_id: str
    flow_run_name: str
    url: str | None
    what: str
    todo: str


WaitListener = Callable[[Waiting], None]
_wait_listeners: list[WaitListener] = []


def waiting(notice: Waiting) -> None:
    for listener in list(_wait_listeners):
        listener(notice)


@contextmanager
def on_waiting(listener: WaitListener) -> Iterator[None]:
    _wait_listeners.append(listener)
    try:
        yield
    finally:
        _wait_listeners.remove(listener)
