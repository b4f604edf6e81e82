"""Adapting the embedder on a BEIR dataset: the passages the index embeds, relevance pairs from
the training half's judgements, hard negatives, and a fast dense evaluation by half.

Passages are made exactly as ingest makes them (`tasks.ingest.discover.record_to_document`,
then `tasks.text.chunk.document_to_chunks`, then `Chunk.embed_text`: the title as heading, a
newline, the chunk), so a model learns on the texts it will rank. A long abstract becomes
several chunks, and a judgement names the document, not the chunk. The positive for a pair is
the relevant document's chunk that the base model already ranks highest for the query: the
index ranks a document by its best chunk, so that is the chunk whose score decides the
document's rank, and it is the likeliest to hold the evidence (a chunk that only carries the
methods is a noisy positive). `positives="all"` makes one pair per chunk instead.

The dense evaluation is a brute-force NumPy search over every passage (max-passage per
document, `DOC_DEPTH` documents), scored with `evals.metrics` on each half of the queries. It
has no BM25 leg and no gate, so it is for iterating; `kbflow eval run` is the real measure.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from core.errors import ConfigError
from evals.beir import BeirDataset
from evals.metrics import Qrels, Run, evaluate
from tasks.ingest.discover import jsonl_sources, record_to_document
from tasks.text.chunk import document_to_chunks
from tasks.text.embed import CachedEmbedder, Embedder, MiniLMEmbedder
from tasks.text.finetune import (
    FinetunedModel,
    FinetuneParams,
    QuerySplit,
    RelevancePair,
    finetune_embedder,
    promote,
    record_evaluation,
    split_by_position,
)

if TYPE_CHECKING:
    import numpy as np

    from core.settings import Settings

DOC_DEPTH = 100  # documents ranked per query (Recall@100), as evals.retrieval
MINE_DEPTH = 200  # passages ranked per training query to mine hard negatives from

Positives = Literal["best", "all"]
NegativesFrom = Literal["none", "bm25", "dense"]


@dataclass(frozen=True)
class Passages:
    """The corpus as the index embeds it: one entry per chunk, a document's chunks adjacent."""

    doc_ids: tuple[str, ...]
    """The corpus record id of each passage."""
    texts: tuple[str, ...]
    """Each passage's text as embedded (`Chunk.embed_text`)."""
    of_doc: dict[str, list[int]] = field(default_factory=dict)
    """Corpus record id -> its passages' positions, in chunk order."""

    def __len__(self) -> int:
        return len(self.texts)


def corpus_passages(dataset: BeirDataset, *, max_words: int, overlap_words: int) -> Passages:
    """Chunk the corpus the way ingest does (same functions, same settings)."""
    doc_ids: list[str] = []
    texts: list[str] = []
    of_doc: dict[str, list[int]] = {}
    for source in jsonl_sources(dataset.corpus_path):
        record_id = source.name
        chunks = document_to_chunks(
            record_id,
            record_to_document(source),
            max_words=max_words,
            overlap_words=overlap_words,
        )
        for chunk in chunks:
            of_doc.setdefault(record_id, []).append(len(texts))
            doc_ids.append(record_id)
            texts.append(chunk.embed_text)
    return Passages(tuple(doc_ids), tuple(texts), of_doc)


def embed_texts(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """Unit vectors of ``texts`` as a float32 matrix (documents' path: no query cache)."""
    import numpy as np

    return np.asarray(embedder.embed_documents(list(texts)), dtype=np.float32)


def passage_rankings(scores: np.ndarray, depth: int | None = None) -> np.ndarray:
    """Each row's passage positions, best first (all of them, or the top ``depth``)."""
    import numpy as np

    if depth is None or depth >= scores.shape[1]:
        return np.argsort(-scores, axis=1, kind="stable")
    top = np.argpartition(-scores, depth, axis=1)[:, :depth]
    order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1)


def document_run(
    query_ids: Sequence[str], scores: np.ndarray, passages: Passages, depth: int = DOC_DEPTH
) -> Run:
    """Rank documents per query by their best passage's score (as the index ranks them)."""
    import numpy as np

    docs = list(passages.of_doc)
    starts = np.asarray([passages.of_doc[d][0] for d in docs])
    # a document's passages are adjacent, so a segment maximum is its best passage
    best = np.maximum.reduceat(scores, starts, axis=1)
    top = passage_rankings(best, depth)
    return {qid: [docs[j] for j in row] for qid, row in zip(query_ids, top, strict=True)}


def bm25_rankings(passages: Passages, queries: Sequence[str], depth: int) -> np.ndarray:
    """BM25 passage rankings (bm25s over kbflow's own analyser), best first."""
    import bm25s
    import numpy as np

    from tasks.text.sparse import analyze

    retriever = bm25s.BM25()
    retriever.index([analyze(t) for t in passages.texts], show_progress=False)
    hits, _ = retriever.retrieve(
        [analyze(q) for q in queries], k=min(depth, len(passages)), show_progress=False
    )
    return np.asarray(hits)


def training_pairs(
    dataset: BeirDataset,
    split: QuerySplit,
    passages: Passages,
    *,
    ranking: Mapping[str, Sequence[int]],
    positives: Positives = "best",
    negatives: Mapping[str, Sequence[int]] | None = None,
    negatives_per_pair: int = 1,
    skip_top: int = 3,
    pool: int = 30,
    seed: int = 0,
) -> list[RelevancePair]:
    """(query, positive passage[, hard negatives]) for the TRAINING half's judgements only.

    Args:
        dataset: The benchmark (its queries and qrels).
        split: Which queries to train on; held-out queries are never read.
        passages: The corpus as embedded.
        ranking: Training query id -> passage positions by the base model, best first (picks
            each relevant document's best chunk when ``positives="best"``).
        positives: ``"best"``: one pair per relevant document, its best-ranked chunk;
            ``"all"``: one pair per chunk of each relevant document.
        negatives: Training query id -> passage positions by the mining engine, best first;
            None for in-batch negatives only.
        negatives_per_pair: Hard negatives per pair (when ``negatives`` is given).
        skip_top: Candidates skipped at the top of the mined ranking: unjudged but relevant
            passages gather there, and a false negative teaches the wrong thing.
        pool: Negatives are drawn from the ranks ``[skip_top, skip_top + pool)`` that belong to
            no relevant document, seeded by ``seed`` and the query id.
        seed: Seeds the draw of negatives.

    Raises:
        ConfigError: A training query is missing from ``ranking`` or ``negatives``.
    """
    pairs: list[RelevancePair] = []
    for qid in split.train:
        query = dataset.queries[qid]
        relevant = {d for d, grade in dataset.qrels.get(qid, {}).items() if grade > 0}
        mined: tuple[str, ...] = ()
        if negatives is not None and negatives_per_pair:
            if qid not in negatives:
                raise ConfigError(f"no mined ranking for training query {qid!r}")
            candidates = [i for i in negatives[qid] if passages.doc_ids[i] not in relevant][
                skip_top : skip_top + pool
            ]
            picked = random.Random(f"{seed}:{qid}").sample(
                candidates, min(negatives_per_pair, len(candidates))
            )
            if len(picked) < negatives_per_pair:
                continue  # too few candidates: a pair needs as many negatives as the others
            mined = tuple(passages.texts[i] for i in picked)
        if qid not in ranking:
            raise ConfigError(f"no base ranking for training query {qid!r}")
        rank_of = {p: r for r, p in enumerate(ranking[qid])}
        for doc in sorted(relevant):
            chunks = passages.of_doc.get(doc)
            if not chunks:
                continue  # judged document absent from the corpus
            if positives == "all":
                chosen = list(chunks)
            else:
                chosen = [min(chunks, key=lambda p: rank_of.get(p, len(rank_of) + p))]
            pairs.extend(RelevancePair(query, passages.texts[p], mined) for p in chosen)
    return pairs


def scores_by_half(run: Run, qrels: Qrels, split: QuerySplit) -> dict[str, dict[str, Any]]:
    """Mean metrics on the held-out half, the training half and all queries."""
    out: dict[str, dict[str, Any]] = {}
    for name, ids in (("held_out", split.held_out), ("train", split.train)):
        half = {q: qrels[q] for q in ids if q in qrels}
        scores = evaluate({q: run.get(q, []) for q in half}, half)
        out[name] = {**scores.mean, "queries": scores.queries}
    scores = evaluate(run, qrels)
    out["all"] = {**scores.mean, "queries": scores.queries}
    return out


def per_query_means(
    rows: Mapping[str, Mapping[str, float]], split: QuerySplit
) -> dict[str, dict[str, Any]]:
    """Mean of recorded per-query metrics (``evals.eval_queries`` rows: query id -> metric ->
    value) on each half and on all queries.

    Raises:
        ConfigError: A query of the split has no recorded row.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, ids in (
        ("held_out", split.held_out),
        ("train", split.train),
        ("all", split.train + split.held_out),
    ):
        missing = [q for q in ids if q not in rows]
        if missing:
            raise ConfigError(
                f"no recorded metrics for {len(missing)} queries, e.g. {missing[0]!r}"
            )
        metrics = {m for q in ids for m in rows[q]}
        out[name] = {m: sum(rows[q][m] for q in ids) / len(ids) for m in sorted(metrics)}
        out[name]["queries"] = len(ids)
    return out


@dataclass(frozen=True)
class Decision:
    """Whether a fine-tuned model replaces its base, and the held-out figures that decided."""

    promote: bool
    reason: str
    metric: str
    base: float
    candidate: float


def promotion_decision(
    base: Mapping[str, Mapping[str, Any]],
    candidate: Mapping[str, Mapping[str, Any]],
    *,
    metric: str = "ndcg@10",
    min_gain: float = 0.0,
) -> Decision:
    """Promote only when the candidate beats the base on the HELD-OUT half by more than
    ``min_gain``; the training half is not consulted (a model always looks good on the queries
    it learned)."""
    before, after = float(base["held_out"][metric]), float(candidate["held_out"][metric])
    gain = after - before
    if gain > min_gain:
        return Decision(True, f"held-out {metric} {before:.4f} -> {after:.4f} (+{gain:.4f})",
                        metric, before, after)  # fmt: skip
    return Decision(
        False,
        f"held-out {metric} {before:.4f} -> {after:.4f} ({gain:+.4f}); it must gain more than "
        f"{min_gain:.4f} to be promoted",
        metric,
        before,
        after,
    )


class AdaptationData:
    """A BEIR dataset made ready to adapt the embedder: its queries split by position, its
    corpus as the index embeds it, and each model's vectors (cached on disk by model and text,
    in the same cache file as the eval's, so the eval of a model embedded here is free).

    Args:
        dataset: The benchmark.
        max_words: Chunk word cap (the index's `Settings.ingest.chunk_max_words`).
        overlap_words: Chunk overlap (`Settings.ingest.chunk_overlap_words`).
        cache_path: The embedding cache (``<KBFLOW_HOME>/cache/embeddings.sqlite``).
        threads: CPU threads per embedding call.
        backend: ``onnx`` or ``torch`` (`tasks.text.embed.MiniLMEmbedder`).
    """

    def __init__(
        self,
        dataset: BeirDataset,
        *,
        max_words: int,
        overlap_words: int,
        cache_path: Path,
        threads: int = 2,
        backend: str = "onnx",
    ) -> None:
        self.dataset = dataset
        self.passages = corpus_passages(dataset, max_words=max_words, overlap_words=overlap_words)
        self.qids = list(dataset.queries)
        self.split = split_by_position(self.qids)
        self.cache_path = cache_path
        self.threads = threads
        self.backend = backend
        self.embed_seconds: dict[str, float] = {}
        self.computed: dict[str, int] = {}
        self._row = {q: n for n, q in enumerate(self.qids)}
        self._vectors: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def vectors(self, model: str) -> tuple[np.ndarray, np.ndarray]:
        """(query vectors in `qids` order, passage vectors) of ``model``."""
        if model not in self._vectors:
            inner = MiniLMEmbedder(model, batch_size=64, backend=self.backend, threads=self.threads)
            cached = CachedEmbedder(inner, self.cache_path)
            started = time.perf_counter()
            try:
                queries = embed_texts(cached, [self.dataset.queries[q] for q in self.qids])
                passages = embed_texts(cached, self.passages.texts)
            finally:
                cached.close()
            self.embed_seconds[model] = round(time.perf_counter() - started, 1)
            self.computed[model] = cached.misses
            self._vectors[model] = (queries, passages)
        return self._vectors[model]

    def scores(self, model: str, qids: Sequence[str]) -> np.ndarray:
        """Cosine similarity of each query of ``qids`` with every passage."""
        queries, passages = self.vectors(model)
        result: np.ndarray = queries[[self._row[q] for q in qids]] @ passages.T
        return result

    def dense_halves(self, model: str, split: QuerySplit) -> dict[str, dict[str, Any]]:
        """Brute-force dense metrics of ``model`` on each half of ``split`` (and both)."""
        qids = list(split.train + split.held_out)
        run = document_run(qids, self.scores(model, qids), self.passages)
        return scores_by_half(run, {q: self.dataset.qrels[q] for q in qids}, split)

    def pairs(
        self,
        split: QuerySplit,
        *,
        base: str,
        positives: Positives = "best",
        negatives: NegativesFrom = "none",
        seed: int = 0,
    ) -> list[RelevancePair]:
        """Training pairs from ``split.train`` (`training_pairs`); positives are chosen, and
        dense negatives mined, with ``base``."""
        train = list(split.train)
        ranking = dict(zip(train, passage_rankings(self.scores(base, train)).tolist(), strict=True))
        mined: dict[str, list[int]] | None = None
        if negatives == "dense":
            mined = {q: r[:MINE_DEPTH] for q, r in ranking.items()}
        elif negatives == "bm25":
            texts = [self.dataset.queries[q] for q in train]
            hits = bm25_rankings(self.passages, texts, MINE_DEPTH)
            mined = dict(zip(train, hits.tolist(), strict=True))
        return training_pairs(
            self.dataset, split, self.passages, ranking=ranking, positives=positives,
            negatives=mined, seed=seed,
        )  # fmt: skip


def open_adaptation(
    settings: Settings, dataset_dir: Path, split: str | None = None, threads: int = 2
) -> AdaptationData:
    """A BEIR folder made ready with the index's chunking, backend and embedding cache."""
    from evals.beir import load_beir

    return AdaptationData(
        load_beir(dataset_dir, split),
        max_words=settings.ingest.chunk_max_words,
        overlap_words=settings.ingest.chunk_overlap_words,
        cache_path=settings.home / "cache" / "embeddings.sqlite",
        threads=threads,
        backend=settings.ingest.embedding_backend,
    )


def train_candidate(
    settings: Settings,
    dataset_dir: Path,
    split: str | None = None,
    *,
    base: str,
    params: FinetuneParams,
    negatives: NegativesFrom = "none",
    threads: int = 2,
) -> FinetunedModel:
    """Fine-tune ``base`` on the training half (even positions) of a BEIR folder's queries,
    into ``settings.models_dir`` (a model already trained from the same inputs is reused)."""
    data = open_adaptation(settings, dataset_dir, split, threads)
    pairs = data.pairs(data.split, base=base, negatives=negatives, seed=params.seed)
    source = {
        "dataset": data.dataset.name,
        "split": "even query positions",
        "queries": len(data.split.train),
        "positives": "best",
        "negatives": negatives,
    }
    return finetune_embedder(
        pairs, models_dir=settings.models_dir, base=base, params=params, source=source,
        threads=threads,
    )  # fmt: skip


def score_model(
    settings: Settings, dataset_dir: Path, model: str, split: str | None = None, threads: int = 2
) -> dict[str, dict[str, Any]]:
    """Brute-force dense metrics of ``model`` on each half of a BEIR folder's queries."""
    data = open_adaptation(settings, dataset_dir, split, threads)
    return data.dense_halves(model, data.split)


def decide_and_promote(
    models_dir: Path,
    candidate: FinetunedModel,
    base_scores: Mapping[str, Mapping[str, Any]],
    candidate_scores: Mapping[str, Mapping[str, Any]],
    *,
    min_gain: float = 0.0,
) -> dict[str, Any]:
    """Record both models' scores in the candidate's manifest; promote it only if it wins on
    the held-out half (`promotion_decision`). Returns the report."""
    decision = promotion_decision(base_scores, candidate_scores, min_gain=min_gain)
    evidence = {
        "reason": decision.reason,
        "metric": decision.metric,
        "min_gain": min_gain,
        "dense_bruteforce": {"base": base_scores, "finetuned": candidate_scores},
    }
    record_evaluation(candidate.path, {"dense_bruteforce": evidence["dense_bruteforce"]})
    promoted = promote(models_dir, candidate, evidence) if decision.promote else None
    return {
        "model_id": candidate.model_id,
        "path": str(candidate.path),
        "promoted": decision.promote,
        "reason": decision.reason,
        "promoted_file": str(promoted) if promoted else None,
        "held_out": {"base": base_scores["held_out"], "finetuned": candidate_scores["held_out"]},
        "train": {"base": base_scores["train"], "finetuned": candidate_scores["train"]},
        "pairs": candidate.manifest["data"]["pairs"],
        "train_seconds": candidate.manifest["training"]["seconds"],
    }
