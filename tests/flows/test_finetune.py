"""The finetune-embedder flow: trains on the training half, scores both models on the
held-out half, and promotes the candidate only when it wins there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.settings import Settings
from evals.golden import write_golden_set
from tasks.text.finetune import MANIFEST, PROMOTED, FinetuneParams, list_models

TINY = FinetuneParams(batch_size=2, max_steps=1, max_seq_length=32, learning_rate=1e-4)


def test_the_flow_promotes_only_a_winner(
    prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.finetune import finetune_embedder_flow

    monkeypatch.setenv("KBFLOW_EMBEDDING_BACKEND", "torch")  # no ONNX build for a throwaway
    golden = write_golden_set(tmp_path / "golden")
    models = Settings().models_dir

    kept = finetune_embedder_flow(dataset=str(golden), params=TINY, min_gain=1.0)
    assert kept["promoted"] is False and "must gain more than 1.0000" in kept["reason"]
    assert not (models / PROMOTED).exists()
    assert kept["held_out"]["base"]["queries"] == 2 and kept["train"]["base"]["queries"] == 3
    manifest = json.loads((Path(kept["path"]) / MANIFEST).read_text())
    assert manifest["data"]["queries"] == 3  # the training half only
    assert (
        manifest["evaluation"]["dense_bruteforce"]["finetuned"]["held_out"]
        == (kept["held_out"]["finetuned"])
    )

    won = finetune_embedder_flow(dataset=str(golden), params=TINY, min_gain=-1.0)
    assert won["model_id"] == kept["model_id"]  # the same inputs: the model was reused
    assert won["promoted"] is True
    promoted = json.loads((models / PROMOTED).read_text())
    assert promoted["model_id"] == won["model_id"] and promoted["path"] == won["path"]
    assert promoted["evidence"]["metric"] == "ndcg@10"
    assert [m["model_id"] for m in list_models(models)] == [won["model_id"]]
