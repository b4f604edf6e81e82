"""A package's names imported on first use (PEP 562): a domain of `kbflow.services` lists what
other domains may import from it without importing its modules until one is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def public_names(package: str, names: Mapping[str, str]) -> Callable[[str], object]:
    """A domain's module ``__getattr__`` (PEP 562) for the names other domains may import from
    it: ``names`` maps each public name to ``"module"`` or ``"module:attribute"`` inside the
    domain, imported on first use, so that importing a domain stays as cheap as importing the
    modules it names. Other domains import only these (`tests/test_house.py`)."""

    def __getattr__(name: str) -> object:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = where.partition(":")
        found = importlib.import_module(f"{package}.{module}")
        return getattr(found, attribute or name) if attribute or module != name else found

    return __getattr__
