"""Refusal thresholds per query form (issue 32): each form's threshold chosen on the EVEN
positions of its data, reported on the ODD ones (never seen by the choice) and on all.

Queries come in three forms (`tasks.answer.confidence.query_form`), with different support
distributions; each gets its own threshold (``KBFLOW_ANSWER_MIN_CONFIDENCE_<FORM>``):

- **claims**: SciFact dev, exactly as bench/refusal_calibration.py measures it: each claim
  answerable (its relevant abstracts in the index) and unanswerable (their chunks dropped from
  an over-fetched hybrid ranking). Needs the index that ``kbflow eval run --dataset
  ../shared/datasets/scifact`` builds in the same ``KBFLOW_HOME``; ``--claims N`` measures the
  first N claims only.
- **questions**: `evals/questions/questions.jsonl` (demo corpus and real-docs; answerable
  questions and near-misses), retrieved as `kbflow answer` retrieves, in a home built as
  bench/refusal_questions.py builds it (``--questions-home DIR``; built there when it has no
  sources yet). The held-out question file of the answer eval is not read: no calibration sees it.
- **keywords**: DERIVED from the same questions, since no keyword queries were written by
  people: each question's content words, in its order, punctuation stripped, stop words
  (`tasks.text.sparse.STOPWORDS`) and question words dropped ("Meridian gravel bike sell" from
  "What does the Meridian gravel bike sell for?"), with the question's label (answerable or
  near-miss). A derived text that `query_form` does not class as keywords (more than
  `KEYWORD_MAX_WORDS` content words, or an auxiliary the stop words keep, such as "must") is
  left out and counted. They share the questions' documents and labels, so the two forms are
  not independent evidence.

A query's score is the best support-v2 (`tasks.answer.confidence.support_scores`) over its top
``KBFLOW_ANSWER_TOP_K`` gated hybrid hits. Per form, positions are those of its claims /
questions in file order (a SciFact claim's two situations sit on the same side). The threshold
is the one today's calibration uses: best balanced accuracy (refusing the unanswerable and
answering the answerable weigh the same) on the even half over 0.100, 0.105 … 0.900, the
lowest within 0.005 of the best. The default shipped for a form (``adopted``) is that threshold
when it beats the single one on the odd half, else the single one (`adoption`). Reported per
form: ROC AUC (even, odd, all), and at the chosen threshold and at the single threshold before
(0.515): refusal precision and recall, answerable answered, on the odd half and on all. Saves
bench/results/refusal_forms.json and prints a Markdown table.

Usage::

    KBFLOW_HOME=<SciFact eval home> .venv/bin/python bench/refusal_forms.py \
        --questions-home DIR [--claims N]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.refusal_calibration import DATASETS, auc, rates  # noqa: E402
from bench.stats import save_results  # noqa: E402

SINGLE_THRESHOLD = 0.515  # the one threshold for every form, before issue 32
GRID = [t / 1000 for t in range(100, 901, 5)]
TOLERANCE = 0.005  # of balanced accuracy: thresholds closer than this are not told apart
_QUESTION_WORDS = frozenset(
    ("what", "who", "whom", "whose", "when", "where", "which", "why", "how")
)
_PUNCTUATION = "?!.,;:\"'()[]"


def keyword_query(question: str) -> str:
    """A keyword query from a question: its content words in order (see the module docstring).

    >>> keyword_query("What does the Meridian gravel bike sell for?")
    'Meridian gravel bike sell'
    """
    from tasks.text.sparse import STOPWORDS

    kept = [w.strip(_PUNCTUATION) for w in question.split()]
    return " ".join(
        w for w in kept if w and w.lower() not in STOPWORDS and w.lower() not in _QUESTION_WORDS
    )


def choose(ans: list[float], unans: list[float]) -> float:
    """The lowest threshold whose balanced accuracy is within `TOLERANCE` of the best."""
    curve = [rates(ans, unans, t) for t in GRID]
    best = max(r["balanced_accuracy"] for r in curve)
    return min(r["threshold"] for r in curve if r["balanced_accuracy"] >= best - TOLERANCE)


def _brief(r: dict[str, float]) -> dict[str, float]:
    keep = ("refusal_precision", "refusal_recall", "answerable_answered", "balanced_accuracy")
    return {k: r[k] for k in keep}


Row = tuple[int, bool, float]
"""A scored situation: its item's position in the form's data, answerable or not, support."""


def _labelled(rows: list[Row]) -> tuple[list[float], list[float]]:
    return [s for _, a, s in rows if a], [s for _, a, s in rows if not a]


def form_report(rows: list[Row]) -> dict[str, Any]:
    """One form's figures: the threshold chosen on the rows at even positions, measured on
    those at odd positions and on all; the single threshold on the same rows beside it."""
    even = _labelled([r for r in rows if r[0] % 2 == 0])
    odd = _labelled([r for r in rows if r[0] % 2 == 1])
    every = _labelled(rows)
    chosen = choose(*even)
    return {
        "answerable": len(every[0]),
        "unanswerable": len(every[1]),
        "roc_auc": {
            "even": round(auc(*even), 4),
            "odd": round(auc(*odd), 4),
            "all": round(auc(*every), 4),
        },
        "threshold": chosen,
        "at_threshold": {"odd": _brief(rates(*odd, chosen)), "all": _brief(rates(*every, chosen))},
        "at_single": {
            "odd": _brief(rates(*odd, SINGLE_THRESHOLD)),
            "all": _brief(rates(*every, SINGLE_THRESHOLD)),
        },
    } | adoption(chosen, rates(*odd, chosen), rates(*odd, SINGLE_THRESHOLD))


def adoption(
    chosen: float, at_chosen: dict[str, float], at_single: dict[str, float]
) -> dict[str, Any]:
    """The default shipped for the form: its chosen threshold when that beats the single one on
    the held-out half (balanced accuracy), else the single one (where refusal cannot tell,
    kbflow answers; the single threshold is also what turns were decided with before).

    This one comparison reads the odd half: between two candidates, never to tune either."""
    better = at_chosen["balanced_accuracy"] > at_single["balanced_accuracy"]
    return {
        "adopted": chosen if better else SINGLE_THRESHOLD,
        "adopted_by": "the chosen threshold when its odd-half balanced accuracy beats the single "
        f"{SINGLE_THRESHOLD}'s, else {SINGLE_THRESHOLD}",
    }


def claim_rows(settings: Any, claims: int | None) -> list[Row]:
    """SciFact dev: each claim's best support, answerable and unanswerable, at its position."""
    from evals.beir import load_beir
    from evals.retrieval import cached_embedder, eval_situations
    from tasks.answer.confidence import query_form, support_scores

    dataset = load_beir(DATASETS / "scifact", "dev")
    forms = {query_form(t) for t in list(dataset.queries.values())[:claims]}
    if forms != {"claim"}:
        sys.stderr.write(f"note: SciFact claims classed as {sorted(forms)}\n")
    position = {qid: i for i, qid in enumerate(dataset.queries)}
    embedder = cached_embedder(settings)
    rows: list[Row] = []
    try:
        with eval_situations(dataset, settings, embedder=embedder, queries=claims) as index:
            for n, case in enumerate(index.cases, 1):
                scores = support_scores(case.text, case.vector, case.hits, embedder, index.stats)
                rows.append((position[case.query_id], case.answerable, max(scores, default=0.0)))
                if n % 100 == 0:
                    print(f"claims: {n} situations scored", file=sys.stderr, flush=True)
    finally:
        embedder.close()
    return rows


def build_questions_home(home: Path) -> None:
    """Ingest each question corpus into its own org, as bench/refusal_questions.py does."""
    from bench.refusal_questions import BENCH_ADMIN, _bootstrap, _kbflow
    from evals.questions import datasets_folder, sources_for

    corpora = ["demo"] + (["real-docs"] if (datasets_folder() / "real-docs").is_dir() else [])
    for corpus in corpora:
        folder = home / "sources" / corpus
        if folder.is_dir():
            continue
        files = sources_for(corpus, demo_folder=home / "staging" / corpus)  # type: ignore[arg-type]
        folder.mkdir(parents=True)
        for path in files:
            shutil.copy2(path, folder / path.name)
        _bootstrap(home)
        _kbflow(home, "orgs", "create", f"q-{corpus}", "--as", BENCH_ADMIN)
        _kbflow(home, "ingest", str(folder), "--org", f"q-{corpus}")


def question_rows(home: Path) -> list[dict[str, Any]]:
    """Every question of the question set and its derived keyword query, with both scores."""
    from core.models import Scope
    from core.settings import Settings
    from evals.questions import datasets_folder, load_questions
    from kbflow.services.query.answers import answer_config
    from kbflow.services.query.context import open_home
    from tasks.answer.confidence import TermStats, query_form, support_scores

    settings = Settings(home=home)
    config = answer_config(settings)
    corpora = ["demo"] + (["real-docs"] if (datasets_folder() / "real-docs").is_dir() else [])
    rows: list[dict[str, Any]] = []
    with open_home(settings) as ctx:
        for corpus in corpora:
            scope = Scope(org_id=f"q-{corpus}")
            stats = TermStats.of_org(f"q-{corpus}", ctx.registry)
            for q in load_questions(corpus):  # type: ignore[arg-type]
                row: dict[str, Any] = {"id": q.id, "answerable": q.answerable}
                for key, text in (("question", q.text), ("keywords", keyword_query(q.text))):
                    hits = ctx.retrieve(text, scope, mode=config.mode, top_k=config.top_k).hits
                    vector = ctx.embedder.embed_query(text)
                    scores = support_scores(text, vector, hits, ctx.embedder, stats)
                    row[key] = {"text": text, "form": query_form(text),
                                "support": round(max(scores, default=0.0), 4)}  # fmt: skip
                rows.append(row)
    return rows


def markdown(report: dict[str, Any]) -> str:
    head = (
        "| form | queries (ans / unans) | ROC AUC odd / all | threshold | refusal P / R odd "
        "| answerable answered odd | refusal P / R all | answerable answered all "
        "| balanced acc. odd | at 0.515: refusal P / R odd | at 0.515: answered odd "
        "| at 0.515: answered all | at 0.515: balanced acc. odd | adopted |"
    )
    lines = [head, "|" + "---|" * 14]
    for form, r in report["forms"].items():
        t, s = r["at_threshold"], r["at_single"]
        lines.append(
            f"| {form} | {r['answerable']} / {r['unanswerable']} "
            f"| {r['roc_auc']['odd']:.3f} / {r['roc_auc']['all']:.3f} | {r['threshold']:.3f} "
            f"| {t['odd']['refusal_precision']:.3f} / {t['odd']['refusal_recall']:.3f} "
            f"| {t['odd']['answerable_answered']:.3f} "
            f"| {t['all']['refusal_precision']:.3f} / {t['all']['refusal_recall']:.3f} "
            f"| {t['all']['answerable_answered']:.3f} | {t['odd']['balanced_accuracy']:.3f} "
            f"| {s['odd']['refusal_precision']:.3f} / {s['odd']['refusal_recall']:.3f} "
            f"| {s['odd']['answerable_answered']:.3f} | {s['all']['answerable_answered']:.3f} "
            f"| {s['odd']['balanced_accuracy']:.3f} | {r['adopted']:.3f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions-home", type=Path, required=True)
    parser.add_argument("--claims", type=int, help="only the first N dev claims (default: all)")
    parser.add_argument("--skip-claims", action="store_true", help="questions and keywords only")
    args = parser.parse_args()
    from core.settings import Settings, configure_environment

    settings = Settings()
    configure_environment(settings)
    from tasks.answer.confidence import KEYWORD_MAX_WORDS, SUPPORT_VERSION

    started = time.perf_counter()
    build_questions_home(args.questions_home)
    rows = question_rows(args.questions_home)
    questions_s = time.perf_counter() - started
    forms: dict[str, Any] = {}
    timings: dict[str, float] = {"questions_and_keywords_s": round(questions_s, 1)}
    if not args.skip_claims:
        tick = time.perf_counter()
        forms["claim"] = form_report(claim_rows(settings, args.claims))
        first = f", first {args.claims} claims" if args.claims else ""
        forms["claim"]["dataset"] = f"scifact dev{first}"
        timings["claims_s"] = round(time.perf_counter() - tick, 1)
    asked = [(i, r["answerable"], r["question"]["support"]) for i, r in enumerate(rows)]
    forms["question"] = form_report(asked)
    forms["question"]["dataset"] = "evals/questions/questions.jsonl"
    keyed = [
        (i, r["answerable"], r["keywords"]["support"])
        for i, r in enumerate(rows)
        if r["keywords"]["form"] == "keywords"
    ]  # a derived query keeps its question's position, so it falls on the same side
    forms["keywords"] = form_report(keyed)
    forms["keywords"]["dataset"] = "derived from evals/questions/questions.jsonl (content words)"
    forms["keywords"]["left_out"] = sum(r["keywords"]["form"] != "keywords" for r in rows)
    out: dict[str, Any] = {
        "signal": SUPPORT_VERSION,
        "top_k": settings.answers.answer_top_k,
        "single_threshold": SINGLE_THRESHOLD,
        "chosen_by": "best balanced accuracy on the even positions of each form's data, the "
        f"lowest threshold within {TOLERANCE} of the best; reported on the odd positions",
        "keyword_max_words": KEYWORD_MAX_WORDS,
        "seconds": timings,
        "forms": forms,
        "question_rows": rows,
    }
    save_results("refusal_forms", out, unprinted="question_rows")
    print(markdown(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
