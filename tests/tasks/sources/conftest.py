"""The ``site`` fixture of the website source tests: `tests.tasks.sources.site_server`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tasks.sources.site_server import Site, serve_site


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    with serve_site(tmp_path) as served:
        yield served
