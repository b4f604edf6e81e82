"""The nightly eval as Prefect runs it: served on a schedule, triggered against a local Prefect
server, recorded in the warehouse; and its alarm against a better baseline."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from core.settings import Settings
from evals.beir import load_beir
from evals.golden import write_golden_set
from evals.regression import Baseline, EvalRegression, baseline_path, save_baseline
from evals.schedule import NIGHTLY_CRON, NIGHTLY_DEPLOYMENT, NIGHTLY_TIMEZONE
from evals.warehouse import read_history

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_golden_set(tmp_path_factory.mktemp("golden"))


def test_the_nightly_deployment_runs_and_records_rows(prefect_harness: None, golden: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, PREFECT_API_URL=str(PREFECT_API_URL.value()))
    env["PREFECT_RUNNER_POLL_FREQUENCY"] = "1"
    server = subprocess.Popen(
        [sys.executable, "-m", "kbflow.cli", "serve-schedules", "--dataset", str(golden)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deployment = _wait_for_deployment(f"nightly-eval/{NIGHTLY_DEPLOYMENT}", server)
        (schedule,) = deployment.schedules
        assert schedule.schedule.cron == NIGHTLY_CRON  # type: ignore[union-attr]
        assert schedule.schedule.timezone == NIGHTLY_TIMEZONE  # type: ignore[union-attr]

        run = run_deployment("nightly-eval/nightly-eval", timeout=300, poll_interval=1)
        assert run.state is not None and run.state.is_completed(), run.state
    finally:
        server.terminate()
        try:
            output, _ = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            output, _ = server.communicate()
    rows = read_history(Settings().home)
    assert {r["mode"] for r in rows} == {"keyword", "dense", "hybrid"}, output[-2000:]
    assert {r["dataset"] for r in rows} == {load_beir(golden).name}

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(run.id)
    assert flow_run.deployment_id == deployment.id


def _wait_for_deployment(name: str, server: subprocess.Popen[str], timeout_s: float = 120) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            try:
                return client.read_deployment_by_name(name)
            except ObjectNotFound:
                if server.poll() is not None or time.monotonic() > deadline:
                    output = server.stdout.read() if server.stdout else ""
                    raise AssertionError(f"serve-schedules did not register: {output}") from None
                time.sleep(1)


def test_the_alarm_fires_against_a_better_baseline(
    prefect_harness: None, golden: Path, tmp_path: Path
) -> None:
    from evals.nightly import nightly_eval

    name = load_beir(golden).name
    first = nightly_eval(datasets=[str(golden)], baseline_dir=str(tmp_path))  # no baseline yet
    measured = first[name]["modes"]
    # A baseline 0.05 better than what this code measures, on every metric of the dense mode.
    better = {"dense": {metric: value + 0.05 for metric, value in measured["dense"].items()}}
    save_baseline(tmp_path / baseline_path(name).name, Baseline(name, 0.02, better))

    with pytest.raises(EvalRegression) as alarm:
        nightly_eval(datasets=[str(golden)], baseline_dir=str(tmp_path))

    message = str(alarm.value)
    for metric in ("mrr@10", "ndcg@10", "recall@100"):
        assert f"dense {metric} dropped 0.0500" in message, message
    assert "hybrid" not in message.split(" — ")[0]  # modes without a baseline are not judged
    # Both runs were recorded, the failing one before its alarm.
    runs = {r["run_id"] for r in read_history(Settings().home, name)}
    assert len(runs) == 2


def test_prefect_yaml_schedules_the_nightly_eval() -> None:
    """prefect.yaml's nightly-eval deployment runs when `evals.schedule` says, like
    `kbflow serve-schedules` by default."""
    import importlib

    import typer
    import yaml

    from kbflow.cli import app

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    (nightly,) = [d for d in spec["deployments"] if d["name"] == NIGHTLY_DEPLOYMENT]
    (schedule,) = nightly["schedules"]
    assert schedule == {"cron": NIGHTLY_CRON, "timezone": NIGHTLY_TIMEZONE}
    serve = typer.main.get_command(app).commands["serve-schedules"]  # type: ignore[attr-defined]
    defaults = {p.name: p.default for p in serve.params}
    assert (defaults["cron"], defaults["timezone"]) == (NIGHTLY_CRON, NIGHTLY_TIMEZONE)
    module, _, name = nightly["entrypoint"].partition(":")
    flow = getattr(importlib.import_module(module.replace("/", ".").removesuffix(".py")), name)
    assert flow.name == "nightly-eval"
    assert set(nightly["parameters"]) <= set(flow.parameters.properties)


def test_the_nightly_eval_adds_a_question_set_with_its_refusal_metric(
    prefect_harness: None, tmp_path: Path
) -> None:
    """The demo question set is written, evaluated and recorded; its near-misses are scored by
    the refusal metric, which the baseline watches like any retrieval metric."""
    from evals.nightly import nightly_eval, question_set_name

    name = question_set_name("demo")
    got = nightly_eval(datasets=[], question_sets=["demo"], baseline_dir=str(tmp_path))
    assert set(got) == {name}
    folder = Settings().home / "evals" / "question-sets" / name
    assert (folder / "unanswerable.jsonl").stat().st_size > 0
    refusal = got[name]["refusal"]
    assert 0.0 < refusal["refusal_auc"] < 1.0
    (hybrid,) = [r for r in read_history(Settings().home, name) if r["mode"] == "hybrid"]
    assert hybrid["refusal_auc"] == pytest.approx(refusal["refusal_auc"], abs=1e-4)

    better = {"hybrid": {"refusal_auc": refusal["refusal_auc"] + 0.05}}
    save_baseline(tmp_path / baseline_path(name).name, Baseline(name, 0.02, better))
    with pytest.raises(EvalRegression, match=r"hybrid refusal_auc dropped 0\.0500"):
        nightly_eval(datasets=[], question_sets=["demo"], baseline_dir=str(tmp_path))
