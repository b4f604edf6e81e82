"""The ``kbflow`` command line (typer + rich): one module per command group, assembled here.

| module | commands |
|---|---|
| `ingest` | ``ingest``, ``jobs list/status`` |
| `search` | ``search``, ``docs list``, ``store optimize/migrate/reembed`` |
| `orgs` | ``orgs create/assign-am/list``, ``users add/list`` |
| `tokens` | ``tokens create/list/revoke`` (API tokens) |
| `review` | ``review list/show/approve/reject/withdraw/edit/flow``, ``audit``, ``reconcile`` |
| `research` | ``seed``, ``seed list``, ``research`` |
| `catalog` | ``collections …``, ``agents …``, ``tools schema/call`` |
| `answers` | ``ask``, ``answer``, ``replay``, ``turns``, ``provenance`` |
| `evals` | ``eval run/report/baseline/golden``, ``serve-schedules`` |
| `models` | ``models finetune/list`` (fine-tuned embedding models) |
| `server` | ``server``, ``demo`` |

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
    answers,
    catalog,
    evals,
    ingest,
    models,
    orgs,
    research,
    review,
    search,
    server,
    tokens,
)
from kbflow.cli.common import EXIT_CONFLICT

__all__ = ["EXIT_CONFLICT", "app"]


class _Program(typer.Typer):
    """The ``kbflow`` program. Run as a process (``kbflow …``, ``python -m kbflow.cli``; typer's
    test runner calls the commands directly), it first takes charge of the Prefect servers it
    may start: orphans of dead kbflow processes are reaped, SIGTERM/SIGHUP become a clean exit,
    and what it starts is recorded and stopped with it
    (`kbflow.services.processes.guard_process`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from kbflow.services.processes import guard_process

        try:
            home = Settings().home
        except ValueError:
            home = None  # the command reports bad settings itself
        if home is not None:
            guard_process(home)
        return super().__call__(*args, **kwargs)


app = _Program(
    name="kbflow",
    help="kbflow: ingest an org's documents, gate them by review, and serve gated hybrid search.",
    no_args_is_help=True,
    add_completion=False,
)

# Top-level commands, in the order `kbflow --help` lists them, then the command groups.
for module in (ingest, search, research, review, server, evals, answers):
    app.add_typer(module.commands)
app.add_typer(search.docs_app, name="docs")
app.add_typer(search.store_app, name="store")
app.add_typer(orgs.orgs_app, name="orgs")
app.add_typer(orgs.users_app, name="users")
app.add_typer(tokens.tokens_app, name="tokens")
app.add_typer(review.review_app, name="review")
app.add_typer(research.seed_app, name="seed")
app.add_typer(ingest.jobs_app, name="jobs")
app.add_typer(evals.eval_app, name="eval")
app.add_typer(models.models_app, name="models")
app.add_typer(catalog.collections_app, name="collections")
app.add_typer(catalog.agents_app, name="agents")
app.add_typer(catalog.tools_app, name="tools")
