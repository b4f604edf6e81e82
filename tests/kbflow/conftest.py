"""Fixtures the HTTP tests share: `kbflow serve` started on a world of two orgs
(tests/kbflow/service.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.settings import Settings
from tests.kbflow.service import _serving


@pytest.fixture
def served(
    request: pytest.FixtureRequest, settings: Settings, tmp_path: Path, embedder: Any
) -> Iterator[dict[str, Any]]:
    """Two orgs' documents, agents and tokens; then the service started on them (with the
    environment of an indirect parameter, if any). For a test that changes what it serves."""
    options = dict(getattr(request, "param", {}))  # "_drafts": how many; the rest: environment
    with _serving(settings, tmp_path / "serve.log", options, embedder) as world:
        yield world


@pytest.fixture(scope="module")
def served_once(
    tmp_path_factory: pytest.TempPathFactory, embedder: Any
) -> Iterator[dict[str, Any]]:
    """The same world and service, started once per module for the tests that only read it
    and are refused (nothing they do changes what another sees; a generous rate, since they
    share the tokens' buckets)."""
    folder = tmp_path_factory.mktemp("served-once")
    options = {"KBFLOW_API_RATE_BURST": "1000", "KBFLOW_API_RATE_PER_MINUTE": "100000"}
    with _serving(Settings(home=folder / "home"), folder / "serve.log", options, embedder) as w:
        yield w
