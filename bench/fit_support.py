"""Fit support-v2 (`tasks.answer.confidence.SUPPORT_V2`) on the EVEN halves of both refusal sets.

The two sets are those of bench/refusal_calibration.py (SciFact dev: each claim answerable, and
unanswerable with its relevant abstracts dropped from an over-fetched hybrid ranking) and
bench/refusal_questions.py (the question-form set over the demo corpus and real-docs). For every
query (both situations for SciFact), the top ``KBFLOW_ANSWER_TOP_K`` gated hybrid hits and each
hit's `SupportParts` are gathered and cached (``--cache``). A query's score is its best hit's.

The weights are chosen by a grid (no randomness, so the same caches give the same fit): the
sentence-cosine weight ``a`` in 0, 0.1 … 1, coverage with value words (or without, with
``fit_value_words_free``), the dropped-word weight ``d`` in 0, 0.5 … 3; the objective is the
mean over the two sets of the ROC AUC on the queries at EVEN positions. The threshold is then
chosen on the even halves too: the lowest whose mean balanced accuracy over the two sets is
within 0.005 of the best. Reported for support-v1 (what the answer path
gated on before) and the fit, per set: AUC on even, odd (held out) and all.
Saves bench/results/fit_support.json.

``--features`` adds a report of what lies beyond the best hit's support-v2 (results key
``features``): query-level features across the top-k hits (second best, mean, the best less a
share of the mean, the top-1/top-2 gap, the top hit's raw dense cosine and BM25 score over the
question's IDF mass, how many hits hold the rarest term, …), each alone; and two grids chosen on
the even halves exactly as the fit is: "lead" (the best hit's support less ``λ`` × the mean of
the top-k, with ``a`` and ``d`` refitted) and "lead + missing term" (each hit also loses ``m`` ×
the IDF of the heaviest question term it lacks, over the question's heaviest). For the two
grids, a paired bootstrap of the held-out (odd) ROC AUC difference with support-v2 says how
much of it is noise. The gathered rows then need the per-hit extras (`hit_extras`): a cache
written before them is gathered again.

Usage (the SciFact index as bench/refusal_calibration.py reads it, and the home that
``bench/refusal_questions.py --home DIR`` built)::

    KBFLOW_HOME=<eval home> .venv/bin/python bench/fit_support.py --questions-home DIR \
        [--features]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))
WEIGHTS = [round(0.1 * i, 1) for i in range(11)]
DROPPED = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
GRID = [t / 1000 for t in range(100, 901, 5)]
TOLERANCE = 0.005  # of mean balanced accuracy: thresholds closer than this are not told apart
LEAD_WEIGHTS = [0.5, 0.6, 0.7, 0.8, 0.9]  # --features grids (a around the fit's 0.7)
LEADS = [round(0.1 * i, 1) for i in range(11)]
MISSING = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
RESAMPLES = 1000  # bootstrap of the held-out AUC difference

from bench.refusal_calibration import auc  # noqa: E402
from bench.stats import save_results  # noqa: E402


def _row(
    kind: str, pos: int, answerable: bool, v1: list[float], parts: list[Any], extra: dict[str, Any]
) -> dict[str, Any]:
    return {
        "set": kind,
        "pos": pos,
        "answerable": answerable,
        "v1": max(v1, default=0.0),
        "parts": [
            [p.sentence_cosine, p.coverage, p.coverage_plain, p.dropped_word_gain] for p in parts
        ],
        "extra": extra,
    }


def hit_extras(
    query: str, vector: Any, hits: list[Any], embedder: Any, stats: Any
) -> dict[str, Any]:
    """What ``--features`` builds on beyond the parts, from what the answer path has at query
    time: the IDF of each of the question's terms, and per hit its raw dense cosine (the
    chunk's, computed when retrieval kept none), its raw BM25 score, its second-best sentence
    cosine and which of the terms it holds. Called after `support_parts`, so every vector is
    in the per-process cache."""
    from tasks.answer.confidence import (
        _dot,
        _embedded_text,
        _holds,
        _vectors,
        query_terms,
        sentence_units,
    )
    from tasks.text.sparse import analyze

    terms = query_terms(query)
    out = []
    for hit in hits:
        text, units = _embedded_text(hit), sentence_units(hit.text)
        vectors = _vectors(embedder, [text, *units])
        cosines = sorted((_dot(vector, vectors[u]) for u in units), reverse=True)
        present = set(analyze(text))
        out.append({
            "dense": hit.scores.get("dense", _dot(vector, vectors[text])),
            "keyword": hit.scores.get("keyword", 0.0),
            "second_sentence_cosine": cosines[1] if len(cosines) > 1 else cosines[0],
            "holds": [int(_holds(t, present)) for t in terms],
        })  # fmt: skip
    return {"idf": [stats.idf(t) for t in terms], "hits": out}


def gather_scifact(claims: int | None = None) -> list[dict[str, Any]]:
    """SciFact dev claims, answerable and not (bench/refusal_calibration.py's protocol); the
    first ``claims`` of them when given."""
    from core.errors import ConfigError
    from core.settings import Settings
    from evals.beir import load_beir
    from evals.retrieval import cached_embedder, eval_situations
    from tasks.answer.confidence import support_parts, support_scores_v1

    settings = Settings()
    dataset = load_beir(DATASETS / "scifact", "dev")
    embedder = cached_embedder(settings)
    rows: list[dict[str, Any]] = []
    try:
        with eval_situations(dataset, settings, embedder=embedder, queries=claims) as index:
            stats = index.stats
            for case in index.cases:
                v1 = support_scores_v1(case.text, case.vector, case.hits, embedder, stats)
                parts = support_parts(case.text, case.vector, case.hits, embedder, stats)
                extra = hit_extras(case.text, case.vector, list(case.hits), embedder, stats)
                rows.append(_row("scifact", case.position, case.answerable, v1, parts, extra))
    except ConfigError as exc:
        raise SystemExit(str(exc)) from exc
    finally:
        embedder.close()
    return rows


def gather_questions(home: Path) -> list[dict[str, Any]]:
    """The question-form set, retrieved as `kbflow answer` does, from a built questions home."""
    from core.models import Scope
    from core.settings import Settings
    from evals.questions import load_questions
    from kbflow.services.query.answers import answer_config
    from kbflow.services.query.context import open_home
    from tasks.answer.confidence import TermStats, support_parts, support_scores_v1
    from tasks.text.embed import CachedEmbedder

    settings = Settings(home=home)
    config = answer_config(settings)
    rows: list[dict[str, Any]] = []
    with open_home(settings) as ctx:
        embedder = CachedEmbedder(ctx.embedder, home / "cache" / "embeddings.sqlite")
        for corpus in ("demo", "real-docs"):
            org = f"q-{corpus}"
            if org not in {o.id for o in ctx.registry.people.list_orgs()}:
                raise SystemExit(
                    f"{home} has no org {org}: build it with bench/refusal_questions.py"
                )
            stats = TermStats.of_org(org, ctx.registry)
            for q in load_questions(corpus):  # type: ignore[arg-type]
                hits = ctx.retrieve(q.text, Scope(org_id=org), mode=config.mode,
                                    top_k=config.top_k).hits  # fmt: skip
                vector = embedder.embed_query(q.text)
                v1 = support_scores_v1(q.text, vector, hits, embedder, stats)
                parts = support_parts(q.text, vector, hits, embedder, stats)
                extra = hit_extras(q.text, vector, hits, embedder, stats)
                rows.append(_row("questions", len(rows), q.answerable, v1, parts, extra))
        embedder.close()
    return rows


def score(row: dict[str, Any], a: float, value_words: bool, d: float) -> float:
    """The query's support under the weights: its best hit's (as `SupportParts.support`)."""
    return max(
        (a * s + (1 - a) * (c if value_words else cp) - d * max(g, 0.0)
         for s, c, cp, g in row["parts"]),
        default=0.0,
    )  # fmt: skip


def halves(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {
        "even": [r for r in rows if r["pos"] % 2 == 0],
        "odd": [r for r in rows if r["pos"] % 2 == 1],
        "all": rows,
    }


def roc(rows: list[dict[str, Any]], values: list[float]) -> float:
    pos = [v for r, v in zip(rows, values, strict=True) if r["answerable"]]
    neg = [v for r, v in zip(rows, values, strict=True) if not r["answerable"]]
    return auc(pos, neg)


def balanced_accuracy(rows: list[dict[str, Any]], values: list[float], threshold: float) -> float:
    ans = [v >= threshold for r, v in zip(rows, values, strict=True) if r["answerable"]]
    ref = [v < threshold for r, v in zip(rows, values, strict=True) if not r["answerable"]]
    return (sum(ans) / len(ans) + sum(ref) / len(ref)) / 2


def fit(
    sets: dict[str, list[dict[str, Any]]], value_words_options: tuple[bool, ...] = (True,)
) -> dict[str, Any]:
    """The weights with the best mean even-half ROC AUC, then the threshold.

    Value words stay on by default: the issue asks that a price question over a price list
    ("price" / "14.50 EUR") be answered, which plain coverage misses (``--free-value-words``
    lets the grid drop them; both fits are saved).
    """
    even = {name: halves(rows)["even"] for name, rows in sets.items()}
    best: tuple[float, float, float, bool, float] | None = None
    for a, value_words, d in itertools.product(WEIGHTS, value_words_options, DROPPED):
        aucs = [roc(rows, [score(r, a, value_words, d) for r in rows]) for rows in even.values()]
        key = (sum(aucs) / len(aucs), min(aucs), a, value_words, d)
        if best is None or key[:2] > best[:2]:  # ties keep the first: lower a, then d
            best = key
    assert best is not None
    _, _, a, value_words, d = best
    even_values = {n: [score(r, a, value_words, d) for r in rows] for n, rows in even.items()}
    mean_ba = {
        t: sum(balanced_accuracy(even[n], even_values[n], t) for n in even) / len(even)
        for t in GRID
    }
    # The curve is flat near its top (0.515 and 0.62 within 0.003 on all 809 claims), so of the
    # thresholds within TOLERANCE of the best, the lowest: where refusal cannot tell, answer.
    threshold = min(t for t in GRID if mean_ba[t] >= max(mean_ba.values()) - TOLERANCE)
    return {"sentence_cosine": a, "value_words": value_words, "dropped_word": d,
            "threshold": threshold}  # fmt: skip


def report(sets: dict[str, list[dict[str, Any]]], chosen: dict[str, Any]) -> dict[str, Any]:
    a, vw, d = chosen["sentence_cosine"], chosen["value_words"], chosen["dropped_word"]
    out: dict[str, Any] = {}
    for name, rows in sets.items():
        out[name] = {}
        for half, sel in halves(rows).items():
            out[name][half] = {
                "queries": len(sel),
                "v1_auc": round(roc(sel, [r["v1"] for r in sel]), 4),
                "v2_auc": round(roc(sel, [score(r, a, vw, d) for r in sel]), 4),
                "v2_balanced_accuracy": round(
                    balanced_accuracy(sel, [score(r, a, vw, d) for r in sel], chosen["threshold"]),
                    4,
                ),
            }
    return out


def _supports(row: dict[str, Any], a: float, d: float, m: float = 0.0) -> list[float]:
    """Each hit's support (as `score`, value words on), less ``m`` × its missing-term share."""
    missing = row["_missing"] if m else [0.0] * len(row["parts"])
    return [
        a * s + (1 - a) * c - d * max(g, 0.0) - m * x
        for (s, c, _, g), x in zip(row["parts"], missing, strict=True)
    ]


def lead(row: dict[str, Any], a: float, d: float, lam: float, m: float = 0.0) -> float:
    """The best hit's support less ``lam`` × the mean support of the top-k (0 without hits)."""
    supports = _supports(row, a, d, m)
    return max(supports) - lam * statistics.fmean(supports) if supports else 0.0


def _prepare(row: dict[str, Any]) -> None:
    """Per hit, the IDF of the heaviest question term it lacks over the question's heaviest."""
    idf = [max(w, 0.0) for w in row["extra"]["idf"]]
    heaviest = max(idf, default=0.0)
    row["_missing"] = [
        max((w for w, held in zip(idf, h["holds"], strict=True) if not held), default=0.0)
        / heaviest
        if heaviest > 0
        else 0.0
        for h in row["extra"]["hits"]
    ]


def _query_features() -> dict[str, Any]:
    """Query-level features over the top-k, each alone (support-v2's weights per hit)."""

    def v2(row: dict[str, Any]) -> list[float]:
        return _supports(row, 0.7, 2.0)

    def ranked(row: dict[str, Any]) -> list[float]:
        return sorted(v2(row), reverse=True) or [0.0]

    def hits(row: dict[str, Any], key: str) -> list[float]:
        return [h[key] for h in row["extra"]["hits"]] or [0.0]

    def idf_mass(row: dict[str, Any]) -> float:
        return sum(max(w, 0.0) for w in row["extra"]["idf"]) or 1.0

    def rarest(row: dict[str, Any]) -> list[int]:
        idf = row["extra"]["idf"]
        if not idf or not row["extra"]["hits"]:
            return [0]
        i = max(range(len(idf)), key=idf.__getitem__)
        return [h["holds"][i] for h in row["extra"]["hits"]]

    def any_hit(row: dict[str, Any]) -> float:
        idf = [max(w, 0.0) for w in row["extra"]["idf"]]
        held = [any(h["holds"][i] for h in row["extra"]["hits"]) for i in range(len(idf))]
        return sum(w for w, h in zip(idf, held, strict=True) if h) / (sum(idf) or 1.0)

    return {
        "best hit (support-v2)": lambda r: ranked(r)[0],
        "second-best hit": lambda r: ranked(r)[min(1, len(ranked(r)) - 1)],
        "mean of the top-k": lambda r: statistics.fmean(ranked(r)),
        "best - 0.5 x mean (lead)": lambda r: ranked(r)[0] - 0.5 * statistics.fmean(ranked(r)),
        "top-1 - top-2 gap": lambda r: ranked(r)[0] - ranked(r)[min(1, len(ranked(r)) - 1)],
        "top-ranked hit's support": lambda r: (v2(r) or [0.0])[0],
        "top-ranked hit's raw dense cosine": lambda r: hits(r, "dense")[0],
        "best raw dense cosine": lambda r: max(hits(r, "dense")),
        "top-ranked hit's BM25 / question IDF mass": lambda r: hits(r, "keyword")[0] / idf_mass(r),
        "best BM25 / question IDF mass": lambda r: max(hits(r, "keyword")) / idf_mass(r),
        "best second-best-sentence cosine": lambda r: max(hits(r, "second_sentence_cosine")),
        "share of hits holding the rarest term": lambda r: statistics.fmean(rarest(r)),
        "question IDF held by any hit": any_hit,
        "best hit less 0.2 x missing-term share": lambda r: max(
            _supports(r, 0.7, 2.0, 0.2), default=0.0
        ),
    }


def _aucs(sets: dict[str, list[dict[str, Any]]], fn: Any) -> dict[str, dict[str, float]]:
    return {
        name: {half: round(roc(sel, [fn(r) for r in sel]), 4) for half, sel in halves(rows).items()}
        for name, rows in sets.items()
    }


def _grid(
    sets: dict[str, list[dict[str, Any]]], combos: list[tuple[float, ...]]
) -> tuple[float, ...]:
    """The (a, d, lam, m) with the best mean even-half ROC AUC (then the best minimum), as
    `fit` chooses: ties keep the first."""
    even = [halves(rows)["even"] for rows in sets.values()]
    best: tuple[float, float, tuple[float, ...]] | None = None
    for combo in combos:
        aucs = [roc(rows, [lead(r, *combo) for r in rows]) for rows in even]
        key = (statistics.fmean(aucs), min(aucs), combo)
        if best is None or key[:2] > best[:2]:
            best = key
    assert best is not None
    return best[2]


def _bootstrap(rows: list[dict[str, Any]], fn: Any, base: Any, seed: int = 0) -> dict[str, float]:
    """2.5 / 50 / 97.5 percentiles of ROC AUC(fn) - ROC AUC(base) over the odd half, queries
    resampled (a SciFact claim with both its situations)."""
    odd = halves(rows)["odd"]
    by_pos: dict[int, list[tuple[bool, float, float]]] = {}
    for r in odd:
        by_pos.setdefault(r["pos"], []).append((r["answerable"], fn(r), base(r)))
    positions = sorted(by_pos)
    rng = random.Random(seed)
    diffs = []
    for _ in range(RESAMPLES):
        drawn = [x for _ in positions for x in by_pos[rng.choice(positions)]]
        pos = [(f, b) for ans, f, b in drawn if ans]
        neg = [(f, b) for ans, f, b in drawn if not ans]
        if pos and neg:
            diffs.append(
                auc([f for f, _ in pos], [f for f, _ in neg])
                - auc([b for _, b in pos], [b for _, b in neg])
            )
    diffs.sort()
    return {
        q: round(diffs[min(len(diffs) - 1, int(p * len(diffs)))], 4)
        for q, p in (("p2.5", 0.025), ("p50", 0.5), ("p97.5", 0.975))
    }


def features(sets: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The ``--features`` report (the module docstring)."""
    for rows in sets.values():
        if any("extra" not in r for r in rows):
            raise SystemExit("the cache predates --features: delete it and gather again")
        for r in rows:
            _prepare(r)
    alone = {name: _aucs(sets, fn) for name, fn in _query_features().items()}
    lead_fit = _grid(
        sets, [(a, d, lam, 0.0) for a, d, lam in itertools.product(LEAD_WEIGHTS, DROPPED, LEADS)]
    )
    missing_fit = _grid(
        sets,
        [
            (a, d, lam, m)
            for a, d, lam, m in itertools.product(LEAD_WEIGHTS, DROPPED, LEADS[:7:2], MISSING)
        ],
    )

    def v2(r: dict[str, Any]) -> float:
        return lead(r, 0.7, 2.0, 0.0)

    variants = {}
    for name, combo in (("lead", lead_fit), ("lead + missing term", missing_fit)):

        def fn(r: dict[str, Any], combo: tuple[float, ...] = combo) -> float:
            return lead(r, *combo)

        variants[name] = {
            "chosen": dict(zip(("sentence_cosine", "dropped_word", "lead", "missing"), combo,
                               strict=True)),
            "auc": _aucs(sets, fn),
            "odd_auc_minus_v2": {n: _bootstrap(rows, fn, v2) for n, rows in sets.items()},
        }  # fmt: skip
    for rows in sets.values():
        for r in rows:
            del r["_missing"]
    grid = {"sentence_cosine": LEAD_WEIGHTS, "dropped_word": DROPPED, "lead": LEADS,
            "missing": MISSING, "lead_with_missing": LEADS[:7:2]}  # fmt: skip
    return {"grid": grid, "alone": alone, "variants": variants}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions-home", type=Path, required=True)
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "kbflow-support-parts.json",
        help="the gathered parts (reused when present; delete it after changing the signal)",
    )
    parser.add_argument(
        "--claims",
        type=int,
        help="only the first N SciFact dev claims (each costs its hits' sentences embedded once)",
    )
    parser.add_argument(
        "--features",
        action="store_true",
        help="also report query-level features and the lead grids (results key 'features')",
    )
    args = parser.parse_args()
    from core.settings import Settings, configure_environment

    configure_environment(Settings())
    started = time.perf_counter()
    if args.cache.is_file():
        sets = json.loads(args.cache.read_text())
    else:
        sets = {
            "scifact": gather_scifact(args.claims),
            "questions": gather_questions(args.questions_home),
        }
        args.cache.write_text(json.dumps(sets))
    chosen = fit(sets)
    free = fit(sets, (True, False))
    from tasks.answer.confidence import SUPPORT_V2

    shipped = {
        "sentence_cosine": SUPPORT_V2.sentence_cosine,
        "value_words": SUPPORT_V2.value_words,
        "dropped_word": SUPPORT_V2.dropped_word,
    }
    out = {
        "scifact_claims": len({r["pos"] for r in sets["scifact"]}),
        "chosen_on": "even positions of both sets (mean ROC AUC; threshold: mean balanced "
        "accuracy)",
        "grid": {"sentence_cosine": WEIGHTS, "dropped_word": DROPPED, "value_words": [True, False]},
        "fit": chosen,
        "fit_value_words_free": free,
        "auc_value_words_free": report(sets, free),
        "shipped": {**shipped, "version": SUPPORT_V2.version},
        "shipped_matches_fit": all(chosen[k] == v for k, v in shipped.items()),
        "seconds": round(time.perf_counter() - started, 1),
        "auc": report(sets, chosen),
    }
    if args.features:
        out["features"] = features(sets)
        out["seconds"] = round(time.perf_counter() - started, 1)
    save_results("fit_support", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
