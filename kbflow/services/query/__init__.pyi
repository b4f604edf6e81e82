"""The names other domains import from this package, for the type checker: at run time
`__init__.py` imports each from its module on first use (its `_PUBLIC`, which
`tests/test_house.py` holds equal to this list)."""

from kbflow.services.query.context import OpenHome as OpenHome
from kbflow.services.query.context import store_opener as store_opener
