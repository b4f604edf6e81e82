"""Fixtures the eval tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.questions import sources_for
from tests.conftest import datasets_dir


@pytest.fixture(scope="module")
def real_sources() -> list[Path]:
    """The real-docs files a question set is asked over (skips without the dataset)."""
    folder = datasets_dir("real-docs", "sources")
    return sources_for("real-docs", folder.parents[1])
