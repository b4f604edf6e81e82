"""The refusal metric of an eval run: does the answer path's support tell answerable questions
from unanswerable ones?

For every judged query of a BEIR dataset, two situations come from the same index:
- answerable: the knowledge base as it is (the query's relevant documents are in it);
- unanswerable: the query's relevant documents removed. Their chunks are dropped from an
  over-fetched hybrid ranking before the top ``KBFLOW_ANSWER_TOP_K`` are taken, which is what
  searching a knowledge base without them returns (up to the fusion's per-query normalisation).
A dataset may also hold questions that nothing in its corpus answers (`BeirDataset.unanswerable`,
e.g. the question set's near-misses); each is one more unanswerable situation, as it is.

The signal is what `tasks.answer.cited_answer.answer` gates on: the best
`tasks.answer.confidence.support_scores` over the gated hybrid hits, with the corpus's term
statistics. Reported: ROC AUC (answerable above unanswerable, ties half), and at the configured
threshold (``KBFLOW_ANSWER_MIN_CONFIDENCE``) the share of answerable situations answered and of
unanswerable ones refused. An eval run stores them beside hybrid's retrieval metrics (the mode
the answer path retrieves in), so the nightly baseline watches them too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.models import Scope, SearchMode

AT_THRESHOLD: tuple[str, ...] = ("answered", "refused")
"""Answerable answered and unanswerable refused at the threshold: they trade off as it moves,
so baselines leave them out and watch the ROC AUC."""
REFUSAL_METRICS: tuple[str, ...] = ("refusal_auc", *AT_THRESHOLD)
"""Run-level refusal metrics: the threshold-free ROC AUC, then `AT_THRESHOLD`."""
SUPPORT_METRICS: tuple[str, ...] = ("support_answerable", "support_unanswerable")
"""Per-query values: the best support with the relevant documents, and without them."""
OVERFETCH = 40
"""Hits fetched per query, so that the top k remain after the relevant ones are dropped."""


@dataclass
class RefusalSupports:
    """Best support per query, in each situation."""

    answerable: dict[str, float] = field(default_factory=dict)
    unanswerable: dict[str, float] = field(default_factory=dict)

    def metrics(self, threshold: float) -> dict[str, float]:
        """`REFUSAL_METRICS` at ``threshold`` (empty when a situation has no query)."""
        ans, unans = list(self.answerable.values()), list(self.unanswerable.values())
        if not ans or not unans:
            return {}
        return {
            "refusal_auc": roc_auc(ans, unans),
            "answered": sum(s >= threshold for s in ans) / len(ans),
            "refused": sum(s < threshold for s in unans) / len(unans),
        }

    def per_query(self) -> dict[str, dict[str, float]]:
        """Query id -> {`SUPPORT_METRICS` name: best support} for the situations it was in."""
        out: dict[str, dict[str, float]] = {}
        for qid, value in self.answerable.items():
            out.setdefault(qid, {})["support_answerable"] = value
        for qid, value in self.unanswerable.items():
            out.setdefault(qid, {})["support_unanswerable"] = value
        return out


def relevant_documents(qrels: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    """Query id -> the corpus ids judged relevant to it (grade > 0): what `situations` drops."""
    return {
        qid: {doc for doc, grade in judged.items() if grade > 0} for qid, judged in qrels.items()
    }


def roc_auc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """P(a positive scores above a negative), ties counted half (Mann–Whitney U / n·m)."""
    if not positives or not negatives:
        raise ValueError("ROC AUC needs at least one positive and one negative score")
    ranked = sorted([(s, 1) for s in positives] + [(s, 0) for s in negatives])
    wins = 0.0
    below = 0  # negatives strictly below the current score
    i = 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        tied_neg = sum(1 for _, label in ranked[i:j] if label == 0)
        tied_pos = (j - i) - tied_neg
        wins += tied_pos * (below + 0.5 * tied_neg)
        below += tied_neg
        i = j
    return wins / (len(positives) * len(negatives))


@dataclass(frozen=True)
class Situation:
    """One query in one situation: the hits the answer path would weigh."""

    position: int
    """The query's position among the judged queries, then the unanswerable ones."""
    query_id: str
    text: str
    vector: Sequence[float]
    """The query's embedding."""
    answerable: bool
    hits: Sequence[Any]
    """The top ``top_k`` gated hybrid hits of this situation."""


def situations(
    queries: dict[str, str],
    relevant: dict[str, set[str]],
    unanswerable: dict[str, str],
    *,
    org_id: str,
    store: Any,
    registry: Any,
    embedder: Any,
    config: Any,
    corpus_ids: dict[str, str],
    top_k: int,
) -> Iterator[Situation]:
    """Each judged query answerable, then with its relevant documents dropped; then each
    unanswerable question as it is (the module docstring's protocol).

    Args:
        queries: judged query id -> text.
        relevant: query id -> the corpus ids judged relevant (grade > 0).
        unanswerable: query id -> text of questions nothing in the corpus answers.
        org_id: the org the corpus is indexed in.
        store, registry, embedder, config: what `tasks.query.retrieve.search` takes.
        corpus_ids: document id -> corpus id (`evals.retrieval.corpus_ids`).
        top_k: hits the answer path considers (``KBFLOW_ANSWER_TOP_K``).
    """
    from tasks.query.retrieve import search

    scope = Scope(org_id=org_id)

    def hybrid(text: str, depth: int) -> list[Any]:
        return search(
            text, scope, store=store, registry=registry, embedder=embedder,
            mode=SearchMode.HYBRID, top_k=depth, config=config,
        )  # fmt: skip

    position = 0
    for qid, text in queries.items():
        hits = hybrid(text, OVERFETCH)
        vector = embedder.embed_query(text)
        without = [h for h in hits if corpus_ids.get(h.doc_id) not in relevant.get(qid, set())]
        yield Situation(position, qid, text, vector, True, hits[:top_k])
        yield Situation(position, qid, text, vector, False, without[:top_k])
        position += 1
    for qid, text in unanswerable.items():
        yield Situation(position, qid, text, embedder.embed_query(text), False, hybrid(text, top_k))
        position += 1


def refusal_supports(cases: Iterable[Situation], embedder: Any, stats: Any) -> RefusalSupports:
    """Best support of each situation's hits (`situations`), by query and situation.

    Args:
        cases: the situations, e.g. `situations` of an eval index.
        embedder: the embedder the situations were searched with.
        stats: term statistics of the corpus (`tasks.answer.confidence.TermStats`).
    """
    from tasks.answer.confidence import support_scores

    out = RefusalSupports()
    for case in cases:
        scores = support_scores(case.text, case.vector, case.hits, embedder, stats)
        side = out.answerable if case.answerable else out.unanswerable
        side[case.query_id] = max(scores, default=0.0)
    return out
