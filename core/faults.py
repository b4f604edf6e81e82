"""Fault injection: named points between the steps of a write, where a test can crash kbflow.

Crash-safety is a claim about every instant between two writes; this module lets tests check it
deterministically. Code that writes in several steps calls :func:`point` between them, e.g.
``faults.point("ingest.after_upsert")``. Nothing happens unless a fault is armed:

- in-process, a test arms a callback with :func:`armed` (it may raise :class:`InjectedCrash`
  to stop the run there, or inspect the state at that instant and return);
- across processes, ``KBFLOW_FAULT_AT=NAME[:N][=kill|raise]`` makes the N-th (default first)
  pass through point NAME send SIGKILL to the process (``kill``, the default: a real
  ``kill -9`` with no cleanup at all), raise :class:`InjectedCrash`, or ``hang`` there for an
  hour (a call that never returns) before raising it.

The cost when nothing is armed is one dict lookup per point.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

ENV = "KBFLOW_FAULT_AT"
HANG_S = 3600.0

Hook = Callable[[str, int], None]

_hooks: list[Hook] = []
_passes: Counter[str] = Counter()


class InjectedCrash(BaseException):
    """A crash injected at a fault point. A BaseException, so ``except Exception`` handlers
    (which may try to compensate) do not see it, as they would not see a real crash."""


def point(name: str) -> None:
    """Mark a point between two writes; crash or call the armed hook here if asked to."""
    if not _hooks and ENV not in os.environ:
        return
    _passes[name] += 1
    count = _passes[name]
    for hook in list(_hooks):
        hook(name, count)
    spec = os.environ.get(ENV)
    if spec:
        _from_env(spec, name, count)


def _from_env(spec: str, name: str, count: int) -> None:
    target, _, action = spec.partition("=")
    wanted, _, nth = target.partition(":")
    if wanted != name or count != (int(nth) if nth else 1):
        return
    if (action or "kill") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "hang":  # a call that never returns (a stuck library call, a hung disk)
        time.sleep(HANG_S)
    raise InjectedCrash(f"injected crash at {name} (pass {count})")


@contextmanager
def armed(hook: Hook) -> Iterator[None]:
    """Call ``hook(name, pass_number)`` at every fault point while the block runs."""
    _passes.clear()
    _hooks.append(hook)
    try:
        yield
    finally:
        _hooks.remove(hook)
        _passes.clear()


def crash_at(name: str, nth: int = 1) -> Hook:
    """A hook that raises :class:`InjectedCrash` at the ``nth`` pass through ``name``."""

    def hook(at: str, count: int) -> None:
        if at == name and count == nth:
            raise InjectedCrash(f"injected crash at {name} (pass {nth})")

    return hook
