"""The ``kbflow`` command line (typer + rich).

Heavy imports (Prefect, Docling, torch) happen inside the commands that need them, so ``--help``
is instant and ``search`` never loads Prefect.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from core import ids
from core.errors import Forbidden, KbflowError, ReviewConflict, StoreBusy
from core.models import AuditAction, DocStatus, JobStatus, RetrievalResult, Role, SearchMode
from core.settings import Settings, configure_environment

if TYPE_CHECKING:
    from sinks.registry import DocRecord, OrgRecord, UserRecord
    from sinks.registry.schema import AuditRow


class _Program(typer.Typer):
    """The ``kbflow`` program. Run as a process (``kbflow …``, ``python -m kbflow.cli``; typer's
    test runner calls the commands directly), it first takes charge of the Prefect servers it
    may start: orphans of dead kbflow processes are reaped, SIGTERM/SIGHUP become a clean exit,
    and what it starts is recorded and stopped with it (`kbflow.processes.guard_process`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from kbflow.processes import guard_process

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
docs_app = typer.Typer(help="Inspect the document registry.", no_args_is_help=True)
store_app = typer.Typer(help="Vector store maintenance.", no_args_is_help=True)
orgs_app = typer.Typer(help="Client orgs and their account managers.", no_args_is_help=True)
users_app = typer.Typer(help="Users and their roles (who may review what).", no_args_is_help=True)
review_app = typer.Typer(
    help="Review drafts: list, read, approve, reject or edit them (only approved is searchable).",
    no_args_is_help=True,
)
app.add_typer(docs_app, name="docs")
app.add_typer(store_app, name="store")
app.add_typer(orgs_app, name="orgs")
app.add_typer(users_app, name="users")
app.add_typer(review_app, name="review")
seed_app = typer.Typer(
    help="An account manager's seed bundle for research: files, URLs and free-text prompts.",
    invoke_without_command=True,
)
app.add_typer(seed_app, name="seed")
jobs_app = typer.Typer(
    help="Background ingest jobs (audio, video, large files).", no_args_is_help=True
)
app.add_typer(jobs_app, name="jobs")
eval_app = typer.Typer(
    help="Retrieval evals: BEIR datasets, every mode, a warehouse of results.",
    no_args_is_help=True,
)
app.add_typer(eval_app, name="eval")
collections_app = typer.Typer(
    help="An org's named, described, nested collections.", no_args_is_help=True
)
app.add_typer(collections_app, name="collections")
agents_app = typer.Typer(
    help="Agents (specialists) and the collections they may read.", no_args_is_help=True
)
app.add_typer(agents_app, name="agents")
tools_app = typer.Typer(
    help="The agent's knowledge tools and their JSON schemas.", no_args_is_help=True
)
app.add_typer(tools_app, name="tools")

console = Console()
err_console = Console(stderr=True)


def _valid(check: Any) -> Any:
    """A typer callback that applies one of `core.ids`' rules (None passes: optional)."""

    def callback(value: Any) -> Any:
        if value is None:
            return value
        try:
            return check(value)
        except KbflowError as exc:
            raise typer.BadParameter(str(exc)) from None

    return callback


OrgOpt = Annotated[
    str,
    typer.Option("--org", help="Organisation id (a short slug).", callback=_valid(ids.org_id)),
]
MaybeOrgOpt = Annotated[
    str | None,
    typer.Option("--org", help="Organisation id (a short slug).", callback=_valid(ids.org_id)),
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
NoteOpt = Annotated[
    str | None, typer.Option("--note", help="Why: kept with the decision in the audit log.")
]

EXIT_CONFLICT = 3
"""Exit code of a review decision that lost a race (the document was no longer pending)."""


def _settings() -> Settings:
    try:
        settings = Settings()
    except ValueError as exc:
        err_console.print(f"[red]invalid settings:[/red] {exc}")
        raise typer.Exit(2) from exc
    configure_environment(settings)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return settings


def _fail(exc: Exception) -> typer.Exit:
    # escape: messages quote user values ("[draft] memo.md"), which rich would read as markup.
    err_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
    return typer.Exit(1)


def _fail_review(exc: KbflowError) -> typer.Exit:
    """A review error, its message as-is; a lost race exits with EXIT_CONFLICT."""
    if isinstance(exc, ReviewConflict):
        err_console.print(f"[red]conflict:[/red] {escape(str(exc))}", soft_wrap=True)
        return typer.Exit(EXIT_CONFLICT)
    if isinstance(exc, Forbidden):
        err_console.print(f"[red]forbidden:[/red] {escape(str(exc))}", soft_wrap=True)
        return typer.Exit(1)
    exit_ = _fail(exc)
    if isinstance(exc, StoreBusy):
        err_console.print(
            "The registry may already record the decision (see `kbflow docs list`); once the "
            "store is free, `kbflow reconcile` brings the search index in line with it.",
            soft_wrap=True,
        )
    return exit_


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@app.command()
def ingest(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Files, directories, globs or JSONL(.gz) corpora. Symbolic links are never "
            "followed: one named here is refused (name its target), one inside a folder is "
            "skipped with a note."
        ),
    ],
    org: OrgOpt,
    collection: Annotated[
        str, typer.Option("--collection", help="Collection path, e.g. 'policies/hr'.")
    ] = "default",
    status: Annotated[
        DocStatus, typer.Option(help="Review status of new documents.")
    ] = DocStatus.APPROVED,
    audience: Annotated[
        str | None, typer.Option(help="Audience of the documents (default: everyone).")
    ] = None,
    effective_date: Annotated[
        str | None, typer.Option(help="YYYY-MM-DD; hidden from agents before this day.")
    ] = None,
    source_tag: Annotated[
        str | None, typer.Option(help="Free tag recorded on each document.")
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait", help="Ingest audio, video and large files here too, instead of as a job."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Ingest documents into an org's collection (unchanged files are skipped).

    The org must exist (`kbflow orgs create ORG`). Audio, video and files over
    KBFLOW_JOB_THRESHOLD_MB are handed to a background job, whose id is printed at once:
    follow it with `kbflow jobs status ID`. `--wait` ingests them here. A file or folder that
    cannot be read, and a symbolic link, is reported per path and the rest is ingested.
    """
    settings = _settings()
    try:
        eff = dt.date.fromisoformat(effective_date) if effective_date else None
    except ValueError as exc:
        bad = KbflowError(
            f"--effective-date must be YYYY-MM-DD. Currently it is {effective_date!r}."
        )
        raise _fail(bad) from exc
    from kbflow.flow_cli import quiet_expected_failures

    try:
        with quiet_expected_failures():  # an IngestFailed is one message, not a traceback
            report = run_ingest(
                settings,
                paths,
                org=org,
                collection=collection,
                status=status,
                audience=audience,
                effective_date=eff,
                source_tag=source_tag,
                show_progress=not as_json,
                wait=wait,
            )
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(report)
        return
    _print_ingest_report(report)


def run_ingest(
    settings: Settings,
    paths: list[str],
    *,
    org: str,
    collection: str,
    status: DocStatus | None = DocStatus.APPROVED,
    audience: str | None = None,
    effective_date: dt.date | None = None,
    source_tag: str | None = None,
    show_progress: bool = True,
    wait: bool = True,
) -> dict[str, Any]:
    """Plan without Prefect; start the ingest flow only when there is work to do.

    Unless ``wait``, audio, video and large files go to a background job (see `kbflow.jobs`);
    the report's ``jobs`` lists them.
    """
    import time

    from kbflow.jobs import ingest_params, submit_ingest_job
    from sinks.connect import open_registry, open_vector_store
    from tasks.ingest.discover import discover
    from tasks.ingest.extract import SUPPORTED_SUFFIXES, runs_long
    from tasks.ingest.index import BatchReport, IngestSummary, plan_ingest, repair_shadowed

    started = time.perf_counter()
    with open_registry(settings) as registry:
        registry.get_org(org)  # refuse an unknown org before reading a single file
        found = discover(paths, SUPPORTED_SUFFIXES)
        sources = found.sources
        plan = plan_ingest(sources, registry, org)
        repaired = 0
        if plan.shadowed and not plan.work:  # nothing else to do: repair here, without a flow
            with open_vector_store(settings) as store:
                repaired = repair_shadowed(plan, registry, store, actor="system")
    jobs: list[dict[str, Any]] = []
    if not wait:
        threshold = int(settings.job_threshold_mb * 1024 * 1024)
        long_files = [w for w in plan.work if runs_long(w.source.path, threshold)]
        if long_files:
            job = submit_ingest_job(
                settings,
                sorted({str(w.source.path) for w in long_files}),
                ingest_params(
                    org=org,
                    collection=collection,
                    status=status,
                    audience=audience,
                    effective_date=effective_date,
                    source_tag=source_tag,
                ),
            )
            jobs.append({"id": job.id, "status": job.status.value, "files": len(job.inputs)})
            plan.work = [w for w in plan.work if w not in long_files]
            paths = sorted({str(w.source.path) for w in plan.work})
    if not plan.work:
        summary = IngestSummary.build(
            plan,
            BatchReport(skipped=list(found.skipped), notes=list(found.notes), superseded=repaired),
            org=org,
            collection=collection,
            discovered=len(sources),
            seconds=time.perf_counter() - started,
        )
        summary.raise_if_too_many_skipped(settings.max_skip_ratio)
        return summary.to_dict() | {"jobs": jobs}
    from flows.ingest import ingest as ingest_flow

    kwargs: dict[str, Any] = dict(
        paths=paths,
        org=org,
        collection=collection,
        status=status,
        audience=audience,
        effective_date=effective_date,
        source_tag=source_tag,
    )
    if not show_progress:
        return ingest_flow(**kwargs) | {"jobs": jobs}
    from core import progress

    with _progress_bar() as bar:
        task_id = bar.add_task(f"ingest {len(plan.work)} documents", total=len(plan.work))

        def on_progress(stage: str, by: int, total: int | None) -> None:
            if total is not None:
                bar.update(task_id, total=total)
            bar.advance(task_id, by)

        with progress.listening(on_progress):
            return ingest_flow(**kwargs) | {"jobs": jobs}


def _print_ingest_report(r: dict[str, Any]) -> None:
    empty = f", {len(r['empty'])} empty" if r.get("empty") else ""
    console.print(
        f"[bold]{escape(r['org'])}/{escape(r['collection'])}[/bold]: {r['discovered']} found, "
        f"{r['new']} new, {r['changed']} changed, {r['unchanged']} unchanged → "
        f"{r['documents']} indexed ({r['chunks']} chunks), {r['superseded']} superseded, "
        f"{len(r['skipped'])} skipped{empty} in {r['seconds']:.1f}s"
    )
    for item in r.get("notes", []):
        console.print(f"  [cyan]note[/cyan] {escape(item['source'])}: {escape(item['note'])}")
    for item in r.get("empty", []):
        console.print(f"  [cyan]empty[/cyan] {escape(item['source'])}: {escape(item['reason'])}")
    for item in r["skipped"]:
        console.print(
            f"  [yellow]skipped[/yellow] {escape(item['source'])}: {escape(item['reason'])}"
        )
    for job in r.get("jobs", []):
        console.print(
            f"  [bold]job {job['id']}[/bold] {job['status']}: {job['files']} long file(s) "
            f"(audio, video or large) ingesting in the background — `kbflow jobs status "
            f"{job['id']}`"
        )


def _job_line(job: Any) -> str:
    when = job.created_at.astimezone().strftime("%Y-%m-%d %H:%M")
    line = f"{job.id}  {job.status.value:<10}  {job.org_id}  {len(job.inputs)} file(s)  {when}"
    return line + (f"\n    {job.reason}" if job.reason else "")


@jobs_app.command("list")
def jobs_list(
    org: Annotated[
        str | None, typer.Option(help="Only this org's jobs.", callback=_valid(ids.org_id))
    ] = None,
    status: Annotated[JobStatus | None, typer.Option(help="Only jobs in this state.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List recent jobs, newest first: PROCESSING, COMPLETE or FAILED (with the reason)."""
    from kbflow.jobs import refresh
    from sinks.connect import open_registry
    from sinks.jobs import JobStore

    settings = _settings()
    with open_registry(settings) as registry:
        store = JobStore(registry)
        jobs = [refresh(store, job) for job in store.list(org, status, limit)]
    if as_json:
        _print_json([job.to_dict() for job in jobs])
        return
    if not jobs:
        console.print("no jobs.")
    for job in jobs:
        console.print(_job_line(job), markup=False, highlight=False)


@jobs_app.command("status")
def jobs_status(
    job_id: Annotated[str, typer.Argument(help="The id `kbflow ingest` printed.")],
    as_json: JsonOpt = False,
) -> None:
    """Show one job: its state, the Prefect flow run doing it, and its report when done."""
    from kbflow.jobs import refresh
    from sinks.connect import open_registry
    from sinks.jobs import JobStore

    settings = _settings()
    try:
        with open_registry(settings) as registry:
            store = JobStore(registry)
            job = refresh(store, store.get(job_id))
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(job.to_dict())
        return
    console.print(_job_line(job), markup=False, highlight=False)
    console.print(f"  flow run: {job.flow_run_id or '(not started yet)'}", markup=False)
    console.print(f"  log: {job.log_path or '-'}", markup=False)
    for path in job.inputs:
        console.print(f"  input: {path}", markup=False)
    if job.report:
        _print_ingest_report(job.report)


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    org: Annotated[
        str | None,
        typer.Option(
            help="Org-wide search (engineers and admins; needs --as).",
            callback=_valid(ids.org_id),
        ),
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(
            help="Search as this agent: only the collections it may read.",
            callback=_valid(ids.agent_id),
        ),
    ] = None,
    actor: Annotated[
        str | None, typer.Option("--as", help="Your user id (an engineer or superadmin).")
    ] = None,
    mode: Annotated[SearchMode, typer.Option(help="Retrieval engine.")] = SearchMode.HYBRID,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, max=200)] = 10,
    audience: Annotated[
        list[str] | None,
        typer.Option(
            help="Narrow to these audiences (repeatable). Only narrows: an agent reads the "
            "audiences set on it, a person those of their role."
        ),
    ] = None,
    collection: Annotated[
        list[str] | None, typer.Option(help="Restrict to these collections (repeatable).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Search approved, effective documents of one org (hybrid BM25 + dense by default).

    Modes: hybrid, dense, keyword, hybrid+rerank (Cohere with COHERE_API_KEY, or a local
    cross-encoder from KBFLOW_RERANK_MODEL). When the vector store is unavailable the answer
    comes from the keyword fallback over the registry and is marked degraded.
    """
    settings = _settings()
    from kbflow.wiring import search_context
    from tasks.query.scopes import agent_scope, narrow_audiences, person_scope

    if (agent is None) == (org is None):
        raise _fail(
            KbflowError(
                "say whose search this is: --agent AGENT (scoped to its collections), or "
                "--org ORG --as USER (org-wide, for engineers and admins)"
            )
        )
    try:
        with search_context(settings, degrade=True) as ctx:
            if agent is not None:
                scope = agent_scope(ctx.registry, agent, tuple(collection or ()))
                who = f"agent {agent}"
            else:
                assert org is not None
                scope = person_scope(ctx.registry, actor, org, tuple(collection or ()))
                who = f"user {actor}"
            if scope is None:
                result = RetrievalResult([], mode, reason=f"knowledge base is off for {agent}")
            else:
                scope = narrow_audiences(scope, tuple(audience or ()), who)
                result = ctx.retrieve(query, scope, mode=mode, top_k=top_k)
    except KbflowError as exc:
        raise _fail(exc) from exc
    org = scope.org_id if scope else org
    hits = result.hits
    if as_json:
        _print_json({"query": query, "org": org} | result.to_dict())
        return
    if result.paused:
        console.print(f"[yellow]paused:[/yellow] {escape(result.reason or '')}")
        return
    if result.degraded:
        err_console.print(f"[yellow]degraded:[/yellow] {escape(result.reason or '')}")
    elif result.reason:
        err_console.print(f"[dim]note: {escape(result.reason)}[/dim]")
    if not hits:
        console.print("[yellow]no approved document matches.[/yellow]")
        return
    for rank, hit in enumerate(hits, start=1):
        where = " > ".join(hit.heading_path)
        if hit.location is not None:
            where = f"{where} · {hit.location.describe()}" if where else hit.location.describe()
        console.print(
            f"[bold]{rank}. {escape(hit.title)}[/bold]  [dim]{hit.score:.4f} · "
            f"{escape(hit.collection)} · {escape(hit.uri)}[/dim]"
        )
        if where:
            console.print(f"   [cyan]{escape(where)}[/cyan]")
        console.print(f"   {_snippet(hit.text)}", markup=False)


def _snippet(text: str, width: int = 240) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


@docs_app.command("list")
def docs_list(
    org: OrgOpt,
    status: Annotated[list[DocStatus] | None, typer.Option(help="Only these statuses.")] = None,
    collection: Annotated[
        str | None, typer.Option(help="Only this collection (and below).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1)] = 200,
    as_json: JsonOpt = False,
) -> None:
    """List an org's documents with their version, review and parse status."""
    settings = _settings()
    from sinks.connect import open_registry

    try:
        with open_registry(settings) as registry:
            docs = registry.list_documents(
                org,
                statuses=[s.value for s in status] if status else None,
                collection=collection,
                limit=limit,
            )
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json([d.to_dict() for d in docs])
        return
    table = Table(title=f"documents of {org} ({len(docs)})")
    for col in ("id", "title", "collection", "v", "status", "parse", "chunks"):
        table.add_column(col)
    for d in docs:
        table.add_row(
            d.id,
            d.title[:60],
            d.collection_path,
            str(d.version),
            d.status or "—",
            d.parse_status,
            str(d.chunk_count),
        )
    console.print(table)


@store_app.command("optimize")
def store_optimize() -> None:
    """Build the vector indexes (slow at scale: run it as maintenance, not during queries)."""
    settings = _settings()
    from sinks.connect import open_vector_store

    try:
        with open_vector_store(settings) as store:
            store.optimize()
            count = store.count()
    except KbflowError as exc:
        raise _fail(exc) from exc
    console.print(f"optimized: {count} points")


# --- orgs and users ----------------------------------------------------------------------------


def _org_dict(org: OrgRecord) -> dict[str, Any]:
    return {"id": org.id, "name": org.name, "am_user_id": org.am_user_id}


def _user_dict(user: UserRecord) -> dict[str, Any]:
    return {"id": user.id, "name": user.name, "role": user.role.value, "org_id": user.org_id}


@orgs_app.command("create")
def orgs_create(
    org: Annotated[str, typer.Argument(help="Organisation id, a short slug such as 'acme'.")],
    name: Annotated[str | None, typer.Option(help="Display name (default: the id).")] = None,
    am: Annotated[
        str | None,
        typer.Option(
            "--am",
            help="Assign this account manager (a user added with --role account_manager); "
            "needs --as a superadmin.",
        ),
    ] = None,
    actor: AdminOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create an org; if it exists, rename it (--name) or assign its account manager (--am).

    The id is a short lowercase slug (letters, digits, '-' and '_'). Assigning the account
    manager needs --as a superadmin.
    """
    settings = _settings()
    from sinks.connect import open_registry
    from tasks.review.access import authorize_admin

    try:
        ids.org_id(org)
        with open_registry(settings) as registry:
            admin = (
                authorize_admin(registry, actor, "assign account managers", org_id=org)
                if am
                else actor or "cli"
            )
            registry.ensure_org(org, name=name, actor=admin)
            record = registry.get_org(org)
            if am:
                try:
                    record = registry.assign_am(org, am, actor=admin)
                except KbflowError as exc:
                    raise type(exc)(
                        f"{exc} Org {org!r} is saved with account manager "
                        f"{record.am_user_id or 'none'}; run `kbflow orgs assign-am {org} USER` "
                        "once the user is an account manager."
                    ) from exc
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(_org_dict(record))
        return
    console.print(
        f"org [bold]{escape(record.id)}[/bold] ({escape(record.name)}), account manager: "
        f"{escape(record.am_user_id or 'none')}"
    )


@orgs_app.command("assign-am")
def orgs_assign_am(
    org: Annotated[str, typer.Argument(help="Organisation id.")],
    user: Annotated[str, typer.Argument(help="User id of an account manager.")],
    actor: AdminOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make USER (an account manager) the one who approves ORG's documents (a superadmin's
    decision: --as; audited)."""
    settings = _settings()
    from sinks.connect import open_registry
    from tasks.review.access import authorize_admin

    try:
        with open_registry(settings) as registry:
            admin = authorize_admin(registry, actor, "assign account managers", org_id=org)
            record = registry.assign_am(org, user, actor=admin)
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(_org_dict(record))
        return
    console.print(f"org [bold]{escape(record.id)}[/bold]: account manager is now {escape(user)}")


@orgs_app.command("list")
def orgs_list(as_json: JsonOpt = False) -> None:
    """List organisations and their assigned account managers."""
    settings = _settings()
    from sinks.connect import open_registry

    try:
        with open_registry(settings) as registry:
            orgs = registry.list_orgs()
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json([_org_dict(o) for o in orgs])
        return
    table = Table(title=f"orgs ({len(orgs)})")
    for col in ("id", "name", "account manager"):
        table.add_column(col)
    for o in orgs:
        table.add_row(escape(o.id), escape(o.name), escape(o.am_user_id or "—"))
    console.print(table)


@users_app.command("add")
def users_add(
    user: Annotated[str, typer.Argument(help="User id, e.g. an email address or a handle.")],
    role: Annotated[
        Role,
        typer.Option(
            help="superadmin: decides for every org; account_manager: decides for the orgs "
            "assigned to them; expert: reads the drafts of their org (or of every org without "
            "--org); engineer: no review rights."
        ),
    ],
    name: Annotated[str | None, typer.Option(help="Display name (default: the id).")] = None,
    org: Annotated[
        str | None,
        typer.Option(
            "--org",
            help="The user's organisation (must exist; omit for agency-wide).",
            callback=_valid(ids.org_id),
        ),
    ] = None,
    actor: AdminOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a user, or update an existing one (its role and org are replaced by what you give).

    Managing users and roles needs --as a superadmin; only the very first superadmin of a
    registry that has none is created without it. Every change is audited
    (`kbflow audit`).
    """
    settings = _settings()
    from sinks.connect import open_registry
    from tasks.review.access import authorize_admin

    try:
        ids.user_id(user)
        with open_registry(settings) as registry:
            admin = authorize_admin(
                registry, actor, "manage users and roles", org_id=org,
                bootstrap=role is Role.SUPERADMIN,
            )  # fmt: skip
            if org:
                registry.get_org(org)  # a clear "does not exist" instead of a foreign-key error
            record = registry.ensure_user(user, role, name=name, org_id=org, actor=admin)
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(_user_dict(record))
        return
    console.print(
        f"user [bold]{escape(record.id)}[/bold] ({escape(record.name)}): {record.role.value}"
        + (f" of {escape(record.org_id)}" if record.org_id else "")
    )


@users_app.command("list")
def users_list(as_json: JsonOpt = False) -> None:
    """List users with their roles and organisations."""
    settings = _settings()
    from sinks.connect import open_registry

    try:
        with open_registry(settings) as registry:
            users = registry.list_users()
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json([_user_dict(u) for u in users])
        return
    table = Table(title=f"users ({len(users)})")
    for col in ("id", "name", "role", "org"):
        table.add_column(col)
    for u in users:
        table.add_row(escape(u.id), escape(u.name), u.role.value, escape(u.org_id or "—"))
    console.print(table)


# --- review ------------------------------------------------------------------------------------


@review_app.command("list")
def review_list(
    org: OrgOpt,
    actor: ActorOpt,
    status: Annotated[
        list[DocStatus] | None,
        typer.Option(help="Statuses to list (repeatable). Default: pending_review and rejected."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """An org's drafts grouped by the synthesis run that produced them (experts may look too)."""
    settings = _settings()
    from sinks.connect import open_registry
    from tasks.review.inspection import list_drafts

    try:
        with open_registry(settings) as registry:
            if status:
                groups = list_drafts(registry, actor, org, statuses=status)
            else:
                groups = list_drafts(registry, actor, org)
    except KbflowError as exc:
        raise _fail_review(exc) from exc
    if as_json:
        _print_json(
            {
                "org": org,
                "runs": [
                    {"synthesis_run_id": run, "documents": [d.to_dict() for d in docs]}
                    for run, docs in groups.items()
                ],
            }
        )
        return
    if not groups:
        console.print(f"[green]no drafts in {escape(org)}.[/green]")
        return
    for run, docs in groups.items():
        table = Table(title=f"synthesis run {escape(run or 'none')} ({len(docs)})")
        table.add_column("id", no_wrap=True)  # whole: it is what `review approve` takes
        for col in ("title", "collection", "v", "status", "tag", "updated"):
            table.add_column(col)
        for d in docs:
            table.add_row(
                d.id,
                escape(d.title[:60]),
                escape(d.collection_path),
                str(d.version),
                d.status or "—",
                escape(d.source_tag or "—"),
                _when(d.updated_at),
            )
        console.print(table)


def _when(at: dt.datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S") if at else "—"


@review_app.command("show")
def review_show(
    doc_id: Annotated[str, typer.Argument(help="Document id (see `kbflow review list`).")],
    actor: ActorOpt,
    as_json: JsonOpt = False,
) -> None:
    """A document's metadata and full stored text, chunk by chunk, whatever its status."""
    settings = _settings()
    from kbflow.wiring import store_opener
    from sinks.connect import open_registry
    from tasks.review.inspection import inspect_draft

    try:
        with open_registry(settings) as registry:  # rights first: the store only once allowed
            view = inspect_draft(
                doc_id, actor, registry=registry, open_store=store_opener(settings)
            )
    except KbflowError as exc:
        raise _fail_review(exc) from exc
    if as_json:
        _print_json({"document": view.doc.to_dict(), "chunks": view.chunks, "text": view.text})
        return
    d = view.doc
    meta = Table.grid(padding=(0, 2))
    meta.add_column(style="dim")
    meta.add_column()
    for key, value in (
        ("id", d.id),
        ("title", d.title),
        ("org / collection", f"{d.org_id} / {d.collection_path}"),
        ("uri", d.uri),
        ("version", str(d.version)),
        ("status", d.status or "—"),
        ("parse status", f"{d.parse_status}, {d.chunk_count} chunks"),
        ("synthesis run", d.synthesis_run_id or "—"),
        ("source tag", d.source_tag or "—"),
        ("audience", d.audience or "all"),
        ("effective", d.effective_date.isoformat() if d.effective_date else "—"),
        ("approved", f"{d.approved_by} at {_when(d.approved_at)}" if d.approved_by else "—"),
        ("rejected", f"{d.rejected_by} at {_when(d.rejected_at)}" if d.rejected_by else "—"),
        ("edited", f"{d.edited_by} at {_when(d.edited_at)}" if d.edited_by else "—"),
    ):
        meta.add_row(key, escape(value))
    console.print(meta)
    if not view.chunks:
        console.print("[yellow]no chunks stored for this document.[/yellow]")
    for index, text in enumerate(view.chunks, start=1):
        console.rule(f"chunk {index}/{len(view.chunks)}", style="dim")
        console.print(text, markup=False, highlight=False)


def _print_decision(doc: DocRecord, verb: str, actor: str, as_json: bool) -> None:
    if as_json:
        _print_json(doc.to_dict())
        return
    console.print(
        f"[green]{verb}[/green] {doc.id} “{escape(doc.title)}” ({escape(doc.org_id)}, "
        f"v{doc.version}) by {escape(actor)}: now {doc.status}"
    )


def _decide(verb: str, doc_id: str, actor: str, note: str | None, as_json: bool) -> None:
    """Approve, reject or withdraw one document through the state machine, holding the store
    only briefly."""
    settings = _settings()
    from kbflow.wiring import store_opener
    from sinks.connect import open_registry
    from tasks.review.machine import approve, reject, withdraw

    transition: Any = {"approve": approve, "reject": reject, "withdraw": withdraw}[verb]
    try:
        with open_registry(settings) as registry:
            doc = transition(
                doc_id, actor, registry=registry, open_store=store_opener(settings), note=note
            )
    except KbflowError as exc:
        raise _fail_review(exc) from exc
    done = {"approve": "approved", "reject": "rejected", "withdraw": "withdrew"}[verb]
    _print_decision(doc, done, actor, as_json)


@review_app.command("approve")
def review_approve(
    doc_id: Annotated[str, typer.Argument(help="Document id of a pending_review draft.")],
    actor: ActorOpt,
    note: NoteOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Approve a draft: it becomes searchable and older versions of its source are superseded.

    Only a superadmin or the org's assigned account manager may. Exit code 3 means someone else
    decided first (nothing was changed).
    """
    _decide("approve", doc_id, actor, note, as_json)


@review_app.command("reject")
def review_reject(
    doc_id: Annotated[str, typer.Argument(help="Document id of a pending_review draft.")],
    actor: ActorOpt,
    note: NoteOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Reject a draft: it stays stored for reviewers but is never searchable.

    Only a superadmin or the org's assigned account manager may. Exit code 3 means someone else
    decided first (nothing was changed).
    """
    _decide("reject", doc_id, actor, note, as_json)


@review_app.command("withdraw")
def review_withdraw(
    doc_id: Annotated[str, typer.Argument(help="Document id of an approved document.")],
    actor: ActorOpt,
    note: Annotated[
        str,
        typer.Option("--note", help="Why it is taken out of service (required; audited)."),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Take an approved document out of service: hidden from every search at once, audited
    with your note; `kbflow provenance --stale` then flags the answers that cited it.

    Only a superadmin or the org's assigned account manager may. Exit code 3 means it was no
    longer approved (someone else acted first; nothing was changed).
    """
    _decide("withdraw", doc_id, actor, note, as_json)


@review_app.command("edit")
def review_edit(
    doc_id: Annotated[
        str, typer.Argument(help="Document id of a pending_review draft or an approved document.")
    ],
    actor: ActorOpt,
    file: Annotated[
        Path | None,
        typer.Option("--file", help="Markdown file with the full corrected text ('-': stdin)."),
    ] = None,
    content: Annotated[
        str | None, typer.Option("--content", help="The full corrected text (Markdown).")
    ] = None,
    note: NoteOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replace a document's text with a corrected one, re-chunk and re-embed it, and approve it.

    A draft is approved with the new text; an approved document gets a new approved version
    that supersedes it (in one step: never both, never neither). Give the whole text (--file or
    --content), not a diff. Only a superadmin or the org's assigned account manager may. Exit
    code 3 means someone else decided first.
    """
    settings = _settings()
    try:
        text = _edited_text(file, content)
    except KbflowError as exc:
        raise _fail(exc) from exc
    from kbflow.wiring import store_opener
    from sinks.connect import open_registry
    from tasks.review.machine import edit_and_approve
    from tasks.text.embed import get_embedder

    try:
        with open_registry(settings) as registry:
            doc = edit_and_approve(
                doc_id,
                actor,
                text,
                registry=registry,
                open_store=store_opener(settings),
                embedder=get_embedder(settings.embedding_model, settings.embed_batch_size),
                max_words=settings.chunk_max_words,
                overlap_words=settings.chunk_overlap_words,
                note=note,
            )
    except KbflowError as exc:
        raise _fail_review(exc) from exc
    _print_decision(doc, "edited and approved", actor, as_json)


def _edited_text(file: Path | None, content: str | None) -> str:
    from core.errors import ConfigError

    if (file is None) == (content is None):
        raise ConfigError(
            "give the corrected text with exactly one of --file PATH or --content TEXT. "
            f"Currently {'both are' if file is not None else 'neither is'} given."
        )
    if content is not None:
        return content
    assert file is not None
    if str(file) == "-":
        return sys.stdin.read()
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the edited text from {str(file)!r}: {exc}. Give a readable UTF-8 "
            "Markdown file."
        ) from exc


@review_app.command("flow")
def review_flow(
    org: OrgOpt,
    actor: Annotated[
        str | None,
        typer.Option(
            "--as", help="Prefill the form's reviewer (whoever resumes the run may change it)."
        ),
    ] = None,
    timeout: Annotated[
        int,
        typer.Option(
            "--timeout",
            min=1,
            help="Seconds to wait for the form; then the run fails and nothing changes.",
        ),
    ] = 3600,
    as_json: JsonOpt = False,
) -> None:
    """Run the review flow: it pauses for decisions in the Prefect UI, then applies them.

    Start `kbflow server` in another shell first, then in this one export
    PREFECT_API_URL=http://127.0.0.1:4200/api

    While it waits, the run's id and UI link are printed on stderr: open it, press Resume,
    pick approve, edit, reject or skip for each draft and submit. Each draft's text is shown
    in the form and prefilled for edit. Decisions are checked like `kbflow review approve`;
    a refused reviewer ends the run Failed (the report still prints, exit code 0).
    """
    _settings()  # points Prefect at kbflow's data dir before it is imported
    from prefect.settings import get_current_settings

    if not get_current_settings().api.url:
        bad = KbflowError(
            "PREFECT_API_URL is not set, so the run would pause on a temporary server that no UI "
            "can reach. Start `kbflow server` in another shell and export "
            "PREFECT_API_URL=http://127.0.0.1:4200/api here."
        )
        raise _fail(bad)
    from core.errors import RunFailed
    from flows.review import review as run_review_flow
    from kbflow.flow_cli import running_flow

    failure = None
    try:
        with running_flow(err_console):
            report = run_review_flow(org=org, reviewer=actor, timeout_s=timeout)
    except RunFailed as exc:  # the run ended Failed; what it did is in its report
        report, failure = exc.report, str(exc)
    except KbflowError as exc:  # incl. ReviewTimeout: nobody answered in time
        raise _fail_review(exc) from exc
    if as_json:
        _print_json(report)
    else:
        _print_report(report)
    if failure:  # it did not do its job (a refused reviewer, only invalid rows): exit 1
        err_console.print(f"[red]review run failed:[/red] {escape(failure)}", soft_wrap=True)
        raise typer.Exit(1)


def _print_report(report: dict[str, Any]) -> None:
    """Scalars as `key: value` lines, lists of records as tables, anything else as JSON."""
    for key, value in report.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            table = Table(title=escape(key))
            columns = list(dict.fromkeys(k for row in value for k in row))
            for col in columns:
                table.add_column(escape(col))
            for row in value:
                table.add_row(*(escape(_cell(row.get(col))) for col in columns))
            console.print(table)
        elif isinstance(value, dict | list):
            console.print(f"[dim]{escape(key)}:[/dim] {escape(json.dumps(value, default=str))}")
        else:
            console.print(f"[dim]{escape(key)}:[/dim] {escape(_cell(value))}")


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


# --- audit and reconcile -----------------------------------------------------------------------


def _audit_dict(row: AuditRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": row.at.isoformat() if row.at else None,
        "actor": row.actor,
        "action": row.action,
        "org_id": row.org_id,
        "doc_id": row.doc_id,
        "synthesis_run_id": row.synthesis_run_id,
        "source_tag": row.source_tag,
        "before": row.before,
        "after": row.after,
    }


def _audit_change(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    was = (before or {}).get("status") or "—"
    now = dict(after or {})
    change = f"{was} → {now.pop('status', None) or '—'}"
    extras = ", ".join(f"{k}={v}" for k, v in now.items())
    return f"{change} ({extras})" if extras else change


@seed_app.callback()
def seed(
    ctx: typer.Context,
    org: Annotated[
        str | None, typer.Option("--org", help="Organisation id.", callback=_valid(ids.org_id))
    ] = None,
    file: Annotated[
        list[Path] | None,
        typer.Option(
            "--file",
            help="A file to seed (repeatable; at most 20 in the org's bundle). Symbolic links "
            "are refused.",
        ),
    ] = None,
    url: Annotated[
        list[str] | None, typer.Option("--url", help="A URL to research (repeatable).")
    ] = None,
    prompt: Annotated[
        list[str] | None, typer.Option("--prompt", help="Free-text guidance (repeatable).")
    ] = None,
    actor: Annotated[
        str | None,
        typer.Option("--as", help="Your user id: the org's account manager or a superadmin."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Seed research inputs for an org (`kbflow seed --org ORG --as AM --file F --url U
    --prompt T`).

    Only the org's account manager or a superadmin may. Files are at most 25 MB each and 20
    in the org's bundle as a whole; a command that would pass a limit stores nothing. The
    first http(s) URL is taken as the client's homepage. Inputs are readable by reviewers
    (`kbflow seed list`, `kbflow review show`) and never returned by any search.
    """
    if ctx.invoked_subcommand is not None:
        return
    if not org:
        raise _fail(KbflowError("--org is required to seed inputs."))
    settings = _settings()
    from sinks.connect import open_registry, open_vector_store
    from tasks.ingest.isolate import isolated_extractor
    from tasks.research.seed import SeedBundle, seed_bundle
    from tasks.review.access import authorize_decision
    from tasks.text.embed import get_embedder

    bundle = SeedBundle(tuple(file or ()), tuple(url or ()), tuple(prompt or ()))
    try:
        with open_registry(settings) as registry:
            user = authorize_decision(registry, actor, org, what="seed research inputs")
            bundle.check()
            with isolated_extractor(settings) as extract, open_vector_store(settings) as store:
                report = seed_bundle(
                    bundle,
                    org,
                    registry=registry,
                    store=store,
                    embedder=get_embedder(settings.embedding_model, settings.embed_batch_size),
                    extract_file=extract,
                    actor=user.id,
                )
    except KbflowError as exc:
        raise _fail(exc) from exc
    result = {
        "org": org,
        "stored": report.documents,
        "doc_ids": report.doc_ids,
        "skipped": [{"source": s, "reason": r} for s, r in report.skipped],
    }
    if as_json:
        _print_json(result)
        return
    console.print(f"seeded {report.documents} new input(s) for {escape(org)}")
    for source, reason in report.skipped:
        console.print(f"  [yellow]skipped[/yellow] {escape(source)}: {escape(reason)}")


@seed_app.command("list")
def seed_list(org: OrgOpt, actor: ActorOpt, as_json: JsonOpt = False) -> None:
    """List an org's seed inputs (am_file, am_url, am_prompt): for those who may read its
    drafts (a superadmin, its account manager, its experts)."""
    settings = _settings()
    from sinks.connect import open_registry
    from tasks.research.seed import list_seeds
    from tasks.review.access import authorize_inspection

    try:
        with open_registry(settings) as registry:
            authorize_inspection(registry, actor, org)
            seeds = list_seeds(registry, org)
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json([d.to_dict() for d in seeds])
        return
    table = Table(title=f"seed inputs of {org} ({len(seeds)})")
    for col in ("id", "tag", "title", "uri"):
        table.add_column(col)
    for d in seeds:
        table.add_row(d.id, d.source_tag or "", escape(d.title[:60]), escape(d.uri[:60]))
    console.print(table)


@app.command()
def research(
    org: OrgOpt,
    client_name: Annotated[str, typer.Option("--client-name", help="The client's name.")],
    model: Annotated[
        str | None, typer.Option(help="Anthropic model (default: KB_RESEARCH_MODEL).")
    ] = None,
    budget: Annotated[
        int, typer.Option("--budget", min=1, help="Token budget for the run.")
    ] = 200_000,
    actor: Annotated[
        str | None,
        typer.Option(
            "--as",
            help="Your user id: the org's account manager or a superadmin (also prefilled as "
            "the reviewer in the review form).",
        ),
    ] = None,
    review_timeout: Annotated[
        int | None,
        typer.Option(
            help="Seconds to wait for the review form (default: 3600 with a Prefect server, "
            "else 0 = don't pause)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Draft the four KB documents for an org from its seed bundle, then pause for review.

    Only the org's account manager or a superadmin may (--as). Uses Anthropic when
    ANTHROPIC_API_KEY is set, else the offline extractive synthesizer. The drafts are
    pending_review (never searchable) until approved. With a Prefect server
    (`kbflow server`, PREFECT_API_URL exported) the run pauses for the review form in the UI;
    without one, review with `kbflow review list/approve/reject`.
    """
    import os

    settings = _settings()
    from sinks.connect import open_registry
    from tasks.review.access import authorize_decision

    try:  # refuse before starting a flow run (the flow checks again, for deployments)
        with open_registry(settings) as registry:
            authorize_decision(registry, actor, org, what="run research")
    except KbflowError as exc:
        raise _fail_review(exc) from exc
    from core.errors import RunFailed
    from flows.research import research as research_flow
    from kbflow.flow_cli import running_flow

    timeout = review_timeout
    if timeout is None:
        timeout = 3600 if os.environ.get("PREFECT_API_URL") else 0
    try:
        with running_flow(err_console):
            report = research_flow(
                org=org,
                client_name=client_name,
                model=model,
                budget_cap_tokens=budget,
                reviewer=actor,
                review_timeout_s=timeout,
            )
    except RunFailed as exc:  # the budget stopped it, or its review failed: see the report
        report = exc.report
    except KbflowError as exc:
        raise _fail(exc) from exc
    # A review that failed (nobody answered, or it refused its reviewer) exits 1 after the
    # report: the drafts are still pending_review.
    review_failed = report.get("review_failed")
    unfinished = bool(review_failed)
    if as_json:
        _print_json(report)
        if review_failed:
            err_console.print(f"[red]review failed:[/red] {escape(review_failed)}", soft_wrap=True)
        if unfinished:
            raise typer.Exit(1)
        return
    if report["budget_exceeded"]:
        # Which cap stopped it (the fetch cap or the token budget) and what raises that one.
        console.print(f"[red]research budget exceeded[/red]: {escape(report['budget_stop'])}")
        for note in report["notes"]:
            console.print(f"  {escape(note)}")
        raise typer.Exit(1)
    console.print(
        f"research run [bold]{report['synthesis_run_id']}[/bold] ({report['synthesizer']}, "
        f"{report['consumed_tokens']} tokens): {len(report['documents'])} drafts pending review"
    )
    for doc_id, doc in zip(report["doc_ids"], report["documents"], strict=False):
        console.print(f"  {doc_id}  {escape(doc['filename'])}")
    for note in report["notes"]:
        console.print(f"  [dim]{escape(note)}[/dim]")
    if review_failed:
        err_console.print(f"[red]review failed:[/red] {escape(review_failed)}", soft_wrap=True)
    if "review" not in report or review_failed:
        console.print(
            f"review them: kbflow review list --org {org} --as USER, then "
            "kbflow review approve|edit|reject DOC_ID --as USER"
        )
    if unfinished:
        raise typer.Exit(1)


@app.command()
def audit(
    org: MaybeOrgOpt = None,
    doc: Annotated[str | None, typer.Option("--doc", help="Only this document's rows.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show the most recent N rows.")] = 200,
    as_json: JsonOpt = False,
) -> None:
    """An org's audit log: who created, approved, rejected, edited, withdrew or superseded
    what, who assigned its account manager and changed its users, and when. Without --org:
    the agency-wide rows (users and roles of no org, refused admin actions)."""
    settings = _settings()
    from sinks.connect import open_registry

    try:
        with open_registry(settings) as registry:
            if org is not None:
                registry.get_org(org)  # an unknown org is an error, not an empty log
            rows = registry.audit_trail(org, doc, last=limit)
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json([_audit_dict(r) for r in rows])
        return
    title = f"audit log of {escape(org)}" if org else "agency-wide audit log"
    table = Table(title=f"{title} ({len(rows)} rows)")
    for col in ("time", "actor", "action", "doc", "run", "tag", "before → after"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            _when(r.at),
            escape(r.actor),
            escape(r.action.removeprefix("kb.document.")),
            (r.doc_id or "—")[:12],
            escape((r.synthesis_run_id or "—")[:12]),
            escape(r.source_tag or "—"),
            escape(_audit_change(r.before, r.after)),
        )
    console.print(table)


@app.command()
def reconcile(
    org: Annotated[
        str | None, typer.Option("--org", help="Only this org's chunks (default: every org).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Report the drift; change nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Bring the search index in line with the registry (the source of truth).

    Rewrites chunk statuses that differ from the registry's and deletes chunks of documents the
    registry does not know. Safe to run any time; holds the embedded store while it runs.
    """
    settings = _settings()
    from sinks.connect import open_registry, open_vector_store
    from tasks.review.machine import reconcile as reconcile_payloads

    try:
        with open_registry(settings) as registry, open_vector_store(settings) as store:
            report = reconcile_payloads(registry, store, org_id=org, dry_run=dry_run)
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json({**report.to_dict(), "org": org, "dry_run": dry_run})
        return
    where = f" in {escape(org)}" if org else ""
    repaired, removed = len(report.repaired), len(report.orphans_removed)
    if dry_run:
        summary = (
            f"{repaired} documents need repair, {removed} unknown documents' chunks would be "
            "removed (dry run: nothing changed)"
        )
    else:
        summary = f"{repaired} documents repaired, {removed} unknown documents' chunks removed"
    checked = f"checked {report.points} chunks of {report.documents} documents{where}"
    console.print(f"{checked}: {summary}")
    verb = ("would repair", "would remove") if dry_run else ("repaired", "removed")
    for item in report.repaired:
        console.print(
            f"  {verb[0]} {item['doc_id']}: {escape(', '.join(item['was']))} → "
            f"{escape(item['now'])}"
        )
    for doc_id in report.orphans_removed:
        console.print(f"  {verb[1]} the chunks of {escape(doc_id)} (not in the registry)")


@app.command()
def demo(as_json: JsonOpt = False) -> None:
    """End-to-end demo: a fictional client's documents, the approval gate, hybrid search."""
    settings = _settings()
    from kbflow.demo import run_demo

    try:
        result = run_demo(settings, show_progress=not as_json, console=None if as_json else console)
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(result)
    elif not result["ok"]:
        raise typer.Exit(1)


@app.command()
def server(
    port: Annotated[int, typer.Option(help="Port for the Prefect UI/API.")] = 4200,
) -> None:
    """Start a Prefect server (UI, pause/resume, schedules) with kbflow's data directory.

    SIGTERM, SIGINT (Ctrl-C) or SIGHUP stop it and everything it started.
    """
    import os

    from kbflow.processes import PREFECT_SERVER, run_supervised

    settings = _settings()
    console.print(
        f"Prefect UI on http://127.0.0.1:{port} — in other shells, "
        f"export PREFECT_API_URL=http://127.0.0.1:{port}/api"
    )
    cmd = [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    # The UI asks the API at PREFECT_UI_API_URL, which Prefect derives from port 4200 whatever
    # --port says: point it at this server (unless the user chose another address).
    env = dict(os.environ)
    env.setdefault("PREFECT_UI_API_URL", f"http://127.0.0.1:{port}/api")
    raise typer.Exit(run_supervised(cmd, home=settings.home, kind=PREFECT_SERVER, env=env))


DatasetOpt = Annotated[
    Path,
    typer.Option(
        "--dataset", help="A BEIR folder: corpus.jsonl[.gz], queries.jsonl, qrels.", exists=True
    ),
]


@eval_app.command("run")
def eval_run(
    dataset: DatasetOpt,
    split: Annotated[
        str | None, typer.Option(help="Split to use (default: test, then dev, then none).")
    ] = None,
    modes: Annotated[
        str | None,
        typer.Option(help="Comma-separated modes (default: keyword,dense,hybrid [+rerank])."),
    ] = None,
    record: Annotated[
        bool, typer.Option("--record/--no-record", help="Save to the eval warehouse.")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate retrieval on a BEIR dataset in every mode: MRR@10, nDCG@10, Recall@100.

    The corpus is indexed into its own data directory (<home>/evals/<dataset>) with cached
    embeddings, so a re-run re-embeds nothing. Results go to the DuckDB warehouse.
    """
    settings = _settings()
    from evals.beir import load_beir
    from evals.metrics import METRICS
    from evals.retrieval import parse_modes, run_eval
    from evals.warehouse import write_eval

    try:
        ds = load_beir(dataset, split)
        chosen = parse_modes(modes)
        with _stage_progress(enabled=not as_json) as progress:
            result = run_eval(ds, settings, chosen, progress=progress)
        if record:
            write_eval(result.record, home=settings.home)
    except KbflowError as exc:
        raise _fail(exc) from exc
    summary = result.summary()
    if as_json:
        _print_json(summary)
        return
    from rich.table import Table

    table = Table(title=f"{summary['dataset']} — {summary['queries']} queries")
    table.add_column("mode")
    for metric in METRICS:
        table.add_column(metric, justify="right")
    for mode, metrics in summary["modes"].items():
        table.add_row(mode, *(f"{metrics[m]:.4f}" for m in METRICS))
    console.print(table)
    index = summary["index"]
    console.print(
        f"run {summary['run_id']} in {summary['seconds']:.0f}s; index: {index['documents']} "
        f"documents ({index['indexed']} indexed now), embeddings computed "
        f"{index.get('embeddings_computed', 0)}, cached {index.get('embeddings_cached', 0)}"
        + ("" if record else "; not recorded")
    )
    for note in summary["notes"]:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")


def _progress_bar() -> Any:
    """The progress bar every long command shows on stderr."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
    )


@contextlib.contextmanager
def _stage_progress(enabled: bool) -> Iterator[Any]:
    """A rich progress bar per stage ("index", then each mode), fed by (stage, done, total)."""
    if not enabled:
        yield None
        return
    with _progress_bar() as bar:
        tasks: dict[str, Any] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        yield update


@eval_app.command("report")
def eval_report(
    dataset: Annotated[
        str | None, typer.Option(help="Only this dataset (e.g. scifact/dev).")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="PNG to write (default: <home>/evals/history.png).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the history of recorded eval runs and plot each metric over time (PNG)."""
    settings = _settings()
    from evals.warehouse import METRIC_COLUMNS, plot_history, read_history

    try:
        rows = read_history(settings.home, dataset)
        out = plot or settings.home / "evals" / "history.png"
        written = plot_history(rows, out) if rows else None
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json({"runs": rows, "plot": str(written) if written else None})
        return
    if not rows:
        console.print("no eval runs recorded yet — run `kbflow eval run --dataset DIR` first.")
        return
    from rich.table import Table

    table = Table(title="eval history")
    for column in ("started", "run", "dataset", "mode", *METRIC_COLUMNS):
        table.add_column(column)
    for row in rows:
        table.add_row(
            str(row["started_at"])[:16],
            str(row["run_id"]),
            str(row["dataset"]),
            str(row["mode"]),
            *(f"{row[c]:.4f}" for c in METRIC_COLUMNS.values()),
        )
    console.print(table)
    console.print(f"plot: {written}")


@eval_app.command("baseline")
def eval_baseline(
    dataset: Annotated[str, typer.Option(help="Recorded dataset name, e.g. scifact/dev.")],
    tolerance: Annotated[
        float, typer.Option(min=0, max=1, help="Allowed drop before the alarm fires.")
    ] = 0.02,
    out: Annotated[
        Path | None, typer.Option(help="Where to write it (default: evals/baselines/<name>.json).")
    ] = None,
) -> None:
    """Make the latest recorded run of a dataset its baseline (what the nightly compares to)."""
    settings = _settings()
    from evals.regression import Baseline, baseline_path, save_baseline
    from evals.warehouse import latest

    try:
        modes = latest(settings.home, dataset)
        if not modes:
            raise KbflowError(
                f"no recorded run of {dataset!r} — run `kbflow eval run --dataset DIR` first"
            )
        path = save_baseline(out or baseline_path(dataset), Baseline(dataset, tolerance, modes))
    except KbflowError as exc:
        raise _fail(exc) from exc
    console.print(f"baseline for {escape(dataset)} written to {path}")


@eval_app.command("golden")
def eval_golden(
    out: Annotated[Path, typer.Option(help="Folder to write the BEIR files to.")] = Path("golden"),
) -> None:
    """Write the small golden set over the demo corpus as a BEIR folder."""
    _settings()
    from evals.golden import write_golden_set

    console.print(f"golden set written to {write_golden_set(out)}")


@app.command("serve-schedules")
def serve_schedules(
    dataset: Annotated[
        list[Path] | None, typer.Option(help="BEIR folders the nightly eval runs (repeatable).")
    ] = None,
    cron: Annotated[str, typer.Option(help="When, as a cron expression.")] = "0 2 * * *",
    timezone: Annotated[str, typer.Option(help="The cron's time zone.")] = "Europe/London",
) -> None:
    """Serve kbflow's schedules from this process (the nightly eval) until stopped.

    Needs a Prefect server: `kbflow server` in another shell and
    PREFECT_API_URL=http://127.0.0.1:4200/api. Equivalent to `prefect deploy` of the
    `nightly-eval` deployment in prefect.yaml plus a process worker.
    """
    import os

    _settings()
    if not os.environ.get("PREFECT_API_URL"):
        raise _fail(
            KbflowError(
                "PREFECT_API_URL is not set: schedules need a running Prefect server — start "
                "`kbflow server` and export PREFECT_API_URL=http://127.0.0.1:4200/api"
            )
        )
    from prefect import serve
    from prefect.schedules import Cron

    from evals.nightly import DEPLOYMENT, nightly_eval

    folders = [str(p.resolve()) for p in dataset] if dataset else [_default_eval_dataset()]
    deployment: Any = nightly_eval.to_deployment(
        name=DEPLOYMENT, schedule=Cron(cron, timezone=timezone), parameters={"datasets": folders}
    )
    console.print(f"serving {DEPLOYMENT} ({cron}, {timezone}) on {', '.join(folders)}")
    serve(deployment)


def _default_eval_dataset() -> str:
    repo = Path(__file__).resolve().parents[1]
    return str(
        Path(os.environ.get("KBFLOW_DATASETS", repo.parent / "shared" / "datasets")) / "scifact"
    )


CollectionRef = Annotated[str, typer.Argument(help="Collection id or path (e.g. policies/hr).")]


@contextlib.contextmanager
def _catalog(*, with_store: bool = False) -> Iterator[Any]:
    """The registry's catalog (and the vector store, for moves and deletes) for one command;
    a kbflow error ends the command with its message."""
    settings = _settings()
    from sinks.catalog import Catalog
    from sinks.connect import open_registry, open_vector_store

    try:
        with open_registry(settings) as registry, contextlib.ExitStack() as stack:
            store = stack.enter_context(open_vector_store(settings)) if with_store else None
            yield Catalog(registry), store
    except KbflowError as exc:
        raise _fail(exc) from exc


def _ref(value: str | None) -> int | str | None:
    return int(value) if value is not None and value.isdigit() else value


@collections_app.command("create")
def collections_create(
    org: OrgOpt,
    name: Annotated[str, typer.Argument(help="The collection's name (no '/').")],
    description: Annotated[
        str, typer.Option(help="What it holds: agents read this to pick a collection.")
    ],
    parent: Annotated[str | None, typer.Option(help="Parent collection id or path.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a collection (optionally nested under a parent); a description is required."""
    with _catalog() as (catalog, _):
        made = catalog.create_collection(org, name, description, _ref(parent))
    if as_json:
        _print_json(made.to_dict())
        return
    console.print(f"created collection {made.id} {escape(made.path)}")


@collections_app.command("list")
def collections_list(org: OrgOpt, as_json: JsonOpt = False) -> None:
    """List an org's collections as a tree."""
    with _catalog() as (catalog, _):
        found = catalog.list_collections(org)
    if as_json:
        _print_json([c.to_dict() for c in found])
        return
    for c in found:
        indent = "  " * c.path.count("/")
        console.print(f"{indent}{c.id:>4}  {escape(c.name)}  [dim]{escape(c.description)}[/dim]")


@collections_app.command("describe")
def collections_describe(
    org: OrgOpt,
    ref: CollectionRef,
    description: Annotated[str, typer.Argument(help="The new description.")],
) -> None:
    """Set a collection's description."""
    with _catalog() as (catalog, _):
        done = catalog.describe(org, _ref(ref) or ref, description)
    console.print(f"described {escape(done.path)}")


@collections_app.command("move")
def collections_move(
    org: OrgOpt,
    ref: CollectionRef,
    parent: Annotated[
        str | None, typer.Option(help="New parent id or path; omit for the top level.")
    ] = None,
) -> None:
    """Move a collection (with its sub-collections and documents) under another parent."""
    from tasks.review.collections import move_collection

    with _catalog(with_store=True) as (catalog, store):
        moved, docs = move_collection(catalog, store, org, _ref(ref) or ref, _ref(parent))
    console.print(f"moved to {escape(moved.path)}; {docs} document(s) re-filed")


@collections_app.command("delete")
def collections_delete(
    org: OrgOpt,
    ref: CollectionRef,
    move_to: Annotated[
        str | None, typer.Option(help="Move its documents to this collection first.")
    ] = None,
    delete_contents: Annotated[
        bool, typer.Option("--delete-contents", help="Delete its documents too.")
    ] = False,
) -> None:
    """Delete a collection and its sub-collections; refused while it holds documents unless
    they are moved (--move-to) or deleted (--delete-contents)."""
    from tasks.review.collections import delete_collection

    with _catalog(with_store=True) as (catalog, store):
        counts = delete_collection(
            catalog, store, org, _ref(ref) or ref,
            move_to=_ref(move_to), delete_contents=delete_contents,
        )  # fmt: skip
    console.print(f"deleted; {counts['moved']} document(s) moved, {counts['deleted']} deleted")


@agents_app.command("create")
def agents_create(
    org: OrgOpt,
    agent_id: Annotated[str, typer.Argument(help="The agent's id.")],
    name: Annotated[str | None, typer.Option(help="Display name.")] = None,
    disabled: Annotated[
        bool, typer.Option("--disabled", help="Create with the knowledge base switched off.")
    ] = False,
    audience: Annotated[
        list[str] | None,
        typer.Option(
            help="An audience the agent reads as (repeatable; needs --as a superadmin). "
            "Without: only documents meant for everyone."
        ),
    ] = None,
    actor: AdminOpt = None,
) -> None:
    """Create an agent; it may read every collection of its org until you `allow` some.

    Its audiences are a property of the agent (never of a request): documents ingested for an
    audience reach only agents given it here or with `kbflow agents audience`.
    """
    with _catalog() as (catalog, _):
        if audience:
            from tasks.review.access import authorize_admin

            authorize_admin(catalog.registry, actor, "give agents audiences", org_id=org)
        made = catalog.create_agent(
            org, agent_id, name, enabled=not disabled, audiences=tuple(audience or ())
        )
    console.print(f"created agent {escape(made.id)} in {escape(made.org_id)}")


def _agent_change(agent_id: str, refs: list[str], *, allow: bool) -> None:
    with _catalog() as (catalog, _):
        agent = catalog.set_allowed(agent_id, [_ref(r) or r for r in refs], allow=allow)
    allowed = agent.allowed_collection_ids
    console.print(f"{agent.id} may read: {', '.join(map(str, allowed)) or 'every collection'}")


AgentArg = Annotated[str, typer.Argument(help="The agent's id.")]
CollectionsArg = Annotated[list[str], typer.Argument(help="Collection ids or paths.")]


@agents_app.command("allow")
def agents_allow(agent_id: AgentArg, collection: CollectionsArg) -> None:
    """Let an agent read these collections (and their descendants)."""
    _agent_change(agent_id, collection, allow=True)


@agents_app.command("disallow")
def agents_disallow(agent_id: AgentArg, collection: CollectionsArg) -> None:
    """Take collections off an agent's allow-list. The last one cannot be removed (an empty
    list means every collection): allow another first, or `agents show ID --disable`."""
    _agent_change(agent_id, collection, allow=False)


@agents_app.command("audience")
def agents_audience(
    agent_id: AgentArg,
    audience: Annotated[
        list[str] | None,
        typer.Argument(help="The audiences it reads as (replacing the current ones)."),
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Remove every audience (documents for everyone only).")
    ] = False,
    actor: AdminOpt = None,
) -> None:
    """Set the audiences an agent reads as (a superadmin's decision: --as; audited).

    Documents ingested with `--audience A` reach only agents that read as A; documents without
    an audience (or for `all`) reach every agent in scope. Seed inputs reach none.
    """
    if not audience and not clear:
        raise _fail(KbflowError("name the audiences to set, or --clear to remove them all"))
    from tasks.review.access import authorize_admin

    with _catalog() as (catalog, _):
        agent = catalog.get_agent(agent_id)
        admin = authorize_admin(
            catalog.registry, actor, "give agents audiences", org_id=agent.org_id
        )
        before = list(agent.audiences)
        agent = catalog.set_audiences(agent_id, tuple(audience or ()))
        catalog.registry.record_admin(
            admin, AuditAction.AGENT_AUDIENCES, org_id=agent.org_id,
            before={"agent": agent_id, "audiences": before},
            after={"agent": agent_id, "audiences": list(agent.audiences)},
        )  # fmt: skip
    shown = ", ".join(agent.audiences) or "none (documents for everyone only)"
    console.print(f"{escape(agent.id)} reads as: {escape(shown)}")


@agents_app.command("show")
def agents_show(
    agent_id: AgentArg,
    enable: Annotated[
        bool | None, typer.Option("--enable/--disable", help="Switch its knowledge base.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show an agent, what it may read; `--enable/--disable` flips its master switch."""
    with _catalog() as (catalog, _):
        agent = catalog.get_agent(agent_id)
        if enable is not None:
            agent = catalog.set_enabled(agent_id, enable)
        readable = catalog.readable_collections(agent)
    data = agent.to_dict() | {"readable": [c.to_dict() for c in readable]}
    if as_json:
        _print_json(data)
        return
    state = "on" if agent.knowledge_base_enabled else "OFF"
    console.print(f"{escape(agent.id)} ({escape(agent.org_id)}): knowledge base {state}")
    for c in readable:
        console.print(f"  {c.id:>4}  {escape(c.path)}")


@tools_app.command("schema")
def tools_schema() -> None:
    """Print the tools' names, descriptions and JSON schemas (inputs and outputs)."""
    from kbflow.tools import export_schemas

    _print_json(export_schemas())


@tools_app.command("call")
def tools_call(
    name: Annotated[
        str,
        typer.Argument(
            help="list_knowledge_collections, search_knowledge_base or research_knowledge_search"
        ),
    ],
    agent: Annotated[
        str, typer.Option(help="The agent the call is made for.", callback=_valid(ids.agent_id))
    ],
    args: Annotated[str, typer.Option("--args", help="The arguments as a JSON object.")] = "{}",
) -> None:
    """Call a tool as an agent would; prints its JSON result."""
    settings = _settings()
    from kbflow.tools import call_tool
    from kbflow.wiring import search_context

    try:
        arguments = json.loads(args)
    except json.JSONDecodeError as exc:
        raise _fail(KbflowError(f"--args is not JSON: {exc.msg} at {exc.pos}")) from exc
    try:
        with search_context(settings, degrade=True) as ctx:
            result = call_tool(ctx, name, agent, arguments)
    except KbflowError as exc:
        raise _fail(exc) from exc
    _print_json(result)


AgentOpt = Annotated[
    str,
    typer.Option(
        "--agent", help="The agent asking (see `kbflow agents`).", callback=_valid(ids.agent_id)
    ),
]


@app.command()
def ask(
    queries: Annotated[list[str], typer.Argument(help="1 to 5 research queries.")],
    agent: AgentOpt,
    as_json: JsonOpt = False,
) -> None:
    """Search the agent's knowledge: yes / maybe / no, a cited synthesis and what to do next.

    yes: answer from the synthesis; maybe: use it and research the gaps; no: research live
    (the miss says why). Offline, the synthesis quotes the knowledge's own sentences. The turn
    is recorded in the ledger (`kbflow replay TURN_ID`).
    """
    settings = _settings()
    from kbflow.answers import ask as run_ask
    from kbflow.wiring import search_context

    try:
        with search_context(settings, degrade=True) as ctx:
            out = run_ask(ctx, agent, queries)
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(out)
        return
    colour = {"yes": "green", "maybe": "yellow", "no": "red"}[out["answer_status"]]
    console.print(f"[bold {colour}]{out['answer_status']}[/bold {colour}]  "
                  f"[dim]turn {out['turn_id']}[/dim]")  # fmt: skip
    if out["miss"]:
        console.print(f"[dim]miss: {out['miss']['reason']}: {escape(out['miss']['detail'])}[/dim]")
    if out["synthesis"]:
        console.print(out["synthesis"], markup=False)
    for c in out["citations"]:
        console.print(f"  [dim]{escape(c['chunk_id'])} · {escape(c['uri'])}[/dim]")
    console.print(f"[italic]{escape(out['steering'])}[/italic]")


@app.command()
def answer(
    question: Annotated[str, typer.Argument(help="The question.")],
    agent: AgentOpt,
    as_json: JsonOpt = False,
) -> None:
    """Answer from approved knowledge with a citation on every claim, or refuse.

    "No chunk, no answer": when no retrieved chunk reaches KBFLOW_ANSWER_MIN_CONFIDENCE the
    standard refusal comes back with the evidence it lacked. The turn is recorded in the ledger.
    """
    settings = _settings()
    from kbflow.answers import answer_question
    from kbflow.wiring import search_context

    try:
        with search_context(settings, degrade=True) as ctx:
            out = answer_question(ctx, agent, question)
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(out)
        return
    if out["status"] == "refused":
        console.print(f"[yellow]{escape(out['answer'])}[/yellow]")
        r = out["refusal"]
        console.print(f"[dim]{escape(r['reason'])} · policy {r['policy_id']} v"
                      f"{r['policy_version']} · turn {out['turn_id']}[/dim]")  # fmt: skip
        return
    console.print(out["answer"], markup=False)
    console.print(f"[dim]turn {out['turn_id']} · {out['model']}[/dim]")


@app.command()
def replay(
    turn_id: Annotated[str, typer.Argument(help="A turn id from `kbflow ask/answer`.")],
    prompt: Annotated[
        Path | None,
        typer.Option(help="A system prompt file to replay with instead of the recorded one."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-run a recorded turn's synthesis on its recorded chunks (no retrieval, no embedding)
    and show the diff. Exit code 1 when the replay differs."""
    settings = _settings()
    from kbflow.answers import replay_turn

    try:
        system = prompt.read_text(encoding="utf-8") if prompt else None
    except OSError as exc:
        raise _fail(KbflowError(f"cannot read --prompt {prompt}: {exc.strerror}")) from exc
    try:
        result, note = replay_turn(settings, turn_id, prompt=system)
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json({"turn_id": turn_id, "model": result.model, "identical": result.identical,
                     "recorded": result.recorded, "replayed": result.replayed,
                     "diff": result.diff(), "note": note})  # fmt: skip
    else:
        if note:
            err_console.print(f"[dim]note: {escape(note)}[/dim]")
        if result.identical:
            console.print(f"[green]identical[/green]: {turn_id} replays byte for byte "
                          f"({result.model})")  # fmt: skip
        else:
            console.print(result.diff(), markup=False, highlight=False)
    if not result.identical:
        raise typer.Exit(1)


@app.command()
def turns(
    org: Annotated[str | None, typer.Option(help="Only this org's turns.")] = None,
    since: Annotated[
        str | None, typer.Option(help="Only turns since: 7d, 12h, 30m, 2w or an ISO date.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List recent ask/answer turns from the ledger, newest first."""
    settings = _settings()
    from kbflow.answers import parse_since
    from sinks.ledger import Ledger

    try:
        rows = Ledger(settings.home).turns(org_id=org, since=parse_since(since), limit=limit)
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(rows)
        return
    if not rows:
        console.print("[dim]no turn recorded yet.[/dim]")
        return
    for r in rows:
        console.print(f"{r['created_at']:%Y-%m-%d %H:%M} {r['turn_id']} {r['kind']:<6} "
                      f"{r['outcome']:<8} {escape(r['agent_id'])}  "
                      f"{escape(_snippet(r['question'], 80))}")  # fmt: skip


@app.command()
def provenance(
    doc: Annotated[
        str | None, typer.Option(help="The document id whose citing answers to list.")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Only answers since: 7d, 12h, 30m, 2w or an ISO date.")
    ] = None,
    stale: Annotated[
        bool,
        typer.Option(
            help="Only answers citing documents later rejected, superseded, withdrawn or changed."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """List the recorded answers that cited a document, flagging those to revisit."""
    settings = _settings()
    from kbflow.answers import parse_since
    from kbflow.answers import provenance as find
    from sinks.connect import open_registry

    if doc is None and not stale:
        raise _fail(KbflowError("say what to trace: --doc DOC_ID, or --stale for every "
                                "answer to revisit"))  # fmt: skip
    try:
        with open_registry(settings) as registry:
            rows = find(settings, registry, doc_id=doc, since=parse_since(since),
                        stale_only=stale)  # fmt: skip
    except KbflowError as exc:
        raise _fail(exc) from exc
    if as_json:
        _print_json(rows)
        return
    if not rows and doc is not None:  # a known document: `find` refuses an unknown id
        which = ("citing it needs revisiting" if stale else "cites it") + (
            f" (since {since})" if since else ""
        )
        console.print(f"[dim]document {escape(doc)}: no recorded answer {escape(which)}.[/dim]")
        return
    if not rows:
        console.print("[dim]no recorded answer matches.[/dim]")
        return
    for r in rows:
        flag = f"[red]revisit: {escape(r['stale'])}[/red]" if r["stale"] else "[green]ok[/green]"
        console.print(f"{r['created_at']:%Y-%m-%d %H:%M} {r['turn_id']} {r['kind']} "
                      f"{escape(r['agent_id'])} {flag}")  # fmt: skip
        console.print(f"   {escape(_snippet(r['question'], 100))}  [dim]cites "
                      f"{escape(r['chunk_id'])} ({escape(r['doc_id'])})[/dim]")  # fmt: skip


def main() -> None:  # pragma: no cover - console script shim
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
