"""Data checks on chunk points before they are stored: a Great Expectations suite, in code.

The suite runs in an ephemeral GX context (nothing written to disk). Import costs seconds, so it
is loaded lazily, once per process, and only on the ingest path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from core.models import ChunkPoint, DocStatus
from sinks.vectors import DENSE_DIM

log = logging.getLogger(__name__)

MAX_CHUNK_CHARS = 20_000
_lock = threading.Lock()
_state: dict[str, Any] = {}


@dataclass
class CheckReport:
    """What the suite found: each failed expectation with (some of) the offending chunk ids."""

    checked: int
    failures: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures


def _suite() -> tuple[Any, Any]:
    with _lock:
        if not _state:
            import great_expectations as gx
            import great_expectations.expectations as gxe
            from great_expectations.data_context.types.base import ProgressBarsConfig

            # GX logs its temporary directories at INFO (its module logger sets its own level).
            logging.getLogger("great_expectations.data_context.types.base").setLevel(
                logging.WARNING
            )
            context = gx.get_context(mode="ephemeral")
            context.variables.progress_bars = ProgressBarsConfig(globally=False)
            source = context.data_sources.add_pandas("kbflow")
            asset = source.add_dataframe_asset("chunk_points")
            batch_def = asset.add_batch_definition_whole_dataframe("all")
            suite = context.suites.add(gx.ExpectationSuite(name="chunk_points"))
            for expectation in (
                gxe.ExpectColumnValuesToBeUnique(column="chunk_id"),
                gxe.ExpectColumnValuesToBeUnique(column="point_id"),
                gxe.ExpectColumnValuesToNotBeNull(column="text"),
                gxe.ExpectColumnValueLengthsToBeBetween(
                    column="text", min_value=1, max_value=MAX_CHUNK_CHARS
                ),
                gxe.ExpectColumnValuesToNotBeNull(column="org_id"),
                gxe.ExpectColumnValueLengthsToBeBetween(column="org_id", min_value=1),
                gxe.ExpectColumnValuesToBeInSet(
                    column="status", value_set=[s.value for s in DocStatus]
                ),
                gxe.ExpectColumnValuesToBeBetween(
                    column="dense_dim", min_value=DENSE_DIM, max_value=DENSE_DIM
                ),
            ):
                suite.add_expectation(expectation)
            _state.update(batch_def=batch_def, suite=suite)
    return _state["batch_def"], _state["suite"]


def warm_up() -> None:
    """Import Great Expectations and build the suite now (seconds, once per process), so the
    first batch's check does not wait for it."""
    _suite()


def check_chunk_points(points: Sequence[ChunkPoint]) -> CheckReport:
    """Run the chunk suite over ``points`` and report failures (never raises for bad data)."""
    if not points:
        return CheckReport(checked=0)
    import pandas as pd

    frame = pd.DataFrame(
        {
            "chunk_id": [p.payload.get("chunk_id") for p in points],
            "point_id": [p.point_id for p in points],
            "text": [p.payload.get("text") for p in points],
            "org_id": [p.payload.get("org_id") for p in points],
            "status": [p.payload.get("status") for p in points],
            "dense_dim": [len(p.dense) for p in points],
        }
    )
    batch_def, suite = _suite()
    with _lock:  # GX contexts are not thread-safe
        result = batch_def.get_batch(batch_parameters={"dataframe": frame}).validate(
            suite,
            result_format={
                "result_format": "COMPLETE",
                "unexpected_index_column_names": ["chunk_id"],
            },
        )
    report = CheckReport(checked=len(points))
    for res in result.results:
        if res.success:
            continue
        config = res.expectation_config
        name = f"{config.type}({config.kwargs.get('column')})"
        rows = res.result.get("unexpected_index_list") or []
        report.failures[name] = [r.get("chunk_id") if isinstance(r, dict) else r for r in rows[:20]]
    return report
