"""``kbflow models``: fine-tune the embedding model on judged pairs, and list the results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.table import Table

from core.settings import Settings
from kbflow.cli.common import JsonOpt, command, command_group, counted, print_json
from kbflow.render import console
from kbflow.services.catalog import models as service

USE_PROMOTED = (
    "to serve the promoted model: set KBFLOW_EMBEDDING_MODEL=promoted, then run "
    "`kbflow store reembed` (re-embeds the chunks the current model made)"
)

group = command_group(
    "models", "Fine-tuned embedding models: adapt the embedder to judged pairs, list the results."
)


@group.command("finetune")
@command
def models_finetune(
    settings: Settings,
    dataset: Annotated[
        Path,
        typer.Option(
            "--dataset", help="A BEIR folder: corpus.jsonl[.gz], queries.jsonl, qrels.", exists=True
        ),
    ],
    split: Annotated[
        str | None, typer.Option(help="Split to use (default: test, then dev, then none).")
    ] = None,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the training pairs.")] = 3,
    negatives: Annotated[
        Literal["none", "bm25", "dense"],
        typer.Option(help="Hard negatives per pair: none (in-batch only), bm25 or dense."),
    ] = "none",
    seed: Annotated[int, typer.Option(help="Seed: the same inputs train the same model.")] = 0,
    min_gain: Annotated[
        float, typer.Option(help="Held-out nDCG@10 the model must gain to be promoted.")
    ] = 0.0,
    as_json: JsonOpt = False,
) -> None:
    """Fine-tune the embedding model on the qrels of the even-position queries, score it and
    the base on the odd-position (held-out) queries, and promote it only if it wins there.

    The model is saved under <home>/models/<model id>; promotion writes
    <home>/models/promoted.json and changes no setting: to serve the promoted model, set
    KBFLOW_EMBEDDING_MODEL=promoted and run `kbflow store reembed`.
    """
    report = service.finetune(
        settings, dataset, split=split, epochs=epochs, negatives=negatives, seed=seed,
        min_gain=min_gain,
    )  # fmt: skip
    if as_json:
        print_json(report)
        return
    table = Table(title=f"{report['model_id']} — {counted(report['pairs'], 'pair')}")
    table.add_column("queries")
    table.add_column("model")
    for metric in ("ndcg@10", "mrr@10", "recall@100"):
        table.add_column(metric, justify="right")
    for half, label in ((report["held_out"], "held out"), (report["train"], "trained on")):
        for model, scores in (("base", half["base"]), ("finetuned", half["finetuned"])):
            table.add_row(label, model, *(f"{scores[m]:.4f}" for m in ("ndcg@10", "mrr@10",
                                                                        "recall@100")))  # fmt: skip
    console.print(table)
    verdict = "promoted" if report["promoted"] else "not promoted"
    console.print(f"{verdict}: {report['reason']}\nfolder: {report['path']}")
    if report["promoted"]:
        console.print(USE_PROMOTED)


@group.command("list")
@command
def models_list(settings: Settings, as_json: JsonOpt = False) -> None:
    """List the fine-tuned embedding models and which one is promoted."""
    found = service.list_models(settings)
    if as_json:
        print_json(found)
        return
    if not found["models"]:
        console.print("no fine-tuned models yet — run `kbflow models finetune --dataset DIR`.")
        return
    promoted = (found["promoted"] or {}).get("model_id")
    table = Table(title=f"models in {settings.models_dir}")
    for column in ("model id", "created", "base", "pairs", "held-out nDCG@10", "promoted"):
        table.add_column(column)
    for manifest in found["models"]:
        scores = manifest.get("evaluation", {}).get("dense_bruteforce", {})
        held_out = scores.get("finetuned", {}).get("held_out", {}).get("ndcg@10")
        table.add_row(
            manifest["model_id"],
            str(manifest.get("created_at", ""))[:16],
            str(manifest.get("base", {}).get("model", "")),
            str(manifest.get("data", {}).get("pairs", "")),
            f"{held_out:.4f}" if held_out is not None else "-",
            "yes" if manifest["model_id"] == promoted else "",
        )
    console.print(table)
    if promoted:
        console.print(USE_PROMOTED)
