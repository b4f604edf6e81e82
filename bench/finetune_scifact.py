"""Fine-tune the embedder on SciFact dev's training half; measure base vs fine-tuned on both.

The split is by query position (`tasks.text.finetune.split_by_position`): even positions train,
odd positions are held out and never enter training or the choice of settings.

1. ``select`` (optional): the training half is split again by position (its even positions
   train, its odd ones validate), each variant in ``VARIANTS`` is trained and scored there
   (dense nDCG@10), and the best is chosen. The held-out half is not read.
2. ``final``: the chosen variant is trained on the whole training half and the base and the
   fine-tuned model are scored on both halves with a brute-force dense search over the chunked
   corpus (`evals.adapt`). The figures go into the model's manifest too.
3. ``--runs BASE_DB:RUN FT_DB:RUN`` (optional): the real eval (``kbflow eval run`` with
   ``KBFLOW_EMBEDDING_MODEL=<model folder>``, same ``KBFLOW_HOME``, whose embedding cache this
   script fills) is read back from the warehouses' per-query rows and reported per half, for
   every mode (keyword, dense, hybrid).

Prints a table and saves bench/results/finetune_scifact.json.

Run: ``.venv/bin/python bench/finetune_scifact.py --home DIR [--select] [--variant NAME]
[--runs BASE.duckdb:RUN_ID FT.duckdb:RUN_ID]``. Embeddings are cached in
``DIR/cache/embeddings.sqlite`` (as the eval's), so a re-run re-embeds nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))
THREADS = 2

# Pair choices (evals.adapt.training_pairs) and training parameters (FinetuneParams), by name.
VARIANTS: dict[str, dict[str, Any]] = {
    "inbatch-e1": {"pairs": {}, "params": {"epochs": 1}},
    "inbatch-e3": {"pairs": {}, "params": {"epochs": 3}},
    "bm25neg-e3": {"pairs": {"negatives": "bm25"}, "params": {"epochs": 3}},
    "denseneg-e3": {"pairs": {"negatives": "dense"}, "params": {"epochs": 3}},
    "allchunks-e3": {"pairs": {"positives": "all"}, "params": {"epochs": 3}},
}
DEFAULT_VARIANT = "inbatch-e3"


def open_data(settings: Any) -> Any:
    """SciFact dev made ready (`evals.adapt.AdaptationData`) with the index's chunking."""
    from evals.adapt import AdaptationData
    from evals.beir import load_beir

    return AdaptationData(
        load_beir(DATASETS / "scifact", "dev"),
        max_words=settings.ingest.chunk_max_words,
        overlap_words=settings.ingest.chunk_overlap_words,
        cache_path=settings.home / "cache" / "embeddings.sqlite",
        threads=THREADS,
    )


def train(data: Any, home: Path, name: str, split: Any, base: str, label: str) -> Any:
    """Train variant ``name`` on ``split.train`` (a model already trained is reused)."""
    from tasks.text.finetune import FinetuneParams, finetune_embedder

    variant = VARIANTS[name]
    params = FinetuneParams(**variant["params"])
    pairs = data.pairs(split, base=base, seed=params.seed, **variant["pairs"])
    source = {
        "dataset": data.dataset.name,
        "split": label,
        "queries": len(split.train),
        "positives": variant["pairs"].get("positives", "best"),
        "negatives": variant["pairs"].get("negatives", "none"),
        "variant": name,
    }
    return finetune_embedder(
        pairs, models_dir=home / "models", base=base, params=params, source=source,
        threads=THREADS,
    )  # fmt: skip


def halves(data: Any, model: str, split: Any) -> dict[str, Any]:
    result: dict[str, Any] = data.dense_halves(model, split)
    how = f"{data.computed[model]} texts embedded" if data.computed.get(model) else "cached"
    print(f"  {Path(model).name}: {how} ({data.embed_seconds[model]:.0f}s)", flush=True)
    return result


def _row(label: str, m: dict[str, Any]) -> str:
    cells = " | ".join(f"{m[k]:.4f}" for k in ("ndcg@10", "mrr@10", "recall@100"))
    return f"| {label} | {cells} |"


def select(data: Any, home: Path, base: str, names: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """Choose a variant on the training half alone (its own position split)."""
    from tasks.text.finetune import split_by_position

    inner = split_by_position(data.split.train)
    print(f"\nselection: train {len(inner.train)}, validate {len(inner.held_out)} (even half)")
    print("| variant | val nDCG@10 | val MRR@10 | val Recall@100 |\n|---|---|---|---|")
    print(_row("base", halves(data, base, inner)["held_out"]), flush=True)
    rows: list[dict[str, Any]] = []
    for name in names:
        model = train(data, home, name, inner, base, "scifact/dev even positions, even again")
        scored = halves(data, str(model.path), inner)
        rows.append({
            "variant": name,
            "model_id": model.model_id,
            "pairs": model.manifest["data"]["pairs"],
            "train_seconds": model.manifest["training"]["seconds"],
            "validation": scored["held_out"],
        })  # fmt: skip
        print(_row(name, scored["held_out"]), flush=True)
    chosen = max(rows, key=lambda r: r["validation"]["ndcg@10"])["variant"]
    return chosen, rows


def read_runs(spec: str) -> dict[str, dict[str, dict[str, float]]]:
    """``path.duckdb:run_id`` -> mode -> query id -> metric -> value, read from a copy."""
    import duckdb

    path, run_id = spec.rsplit(":", 1)
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "warehouse.duckdb"
        shutil.copy(path, copy)  # never open a live warehouse another process may write
        con = duckdb.connect(str(copy), read_only=True)
        try:
            rows = con.execute(
                "SELECT mode, query_id, mrr_at_10, ndcg_at_10, recall_at_100 "
                "FROM evals.eval_queries WHERE run_id = ?",
                [run_id],
            ).fetchall()
        finally:
            con.close()
    if not rows:
        raise SystemExit(f"no per-query rows for run {run_id} in {path}")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for mode, qid, mrr, ndcg, recall in rows:
        out.setdefault(mode, {})[qid] = {"mrr@10": mrr, "ndcg@10": ndcg, "recall@100": recall}
    return out


def _commit() -> str | None:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    )
    return out.stdout.strip() or None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=REPO / ".kbflow-bench")
    parser.add_argument("--select", action="store_true", help="choose the variant first")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--variant", default=DEFAULT_VARIANT, help="used without --select")
    parser.add_argument("--runs", nargs=2, metavar=("BASE_DB:RUN", "FT_DB:RUN"))
    parser.add_argument(
        "--model",
        type=Path,
        help="with --runs: report the eval runs of this already trained model (its folder) "
        "per half, without training or the brute-force scoring",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/finetune_scifact.json")
    args = parser.parse_args()

    from core.settings import PACKAGED_MINILM, Settings, configure_environment

    home = args.home.resolve()
    settings = Settings(home=home)
    configure_environment(settings)
    data = open_data(settings)
    import torch

    torch.set_num_threads(THREADS)
    from evals.adapt import promotion_decision
    from tasks.text.finetune import record_evaluation

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.perf_counter()
    base = PACKAGED_MINILM
    split = data.split
    print(
        f"{data.dataset.name}: {len(data.qids)} queries (train {len(split.train)}, held out "
        f"{len(split.held_out)}); {len(data.passages)} passages of {len(data.passages.of_doc)} "
        "documents"
    )
    out: dict[str, Any] = {
        "dataset": data.dataset.name,
        "commit": _commit(),
        "started": started,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "threads": THREADS,
        "split": {
            "rule": "train on even query positions, hold out odd ones",
            "train": len(split.train),
            "held_out": len(split.held_out),
        },
        "passages": len(data.passages),
        "documents": len(data.passages.of_doc),
    }

    if args.model is not None:
        if not args.runs:
            parser.error("--model needs --runs")
        from tasks.text.finetune import read_manifest

        manifest = read_manifest(args.model)
        out["model"] = {"model_id": manifest["model_id"], "path": str(args.model),
                        "data": manifest["data"], "params": manifest["params"],
                        "training": manifest["training"]}  # fmt: skip
        return _report_runs(args, out, split, args.model, t0)

    chosen = args.variant
    if args.select:
        chosen, rows = select(data, home, base, [n for n in args.variants.split(",") if n])
        out["selection"] = {"rule": "best dense nDCG@10 on the even half's odd positions",
                            "variants": rows, "chosen": chosen}  # fmt: skip
        print(f"chosen: {chosen}")

    model = train(data, home, chosen, split, base, "scifact/dev even positions")
    base_halves = halves(data, base, split)
    ft_halves = halves(data, str(model.path), split)
    record_evaluation(
        model.path, {"dense_bruteforce": {"base": base_halves, "finetuned": ft_halves}}
    )
    out["variant"] = {"name": chosen, **VARIANTS[chosen]}
    out["model"] = {
        "model_id": model.model_id,
        "path": str(model.path),
        "pairs": model.manifest["data"]["pairs"],
        "params": model.manifest["params"],
        "train_seconds": model.manifest["training"]["seconds"],
        "training": model.manifest["training"],
    }
    out["dense_bruteforce"] = {"base": base_halves, "finetuned": ft_halves}
    decision = promotion_decision(base_halves, ft_halves)
    out["decision"] = {"promote": decision.promote, "reason": decision.reason}
    out["embed_seconds"] = data.embed_seconds

    print(f"\nfinal: {model.model_id}, {model.manifest['data']['pairs']} pairs, "
          f"{model.manifest['training']['seconds']:.0f}s training")  # fmt: skip
    print("\n| dense (brute force) | nDCG@10 | MRR@10 | Recall@100 |\n|---|---|---|---|")
    for half in ("held_out", "train"):
        print(_row(f"base, {half}", base_halves[half]))
        print(_row(f"fine-tuned, {half}", ft_halves[half]))
    print(f"promote: {decision.promote} ({decision.reason})")

    if args.runs:
        return _report_runs(args, out, split, model.path, t0)
    return _save(args, out, t0)


def _report_runs(args: Any, out: dict[str, Any], split: Any, model_path: Path, t0: float) -> int:
    """The real evals of base and fine-tuned (``--runs``), per half, into ``out``; saves."""
    from evals.adapt import per_query_means
    from tasks.text.finetune import record_evaluation

    base_run, ft_run = (read_runs(spec) for spec in args.runs)
    full: dict[str, Any] = {"runs": {"base": args.runs[0], "finetuned": args.runs[1]}}
    print("\n| eval run (kbflow eval run) | nDCG@10 | MRR@10 | Recall@100 |\n|---|---|---|---|")
    for mode in ("keyword", "dense", "hybrid"):
        full[mode] = {
            "base": per_query_means(base_run[mode], split),
            "finetuned": per_query_means(ft_run[mode], split),
        }
        for half in ("held_out", "train", "all"):
            print(_row(f"{mode}, base, {half}", full[mode]["base"][half]))
            print(_row(f"{mode}, fine-tuned, {half}", full[mode]["finetuned"][half]))
    out["eval_run"] = full
    record_evaluation(
        model_path, {"eval_run": {m: full[m] for m in ("keyword", "dense", "hybrid")}}
    )
    return _save(args, out, t0)


def _save(args: Any, out: dict[str, Any], t0: float) -> int:
    out["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nsaved {args.out} in {out['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
