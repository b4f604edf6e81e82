"""Helpers the kbflow tests share: the CLI in-process (typer's CliRunner), an MCP session on a
served world, answers checked against the registry, and the job processes watched with psutil."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import psutil
from click.testing import Result
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from typer.testing import CliRunner

from kbflow.cli import app
from kbflow.services.query import answers
from kbflow.services.query.context import OpenHome
from tests.tasks.answer.handbook import checked_output

# --- the CLI, in-process -------------------------------------------------------------------------


runner = CliRunner()


def kb(*args: str) -> Result:
    # A wide terminal, so that rich's tables keep ids and audit changes on one line.
    return runner.invoke(app, list(args), env={"COLUMNS": "250"})


def ok(*args: str) -> Result:
    result = kb(*args)
    assert result.exit_code == 0, result.output
    return result


def data(*args: str) -> Any:
    return json.loads(ok(*args, "--json").stdout)


def flat(result: Result) -> str:
    """The output with rich's line wrapping undone, for substring checks."""
    return " ".join(result.output.split())


# --- an MCP session on the served world (tests/kbflow/conftest.py) -------------------------------


@asynccontextmanager
async def mcp_session(base: str, token: str) -> AsyncIterator[ClientSession]:
    """A ClientSession on the service's /mcp after the ``initialize`` handshake, the token in
    every request's header."""
    auth = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=auth, timeout=120) as http,
        streamable_http_client(f"{base}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def in_session(
    served: dict[str, Any], who: str, steps: Callable[[ClientSession], Awaitable[Any]]
) -> Any:
    """Run ``steps`` in an MCP session as ``who`` (a key of the fixture's tokens)."""

    async def main() -> Any:
        async with mcp_session(served["base"], served["tokens"][who]) as session:
            return await steps(session)

    return anyio.run(main)


# --- answers, their citations checked ------------------------------------------------------------


QUESTION = "How many days do employees have to submit expense reports?"


def answer_question(ctx: OpenHome, agent: str, question: str, **kw: Any) -> dict[str, Any]:
    return checked_output(ctx.registry, answers.answer(ctx, agent, question, **kw))


# --- job processes, watched ----------------------------------------------------------------------


JOB_RSS_BOUND_MB = 700
"""What one job process may hold at its peak (RSS): measured 450-520 MB for an ingest of a small
text file (the embedding model, Prefect, the extractors), with room to spare."""


class JobSampler:
    """Every 50 ms, the live processes whose command line holds ``kbflow.services.job_runner``:
    their job id,
    RSS, and RSS with their children (the temporary Prefect server a job starts when no
    PREFECT_API_URL is set). `peak_*` count only the jobs given (other tests' jobs may run)."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.samples: list[dict[str, tuple[int, int]]] = []
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> JobSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            seen: dict[str, tuple[int, int]] = {}
            for proc in psutil.process_iter(["cmdline"]):
                cmdline = proc.info["cmdline"] or []
                if "kbflow.services.job_runner" not in cmdline:
                    continue
                at = cmdline.index("kbflow.services.job_runner")
                job_id = cmdline[at + 1] if at + 1 < len(cmdline) else "?"
                try:
                    rss = proc.memory_info().rss
                    tree = rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
                except psutil.Error:
                    continue
                seen[job_id] = (rss, tree)
            self.samples.append(seen)
            self._stop.wait(self.interval_s)

    def _ours(self, ids: Iterable[str]) -> list[dict[str, tuple[int, int]]]:
        wanted = set(ids)
        return [{k: v for k, v in s.items() if k in wanted} for s in self.samples]

    def timeline(self, ids: Iterable[str]) -> str:
        """Which of the jobs ran, sample by sample (a change per line), for a failure."""
        lines: list[str] = []
        for sample in self._ours(ids):
            line = f"{len(sample)} running: {sorted(sample)}"
            if not lines or lines[-1] != line:
                lines.append(line)
        return "\n".join(lines)

    def peak_running(self, ids: Iterable[str]) -> int:
        return max((len(s) for s in self._ours(ids)), default=0)

    def peak_running_per_org(self, orgs: dict[str, str]) -> dict[str, int]:
        peak: Counter[str] = Counter()
        for sample in self._ours(orgs):
            for org, n in Counter(orgs[j] for j in sample).items():
                peak[org] = max(peak[org], n)
        return dict(peak)

    def peak_rss_mb(self, ids: Iterable[str], *, tree: bool = False) -> float:
        """The largest summed RSS of the jobs' processes at one instant (with children: tree)."""
        sums = [sum(v[1 if tree else 0] for v in s.values()) for s in self._ours(ids)]
        return max(sums, default=0) / 2**20

    def peak_job_rss_mb(self, ids: Iterable[str], *, tree: bool = False) -> float:
        """The largest RSS one job process reached."""
        return (
            max((v[1 if tree else 0] for s in self._ours(ids) for v in s.values()), default=0)
            / 2**20
        )
