"""The names other domains import from this package, for the type checker: at run time
`__init__.py` imports each from its module on first use (its `_PUBLIC`, which
`tests/test_house.py` holds equal to this list)."""

from kbflow.services.sources.definitions import SOURCE_SYNC_KIND as SOURCE_SYNC_KIND
from kbflow.services.sources.sync import sync as sync_source

__all__ = ["SOURCE_SYNC_KIND", "sync_source"]
