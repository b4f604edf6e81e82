"""Calibrate and measure the "no chunk, no answer" refusal on SciFact dev (issue 8).

For every dev claim, two situations from the same index:
- answerable: the knowledge base as it is (the claim's relevant abstracts are in it);
- unanswerable: the claim's relevant abstracts removed. Their chunks are dropped from an
  over-fetched hybrid ranking before the top ``KBFLOW_ANSWER_TOP_K`` are taken, which is what
  searching a knowledge base without them returns (up to the fusion's per-query normalisation).

The signal is exactly what `tasks.answer.cited_answer.answer` gates on:
`tasks.answer.confidence.support_scores` (support-v2)
over the gated hybrid hits, with the org's term statistics; a claim is refused when no hit
reaches the threshold. support-v1 (`support_scores_v1`, the signal before) is measured in the
same run and reported beside it. The threshold is chosen on the claims at EVEN positions (best
balanced accuracy: refusing the unanswerable and answering the answerable weigh the same) and
reported on the ODD ones (held out), and on all. Refusal precision = refused claims that were
unanswerable / refused; recall = unanswerable claims refused / unanswerable claims. Also: at the
configured threshold (``KBFLOW_ANSWER_MIN_CONFIDENCE``), the share of answered answerable claims
whose evidence (hits reaching it) holds one of the claim's relevant abstracts.
Saves bench/results/refusal_calibration.json.

Run after ``kbflow eval run --dataset ../shared/datasets/scifact`` with the same KBFLOW_HOME:
``.venv/bin/python bench/refusal_calibration.py [--claims N]``. support-v2 embeds each hit's
sentences: the first run over all 809 claims embeds ~100k of them (kept in the eval cache), so
``--claims`` measures the first N claims only (both signals, the same claims).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))
ANSWERED_FLOOR = 0.90


def rates(answerable: list[float], unanswerable: list[float], threshold: float) -> dict[str, float]:
    refused_unans = sum(s < threshold for s in unanswerable)
    refused_ans = sum(s < threshold for s in answerable)
    refused = refused_unans + refused_ans
    precision = refused_unans / refused if refused else 1.0
    recall = refused_unans / len(unanswerable) if unanswerable else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "threshold": round(threshold, 3),
        "refusal_precision": round(precision, 4),
        "refusal_recall": round(recall, 4),
        "f1": round(f1, 4),
        "answerable_answered": round(1 - refused_ans / len(answerable), 4),
        "unanswerable_refused": round(recall, 4),
        "balanced_accuracy": round((recall + 1 - refused_ans / len(answerable)) / 2, 4),
    }


def auc(positives: list[float], negatives: list[float]) -> float:
    """P(answerable scores above unanswerable), ties counted half: the eval's own
    `evals.refusal.roc_auc`, so the benches and `kbflow eval run` agree."""
    from evals.refusal import roc_auc

    return roc_auc(positives, negatives)


def calibration(ans: list[float], unans: list[float]) -> dict[str, Any]:
    """One signal's figures: ROC AUC on even / odd / all claims, thresholds chosen on the even
    ones (best balanced accuracy, best F1, the highest answering 90 %), each measured on the odd
    ones and on all."""
    even = (ans[0::2], unans[0::2])
    odd = (ans[1::2], unans[1::2])
    grid = [t / 1000 for t in range(100, 901, 5)]
    curve_even = [rates(*even, t) for t in grid]
    chosen = max(curve_even, key=lambda r: (r["balanced_accuracy"], -r["threshold"]))["threshold"]
    best_f1 = max(curve_even, key=lambda r: (r["f1"], -r["threshold"]))["threshold"]
    floor = max(
        (r for r in curve_even if r["answerable_answered"] >= ANSWERED_FLOOR),
        key=lambda r: r["threshold"],
    )["threshold"]
    return {
        "mean_support": {
            "answerable": round(sum(ans) / len(ans), 4),
            "unanswerable": round(sum(unans) / len(unans), 4),
        },
        "roc_auc": {
            "even": round(auc(*even), 4),
            "odd": round(auc(*odd), 4),
            "all": round(auc(ans, unans), 4),
        },
        "chosen_threshold": chosen,
        "chosen_by": "best balanced accuracy (mean of refusal recall and answerable answered) "
        "on even-position claims",
        "at_chosen": {"odd_held_out": rates(*odd, chosen), "all": rates(ans, unans, chosen)},
        "best_f1_threshold": best_f1,
        "at_best_f1": {"odd_held_out": rates(*odd, best_f1), "all": rates(ans, unans, best_f1)},
        "answer_90pct_threshold": floor,
        "at_answer_90pct": {"odd_held_out": rates(*odd, floor), "all": rates(ans, unans, floor)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, help="only the first N dev claims (default: all 809)")
    claims: int | None = parser.parse_args().claims
    from core.settings import Settings, configure_environment

    settings = Settings()
    configure_environment(settings)
    from core.errors import ConfigError
    from evals.beir import load_beir
    from evals.refusal import relevant_documents
    from evals.retrieval import cached_embedder, eval_situations
    from tasks.answer.confidence import SUPPORT_VERSION, support_scores, support_scores_v1

    dataset = load_beir(DATASETS / "scifact", "dev")
    top_k = settings.answers.answer_top_k
    threshold = settings.answers.answer_min_confidence
    embedder = cached_embedder(settings)
    relevant = relevant_documents(dataset.qrels)
    best: dict[str, list[float]] = {"answerable": [], "unanswerable": []}
    best_v1: dict[str, list[float]] = {"answerable": [], "unanswerable": []}
    cites_relevant: list[bool] = []  # per answered answerable claim, at the configured threshold
    seconds_v1: list[float] = []
    seconds_v2: list[float] = []
    started = time.perf_counter()
    try:
        with eval_situations(dataset, settings, embedder=embedder, queries=claims) as index:
            stats, ids = index.stats, index.corpus_ids
            for case in index.cases:
                situation = "answerable" if case.answerable else "unanswerable"
                kept, text, vector = case.hits, case.text, case.vector
                tick = time.perf_counter()
                scores = support_scores(text, vector, kept, embedder, stats)
                seconds_v2.append(time.perf_counter() - tick)
                tick = time.perf_counter()
                old = support_scores_v1(text, vector, kept, embedder, stats)
                seconds_v1.append(time.perf_counter() - tick)
                best[situation].append(max(scores, default=0.0))
                best_v1[situation].append(max(old, default=0.0))
                evidence = [h for h, c in zip(kept, scores, strict=True) if c >= threshold]
                if case.answerable and evidence:
                    cited = {ids.get(h.doc_id) for h in evidence}
                    cites_relevant.append(bool(cited & relevant[case.query_id]))
    except ConfigError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    finally:
        embedder.close()
    seconds = time.perf_counter() - started

    out = {
        "dataset": dataset.name,
        "signal": f"max over the top-k gated hybrid hits of {SUPPORT_VERSION} "
        "(tasks.answer.confidence.support_scores)",
        "queries": len(best["answerable"]),
        "top_k": top_k,
        "seconds": round(seconds, 1),
        "support_ms": {
            name: {
                "p50": round(1000 * statistics.median(values), 1),
                "p95": round(1000 * statistics.quantiles(values, n=20)[-1], 1),
            }
            for name, values in (("v1", seconds_v1), ("v2", seconds_v2))
        },
        "configured_threshold": threshold,
        "at_configured": {
            "odd_held_out": rates(best["answerable"][1::2], best["unanswerable"][1::2], threshold),
            "all": rates(best["answerable"], best["unanswerable"], threshold),
            "answered_citing_relevant": round(sum(cites_relevant) / len(cites_relevant), 4)
            if cites_relevant
            else None,
        },
        SUPPORT_VERSION: calibration(best["answerable"], best["unanswerable"]),
        "support-v1": calibration(best_v1["answerable"], best_v1["unanswerable"]),
    }
    from bench.stats import save_results

    save_results("refusal_calibration", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
