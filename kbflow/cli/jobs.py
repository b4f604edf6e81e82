"""``kbflow jobs``: the background jobs that ingest long media (audio, video, large files)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from core import ids
from core.models import JobStatus
from core.settings import Settings
from kbflow.cli.common import JsonOpt, checked, command, command_group, counted, print_json
from kbflow.cli.ingest import print_ingest_report
from kbflow.render import console
from kbflow.services import ingest as service

group = command_group("jobs", "Background ingest jobs (audio, video, large files).")


def _job_line(job: Any) -> str:
    when = job.created_at.astimezone().strftime("%Y-%m-%d %H:%M")
    files = counted(len(job.inputs), "file")
    line = f"{job.id}  {job.status.value:<10}  {job.org_id}  {files}  {when}"
    if progress := job.progress:  # how far a running research job has got
        counts = f" {progress['done']} of {progress['total']}" if "total" in progress else ""
        line += f"  ({progress.get('stage')}{counts})"
    return line + (f"\n    {job.reason}" if job.reason else "")


@group.command("list")
@command
def jobs_list(
    settings: Settings,
    org: Annotated[
        str | None, typer.Option(help="Only this org's jobs.", callback=checked(ids.org_id))
    ] = None,
    status: Annotated[JobStatus | None, typer.Option(help="Only jobs in this state.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List recent jobs, newest first: PROCESSING, COMPLETE or FAILED (with the reason)."""
    jobs = service.list_jobs(settings, org=org, status=status, limit=limit)
    if as_json:
        print_json([job.to_dict() for job in jobs])
        return
    if not jobs:
        console.print("no jobs.")
    for job in jobs:
        console.print(_job_line(job), markup=False, highlight=False)


@group.command("status")
@command
def jobs_status(
    settings: Settings,
    job_id: Annotated[str, typer.Argument(help="The id `kbflow ingest` printed.")],
    as_json: JsonOpt = False,
) -> None:
    """Show one job: its state, the Prefect flow run doing it, and its report when done."""
    job = service.get_job(settings, job_id)
    if as_json:
        print_json(job.to_dict())
        return
    console.print(_job_line(job), markup=False, highlight=False)
    console.print(f"  flow run: {job.flow_run_id or '(not started yet)'}", markup=False)
    console.print(f"  log: {job.log_path or '-'}", markup=False)
    for path in job.inputs:
        console.print(f"  input: {path}", markup=False)
    if job.report:
        print_ingest_report(job.report)
