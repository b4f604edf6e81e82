"""An ingest discovered, hashed and planned once: handed by the entry point that planned it to
the ingest flow it starts in the same process.

`kbflow.services.ingest.run_ingest` plans before it knows whether a flow is needed at all (no
work: no Prefect; long files: a background job). The flow it then starts takes that plan here
instead of reading and hashing every file again and planning against the registry again. A flow
started any other way (a deployment, a worker, a background job, a test) finds nothing handed
and discovers and plans on its own.

Like `core.progress`, this keeps large values out of flow parameters: a plan holds every source,
a corpus record's text included, and registry rows; parameters must stay small JSON (they are
stored with the run, and shown in a deployment's run form).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tasks.ingest.discover import Discovery
from tasks.ingest.index import IngestPlan


@dataclass
class Planned:
    """What one ingest's discovery found, the plan made of its sources, and how long finding
    and planning took (the run's report counts it, as when the flow plans itself)."""

    found: Discovery
    plan: IngestPlan
    seconds: float = 0.0


_Key = tuple[tuple[str, ...], str]
_handed: dict[_Key, Planned] = {}
_lock = threading.Lock()


@contextmanager
def handing(paths: Sequence[str], org: str, planned: Planned) -> Iterator[None]:
    """Offer ``planned`` to the ingest flow run on exactly ``paths`` for ``org`` in this block;
    withdrawn when the block ends, taken or not."""
    key = (tuple(paths), org)
    with _lock:
        _handed[key] = planned
    try:
        yield
    finally:
        with _lock:
            _handed.pop(key, None)


def take(paths: Sequence[str], org: str) -> Planned | None:
    """The plan handed for ``paths`` and ``org`` (once), or None: discover and plan them."""
    with _lock:
        return _handed.pop((tuple(paths), org), None)
