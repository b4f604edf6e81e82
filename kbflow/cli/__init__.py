"""The ``kbflow`` command line (typer + rich): one module per command group, assembled here.

| module | commands |
|---|---|
| `ingest` | ``ingest`` |
| `search` | ``search`` |
| `research` | ``research`` |
| `review` | ``review list/show/approve/reject/withdraw/edit/flow``, ``audit``, ``reconcile`` |
| `server` | ``demo``, ``server``, ``serve`` |
| `evals` | ``eval run/report/baseline/golden``, ``serve-schedules`` |
| `answers` | ``ask``, ``answer``, ``replay``, ``turns``, ``provenance`` |
| `docs` | ``docs list`` |
| `store` | ``store optimize/migrate/reembed`` |
| `orgs` | ``orgs create/assign-am/list`` |
| `users` | ``users add/list`` |
| `tokens` | ``tokens create/list/revoke`` (API tokens) |
| `seed` | ``seed``, ``seed list`` |
| `jobs` | ``jobs list/status`` |
| `models` | ``models finetune/list`` (fine-tuned embedding models) |
| `collections` | ``collections create/list/describe/move/delete`` |
| `agents` | ``agents create/allow/disallow/audience/show`` |
| `tools` | ``tools schema/call`` |
| `backup` | ``backup`` (+ ``verify/list``), ``restore`` |

A module with top-level commands holds them in ``commands``; a module with a command group holds
it in ``group``, a `typer.Typer` named for the group.

A command parses its arguments, calls a service (`kbflow.services`) and renders the result;
`kbflow.cli.common.command` loads the settings and turns kbflow's errors into a message and an
exit code. Heavy imports (Prefect, Docling, torch) happen inside the services that need them,
so ``--help`` is instant and ``search`` never loads Prefect.
"""

from __future__ import annotations

from typing import Any

import typer

from core.settings import Settings
from kbflow.cli import (
    agents,
    answers,
    backup,
    collections,
    docs,
    evals,
    ingest,
    jobs,
    models,
    orgs,
    research,
    review,
    search,
    seed,
    server,
    sources,
    store,
    tokens,
    tools,
    users,
)
from kbflow.cli.common import EXIT_CONFLICT

__all__ = ["EXIT_CONFLICT", "app"]


class _Program(typer.Typer):
    """The ``kbflow`` program. Run as a process (``kbflow …``, ``python -m kbflow.cli``; typer's
    test runner calls the commands directly), it first takes charge of the Prefect servers it
    may start: orphans of dead kbflow processes are reaped, SIGTERM/SIGHUP become a clean exit,
    and what it starts is recorded and stopped with it
    (`kbflow.services.orchestration.processes.guard_process`); then flow runs whose kbflow process
    died are marked Crashed (`kbflow.services.orchestration.flow_runs.sweep_at_start`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from kbflow.services.orchestration.flow_runs import sweep_at_start
        from kbflow.services.orchestration.processes import guard_process

        try:
            settings: Settings | None = Settings()
        except ValueError:
            settings = None  # the command reports bad settings itself
        if settings is not None:
            guard_process(settings.home)
            sweep_at_start(settings)
        return super().__call__(*args, **kwargs)


app = _Program(
    name="kbflow",
    help="kbflow: ingest an org's documents, gate them by review, and serve gated hybrid search.",
    no_args_is_help=True,
    add_completion=False,
)

# Top-level commands, in the order `kbflow --help` lists them, then the command groups.
for module in (ingest, search, research, review, server, evals, answers, backup):
    app.add_typer(module.commands)
for module in (
    docs,
    store,
    orgs,
    users,
    tokens,
    review,
    seed,
    jobs,
    evals,
    models,
    collections,
    agents,
    tools,
    backup,
    sources,
):
    app.add_typer(module.group)
