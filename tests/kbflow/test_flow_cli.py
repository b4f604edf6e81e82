"""How the CLI runs flows: kbflow's own errors print one message, real crashes a traceback.

Prefect's engine logs a failing run's exception, traceback included, on ``prefect.flow_runs``;
the console gets it through the root logger's handlers. These tests hand such records to a
real root handler, the way propagation does.
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest
from rich.console import Console

from core import progress
from core.errors import ConfigError, IngestFailed, ReviewTimeout
from kbflow.flow_cli import quiet_expected_failures, running_flow


def _engine_record(exc: BaseException, name: str = "prefect.flow_runs") -> logging.LogRecord:
    """The record Prefect's ``logger.exception("Encountered exception ...")`` makes."""
    try:
        raise exc
    except BaseException:
        exc_info = sys.exc_info()
    return logging.LogRecord(
        name, logging.ERROR, __file__, 1, "Encountered exception during execution: %r",
        (exc,), exc_info,
    )  # fmt: skip


@pytest.fixture
def console() -> Iterator[io.StringIO]:
    """A stream handler on the root logger, as `logging.basicConfig` installs in the CLI."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    yield stream
    root.removeHandler(handler)


def _emit(record: logging.LogRecord) -> None:
    for handler in logging.getLogger().handlers:
        handler.handle(record)


@pytest.mark.parametrize(
    "exc", [IngestFailed("2 of 2 documents could not be ingested"), ReviewTimeout("no decisions")]
)
def test_kbflow_errors_of_flow_and_task_runs_stay_off_the_console(
    console: io.StringIO, exc: Exception
) -> None:
    with quiet_expected_failures():
        _emit(_engine_record(exc))
        _emit(_engine_record(ConfigError("bad"), name="prefect.task_runs"))
    assert console.getvalue() == ""


def test_other_exceptions_keep_their_traceback(console: io.StringIO) -> None:
    with quiet_expected_failures():
        _emit(_engine_record(RuntimeError("kaboom")))
        _emit(_engine_record(KeyError("lost")))
    out = console.getvalue()
    assert out.count("Traceback (most recent call last)") == 2
    assert "RuntimeError: kaboom" in out and "KeyError: 'lost'" in out


def test_only_run_loggers_are_filtered_and_only_inside_the_block(console: io.StringIO) -> None:
    with quiet_expected_failures():
        _emit(_engine_record(ConfigError("from elsewhere"), name="kbflow.other"))
    _emit(_engine_record(ConfigError("after the block")))
    out = console.getvalue()
    assert "from elsewhere" in out and "after the block" in out
    assert all(not h.filters for h in logging.getLogger().handlers)


def test_a_pause_is_announced_while_running_a_flow() -> None:
    out = io.StringIO()
    notice = progress.Waiting(
        flow_run_id="0b5e0c1e-6f5b-4a8e-9a39-4d1a3e0b9f11",
        flow_run_name="amber-heron",
        url="http://127.0.0.1:4200/runs/flow-run/0b5e0c1e-6f5b-4a8e-9a39-4d1a3e0b9f11",
        what="decisions on 2 drafts of org acme",
        todo="open it in the Prefect UI, press Resume, decide and submit.",
    )
    with running_flow(Console(file=out, width=40)):
        progress.waiting(notice)
    progress.waiting(notice)  # nobody listens after the block
    assert out.getvalue() == (
        "waiting for decisions on 2 drafts of org acme: flow run amber-heron "
        "(0b5e0c1e-6f5b-4a8e-9a39-4d1a3e0b9f11)\n"
        "  http://127.0.0.1:4200/runs/flow-run/0b5e0c1e-6f5b-4a8e-9a39-4d1a3e0b9f11\n"
        "  open it in the Prefect UI, press Resume, decide and submit.\n"
    )
