"""The plan handed from the entry point that made it to the ingest flow it starts."""

from __future__ import annotations

import pytest

from tasks.ingest import planned
from tasks.ingest.discover import Discovery
from tasks.ingest.index import IngestPlan


def _planned() -> planned.Planned:
    return planned.Planned(Discovery(), IngestPlan(), seconds=0.5)


def test_only_a_run_on_the_same_paths_and_org_takes_it_and_only_once() -> None:
    plan = _planned()
    with planned.handing(["/data/a", "/data/b"], "acme", plan):
        assert planned.take(["/data/a"], "acme") is None
        assert planned.take(["/data/b", "/data/a"], "acme") is None
        assert planned.take(["/data/a", "/data/b"], "other") is None
        assert planned.take(["/data/a", "/data/b"], "acme") is plan
        assert planned.take(["/data/a", "/data/b"], "acme") is None  # a second run plans itself


def test_a_plan_not_taken_is_withdrawn_when_the_block_ends() -> None:
    with planned.handing(["/data/a"], "acme", _planned()):
        pass
    assert planned.take(["/data/a"], "acme") is None
    with pytest.raises(RuntimeError), planned.handing(["/data/a"], "acme", _planned()):
        raise RuntimeError("the flow failed to start")
    assert planned.take(["/data/a"], "acme") is None
