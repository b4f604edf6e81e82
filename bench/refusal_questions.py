"""Refusal on real questions: the question-form set over the demo corpus and real-docs.

Each corpus's sources (`evals.questions.sources_for`: the demo client's approved documents; the
real-docs files that hold text) are ingested into their own org in a fresh ``KBFLOW_HOME``
through ``kbflow ingest``. Every question of `evals/questions/questions.jsonl` then goes
through what `kbflow answer` runs: gated hybrid retrieval of the top ``KBFLOW_ANSWER_TOP_K``
chunks, their support (`tasks.answer.confidence.support_scores`), and the cited answer of the
offline extractive model (`tasks.answer.cited_answer.answer`).

Reported, per corpus and over all, and on the questions at even and at odd positions:
- ROC AUC of the best support (answerable above unanswerable): support-v2, what the answer
  path gates on (`tasks.answer.confidence.support_scores`), beside support-v1 with the
  value-word rule of `tasks.text.values` and without it, all measured in the same run;
- at the configured threshold (``KBFLOW_ANSWER_MIN_CONFIDENCE``): the answerable questions
  answered, the unanswerable ones refused, and the answered questions whose answer text holds
  the expected fact; and what support-v1 answered and refused at its own threshold (0.59);
- the time support scoring takes per question (p50 / p95), v1 and v2, v2 from a cold vector
  cache (every text embedded; every 4th question) and warm (the per-process cache as the
  answer path keeps it).

Usage: ``.venv/bin/python bench/refusal_questions.py [--home DIR]`` (a temporary home by
default). Needs ``../shared/datasets`` for the real-docs half (skipped without it).
Saves bench/results/refusal_questions.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.refusal_calibration import auc  # noqa: E402
from bench.stats import save_results  # noqa: E402

BENCH_ADMIN = "bench"
"""The home's first superadmin, who creates its orgs."""


def _bootstrap(home: Path) -> None:
    """Make `BENCH_ADMIN` the home's first superadmin (fails harmlessly when it has one)."""
    env = {**os.environ, "KBFLOW_HOME": str(home)}
    subprocess.run(
        [sys.executable, "-m", "kbflow.cli", "users", "add", BENCH_ADMIN, "--role", "superadmin"],
        env=env, capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip


def _kbflow(home: Path, *args: str) -> dict[str, Any]:
    env = {**os.environ, "KBFLOW_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-m", "kbflow.cli", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"kbflow {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    out: dict[str, Any] = json.loads(done.stdout) if done.stdout.strip() else {}
    return out


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


COLD_EVERY = 4  # support-v2 is timed from an empty vector cache on every 4th question
V1_THRESHOLD = 0.59  # support-v1's calibrated threshold, the default before support-v2


def _summary(rows: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    ans = [r for r in rows if r["answerable"]]
    unans = [r for r in rows if not r["answerable"]]
    if not ans or not unans:
        return {"questions": len(rows)}
    answered = [r for r in ans if r["status"] == "answered"]

    def roc(key: str) -> float:
        return round(auc([r[key] for r in ans], [r[key] for r in unans]), 4)

    return {
        "questions": len(rows),
        "answerable": len(ans),
        "unanswerable": len(unans),
        "roc_auc": roc("support"),
        "roc_auc_v1": roc("support_v1"),
        "roc_auc_v1_without_value_words": roc("support_v1_plain"),
        "answerable_answered": round(len(answered) / len(ans), 4),
        "unanswerable_refused": round(sum(r["status"] == "refused" for r in unans) / len(unans), 4),
        "v1_answerable_answered": round(
            sum(r["support_v1"] >= V1_THRESHOLD for r in ans) / len(ans), 4
        ),
        "v1_unanswerable_refused": round(
            sum(r["support_v1"] < V1_THRESHOLD for r in unans) / len(unans), 4
        ),
        "answered_with_expected_fact": round(
            sum(r["has_fact"] for r in answered) / len(answered), 4
        )
        if answered
        else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, help="KBFLOW_HOME to use (default: a temp dir)")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="kbflow-refusal-q-"))
    os.environ["KBFLOW_HOME"] = str(home)

    from core.settings import Settings, configure_environment

    settings = Settings()
    configure_environment(settings)
    from core.models import Scope
    from evals.questions import datasets_folder, load_questions, sources_for
    from kbflow.services.query.answers import answer_config, knowledge_model
    from kbflow.services.query.context import open_home
    from tasks.answer.cited_answer import answer
    from tasks.answer.confidence import (
        TermStats,
        clear_vector_cache,
        support_scores,
        support_scores_v1,
    )

    corpora = ["demo"] + (["real-docs"] if (datasets_folder() / "real-docs").is_dir() else [])
    started = time.perf_counter()
    for corpus in corpora:
        org = f"q-{corpus}"
        folder = home / "sources" / corpus
        if not folder.is_dir():
            staged = home / "staging" / corpus
            files = sources_for(corpus, demo_folder=staged)  # type: ignore[arg-type]
            folder.mkdir(parents=True)
            for path in files:
                shutil.copy2(path, folder / path.name)
            _bootstrap(home)
            _kbflow(home, "orgs", "create", org, "--as", BENCH_ADMIN)
            report = _kbflow(home, "ingest", str(folder), "--org", org)
            print(f"{corpus}: ingested {report.get('documents')} documents", file=sys.stderr)
    ingest_s = time.perf_counter() - started

    config = answer_config(settings)
    model, why = knowledge_model(settings.replace(answer_model="extractive"))
    rows: list[dict[str, Any]] = []
    timings: dict[str, list[float]] = {"v1": [], "v2_cold": [], "v2_warm": []}
    with open_home(settings) as ctx:
        for corpus in corpora:
            org = f"q-{corpus}"
            scope = Scope(org_id=org)
            stats = TermStats.of_org(org, ctx.registry)
            for q in load_questions(corpus):  # type: ignore[arg-type]
                hits = ctx.retrieve(q.text, scope, mode=config.mode, top_k=config.top_k).hits
                vector = ctx.embedder.embed_query(q.text)
                tick = time.perf_counter()
                v1 = support_scores_v1(q.text, vector, hits, ctx.embedder, stats)
                timings["v1"].append(time.perf_counter() - tick)
                plain = support_scores_v1(
                    q.text, vector, hits, ctx.embedder, stats, value_words=False
                )
                cold = len(rows) % COLD_EVERY == 0
                if cold:
                    clear_vector_cache()
                tick = time.perf_counter()
                v2 = support_scores(q.text, vector, hits, ctx.embedder, stats)
                if cold:
                    timings["v2_cold"].append(time.perf_counter() - tick)
                tick = time.perf_counter()
                support_scores(q.text, vector, hits, ctx.embedder, stats)
                timings["v2_warm"].append(time.perf_counter() - tick)
                turn = answer(
                    q.text, scope, org_id=org, agent_id="bench", registry=ctx.registry,
                    retrieve_fn=lambda t, s, k: ctx.retrieve(t, s, mode=config.mode, top_k=k),
                    embedder=ctx.embedder, model=model, config=config, no_model_reason=why,
                )  # fmt: skip
                rows.append(
                    {
                        "id": q.id,
                        "corpus": corpus,
                        "kind": q.kind,
                        "answerable": q.answerable,
                        "support": round(max(v2, default=0.0), 4),
                        "support_v1": round(max(v1, default=0.0), 4),
                        "support_v1_plain": round(max(plain, default=0.0), 4),
                        "status": turn.output["status"],
                        "has_fact": bool(q.answer)
                        and _normal(q.answer or "") in _normal(turn.output["answer"]),
                    }
                )
    from tasks.answer.confidence import SUPPORT_VERSION

    threshold = config.threshold
    out: dict[str, Any] = {
        "threshold": threshold,
        "signal": SUPPORT_VERSION,
        "v1_threshold": V1_THRESHOLD,
        "top_k": config.top_k,
        "support_ms": {
            name: {
                "p50": round(1000 * statistics.median(values), 1),
                "p95": round(1000 * statistics.quantiles(values, n=20)[-1], 1),
            }
            for name, values in timings.items()
        },
        "ingest_s": round(ingest_s, 1),
        "seconds": round(time.perf_counter() - started, 1),
        "all": _summary(rows, threshold),
        "even": _summary(rows[0::2], threshold),
        "odd": _summary(rows[1::2], threshold),
        **{c: _summary([r for r in rows if r["corpus"] == c], threshold) for c in corpora},
        "rows": rows,
    }
    save_results("refusal_questions", out, unprinted="rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
