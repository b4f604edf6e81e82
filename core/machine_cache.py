"""What kbflow keeps per machine and user, outside any home: built models and templates that
are the same for every home (``$XDG_CACHE_HOME``, else ``~/.cache``), and the lock a build
holds so that a second process waits for the first instead of building again."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def user_cache() -> Path:
    """The user's cache folder: ``$XDG_CACHE_HOME``, else ``~/.cache``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def kbflow_cache(name: str, override: str | None = None) -> Path:
    """kbflow's cache folder ``name`` (``<user cache>/kbflow/<name>``), or the folder the
    environment variable ``override`` names when it is set."""
    configured = os.environ.get(override) if override else None
    return Path(configured) if configured else user_cache() / "kbflow" / name


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created, with its folder) while the block
    runs; a second process blocks here until the first leaves."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
