"""prefect.yaml as deployments/README.md runs it: a Prefect server, a process work pool,
``prefect deploy --all`` from the repo root, a worker; then the ``ingest`` and ``nightly-eval``
deployments run on that worker and their effects show in the kbflow CLI (same KBFLOW_HOME).
On the same server and worker, two background jobs submitted with ``KBFLOW_JOB_RUNNER=prefect``
run as ``kbflow-job`` deployment runs: one completes, one (an unreadable file) fails, and the
registry row and the Prefect state agree each time.

Every process the test starts is stopped at the end, and psutil checks that none of them or
their children survive.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from core import prefect_database
from core.contracts import IngestRequest
from core.models import JobStatus
from core.settings import Settings
from kbflow.services.jobs.queue import get_job, submit_ingest_job
from kbflow.services.orchestration.prefect_api import RetryingTransport
from tests import web
from tests.conftest import free_port, running

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
POOL = "kbflow-process"  # prefect.yaml's work pool
ORG = "deployco"
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


class Processes:
    """The long-running processes of a test, with their logs; `stop_all` ends them."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.started[name] = proc
        return proc

    def tail(self, name: str, chars: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    def family(self) -> list[psutil.Process]:
        """The started processes and all their descendants, as they are now."""
        found: list[psutil.Process] = []
        for proc in self.started.values():
            if proc.poll() is not None:  # reaped: its pid may name another process by now
                continue
            try:
                parent = psutil.Process(proc.pid)
                found += [parent, *parent.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return found

    def stop_all(self) -> list[str]:
        """SIGINT the worker (it ignores SIGTERM for ~10 s), SIGTERM the rest; SIGKILL what is
        left after 60 s (a server and a worker that ran four flows can take over 30 s to wind
        down on two busy cores), or, once all else has gone, the worker itself after 15 s more
        (it stops within a few seconds, or not at all: issue 16's note in the test). Returns
        what was still running before the SIGKILL, each as its pid and command line."""
        family = self.family()
        names = {}
        for member in family:
            with contextlib.suppress(psutil.Error):
                names[member.pid] = " ".join(member.cmdline())[:200]
        for name, proc in self.started.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if name == "worker" else signal.SIGTERM)
        deadline = time.monotonic() + 60
        worker = self.started.get("worker")
        for name, proc in self.started.items():
            if name != "worker":
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        others = [m for m in family if worker is None or m.pid != worker.pid]
        survivors = _still_running(others, max(0.1, deadline - time.monotonic()))
        if worker is not None:
            worker_s = min(15, deadline - time.monotonic()) if not survivors else 0
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=max(0.1, worker_s))
            survivors = _still_running(family, 0.1)
        for leftover in survivors:
            with contextlib.suppress(psutil.Error):
                leftover.kill()
        for proc in self.started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        return [f"{p.pid}: {names.get(p.pid, '?')}" for p in survivors]


def _still_running(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [proc for proc in procs if running(proc)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()  # after a failure too; the test asserts on its own stop


def _beir_folder(root: Path) -> Path:
    """A six-document BEIR folder: corpus.jsonl, queries.jsonl, qrels/test.tsv."""
    folder = root / "tinybeir"
    (folder / "qrels").mkdir(parents=True)
    corpus = [
        ("d1", "Annual leave", "Staff get twenty-five days of paid annual leave each year."),
        ("d2", "Expenses", "Claim travel expenses within thirty days with receipts attached."),
        ("d3", "Bikes", "The Larkspur touring bike has a steel frame and disc brakes."),
        ("d4", "Returns", "Unused products can be returned within sixty days for a refund."),
        ("d5", "Security", "Laptops use full-disk encryption and lock after five minutes."),
        ("d6", "Parking", "Visitors park in the north car park next to the loading bay."),
    ]
    queries = [
        ("q1", "how many days of annual leave"),
        ("q2", "refund for returned products"),
        ("q3", "laptop disk encryption"),
    ]
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in corpus)
    )
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": i, "text": x}) + "\n" for i, x in queries)
    )
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td4\t1\nq3\td5\t1\n"
    )
    return folder


def _run(cmd: list[str], env: dict[str, str], timeout: int = 300) -> str:
    done = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _wait_healthy(api: str, procs: Processes) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            if web.get(f"{api}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if procs.started["server"].poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"prefect server not healthy:\n{procs.tail('server')}")
        time.sleep(0.25)


def _prefect(api: str) -> httpx.Client:
    """A client that asks again on the 503 a busy Prefect server gives, as Prefect's own does."""
    return web.client(base_url=api, timeout=10, transport=RetryingTransport())


def _run_deployment(api: str, name: str, parameters: dict[str, Any]) -> str:
    with _prefect(api) as client:
        deployment = client.get(f"/deployments/name/{name}")
        assert deployment.status_code == 200, deployment.text
        created = client.post(
            f"/deployments/{deployment.json()['id']}/create_flow_run",
            json={"parameters": parameters},
        )
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def _scheduled_run(api: str, name: str, scheduled: dict[str, Any]) -> str:
    """The run the source's schedule makes next, created as Prefect's scheduler would (its
    service is off in this test so that no other deployment's schedule starts anything):
    ``POST /deployments/{id}/schedule`` fills in the runs each active schedule calls for."""
    with _prefect(api) as client:
        deployment = client.get(f"/deployments/name/{name}").json()
        slugs = {s["slug"]: s for s in deployment["schedules"]}
        mine = slugs[scheduled["slug"]]
        assert mine["active"] and mine["parameters"] == {"source_id": scheduled["id"]}
        assert mine["schedule"]["cron"] == scheduled["cron"]
        start = dt.datetime.now(dt.UTC)
        made = client.post(
            f"/deployments/{deployment['id']}/schedule",
            json={"start_time": start.isoformat(),
                  "end_time": (start + dt.timedelta(seconds=70)).isoformat(), "max_runs": 1},
        )  # fmt: skip
        assert made.status_code in (200, 201, 204), made.text
        runs = client.post(
            "/flow_runs/filter",
            json={"flow_runs": {"deployment_id": {"any_": [deployment["id"]]}}},
        ).json()
    assert len(runs) == 1 and runs[0]["parameters"] == {"source_id": scheduled["id"]}, runs
    assert runs[0]["state"]["type"] == "SCHEDULED"
    return str(runs[0]["id"])


def _wait_final(api: str, run_ids: list[str], procs: Processes, timeout_s: float = 420) -> dict:
    deadline = time.monotonic() + timeout_s
    states: dict[str, Any] = {}
    while True:
        for run_id in run_ids:
            with _prefect(api) as client:
                run = client.get(f"/flow_runs/{run_id}").json()
            states[run_id] = run["state"]
        if all(s and s["type"] in FINAL for s in states.values()):
            return states
        if procs.started["worker"].poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"flow runs not finished: {states}\nworker:\n{procs.tail('worker')}")
        time.sleep(1)


def test_prefect_yaml_deployments_run_from_the_repo_on_a_process_worker(
    tmp_path: Path, processes: Processes, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    home = tmp_path / "kbflow-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_API_URL=api,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_UI_ENABLED="false",
        # No scheduled nightly-eval may start during the test: only the runs it asks for.
        PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED="false",
        PREFECT_WORKER_QUERY_SECONDS="1",
        DO_NOT_TRACK="1",
        KBFLOW_HOME=str(home),  # the worker's flow runs and the CLI below share it
        # Three ingests run at once on the worker; each waits its turn for the embedded store.
        KBFLOW_STORE_LOCK_TIMEOUT_S="300",
    )
    prefect = [sys.executable, "-m", "prefect"]
    kbflow = [sys.executable, "-m", "kbflow.cli"]
    doc = home / "drop" / "incoming" / "leave-policy.md"  # the only folder it may read
    doc.parent.mkdir(parents=True)
    doc.write_text("# Leave policy\n\nEvery employee gets 25 days of paid annual leave a year.\n")
    beir = _beir_folder(tmp_path)
    job_doc = tmp_path / "for-jobs" / "parking-policy.md"
    job_doc.parent.mkdir()
    job_doc.write_text("# Parking\n\nVisitors park in the north car park by the loading bay.\n")
    broken = tmp_path / "for-jobs" / "broken.pdf"
    broken.write_bytes(random.Random(7).randbytes(4096))  # matches no format: the job fails

    prefect_database.seed(Path(env["PREFECT_HOME"]), build=True, environ=env)
    processes.start(
        "server",
        [*prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env,
    )
    _wait_healthy(api, processes)
    _run([*prefect, "work-pool", "create", POOL, "--type", "process"], env)
    deployed = _run([*prefect, "--no-prompt", "deploy", "--all"], env)
    assert "nightly-eval" in deployed, deployed
    with _prefect(api) as client:
        pull_steps = client.get("/deployments/name/ingest/ingest").json()["pull_steps"]
    assert pull_steps == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
    ]
    processes.start("worker", [*prefect, "worker", "start", "--pool", POOL], env)
    _run([*kbflow, "users", "add", "root", "--role", "superadmin"], env)
    _run([*kbflow, "orgs", "create", ORG, "--as", "root"], env)  # ingest refuses unknown orgs
    # A source on a schedule: `kbflow sources schedule` puts its cron on source-sync.
    share = tmp_path / "synced"
    share.mkdir()
    (share / "visitor-parking.md").write_text("# Visitors\n\nVisitors park by the gatehouse.\n")
    _run([*kbflow, "sources", "add", "share", "--org", ORG, "--kind", "filesystem", "--url",
          str(share), "--collection", "synced", "--status", "approved", "--schedule",
          "* * * * *", "--as", "root"], env)  # fmt: skip
    scheduled = json.loads(_run([*kbflow, "sources", "schedule", "--json", "--as", "root"], env))
    assert [(s["source"], s["cron"]) for s in scheduled] == [("share", "* * * * *")]
    sync_run = _scheduled_run(api, "source-sync/source-sync", scheduled[0])

    # A deployment run's parameters are anyone's who reaches the Prefect API (issue 41 #5): it
    # reads the drop folder only, and what it ingests waits for review whatever it asks.
    ingest_run = _run_deployment(
        api, "ingest/ingest", {"paths": ["incoming"], "org": ORG, "status": "approved"}
    )
    outside = tmp_path / "secret.md"
    outside.write_text("# Root's notes\n\nThe vault code is 4711.\n")
    escape_run = _run_deployment(
        api, "ingest/ingest", {"paths": [str(outside), "../secret.md"], "org": ORG}
    )
    eval_run = _run_deployment(
        api,
        "nightly-eval/nightly-eval",
        # prefect.yaml adds kbflow's question sets by default; tests/evals/test_nightly.py
        # covers them, so this run keeps to the one small folder
        {
            "datasets": [str(beir)],
            "question_sets": [],
            "answer_sets": [],
            "baseline_dir": str(tmp_path / "no-baselines"),
        },
    )
    # Background jobs as deployment runs: submitted here, as `kbflow ingest` or the HTTP
    # upload would, with the prefect job runner pointed at this server.
    monkeypatch.setenv("PREFECT_API_URL", api)
    job_settings = Settings(home=home, job_runner="prefect")
    good_job = submit_ingest_job(
        job_settings, [str(job_doc)], IngestRequest(org=ORG, collection="jobs")
    )
    bad_job = submit_ingest_job(
        job_settings, [str(broken)], IngestRequest(org=ORG, collection="jobs")
    )
    assert good_job.status is JobStatus.PROCESSING and good_job.pid is None
    assert good_job.flow_run_id and bad_job.flow_run_id
    job_runs = [good_job.flow_run_id, bad_job.flow_run_id]

    states = _wait_final(api, [ingest_run, escape_run, eval_run, sync_run, *job_runs], processes)

    worker_log = processes.tail("worker")
    assert states[ingest_run]["type"] == "COMPLETED", f"{states[ingest_run]}\n{worker_log}"
    assert states[escape_run]["type"] == "FAILED", f"{states[escape_run]}\n{worker_log}"
    assert "reads only the drop folder" in (states[escape_run].get("message") or worker_log)
    assert states[eval_run]["type"] == "COMPLETED", f"{states[eval_run]}\n{worker_log}"
    assert states[sync_run]["type"] == "COMPLETED", f"{states[sync_run]}\n{worker_log}"
    synced = json.loads(_run([*kbflow, "sources", "show", "share", "--org", ORG, "--json"], env))
    assert synced["last_sync"]["outcome"] == "ok" and synced["last_sync"]["counts"]["new"] == 1
    assert synced["last_sync"]["flow_run_id"] == sync_run
    docs = json.loads(_run([*kbflow, "docs", "list", "--org", ORG, "--json"], env))
    assert sorted((d["uri"].rsplit("/", 1)[-1], d["status"], d["parse_status"]) for d in docs) == [
        ("leave-policy.md", "pending_review", "ingested"),
        ("parking-policy.md", "approved", "ingested"),
        ("visitor-parking.md", "approved", "ingested"),
    ]

    # The jobs: registry row and Prefect state agree, and the row still names the job's run
    # (its ingest subflow did not write its own id over it).
    good_state = states[good_job.flow_run_id]
    assert good_state["type"] == "COMPLETED", f"{good_state}\n{worker_log}"
    good = get_job(job_settings, good_job.id)
    assert good.status is JobStatus.COMPLETE, good
    assert good.flow_run_id == good_job.flow_run_id and good.pid is None
    assert good.report is not None and good.report["documents"] == 1
    bad_state = states[bad_job.flow_run_id]
    bad = get_job(job_settings, bad_job.id)
    assert bad.status is JobStatus.FAILED, bad
    assert "broken.pdf" in (bad.reason or "") and "match no format" in (bad.reason or "")
    assert bad_state["type"] == "FAILED", f"{bad_state}\n{worker_log}"
    assert bad.reason in bad_state["message"], bad_state
    report = json.loads(_run([*kbflow, "eval", "report", "--json"], env))
    assert {r["dataset"] for r in report["runs"]} == {"tinybeir/test"}
    assert {r["mode"] for r in report["runs"]} >= {"keyword", "dense", "hybrid"}

    # Every run is final, so the worker's flow-run processes end by themselves (after their own
    # teardown: flushing logs and events to the server) before anything is stopped; one that
    # never did would be a leak. Then stopping the server and the worker leaves nothing behind.
    worker = psutil.Process(processes.started["worker"].pid)
    runs_left = _still_running(worker.children(recursive=True), 120)
    assert runs_left == [], f"flow-run processes outlived their runs: {runs_left}"
    started = processes.family()
    assert len(started) >= 2
    survivors = processes.stop_all()
    # Known and open (issue 16's note): after a kbflow-job run that ended Failed, Prefect's
    # process worker has been seen, on busy CI cores only, not to finish its SIGINT shutdown
    # within 60 s (its flow-run processes had all ended). Everything else must have stopped.
    worker_cmd = " ".join(processes.started["worker"].args)
    assert [s for s in survivors if not s.endswith(worker_cmd)] == [], survivors


@pytest.mark.parametrize("prefect_file", ["prefect.yaml", "deployments/prefect.k8s.yaml"])
def test_each_prefect_file_names_flows_that_exist(prefect_file: str) -> None:
    """Both prefect files parse, and each deployment's entrypoint is a flow of that name's
    module. The Kubernetes one is checked only this far: no cluster runs it here."""
    import importlib

    import yaml
    from prefect import Flow

    spec = yaml.safe_load((REPO / prefect_file).read_text())
    deployments = {d["name"]: d for d in spec["deployments"]}
    assert "kbflow-job" in deployments
    flow_names = {}
    for name, deployment in deployments.items():
        path, _, func = deployment["entrypoint"].partition(":")
        assert (REPO / path).is_file(), f"{name}: {path} does not exist"
        found = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), func)
        assert isinstance(found, Flow), f"{name}: {deployment['entrypoint']} is not a flow"
        flow_names[name] = found.name
    # The job runner's default deployment is this file's kbflow-job: FLOW/DEPLOYMENT.
    assert f"{flow_names['kbflow-job']}/kbflow-job" == Settings().jobs.job_deployment
    pools = {d["work_pool"]["name"] for d in deployments.values()}
    assert pools == ({POOL} if prefect_file == "prefect.yaml" else {"kbflow-k8s"})
    if prefect_file != "prefect.yaml":
        env = deployments["kbflow-job"]["work_pool"]["job_variables"]["env"]
        assert {"KBFLOW_DATABASE_URL", "KBFLOW_QDRANT_URL", "PREFECT_API_URL"} <= set(env)
