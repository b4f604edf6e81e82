"""What every command module shares: the one wrapper a command runs in (settings in, kbflow's
errors out as a message and an exit code), the options several commands take, a command group's
`typer.Typer`, and JSON and tables out.

A command reads like this::

    @group.command("list")
    @command
    def orgs_list(settings: Settings, as_json: JsonOpt = False) -> None:
        orgs = org_service.list_orgs(settings)   # parse, call a service ...
        ...                                      # ... render

`command` loads the settings once (a ``settings`` parameter, hidden from typer) and turns a
`KbflowError` into ``error: …`` on stderr and exit code 1; ``review=True`` adds the review
voice: a lost race is ``conflict: …`` with `EXIT_CONFLICT`, a refusal ``forbidden: …``.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar, overload

import typer
from rich.markup import escape
from rich.table import Table

from core import ids
from core.contracts import Report
from core.errors import Forbidden, KbflowError, ReviewConflict, StoreBusy
from core.models import SourceRef
from core.settings import Settings, configure_environment
from kbflow.render import console, err_console
from kbflow.render import counted as counted  # the commands' one way to count nouns

EXIT_CONFLICT = 3
"""Exit code of a review decision that lost a race (the document was no longer pending)."""

STORE_BUSY_AFTER_DECISION = (
    "The registry may already record the decision (see `kbflow docs list`); once the store is "
    "free, `kbflow reconcile` brings the search index in line with it."
)

F = TypeVar("F", bound=Callable[..., Any])


def load_settings() -> Settings:
    """The settings, read once per command; bad settings exit 2 with the reason. Points Prefect,
    dlt and Hugging Face at the data dir (before any of them is imported) and sets up logging."""
    try:
        settings = Settings()
    except ValueError as exc:
        err_console.print(f"[red]invalid settings:[/red] {exc}")
        raise typer.Exit(2) from exc
    configure_environment(settings)
    from kbflow.services.orchestration.server import adopt_running_server

    adopt_running_server(settings)  # this home's `kbflow server`, if it runs and no URL is set
    # The handler's own level: Prefect's run loggers log at INFO (to its API, the UI's Logs tab)
    # and propagate here, and a logger's records skip the root logger's level.
    terminal = logging.StreamHandler()
    terminal.setLevel(logging.WARNING)
    terminal.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[terminal])
    return settings


def failure(exc: KbflowError, *, review: bool = False) -> typer.Exit:
    """Print ``exc`` as one message on stderr and return the exit to raise.

    ``review``: a lost race is ``conflict:`` (exit `EXIT_CONFLICT`), a refusal ``forbidden:``,
    and a busy store after a decision says how the registry and the index come back in line.
    """
    # escape: messages quote user values ("[draft] memo.md"), which rich would read as markup.
    message = escape(str(exc))
    if review and isinstance(exc, ReviewConflict):
        err_console.print(f"[red]conflict:[/red] {message}", soft_wrap=True)
        return typer.Exit(EXIT_CONFLICT)
    if review and isinstance(exc, Forbidden):
        err_console.print(f"[red]forbidden:[/red] {message}", soft_wrap=True)
        return typer.Exit(1)
    err_console.print(f"[red]error:[/red] {message}", soft_wrap=True)
    if review and isinstance(exc, StoreBusy):
        err_console.print(STORE_BUSY_AFTER_DECISION, soft_wrap=True)
    return typer.Exit(1)


@contextmanager
def reported(*, review: bool = False) -> Iterator[None]:
    """Inside the block, a `KbflowError` ends the command with its message (see `failure`)."""
    try:
        yield
    except KbflowError as exc:
        raise failure(exc, review=review) from exc


@overload
def command(fn: F, /) -> F: ...
@overload
def command(*, review: bool = False) -> Callable[[F], F]: ...
def command(fn: Any = None, /, *, review: bool = False) -> Any:
    """The wrapper every command body runs in (put it under ``@app.command()``).

    A ``settings`` parameter of the body is filled with `load_settings` and hidden from typer;
    a `KbflowError` the body raises ends the command as `failure` says.
    """

    def wrap(body: F) -> F:
        signature = inspect.signature(body, eval_str=True)
        wants_settings = "settings" in signature.parameters
        shown = [p for p in signature.parameters.values() if p.name != "settings"]

        @functools.wraps(body)
        def run(*args: Any, **kwargs: Any) -> Any:
            with reported(review=review):
                if wants_settings:
                    kwargs["settings"] = load_settings()
                return body(*args, **kwargs)

        run.__signature__ = signature.replace(parameters=shown)  # type: ignore[attr-defined]
        return run  # type: ignore[return-value]

    return wrap(fn) if fn is not None else wrap


def command_group(name: str, help: str) -> typer.Typer:
    """The `typer.Typer` of the command group ``kbflow NAME``; run bare, it shows its help."""
    return typer.Typer(name=name, help=help, no_args_is_help=True)


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout (dates and paths as text; a report as its JSON)."""
    if isinstance(data, Report):
        data = data.to_dict()
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_table(
    title: str,
    columns: Iterable[str],
    rows: Iterable[Iterable[str]],
    *,
    right: Iterable[str] = (),
    whole: Iterable[str] = (),
) -> None:
    """A table on stdout: ``title`` above it, one plain column per name, one row per item of
    ``rows`` (cells are rich markup: escape what users wrote). ``right``: columns aligned right
    (numbers); ``whole``: columns never wrapped (ids a user copies).

    A table wider than the terminal is printed as one block per row instead (its first cell as
    the block's head, then a ``column  value`` line each), so that an 80-column terminal shows
    every value whole rather than columns squeezed to a letter or two."""
    names, right, whole = list(columns), set(right), set(whole)
    cells = [list(row) for row in rows]
    table = Table(title=title)
    for col in names:
        table.add_column(col, justify="right" if col in right else "left", no_wrap=col in whole)
    for row in cells:
        table.add_row(*row)
    natural = console.measure(table, options=console.options.update_width(100_000)).maximum
    if natural <= console.width or len(names) < 3:
        console.print(table)
        return
    console.print(f"[italic]{title}[/italic]")
    for row in cells:
        console.print(f"[bold]{row[0]}[/bold]")
        block = Table.grid(padding=(0, 2))
        block.add_column(style="dim", no_wrap=True)
        block.add_column()
        for col, value in zip(names[1:], row[1:], strict=True):
            block.add_row(f"  {col}", value)
        console.print(block)


def print_listing(
    items: Sequence[Any],
    *,
    as_json: bool,
    to_json: Callable[[Any], Any],
    title: str,
    columns: Iterable[str],
    row: Callable[[Any], Iterable[str]],
) -> None:
    """A list command's output: the items' JSON with ``--json``, else a table titled with
    their count."""
    if as_json:
        print_json([to_json(item) for item in items])
        return
    print_table(f"{title} ({len(items)})", columns, (row(item) for item in items))


def checked(rule: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A typer callback applying one of `core.ids`' rules (None passes: the option is optional)."""

    def callback(value: Any) -> Any:
        if value is None:
            return value
        try:
            return rule(value)
        except KbflowError as exc:
            raise typer.BadParameter(str(exc)) from None

    return callback


def snippet(text: str, width: int = 240) -> str:
    """``text`` on one line, cut to ``width`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def sources_in(*groups: Iterable[Mapping[str, Any]]) -> list[SourceRef]:
    """The distinct sources of JSON ``sources`` lists (``{"tag", "title", "uri"}``), in order."""
    found: dict[str, SourceRef] = {}
    for group in groups:
        for item in group:
            ref = SourceRef.from_dict(dict(item))
            found.setdefault(ref.cite_id, ref)
    return list(found.values())


def source_lines(sources: Iterable[SourceRef]) -> list[str]:
    """One line per source for people (rich markup escaped): its title, then where it is."""
    return [
        f"[dim]{escape(s.tag)}[/dim] {escape(s.title)}"
        + (f" [dim]· {escape(s.uri)}[/dim]" if s.uri else "")
        for s in sources
    ]


OrgOpt = Annotated[
    str,
    typer.Option("--org", help="Organisation id (a short slug).", callback=checked(ids.org_id)),
]
MaybeOrgOpt = Annotated[
    str | None,
    typer.Option("--org", help="Organisation id (a short slug).", callback=checked(ids.org_id)),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
ActorOpt = Annotated[
    str, typer.Option("--as", help="Your user id (see `kbflow users list`); checked per action.")
]
AdminOpt = Annotated[
    str | None,
    typer.Option(
        "--as",
        help="Your user id: a superadmin (not needed to create the very first superadmin).",
    ),
]
OrgAdminOpt = Annotated[
    str | None,
    typer.Option(
        "--as",
        help="Your user id: a superadmin or the org's assigned account manager (see `kbflow "
        "users list`).",
    ),
]
NoteOpt = Annotated[
    str | None, typer.Option("--note", help="Why: kept with the decision in the audit log.")
]
AgentOpt = Annotated[
    str,
    typer.Option(
        "--agent", help="The agent asking (see `kbflow agents`).", callback=checked(ids.agent_id)
    ),
]
