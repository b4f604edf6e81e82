"""Answer correctness: put every question of a set through `kbflow answer` and judge the answer.

Retrieval evals score the ranking and the refusal AUC scores the support; neither says whether
the answer an agent gets is right. Here each question of `evals.questions` (and the held-out
``holdout.jsonl``) goes through the same path as ``kbflow answer --agent A "question"``
(`kbflow.services.query.answers.answer`, recorded in the ledger; the app stands a floor above
``evals/``, so the caller hands it in as an `Answerer`), over its corpus ingested into an org of
its own, and lands in one bucket:

- answerable: ``answered-correct`` (the expected answer is in the answer's quoted text — a
  claim's text or a citation's quote, matched ignoring case, whitespace and punctuation — AND
  one of the question's relevant files is cited), ``answered-wrong`` (answered otherwise),
  ``maybe`` (any status other than answered or refused), ``refused-answerable``;
- unanswerable (a near-miss): ``answered-wrong`` when answered, ``maybe``,
  ``refused-unanswerable``.

Rates (`rates`): answered-wrong / all questions, answered-correct / answered, answered /
answerable, and of the near-misses the share not answered, refused and maybe. They are
reported over all questions, per corpus, per kind and per group: ``even`` (the calibration
half: even positions of ``questions.jsonl``, the positions `bench/fit_support.py` chooses on),
``odd`` (held out from calibration) and ``holdout`` (``holdout.jsonl``, never calibrated on).

Example::

    report = run_answers(settings, answerer, ["demo"], home=Path("/tmp/answers-home"))
    report["all"]["answered_wrong_rate"]
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from core.errors import ConfigError, KbflowError
from core.models import DocStatus
from core.settings import Settings
from evals.warehouse import ANSWER_METRICS, ANSWER_OUTCOMES, EvalRecord

if TYPE_CHECKING:
    from evals.questions import Corpus, Question

# `evals.questions` (and the demo corpus it writes, fpdf included) loads inside the functions
# that need it: a second of imports that judging an answer does not need.

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]

Bucket = Literal[
    "answered-correct", "answered-wrong", "maybe", "refused-answerable", "refused-unanswerable"
]
BUCKETS: tuple[Bucket, ...] = (
    "answered-correct",
    "answered-wrong",
    "maybe",
    "refused-answerable",
    "refused-unanswerable",
)
Group = Literal["even", "odd", "holdout"]
GROUPS: tuple[Group, ...] = ("even", "odd", "holdout")


EVAL_AGENT = "answer-eval"
EVAL_COLLECTION = "default"
QUOTE_CHARS = 300  # of the quoted text kept per question in the report


def _reader(settings: Settings) -> str:
    from tasks.llm_choice import reader_of

    return reader_of(settings)


def answers_dataset(corpus: str) -> str:
    """The warehouse dataset and baseline name of a corpus's answer eval: ``answers-<corpus>``."""
    return f"answers-{corpus}"


# --- judging one answer ---------------------------------------------------------------------


def normalise(text: str) -> str:
    """Case-folded words, punctuation dropped: ``"2,190 EUR."`` -> ``"2 190 eur"``."""
    return " ".join(re.sub(r"[\W_]+", " ", text.casefold()).split())


def holds(expected: str, text: str) -> bool:
    """Whether ``text`` states ``expected``, ignoring case, whitespace and punctuation.

    A Latin letter or digit at either end of the expected answer must meet a word boundary
    ("IV" is not found in "five"); a Korean answer may run on into a particle ("158명" is in
    "158명으로").
    """
    want, have = normalise(expected), normalise(text)
    if not want:
        return False
    before = r"(?<![a-z0-9])" if re.match(r"[a-z0-9]", want) else ""
    after = r"(?![a-z0-9])" if re.search(r"[a-z0-9]$", want) else ""
    return re.search(before + re.escape(want) + after, have) is not None


def quoted_text(output: dict[str, Any]) -> list[str]:
    """What the answer puts forward as knowledge: each claim's text and each citation's quote."""
    texts = [str(c.get("text") or "") for c in output.get("claims") or []]
    citations = list(output.get("citations") or [])
    citations += [c for claim in output.get("claims") or [] for c in claim.get("citations") or []]
    texts += [str(c.get("quote") or "") for c in citations]
    return [t for t in texts if t.strip()]


def cited_files(output: dict[str, Any], files: dict[str, str]) -> tuple[str, ...]:
    """The source file names the answer cites, by document id (``files``: doc id -> name);
    a document not in ``files`` is named by its URI's last part."""
    names = [
        files.get(str(c.get("doc_id")), str(c.get("uri", "")).rsplit("/", 1)[-1])
        for c in output.get("citations") or []
    ]
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class Judged:
    """One question's answer and its bucket.

    Attributes:
        id: The question's id.
        corpus: Its corpus.
        kind: Its kind (``direct``, ``near-miss``, ``table-cell``…).
        group: ``even``/``odd`` (its position in ``questions.jsonl``) or ``holdout``.
        question: The question's text.
        answerable: Whether an approved document answers it.
        expected: The expected answer string, or None.
        status: The answer's status (``answered``, ``refused``, ``maybe``…).
        bucket: Where it lands (`BUCKETS`).
        cited: The source files cited.
        quote: The answer's quoted text, cut to `QUOTE_CHARS`.
        missing: For a "maybe", what the support check found missing (None otherwise).
        evidence: For an answerable question not answered, whether the quotes handed over
            hold the expected answer (the agent can read it there); None otherwise.
    """

    id: str
    corpus: str
    kind: str
    group: Group
    question: str
    answerable: bool
    expected: str | None
    status: str
    bucket: Bucket
    cited: tuple[str, ...]
    quote: str
    missing: str | None = None
    evidence: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"cited": list(self.cited)}


def judge(
    question: Question, output: dict[str, Any], *, group: Group, files: dict[str, str]
) -> Judged:
    """Put one answer output (`kbflow answer --json`'s shape) in its bucket.

    Args:
        question: The question asked.
        output: The answer's output: ``status``, ``claims`` and ``citations``.
        group: The question's group.
        files: Document id -> source file name, for the cited documents.
    """
    status = str(output.get("status"))
    texts = quoted_text(output)
    cited = cited_files(output, files)
    bucket: Bucket
    if status == "answered":
        right = (
            question.answerable
            and any(holds(question.answer or "", t) for t in texts)
            and bool(set(cited) & set(question.relevant))
        )
        bucket = "answered-correct" if right else "answered-wrong"
    elif status == "refused":
        bucket = "refused-answerable" if question.answerable else "refused-unanswerable"
    else:
        bucket = "maybe"
    quote = " | ".join(" ".join(t.split()) for t in texts)
    return Judged(
        id=question.id,
        corpus=question.corpus,
        kind=question.kind,
        group=group,
        question=question.text,
        answerable=question.answerable,
        expected=question.answer,
        status=status,
        bucket=bucket,
        cited=cited,
        quote=quote[:QUOTE_CHARS] + ("…" if len(quote) > QUOTE_CHARS else ""),
        missing=output.get("missing"),
        evidence=(
            any(holds(question.answer or "", t) for t in texts)
            if question.answerable and status != "answered"
            else None
        ),
    )


# --- rates and the report -------------------------------------------------------------------


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def rates(judged: Sequence[Judged]) -> dict[str, Any]:
    """Counts per bucket and the rates (None where a rate has no denominator).

    - ``answered_wrong_rate``: answered-wrong / all questions;
    - ``answered_correct_rate``: answered-correct / answered;
    - ``answered_rate``: answerable questions answered / answerable;
    - ``near_miss_not_answered_rate``, ``near_miss_refused_rate``, ``near_miss_maybe_rate``:
      near-misses refused or maybe, refused, maybe / near-misses;
    - ``maybe_evidence_rate``: answerable questions not answered whose handed-over quotes hold
      the expected answer / answerable questions not answered (refused ones count as without).
    """
    counts = {b: sum(j.bucket == b for j in judged) for b in BUCKETS}
    answerable = [j for j in judged if j.answerable]
    near = [j for j in judged if not j.answerable]
    answered = [j for j in judged if j.status == "answered"]
    near_refused = sum(j.status == "refused" for j in near)
    near_maybe = sum(j.bucket == "maybe" for j in near)
    unanswered = [j for j in answerable if j.status != "answered"]
    return {
        "questions": len(judged),
        "answerable": len(answerable),
        "near_misses": len(near),
        "answered": len(answered),
        "counts": counts,
        "answered_wrong_rate": _share(counts["answered-wrong"], len(judged)),
        "answered_correct_rate": _share(counts["answered-correct"], len(answered)),
        "answered_rate": _share(sum(j.status == "answered" for j in answerable), len(answerable)),
        "near_miss_not_answered_rate": _share(near_refused + near_maybe, len(near)),
        "near_miss_refused_rate": _share(near_refused, len(near)),
        "near_miss_maybe_rate": _share(near_maybe, len(near)),
        "maybe_evidence_rate": _share(sum(bool(j.evidence) for j in unanswered), len(unanswered)),
    }


def summarise(judged: Sequence[Judged]) -> dict[str, Any]:
    """The rates over all questions, per group, per corpus and per kind."""

    from evals.questions import CORPORA

    def by(key: Callable[[Judged], str], order: Iterable[str]) -> dict[str, Any]:
        present = {key(j) for j in judged}
        return {k: rates([j for j in judged if key(j) == k]) for k in order if k in present}

    return {
        "all": rates(judged),
        "groups": by(lambda j: j.group, GROUPS),
        "corpora": by(lambda j: j.corpus, CORPORA),
        "kinds": by(lambda j: j.kind, sorted({j.kind for j in judged})),
    }


def metrics_of(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The rates of ``all`` and each group, as the warehouse's and a baseline's ``modes``."""
    parts = {"all": summary["all"], **summary["groups"]}
    return {
        mode: {m: float(r[m]) for m in ANSWER_METRICS if r.get(m) is not None}
        for mode, r in parts.items()
    }


# --- the questions and the home they are asked in --------------------------------------------


def grouped_questions(corpus: Corpus) -> list[tuple[Question, Group]]:
    """A corpus's questions with their group: position in ``questions.jsonl`` (over the whole
    file, as calibration counts it) even or odd, then the held-out ones."""
    from evals.questions import load_holdout, load_questions

    out: list[tuple[Question, Group]] = [
        (q, "even" if pos % 2 == 0 else "odd")
        for pos, q in enumerate(load_questions())
        if q.corpus == corpus
    ]
    return out + [(q, "holdout") for q in load_holdout(corpus)]


def corpus_org(corpus: str) -> str:
    return f"answers-{corpus}"


def home_settings(settings: Settings, home: Path) -> Settings:
    """``settings`` on ``home``, with the registry, vectors and ledger all inside it."""
    return settings.replace(home=home, database_url=None, qdrant_url=None, warehouse_url=None)


def prepare_corpus(settings: Settings, corpus: Corpus) -> dict[str, str]:
    """Ingest ``corpus`` into its own org of ``settings.home`` through ``kbflow ingest`` and
    create the org's agent (`agent_for`); returns doc id -> file name.

    The demo's draft is ingested ``pending_review`` (the gate must keep it out of every answer);
    the question set's files are approved. Unchanged files are skipped, so a reused home costs
    only the check.

    Raises:
        KbflowError: ``kbflow ingest`` failed (its last output is in the message).
    """
    from core.errors import NotFound
    from evals.demo_corpus import PRICING_DRAFT_FILE
    from evals.questions import sources_for
    from sinks.connect import open_registry

    org = corpus_org(corpus)
    staged = settings.home / "sources" / corpus
    files = sources_for(corpus, demo_folder=staged)
    with open_registry(settings) as registry:
        registry.people.ensure_org(org)
        try:
            registry.catalog.get_agent(agent_for(corpus))
        except NotFound:
            registry.catalog.create_agent(org, agent_for(corpus), f"answer eval over {corpus}")
    _ingest(settings.home, [str(p) for p in files], org, DocStatus.APPROVED)
    if corpus == "demo":
        _ingest(settings.home, [str(staged / PRICING_DRAFT_FILE)], org, DocStatus.PENDING_REVIEW)
    with open_registry(settings) as registry:
        return {
            d.id: Path(d.uri.split("#", 1)[0]).name for d in registry.documents.list_documents(org)
        }


def agent_for(corpus: str) -> str:
    return f"{EVAL_AGENT}-{corpus}"


def _ingest(home: Path, paths: list[str], org: str, status: DocStatus) -> None:
    """``kbflow ingest`` in a child process on ``home``: the flow reads its settings from the
    environment, and every store must be the home's own."""
    env = {k: v for k, v in os.environ.items() if k not in _SHARED_STORES}
    env["KBFLOW_HOME"] = str(home)
    command = [sys.executable, "-m", "kbflow.cli", "ingest", *paths, "--org", org,
               "--status", status.value, "--wait", "--json"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO, check=False)
    if done.returncode != 0:
        raise KbflowError(
            f"kbflow ingest into {org} under {home} failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-1500:]} — fix the cause and run the answer eval again"
        )


_SHARED_STORES = ("KBFLOW_DATABASE_URL", "KBFLOW_QDRANT_URL", "KBFLOW_WAREHOUSE_URL")


# --- the run --------------------------------------------------------------------------------

Ask = Callable[[str, str], dict[str, Any]]
"""(agent id, question) -> the answer's output, as ``kbflow answer --json`` prints it."""
Answerer = Callable[[Settings], AbstractContextManager[Ask]]
"""Opens the answer path on a home's settings for a batch of questions. The path is the app's
(`kbflow.services.query.answers.answer`), a floor above ``evals/``, so the caller hands it in: the
CLI (`kbflow eval answers`) does, and the nightly runs that command."""


def run_answers(
    settings: Settings,
    answerer: Answerer,
    corpora: Sequence[str] | None = None,
    *,
    home: Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Ask every question of ``corpora`` (and the held-out ones) and judge each answer.

    Args:
        settings: The answer settings to measure (model, threshold, top k…).
        answerer: Opens the answer path on a home (`Answerer`); the app's CLI gives
            `kbflow.services.query.answers.answer` in a search context.
        corpora: ``demo`` and/or ``real-docs``; default both.
        home: Where the corpora are ingested; kept and reused across runs. Default: a
            temporary home, removed afterwards.
        progress: Hears (corpus, done, total) after each question.

    Returns:
        The report: ``all``/``groups``/``corpora``/``kinds`` rates, ``by_corpus`` (each
        corpus's own summary), ``questions`` (every judged answer), ``wrong`` (the
        answered-wrong ones), ``model``, ``threshold``, ``seconds``.

    Raises:
        ConfigError: An unknown corpus, or real-docs sources missing.
        KbflowError: An ingest failed.
    """
    from evals.questions import CORPORA, datasets_folder, sources_for

    corpora = list(CORPORA if corpora is None else dict.fromkeys(corpora))
    unknown = sorted(set(corpora) - set(CORPORA))
    if unknown:
        raise ConfigError(f"unknown corpus {unknown}: choose from {', '.join(CORPORA)}")
    if "real-docs" in corpora and not (datasets_folder() / "real-docs").is_dir():
        sources_for("real-docs")  # raises the clear "not found" error
    started = time.perf_counter()
    temporary = home is None
    where = Path(tempfile.mkdtemp(prefix="kbflow-answers-")) if home is None else Path(home)
    try:
        on = home_settings(settings, where.resolve())
        judged, models = _ask_all(on, answerer, corpora, progress)
    finally:
        if temporary:
            shutil.rmtree(where, ignore_errors=True)
    summary = summarise(judged)
    return {
        **summary,
        "by_corpus": {c: summarise([j for j in judged if j.corpus == c]) for c in corpora},
        "model": ", ".join(sorted(models)) or None,
        "provider": _reader(settings),
        "threshold": settings.answers.answer_min_confidence,
        "home": None if temporary else str(where),
        "seconds": round(time.perf_counter() - started, 1),
        "questions": [j.to_dict() for j in judged],
        "wrong": [j.to_dict() for j in judged if j.bucket == "answered-wrong"],
    }


def _ask_all(
    settings: Settings,
    answerer: Answerer,
    corpora: Sequence[str],
    progress: Callable[[str, int, int], None] | None,
) -> tuple[list[Judged], set[str]]:
    judged: list[Judged] = []
    models: set[str] = set()
    for corpus in corpora:
        files = prepare_corpus(settings, corpus)  # type: ignore[arg-type]
        asked = grouped_questions(corpus)  # type: ignore[arg-type]
        with answerer(settings) as ask:
            for done, (question, group) in enumerate(asked, start=1):
                output = ask(agent_for(corpus), question.text)
                models.add(str(output.get("model") or ""))
                judged.append(judge(question, output, group=group, files=files))
                if progress is not None:
                    progress(corpus, done, len(asked))
        log.info("answer eval: %s, %d questions", corpus, len(asked))
    return judged, models - {""}


def _outcome(bucket: str) -> dict[str, float]:
    return {o: float(o == f"answer_{bucket.replace('-', '_')}") for o in ANSWER_OUTCOMES}


def answer_records(report: dict[str, Any], settings: Settings) -> list[EvalRecord]:
    """One warehouse record per corpus (`evals.warehouse.EvalRecord`): dataset
    ``answers-<corpus>``, a mode per group (``all``, ``even``, ``odd``, ``holdout``) holding its
    rates, and each question's bucket (a 0/1 column per bucket) under ``all`` and its group."""
    from evals.retrieval import _git_commit

    now = datetime.now(UTC)
    records = []
    for corpus, summary in report["by_corpus"].items():
        asked = [q for q in report["questions"] if q["corpus"] == corpus]
        per_query = {
            mode: {q["id"]: _outcome(q["bucket"]) for q in asked if mode in ("all", q["group"])}
            for mode in ("all", *GROUPS)
        }
        records.append(
            EvalRecord(
                run_id=f"{answers_dataset(corpus)}-{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}",
                dataset=answers_dataset(corpus),
                started_at=now,
                commit=_git_commit(),
                settings={
                    "model": report["model"],
                    "provider": report.get("provider"),
                    "threshold": report["threshold"],
                    "top_k": settings.answers.answer_top_k,
                },
                modes=metrics_of(summary),
                per_query={mode: rows for mode, rows in per_query.items() if rows},
                seconds=float(report["seconds"]),
            )
        )
    return records
