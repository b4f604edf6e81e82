"""Fine-tuned embedding models: train, score and promote one (`kbflow models finetune`), and
list them (`kbflow models list`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from core.settings import Settings
from kbflow.services.catalog.types import FinetuneReport, ModelsListed

if TYPE_CHECKING:
    from evals.adapt import NegativesFrom


def finetune(
    settings: Settings,
    dataset: Path,
    *,
    split: str | None = None,
    epochs: int = 3,
    negatives: NegativesFrom = "none",
    seed: int = 0,
    min_gain: float = 0.0,
) -> FinetuneReport:
    """Run the ``finetune-embedder`` flow on a BEIR folder; returns its report (model id,
    folder, held-out and training-half scores of base and candidate, promoted or why not)."""
    from flows.finetune import finetune_embedder_flow
    from kbflow.services.orchestration import tracked
    from tasks.text.finetune import FinetuneParams

    params = FinetuneParams(epochs=epochs, seed=seed)
    with tracked(settings.home, finetune_embedder_flow) as run:
        report = run(
            dataset=str(dataset.resolve()),
            split=split,
            params=params,
            negatives=negatives,
            min_gain=min_gain,
        )
    return cast("FinetuneReport", report)


def list_models(settings: Settings) -> ModelsListed:
    """The fine-tuned models under ``<home>/models`` (manifests, oldest first) and the
    promotion record (None when nothing is promoted)."""
    from tasks.text.finetune import list_models as manifests
    from tasks.text.finetune import promoted_model

    return {
        "models": manifests(settings.models_dir),
        "promoted": promoted_model(settings.models_dir),
        "configured": settings.ingest.embedding_model,
    }
