"""Connectors of synced sources (docs/SOURCES.md): each kind turns its source into items
(`tasks.sources.base`); `kind_module` finds a kind's ``check_config`` and ``connector``."""

from __future__ import annotations

import importlib
from types import ModuleType

from core.errors import ConfigError

KINDS = ("filesystem", "website", "sql", "rest")


def kind_module(kind: str) -> ModuleType:
    """The module of a source kind: ``check_config(config)`` and ``connector(config, limits,
    settings=…)``."""
    if kind not in KINDS:
        raise ConfigError(f"unknown source kind {kind!r}: use one of {', '.join(KINDS)}")
    return importlib.import_module(f"tasks.sources.{kind}")
