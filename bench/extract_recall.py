"""Extraction quality and cost on the shared real-docs set, in both OCR engines.

For every file of ``real-docs/sources``: how it was read (Docling, native PDF, OCR, speech),
the word-token recall of its reference (``groundtruth/``, where one exists; evals.extraction),
and the extraction time — inside the isolated worker, as ingest runs it. Prints a Markdown table
and saves JSON (bench/results/extract_recall.json). The speech rows use pocketsphinx (the offline
engine; no Whisper weights can be downloaded here), so they have no reference to score against.

Run: ``.venv/bin/python bench/extract_recall.py``. Needs ../shared/datasets/real-docs
(or KBFLOW_DATASETS), and tesseract + ffmpeg on PATH.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DATASETS = Path(os.environ.get("KBFLOW_DATASETS", REPO.parent / "shared" / "datasets"))


def main() -> int:
    from core.errors import ExtractionError
    from evals.extraction import document_text, groundtruth_for, method_of, recall_row
    from tasks.ingest.extract_options import ExtractOptions
    from tasks.ingest.isolate import ExtractionPool, Limits

    real = DATASETS / "real-docs"
    if not (real / "sources").is_dir():
        sys.stderr.write(f"real-docs not found under {DATASETS} (set KBFLOW_DATASETS)\n")
        return 2
    rows: list[dict[str, Any]] = []
    for engine in ("tesseract", "rapidocr"):
        options = ExtractOptions(ocr_engine=engine, asr_engine="pocketsphinx")
        with ExtractionPool(options=options, limits=Limits(timeout_s=600)) as pool:
            pool.extract(real / "sources" / "mixed.md")  # start the worker outside the timings
            for source in sorted((real / "sources").iterdir()):
                started = time.perf_counter()
                try:
                    doc = pool.extract(source)
                except ExtractionError as exc:
                    rows.append({"engine": engine, "name": source.name, "error": str(exc)})
                    continue
                seconds = time.perf_counter() - started
                reference = groundtruth_for(source, real / "groundtruth")
                row: dict[str, Any] = {"engine": engine, "name": source.name}
                if reference is not None:
                    row |= recall_row(source, reference, doc, seconds).to_dict()
                else:
                    row |= {
                        "source_format": doc.source_format,
                        "method": method_of(doc),
                        "reference_tokens": None,
                        "recall": None,
                        "seconds": round(seconds, 3),
                        "empty_reason": doc.meta.get("empty_reason"),
                        "words": len(document_text(doc).split()) - len(doc.title.split()),
                    }
                rows.append(row)
    out = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "extract_recall.json").write_text(json.dumps(out, indent=2) + "\n")
    print("| file | format | how it was read | reference tokens | recall | seconds |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        if row["engine"] != "tesseract" and "OCR" not in str(row.get("method")):
            continue  # the second engine only changes the OCR rows
        if "error" in row:
            print(f"| {row['name']} | | error: {row['error']} | | | |")
            continue
        recall = f"{row['recall']:.3f}" if row["recall"] is not None else "—"
        if row.get("empty_reason"):
            recall = f"— (empty: {row['empty_reason']})"
        tokens = row["reference_tokens"] if row["reference_tokens"] is not None else "—"
        print(
            f"| {row['name']} | {row['source_format']} | {row['method']} | {tokens} | {recall} "
            f"| {row['seconds']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
