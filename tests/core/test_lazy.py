"""`core.lazy.public_names`: a domain's listed names, imported on first use."""

from __future__ import annotations

import sys

import pytest

from core.lazy import public_names


def test_a_listed_name_is_imported_on_first_use_and_an_unlisted_one_is_an_attribute_error() -> None:
    lookup = public_names("kbflow.services.research", {"run_research": "runs", "runs": "runs"})
    found = lookup("run_research")
    assert found is sys.modules["kbflow.services.research.runs"].run_research
    assert lookup("runs") is sys.modules["kbflow.services.research.runs"]  # a module by its name
    with pytest.raises(AttributeError, match="has no attribute 'seeds'"):
        lookup("seeds")  # a module of the domain that is not listed


def test_an_attribute_can_be_listed_under_another_name() -> None:
    lookup = public_names("kbflow.services.sources", {"sync_source": "sync:sync"})
    from kbflow.services.sources.sync import sync

    assert lookup("sync_source") is sync
