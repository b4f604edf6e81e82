"""How the CLI runs Prefect flows: one clear message for kbflow's own errors, and the address
of a run that waits for a person.

When a flow raises, Prefect's engine logs "Encountered exception during execution" with the
traceback on the ``prefect.flow_runs`` logger (tasks: ``prefect.task_runs``); the record goes
to the run's logs on the server and, by propagation, to the root logger's console handler, so a
terminal user sees a traceback before the command's own message. For kbflow's own errors
(:class:`~core.errors.KbflowError`: too many bad files, a review nobody answered) the command
prints that message itself: :func:`quiet_expected_failures` keeps those records off the console
while it runs (the server still gets them, traceback included). Any other exception is a crash
and keeps its traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from rich.console import Console
from rich.markup import escape

from core import progress
from core.errors import KbflowError

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class ExpectedFailureFilter(logging.Filter):
    """Drops a flow or task run's error record whose exception is a KbflowError."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(RUN_LOGGERS) or not record.exc_info:
            return True
        return not isinstance(record.exc_info[1], KbflowError)


@contextmanager
def quiet_expected_failures() -> Iterator[None]:
    """Keep flow and task runs' tracebacks of kbflow's own errors off the console handlers
    (the root logger's) while the block runs; other errors still print theirs."""
    expected = ExpectedFailureFilter()
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(expected)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(expected)


def print_wait(console: Console, notice: progress.Waiting) -> None:
    """Tell the user, while the run waits, which run it is, where to answer and how."""
    console.print(
        f"[bold]waiting for {escape(notice.what)}[/bold]: flow run "
        f"{escape(notice.flow_run_name)} ({notice.flow_run_id})",
        soft_wrap=True,
        highlight=False,
    )
    where = notice.url or "(no UI URL: set PREFECT_UI_URL or PREFECT_API_URL)"
    console.print(f"  {escape(where)}", soft_wrap=True, highlight=False)
    console.print(f"  {escape(notice.todo)}", soft_wrap=True, highlight=False)


@contextmanager
def running_flow(console: Console) -> Iterator[None]:
    """Around a flow run started by a command: expected errors stay one message (the
    command's), and a pause for input is announced on ``console`` as it happens."""
    with ExitStack() as stack:
        stack.enter_context(quiet_expected_failures())
        stack.enter_context(progress.on_waiting(lambda notice: print_wait(console, notice)))
        yield
